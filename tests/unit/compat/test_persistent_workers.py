"""``vissl_swav_plugin/compat/persistent_workers.py`` in this process: VISSL's loader keeps its
workers between epochs unless the key or an uncarried per-epoch object says otherwise, and the
epoch state taken when an epoch's iterator is built travels with the batches' indices into a
worker's copy of the dataset.  The tests with real worker processes are in
``tests/integration/compat/test_persistent_workers_integration.py``.

Independent truths: torch's own DataLoader flag; a deep copy of the dataset standing for a
worker's copy (pickled as a forkserver / spawn worker gets it); a transform built directly at
the strength the snapshot names."""
import copy
import pickle
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vissl  # noqa: F401  (registers the plugin)
from classy_vision.dataset.transforms import build_transform
from vissl_swav_plugin import compat
from vissl_swav_plugin.compat import persistent_workers as pw
from vissl_swav_plugin.hooks.color_warmup import ColorWarmupHook, scheduled_transforms

from color_warmup_cases import sampled
from persistent_workers_cases import build_loader, flat_folder, main_strengths, warmup_config
from testkit import compose

QUICK = "config=test/swav_plugin/quick_cpu"


@pytest.fixture
def folder(tmp_path):
    return flat_folder(tmp_path / "flat")


def test_patch_applied_and_documented():
    assert "shim_persistent_workers" in compat.applied()
    import vissl.data as vd

    assert vd.DataLoader is pw.loader_class()
    with compat.disabled("shim_persistent_workers"):
        assert vd.DataLoader is torch.utils.data.DataLoader


@pytest.mark.parametrize("workers", [1, 2])
def test_vissl_loader_keeps_its_workers_by_default_and_not_without_the_patch(folder, workers):
    cfg = warmup_config(folder, workers)
    _, loader = build_loader(cfg, workers, probe=False)  # no iteration: no process starts
    assert isinstance(loader, torch.utils.data.DataLoader) and loader.persistent_workers
    assert isinstance(loader._index_sampler, pw.EpochStateSampler)
    with compat.disabled("shim_persistent_workers"):
        _, stock = build_loader(cfg, workers, probe=False)
    assert type(stock) is torch.utils.data.DataLoader and not stock.persistent_workers
    assert len(stock) == len(loader) == 4  # 8 images, batch 2


def test_key_off_and_no_workers_give_vissls_loader(folder):
    # the plugin's key needs no leading '+' (Hydra 1.3 refuses an unknown key without it)
    cfg = warmup_config(folder, 2, ["config.DATA.PERSISTENT_WORKERS=false"])
    assert cfg.DATA.PERSISTENT_WORKERS is False
    _, off = build_loader(cfg, 2, probe=False)
    assert not off.persistent_workers and not isinstance(off._index_sampler, pw.EpochStateSampler)
    _, none = build_loader(warmup_config(folder, 0), 0, probe=False)
    assert not none.persistent_workers
    assert warmup_config(folder, 2, ["config.DATA.PERSISTENT_WORKERS=true"]).DATA.PERSISTENT_WORKERS is True


def test_key_value_must_be_a_bool():
    assert pw.persistent_workers_enabled({"DATA": {}}) is True
    assert pw.persistent_workers_enabled({"DATA": {"PERSISTENT_WORKERS": False}}) is False
    with pytest.raises(ValueError, match=re.escape("config.DATA.PERSISTENT_WORKERS='yes' must be true or false")):
        pw.persistent_workers_enabled({"DATA": {"PERSISTENT_WORKERS": "yes"}})


def test_key_is_in_the_plugin_schema():
    from vissl_swav_plugin.compat.amp import PLUGIN_CONFIG_KEYS

    assert pw.PERSISTENT_WORKERS_KEY in PLUGIN_CONFIG_KEYS
    compose([QUICK, "config.DATA.PERSISTENT_WORKERS=false"])  # no unknown-key error


class _AirstoreLike:
    """A data source updated per epoch by VISSL (``set_epoch``), without the epoch-state methods."""

    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch


def test_an_uncarried_per_epoch_object_keeps_fresh_workers(folder, caplog):
    import logging

    cfg = warmup_config(folder, 2)
    ds, _ = build_loader(cfg, 2, probe=False)
    ds.data_objs.append(_AirstoreLike())
    with caplog.at_level(logging.INFO):
        assert not pw.wants_persistent_workers(ds, 2)
    assert "_AirstoreLike" in caplog.text
    ds.data_objs.pop()
    assert pw.wants_persistent_workers(ds, 2) and not pw.wants_persistent_workers(ds, 0)
    plain = SimpleNamespace(transform=build_transform({"name": "multicrop_plugin", "num_crops": [2], "size_crops": [16],
                                                       "crop_scales": [[0.3, 1.0]]}))
    assert not pw.wants_persistent_workers(plain, 2)  # a carried state but not a GenericSSLDataset


