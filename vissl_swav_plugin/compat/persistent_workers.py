"""DataLoader workers that outlive the epoch, with the epoch's transform state carried to them.

What breaks: ``vissl/data/__init__.py``, ``build_dataloader`` makes its ``DataLoader`` without
``persistent_workers``, and ``vissl/trainer/train_task.py``, ``recreate_data_iterator`` (via
``vissl/trainer/trainer_main.py``, ``_advance_phase``) builds a new data iterator at every phase.
So every epoch starts ``NUM_DATALOADER_WORKERS`` fresh worker processes; with VISSL's default
``MULTI_PROCESSING_METHOD: forkserver`` (every shipped config) each one is a new interpreter
that imports torch and VISSL again: 70 s per epoch with 8 workers on a 16-core H100 machine,
3.9-5.3 s with 2 workers on a 2-core CPU, for a few seconds of training.

Fix (patch ``shim_persistent_workers``): ``vissl.data.DataLoader`` (the name ``build_dataloader``
calls) becomes :class:`PersistentWorkersDataLoader`, torch's DataLoader with
``persistent_workers=True`` when ``NUM_DATALOADER_WORKERS > 0``; the new key
``config.DATA.PERSISTENT_WORKERS`` (default ``True``; ``false`` gives VISSL's fresh workers per
epoch) switches it off.  The sampler lives in the main process, so VISSL's ``set_epoch`` /
``set_start_iter`` on it (shuffling, mid-epoch resume) act as before.

The state that changes between epochs inside the *dataset* is different: a persistent worker
keeps the copy of the dataset and its transforms it got when it started, so a change made in
the main process afterwards (the colour warm-up's ``set_epoch`` on ``multicrop_plugin``, called
by ``ColorWarmupHook`` before each epoch's iterator is built) would never reach it.  Design:
**the epoch state travels with the batches' indices.**

* An object of the dataset (the dataset, its ``data_objs``, every transform reachable through
  ``transform`` / ``transforms``) that has epoch-dependent state implements
  ``epoch_state()`` (a small picklable, comparable value) and ``load_epoch_state(state)``
  (``MultiCropPlugin``: the colour-distortion strength per crop group).
* When the epoch's iterator is built (``iter(loader)``, where VISSL's fresh workers would
  copy the dataset), :class:`EpochStateSampler` takes a snapshot of those states in the main
  process and marks the first index of each batch of that epoch with it
  (:class:`EpochIndex`, an ``int`` that carries the snapshot; a few bytes per batch).
* In the worker, ``GenericSSLDataset.__getitem__`` loads a marked index's snapshot into its
  own copy (only when it differs from the one loaded last) before reading the item, so every
  item of that batch sees the state the main process had when the epoch's iterator was made:
  exactly what fresh workers saw.

Why not shared memory or re-sending the dataset: the indices already go to the workers
through torch's own queues, in order and whatever the start method (fork, forkserver, spawn),
so nothing new has to be created, sized, inherited or cleaned up (``/dev/shm`` is small in
containers), and a snapshot is tied to the batches of its epoch (no race with batches
prefetched earlier); re-pickling the dataset each epoch would cost what fork avoids (a
``disk_folder`` dataset holds every file path).  Each loader (train, test) carries its own
snapshot; a resumed run's loader is new, and ``ColorWarmupHook.on_start`` sets the resumed
epoch's state before the first iterator, as before.

Safe fallback: an object that VISSL or a user's code updates per epoch but that does not
implement the two methods (anything with ``set_epoch``, ``set_start_iter`` or
``set_train_phase_idx`` besides the sampler, e.g. VISSL's ``AirstoreDataset``), or a state
carried to a dataset that is not a ``GenericSSLDataset``, keeps VISSL's fresh workers for that
loader, with a log line naming the object.  Worker seeds: the workers are seeded once (VISSL's
``set_dataloader_seeds``) and their random streams go on from epoch to epoch instead of being
re-drawn; runs stay reproducible for a given seed, with other augmentations than fresh
workers would draw.  A persistent worker holds its memory between epochs, and a run with a
test phase keeps the train and the test loaders' workers (``2 x NUM_DATALOADER_WORKERS``).
"""
import functools
import logging
from typing import Any, Iterator, List, Tuple

from vissl_swav_plugin.compat.engine import patch, raw, register

#: the plugin's config key (added to VISSL's schema through ``compat.amp.PLUGIN_CONFIG_KEYS``)
PERSISTENT_WORKERS_KEY = "config.DATA.PERSISTENT_WORKERS"
#: methods VISSL (or a user's hook) calls on dataset objects per epoch: an object that has one
#: without the epoch-state methods keeps fresh workers
EPOCH_SETTERS = ("set_epoch", "set_start_iter", "set_train_phase_idx")
_LOADED = "_swav_plugin_epoch_states"  # worker-side attribute: the snapshot loaded last
_MAX_DEPTH = 8


def persistent_workers_enabled(cfg) -> bool:
    """``config.DATA.PERSISTENT_WORKERS`` of ``cfg`` (the full config; default ``True``)."""
    data = cfg.get("DATA") if hasattr(cfg, "get") else None
    value = data.get("PERSISTENT_WORKERS", True) if hasattr(data, "get") else True
    if not isinstance(value, bool):
        raise ValueError(f"{PERSISTENT_WORKERS_KEY}={value!r} must be true or false")
    return value


def _children(obj) -> List[Any]:
    out = []
    for name in ("data_objs", "transforms"):
        seq = getattr(obj, name, None)
        if isinstance(seq, (list, tuple)):
            out.extend(seq)
    t = getattr(obj, "transform", None)
    if t is not None and not callable(getattr(type(obj), "transform", None)):  # an attribute, not a method
        out.append(t)
    return out