def test_snapshot_is_taken_when_the_epochs_iterator_is_built_and_marks_each_batch(folder):
    cfg = warmup_config(folder, 2)
    ds, loader = build_loader(cfg, 2, probe=False)
    (t,) = scheduled_transforms(ds)
    t.set_epoch(1, 4)  # linear ramp over 8 iterations: epoch 1 starts at iteration 4 -> half-way
    sampler = loader._index_sampler
    assert len(sampler) == len(loader) == 4
    it = iter(sampler)
    t.set_epoch(2, 4)  # after iter(): belongs to the next epoch, as with fresh workers
    batches = list(it)
    assert len(batches) == 4 and all(len(b) == 2 for b in batches)
    for b in batches:
        assert type(b[0]) is pw.EpochIndex and type(b[1]) is int
        assert b[0].epoch_states == ([0.5, 0.25],)
        again = pickle.loads(pickle.dumps(b[0]))  # how it travels to the worker
        assert again == int(b[0]) and again.epoch_states == b[0].epoch_states
    assert next(iter(sampler))[0].epoch_states == ([1.0, 0.5],)
    assert sorted(i for b in batches for i in b) == list(range(8))


def test_worker_copy_loads_the_carried_state_before_reading_the_item(folder):
    cfg = warmup_config(folder, 2)
    ds, _ = build_loader(cfg, 2, probe=False)
    worker = pickle.loads(pickle.dumps(ds))  # a forkserver / spawn worker's copy
    (t,) = scheduled_transforms(ds)
    (wt,) = scheduled_transforms(worker)
    assert wt.current_color_strength == [0.0, 0.0]
    t.set_epoch(1, 4)
    states = pw.epoch_states(ds)
    item = worker[pw.EpochIndex(3, states)]
    assert wt.current_color_strength == [0.5, 0.25] and worker.__dict__[pw._LOADED] == states
    assert set(item["data_idx"]) == {3} and all(type(i) is int for i in item["data_idx"])
    assert wt.current_color_strength == t.current_color_strength
    worker[5]  # a plain index changes nothing
    assert wt.current_color_strength == [0.5, 0.25]
    # the worker's transform now samples as one built at that strength
    ref = build_transform({"name": "multicrop_plugin", "num_crops": [2, 2], "size_crops": [28, 16],
                           "crop_scales": [[0.3, 1], [0.1, 0.3]], "color_strength": [0.5, 0.25],
                           "color_jitter_p": 1.0, "grayscale_p": 0.0, "blur_p": 0.0})
    for seed in (0, 1):
        (j, f), (rj, rf) = sampled(wt, seed), sampled(ref, seed)
        assert np.array_equal(j, rj) and np.allclose(f, rf)
    # a dataset whose carriers do not match the snapshot is an error naming the key
    with pytest.raises(RuntimeError, match="PERSISTENT_WORKERS=false"):
        pw.load_epoch_states(worker, states + ([1.0],))


def test_hook_state_reaches_the_snapshot_on_resume(folder):
    cfg = warmup_config(folder, 2)
    ds, loader = build_loader(cfg, 2, probe=False)
    task = SimpleNamespace(dataloaders={"train": loader}, train_phase_idx=1, train=True)  # resumed after 2 epochs
    ColorWarmupHook().on_start(task)
    assert next(iter(loader._index_sampler))[0].epoch_states == (main_strengths(ds)[0],) == ([1.0, 0.5],)


def test_multicrop_epoch_state_round_trip():
    kw = {"name": "multicrop_plugin", "num_crops": [2, 2], "size_crops": [28, 16],
          "crop_scales": [[0.3, 1], [0.1, 0.3]], "color_strength": 0.5, "color_warmup_iters": 10,
          "color_warmup_strength": 0.0, "color_warmup_schedule": "linear"}
    a, b = build_transform(kw), build_transform(kw)
    a.set_epoch(1, 4)
    b.load_epoch_state(copy.deepcopy(a.epoch_state()))
    assert b.current_color_strength == a.current_color_strength == [0.2, 0.2]
    for seed in (0, 3):
        (j, f), (rj, rf) = sampled(a, seed), sampled(b, seed)
        assert np.array_equal(j, rj) and np.allclose(f, rf)