def dataset_objects(dataset) -> Iterator[Any]:
    """The dataset, its ``data_objs`` and every transform reachable through ``transform`` /
    ``transforms``, depth first, each once (the same order in every process)."""
    seen, stack = set(), [(dataset, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        yield obj
        stack.extend((c, depth + 1) for c in reversed(_children(obj)))


def _carries(obj) -> bool:
    return callable(getattr(obj, "epoch_state", None)) and callable(getattr(obj, "load_epoch_state", None))


def state_carriers(dataset) -> List[Any]:
    """The objects of ``dataset`` whose epoch state is carried to the workers."""
    return [o for o in dataset_objects(dataset) if _carries(o)]


def uncarried_objects(dataset) -> List[Any]:
    """Objects of ``dataset`` updated per epoch (:data:`EPOCH_SETTERS`) whose state cannot be
    carried (no ``epoch_state`` / ``load_epoch_state``)."""
    return [o for o in dataset_objects(dataset)
            if not _carries(o) and any(callable(getattr(o, m, None)) for m in EPOCH_SETTERS)]


def epoch_states(dataset) -> Tuple:
    """The snapshot carried to the workers: ``epoch_state()`` of every carrier, in order."""
    return tuple(o.epoch_state() for o in state_carriers(dataset))


def load_epoch_states(dataset, states: Tuple) -> None:
    """Load a snapshot of :func:`epoch_states` into ``dataset`` (a worker's copy); a no-op
    when it is the snapshot loaded last."""
    if dataset.__dict__.get(_LOADED) == states:
        return
    carriers = state_carriers(dataset)
    if len(carriers) != len(states):
        raise RuntimeError(
            f"vissl_swav_plugin.compat.persistent_workers: the worker's dataset has {len(carriers)} "
            f"objects with an epoch state, the main process sent {len(states)}; set "
            f"{PERSISTENT_WORKERS_KEY}=false and report this")
    for obj, state in zip(carriers, states):
        obj.load_epoch_state(state)
    dataset.__dict__[_LOADED] = states


class EpochIndex(int):
    """A dataset index that carries the main process's epoch-state snapshot to a worker."""

    def __new__(cls, value: int, states: Tuple):
        self = super().__new__(cls, value)
        self.epoch_states = states
        return self

    def __reduce__(self):
        return EpochIndex, (int(self), self.epoch_states)


class EpochStateSampler:
    """The loader's index sampler (batches of indices), whose ``iter()`` -- once per epoch,
    when the epoch's data iterator is built -- snapshots the dataset's epoch states and marks
    the first index of every batch with them."""

    def __init__(self, inner, dataset):
        self.inner, self.dataset = inner, dataset

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        states = epoch_states(self.dataset)  # now, not at the first next()
        return self._marked(iter(self.inner), states) if states else iter(self.inner)

    @staticmethod
    def _marked(indices, states):
        for batch in indices:
            if isinstance(batch, int):
                yield EpochIndex(batch, states)
            elif len(batch):
                batch = list(batch)
                batch[0] = EpochIndex(batch[0], states)
                yield batch
            else:
                yield batch

    def __getattr__(self, name):  # anything else (set_epoch, ...) is the inner sampler's
        return getattr(self.__dict__["inner"], name)


_warned = set()


def _is_ssl_dataset(dataset) -> bool:
    from vissl.data.ssl_dataset import GenericSSLDataset

    return isinstance(dataset, GenericSSLDataset)


def wants_persistent_workers(dataset, num_workers: int) -> bool:
    """Whether a loader of ``dataset`` with ``num_workers`` workers keeps them between epochs:
    workers, the key on (read from ``dataset.cfg``), and every epoch state of the dataset
    carried (otherwise VISSL's fresh workers, logged once per object type)."""
    if not num_workers or num_workers <= 0:
        return False
    cfg = getattr(dataset, "cfg", None)
    if cfg is not None and not persistent_workers_enabled(cfg):
        return False
    blocked = [type(o).__name__ for o in uncarried_objects(dataset)]
    if state_carriers(dataset) and not _is_ssl_dataset(dataset):
        blocked.append(f"{type(dataset).__name__} (not a GenericSSLDataset)")
    if blocked:
        key = tuple(sorted(set(blocked)))
        if key not in _warned:
            _warned.add(key)
            logging.info(
                "DataLoader workers restart every epoch (VISSL's behaviour): the per-epoch state of %s "
                "cannot be carried to persistent workers (it needs epoch_state() and load_epoch_state(); "
                "vissl_swav_plugin/compat/persistent_workers.py)", ", ".join(key))
        return False
    return True


@functools.lru_cache(maxsize=1)
def _loader_class():
    from torch.utils.data import DataLoader

    class PersistentWorkersDataLoader(DataLoader):
        """torch's DataLoader whose workers survive the epoch (``persistent_workers``) when
        :func:`wants_persistent_workers`, with the epoch state carried by
        :class:`EpochStateSampler`."""

        def __init__(self, dataset, *args, **kwargs):
            if "persistent_workers" not in kwargs:  # VISSL passes everything by keyword
                kwargs["persistent_workers"] = wants_persistent_workers(dataset, kwargs.get("num_workers", 0))
            super().__init__(dataset, *args, **kwargs)

        @property
        def _index_sampler(self):
            inner = DataLoader._index_sampler.fget(self)
            if getattr(self, "persistent_workers", False) and self.num_workers > 0:
                return EpochStateSampler(inner, self.dataset)
            return inner

    PersistentWorkersDataLoader.__module__ = __name__
    PersistentWorkersDataLoader.__qualname__ = "PersistentWorkersDataLoader"
    return PersistentWorkersDataLoader


def loader_class():
    """:class:`PersistentWorkersDataLoader` (made on first use: this module imports no torch)."""
    return _loader_class()


@register
def shim_persistent_workers():
    """vissl/data/__init__.py, build_dataloader: ``DataLoader(...)`` without
    ``persistent_workers`` -> every epoch starts fresh workers (forkserver: new interpreters).
    ``vissl.data.DataLoader`` becomes :class:`PersistentWorkersDataLoader`, and
    ``GenericSSLDataset.__getitem__`` loads the epoch state an :class:`EpochIndex` carries."""
    import vissl.data as vd
    from vissl.data import ssl_dataset

    patch("shim_persistent_workers", vd, "DataLoader", loader_class())

    inner = raw(ssl_dataset.GenericSSLDataset, "__getitem__")

    @functools.wraps(inner)
    def __getitem__(self, idx):
        if type(idx) is EpochIndex:
            load_epoch_states(self, idx.epoch_states)
            idx = int(idx)
        return inner(self, idx)

    patch("shim_persistent_workers", ssl_dataset.GenericSSLDataset, "__getitem__", __getitem__)

