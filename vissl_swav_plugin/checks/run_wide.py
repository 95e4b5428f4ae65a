"""Run-wide config checks.  Key-level ones run when a config is composed
(:func:`~vissl_swav_plugin.config.registries.register_config_check`); the ones that need the
whole run -- head against trunk width, dataset size against batch and processes, data
paths, settings that never act -- run when the run is launched
(:func:`~vissl_swav_plugin.config.registries.register_launch_check`, patch
``plugin_launch_checks``: :mod:`vissl_swav_plugin.compat.launch_checks`, whose slot this
module fills with :func:`~vissl_swav_plugin.config.registries.run_launch_checks`), in the
launcher process before any worker starts.

A wrong setting raises :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming
the key and the values involved; a setting that can never act is logged with
``logging.warning``.

When the config is composed:

* heads: unknown keys of the entries of ``MODEL.HEAD.PARAMS`` built by this plugin, and
  of VISSL's ``swav_head`` under one of our losses (the known keys are the head
  constructor's parameters), and our heads' switches (``use_bn``, ``fp32_head``, ...: the
  parameters annotated ``bool``) that are not booleans; the plugin's trunk block;
* ``multicrop_plugin`` transforms: unknown keys and every parameter, as the workers
  would check them ~15 s later;
* ``DATA.TRAIN.BATCHSIZE_PER_REPLICA`` >= 1;
* the environment variables read when the dataset is built (``VISSL_SWAV_PLUGIN_BAD_IMAGES``,
  ``VISSL_SWAV_PLUGIN_EXIF``): one of their values.

When the run is launched:

* the first head's ``dims[0]`` must equal the trunk's output dimension
  (:func:`trunk_output_dim`);
* at least one iteration per epoch when the dataset size is known
  (:func:`~vissl_swav_plugin.config.dataset_size.train_dataset_size`);
* the local data paths of the splits the run reads exist and hold images; their dataset
  lists have one length, and a dataset name VISSL looks up in its catalog is registered; a
  directory symlink loop in a ``disk_folder`` is an error, files torchvision's ImageFolder
  skips (other extensions) or reads twice (through a symlink) are warnings;
* ``VISSL_SWAV_PLUGIN_TRACE_DIR``, when set: a writable folder, or one that can be made;
* settings that never act: a SwAV queue from ``queue.start_epoch >= num_epochs``,
  ``freeze_prototypes_niters >=`` the run's iterations (warnings).  DeepCluster-v2 /
  SeLa-v2 with more clusters than training samples: an error, registered by those losses
  (:func:`~vissl_swav_plugin.losses.clustering_config.check_clusters_fit_dataset`).

The dataset-size arithmetic is :mod:`vissl_swav_plugin.config.dataset_size`.
"""
import inspect
import logging
import os
from typing import Optional

from vissl_swav_plugin.compat import launch_checks as launch_patch
from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys
from vissl_swav_plugin.config.dataset_size import (
    iterations_per_epoch,
    samples_per_process,
    train_dataset_size,
    world_size_of,
)
from vissl_swav_plugin.config.registries import register_config_check, register_launch_check, run_launch_checks

#: VISSL's ResNe(X)t output (``flatten`` / ``res5avg``) per unit of WIDTH_MULTIPLIER
RESNET_OUT_DIM = 2048
RESNET_DEPTHS = (50, 101, 152, 200)
#: heads whose ``dims[0]`` is the size of the trunk features they take
DIMS_FIRST_HEADS = ("swav_plugin_head", "deepclusterv2_plugin_head", "swav_head", "mlp")


def _is_ours(cls) -> bool:
    """Whether a registered class comes from this plugin."""
    return getattr(cls, "__module__", "").startswith("vissl_swav_plugin.")


def _constructor_params(cls):
    """``(params, closed)``: the keyword parameters (``inspect.Parameter``, after
    ``model_config``) of ``cls``'s constructor and of the base constructors its ``**kwargs``
    reach along the MRO; ``closed`` is False when the ``**kwargs`` end at ``nn.Module`` /
    ``object`` (any key accepted)."""
    import torch.nn as nn

    found = []
    seen = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or init in seen:
            continue
        if klass in (nn.Module, object):
            return found, False  # **kwargs reach a constructor that is not a head's: not checkable
        seen.add(init)
        params = list(inspect.signature(init).parameters.values())[2:]  # self, model_config
        found += [p for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return found, True
    return found, False


def constructor_keys(cls):
    """The keyword parameters of ``cls(model_config, ...)`` (VISSL passes a head's
    ``MODEL.HEAD.PARAMS`` entry as keywords after ``model_config``), or None when any key
    is accepted.  An ``__init__`` that takes ``**kwargs`` is followed to the base class's
    ``__init__`` in the MRO (a subclass passing its extra keywords up, such as
    ``deepclusterv2_plugin_head``); reaching ``nn.Module`` / ``object`` that way gives None.

    Example::

        constructor_keys(SwAVPluginHead)  # {"dims", "num_clusters", "use_bn", ...}
        constructor_keys(DeepClusterV2PluginHead)  # the same set
    """
    params, closed = _constructor_params(cls)
    return {p.name for p in params} if closed else None


def constructor_bool_keys(cls):
    """The keyword parameters of ``cls``'s constructor (and of the constructors its
    ``**kwargs`` reach, as :func:`constructor_keys`) annotated ``bool``: the head's switches,
    which a quoted ``"false"`` would turn on.

    Example: ``constructor_bool_keys(SwAVPluginHead)`` holds ``use_bn`` and ``fp32_head``."""
    return {p.name for p in _constructor_params(cls)[0] if p.annotation in (bool, "bool")}


@register_config_check
def check_head_keys(cfg) -> None:
    """Unknown keys of every ``MODEL.HEAD.PARAMS`` entry built by this plugin, and of
    VISSL's heads when the loss is one of ours (a typo such as ``normalise_feats`` would
    otherwise reach the head's constructor in every worker, or be ignored)."""
    from classy_vision.losses import LOSS_REGISTRY
    from vissl.models.heads import MODEL_HEADS_REGISTRY

    our_loss = _is_ours(LOSS_REGISTRY.get(cfg.LOSS.name))
    for i, entry in enumerate(cfg.MODEL.HEAD.PARAMS or []):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not hasattr(entry[1], "keys"):
            continue
        cls = MODEL_HEADS_REGISTRY.get(entry[0])
        if cls is None or not (_is_ours(cls) or our_loss):
            continue
        known = constructor_keys(cls)
        path = f"config.MODEL.HEAD.PARAMS[{i}] ({entry[0]})"
        if known is not None:
            check_known_keys(entry[1], known, path)
        if _is_ours(cls):  # the switches: the constructor would refuse them in every worker
            for key in sorted(constructor_bool_keys(cls) & {str(k) for k in entry[1].keys()}):
                if not isinstance(entry[1][key], bool):
                    raise ConfigError(f"{path}.{key} must be True or False, got {entry[1][key]!r}")


def trunk_output_dim(model_cfg) -> Optional[int]:
    """The trunk's output dimension (its ``flatten`` feature, what the first head takes),
    or None when unknown: ``2048 * WIDTH_MULTIPLIER`` for VISSL's ``resnet`` (depth 50, 101,
    152, 200: bottleneck blocks), ``8 * WIDTH`` for ``resnet_small_plugin``."""
    trunk = model_cfg.TRUNK
    if trunk.NAME == "resnet":
        res = trunk.get("RESNETS") or {}
        if res.get("DEPTH") in RESNET_DEPTHS and isinstance(res.get("WIDTH_MULTIPLIER", 1), int):
            return RESNET_OUT_DIM * int(res.get("WIDTH_MULTIPLIER", 1))
        return None
    from vissl_swav_plugin.models import trunks

    if trunk.NAME == trunks.TRUNK_NAME:
        return trunks.output_dim(model_cfg)  # also rejects a bad RESNET_SMALL_PLUGIN block
    return None


@register_config_check
def check_trunk_keys(cfg) -> None:
    """The plugin's trunk block (``MODEL.TRUNK.RESNET_SMALL_PLUGIN``): unknown keys and bad
    values, when the config is composed."""
    from vissl_swav_plugin.models import trunks

    if cfg.MODEL.TRUNK.NAME == trunks.TRUNK_NAME:
        trunks.output_dim(cfg.MODEL)


@register_launch_check
def check_head_input_dim(cfg) -> None:
    """The first head's ``dims[0]`` must be the trunk's output dimension (else: a bare
    shape error at the first forward, in every worker).  A launch check: a head fragment
    composed alone (VISSL's ``pretrain/swav/heads/*`` for RegNet trunks) is not a run."""
    model = cfg.MODEL
    out = trunk_output_dim(model)
    heads = model.HEAD.PARAMS or []
    if out is None or not heads or (model.get("FEATURE_EVAL_SETTINGS") or {}).get("EVAL_MODE_ON", False):
        return
    name, params = heads[0][0], heads[0][1] if len(heads[0]) > 1 else {}
    dims = params.get("dims") if hasattr(params, "get") else None
    if name in DIMS_FIRST_HEADS and isinstance(dims, (list, tuple)) and dims and dims[0] != out:
        raise ConfigError(
            f"config.MODEL.HEAD.PARAMS[0] ({name}) dims[0]={dims[0]!r} but the trunk "
            f"MODEL.TRUNK.NAME={model.TRUNK.NAME} outputs {out} features ({_trunk_note(model.TRUNK)}); "
            f"set dims[0] to {out}"
        )


def _trunk_note(trunk) -> str:
    """How the trunk's output dimension follows from its config, for messages."""
    if trunk.NAME == "resnet":
        return f"{RESNET_OUT_DIM} x RESNETS.WIDTH_MULTIPLIER={trunk.RESNETS.get('WIDTH_MULTIPLIER', 1)}"
    return "8 x RESNET_SMALL_PLUGIN.WIDTH"


@register_config_check
def check_multicrop_transforms(cfg) -> None:
    """Every ``multicrop_plugin`` entry of ``DATA.{TRAIN,TEST}.TRANSFORMS``: its keys and
    values, with the defaults of ``MultiCropPlugin`` itself (its signature), as the
    dataloader workers would build it; and every ``per_image_standardize_plugin`` entry's
    keys."""
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
    from vissl_swav_plugin.transforms.multicrop_config import TRANSFORM_NAME, check_config_keys, validate_params

    from vissl_swav_plugin.transforms import standardize

    for split in ("TRAIN", "TEST"):
        for i, t in enumerate((cfg.DATA.get(split) or {}).get("TRANSFORMS") or []):
            path = f"config.DATA.{split}.TRANSFORMS[{i}]"
            if hasattr(t, "get") and t.get("name") == standardize.TRANSFORM_NAME:
                standardize.check_keys(t, path)
            if not hasattr(t, "get") or t.get("name") != TRANSFORM_NAME:
                continue
            kwargs = check_config_keys(t, path)
            bound = inspect.signature(MultiCropPlugin).bind(**kwargs)
            bound.apply_defaults()
            try:
                validate_params(**bound.arguments)
            except ConfigError as e:
                raise type(e)(f"{path}: {e}") from None


@register_config_check
def check_plugin_environment(cfg) -> None:
    """The plugin's environment variables that the training processes read later, when the
    dataset is built: ``VISSL_SWAV_PLUGIN_BAD_IMAGES`` and ``VISSL_SWAV_PLUGIN_EXIF`` take one of
    their values (a :class:`ConfigError` naming the variable and them, when the config is
    composed, not in every worker)."""
    from vissl_swav_plugin.compat.data_safety import bad_image_policy, exif_policy

    for read in (bad_image_policy, exif_policy):
        try:
            read()
        except ValueError as e:
            raise ConfigError(str(e)) from None


@register_launch_check
def check_trace_folder(cfg) -> None:
    """``VISSL_SWAV_PLUGIN_TRACE_DIR`` (the debug trace, written by every rank of a run of
    ``swav_plugin_loss``), when set: a folder that exists or can be made, writable (else every
    rank would fail at its first trace line).  Nothing is created here."""
    from vissl_swav_plugin.hooks.trace import TRACE_ENV

    folder = os.environ.get(TRACE_ENV)
    if not folder or cfg.LOSS.name != "swav_plugin_loss" or cfg.get("TEST_ONLY", False):
        return
    path = os.path.abspath(folder)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{TRACE_ENV}={folder}: not a folder (a file of that name exists); name a folder, "
                          "or unset the variable to run without the debug trace")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{TRACE_ENV}={folder}: {existing} is not a writable folder, so the trace "
                          "cannot be written there; name a writable folder, or unset the variable")


@register_config_check
def check_batches(cfg) -> None:
    """``BATCHSIZE_PER_REPLICA`` >= 1 (when the config is composed)."""
    if cfg.get("TEST_ONLY", False):
        return
    bs = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise ConfigError(f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA must be an integer >= 1, got {bs!r}")


@register_launch_check
def check_batches_fit_dataset(cfg) -> None:
    """At least one training iteration per epoch, when the dataset size is known at launch."""
    if cfg.get("TEST_ONLY", False):
        return
    bs = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    n = train_dataset_size(cfg)
    if n is not None and iterations_per_epoch(cfg, n) == 0:
        raise ConfigError(
            f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={bs} is larger than the {n} training samples "
            f"split over {world_size_of(cfg)} processes ({samples_per_process(cfg, n)} each"
            f"{', DROP_LAST=True' if cfg.DATA.TRAIN.get('DROP_LAST', False) else ''}): no training iteration; "
            "lower the batch size or the number of processes, or use more data"
        )


@register_launch_check
def check_settings_that_never_act(cfg) -> None:
    """Warn about SwAV settings that the run never reaches: the queue from epoch
    ``queue.start_epoch >= num_epochs``, prototypes frozen for ``freeze_prototypes_niters
    >=`` every iteration of the run (when the dataset size is known)."""
    if cfg.LOSS.name != "swav_plugin_loss" or cfg.get("TEST_ONLY", False):
        return
    from vissl_swav_plugin.losses.swav_config import DEFAULTS, QUEUE_DEFAULTS

    lc, key = cfg.LOSS.swav_plugin_loss, "config.LOSS.swav_plugin_loss"
    epochs = int(cfg.OPTIMIZER.num_epochs)
    q = lc.get("queue") or {}
    start = q.get("start_epoch", QUEUE_DEFAULTS["start_epoch"])
    if q.get("queue_length", QUEUE_DEFAULTS["queue_length"]) > 0 and start >= epochs:
        logging.warning(
            f"{key}.queue.start_epoch={start} >= config.OPTIMIZER.num_epochs={epochs}: the queue "
            f"(queue_length={q.get('queue_length')}) is never used (epochs are numbered from 0)"
        )
    freeze = lc.get("freeze_prototypes_niters", DEFAULTS["freeze_prototypes_niters"])
    n = train_dataset_size(cfg)
    if freeze > 0 and n is not None:
        total = epochs * iterations_per_epoch(cfg, n)
        if freeze >= total:
            logging.warning(
                f"{key}.freeze_prototypes_niters={freeze} >= the {total} iterations of the run "
                f"({epochs} epochs x {total // max(epochs, 1)} iterations of {n} samples): the prototypes "
                "are never trained"
            )


#: the data sources whose ``DATA_PATHS`` entries are local paths this check can look at
PATH_SOURCES = ("disk_folder", "disk_filelist")


def _splits_of_the_run(cfg):
    splits = [] if cfg.get("TEST_ONLY", False) else ["TRAIN"]
    if cfg.get("TEST_MODEL", False) or cfg.get("TEST_ONLY", False):
        splits.append("TEST")
    return splits


def _examples(paths, n=3) -> str:
    return ", ".join(paths[:n]) + (", ..." if len(paths) > n else "")


def _pillow_reads(ext: str) -> bool:
    from PIL import Image

    return ext in Image.registered_extensions()


def _report_exif(key, source, path, dataset, sample) -> None:
    """A warning when sampled images carry a non-identity EXIF orientation, which the
    default loader (as the official code) does not apply."""
    from PIL import Image

    from vissl_swav_plugin.compat.data_safety import exif_policy
    from vissl_swav_plugin.compat.image_modes import EXIF_ENV, exif_orientation

    if exif_policy() == "apply":
        return
    rotated = []
    for file in sample:
        try:
            with Image.open(file) as img:
                orientation = exif_orientation(img)
        except Exception:  # unreadable: named by the loader when it is read
            continue
        if orientation != 1:
            rotated.append(f"{file} (orientation {orientation})")
    if rotated:
        logging.warning(
            f"{key}: {source} path {path}{dataset}: {len(rotated)} of {len(sample)} images sampled (the first "
            "of each class folder) carry an EXIF orientation (the camera's rotation / flip): they are read as "
            "stored, not rotated, as the official SwAV code reads them; "
            f"{EXIF_ENV}=apply rotates them upright: {_examples(rotated)}")


def _report_folder_scan(key, source, path, dataset, scan) -> None:
    """An error for a directory symlink loop, warnings for skipped and repeated files
    (see :func:`~vissl_swav_plugin.config.dataset_size.scan_image_folder`)."""
    if scan.loops:
        link, target = scan.loops[0]
        raise ConfigError(
            f"{key}: {source} path {path}{dataset}: the directory symlink {link} -> {target} points to "
            f"one of its own parent folders (a loop: torchvision's ImageFolder follows it and reads the same "
            f"images many times over); {len(scan.loops)} such link(s). Remove the link")
    from vissl_swav_plugin.config.dataset_size import IMAGE_EXTENSIONS

    for ext, files in sorted(scan.skipped.items()):
        what = (f"an image format Pillow reads, but not one of torchvision ImageFolder's extensions "
                f"{' '.join(IMAGE_EXTENSIONS)}; convert them to use them" if _pillow_reads(ext)
                else f"not one of torchvision ImageFolder's extensions {' '.join(IMAGE_EXTENSIONS)}")
        logging.warning(f"{key}: {source} path {path}{dataset}: {len(files)} file(s) with extension "
                        f"{ext or '(none)'!r} are skipped ({what}): {_examples(files)}")
    _report_exif(key, source, path, dataset, scan.sample)
    if scan.repeated:
        pairs = [f"{p} (same file as {first})" for p, first in scan.repeated]
        logging.warning(f"{key}: {source} path {path}{dataset}: {len(scan.repeated)} file(s) are read twice "
                        f"through a symlink, so they weigh double in training: {_examples(pairs)}")


@register_launch_check
def check_data_paths(cfg) -> None:
    """Every local ``DATA_PATHS`` entry of a split the run reads (``disk_folder`` /
    ``disk_filelist``) exists, and a ``disk_folder`` holds images in class sub-folders:
    named at launch, before any worker starts (the workers would name it ~10 s later)."""
    from vissl_swav_plugin.config.dataset_size import scan_image_folder

    for split in _splits_of_the_run(cfg):
        data = cfg.DATA[split]
        sources, paths = list(data.get("DATA_SOURCES") or []), list(data.get("DATA_PATHS") or [])
        names = list(data.get("DATASET_NAMES") or [])
        for i, (source, path) in enumerate(zip(sources, paths)):
            if source not in PATH_SOURCES or not isinstance(path, str) or "://" in path:
                continue
            key = f"config.DATA.{split}.DATA_PATHS[{i}]"
            dataset = f" (dataset {names[i]})" if i < len(names) else ""
            if not os.path.exists(path):
                raise ConfigError(f"{key}: {source} path {path}{dataset} does not exist")
            if source == "disk_folder" and os.path.isdir(path):
                scan = scan_image_folder(path)
                if scan.images == 0:
                    raise ConfigError(
                        f"{key}: {source} path {path}{dataset} holds no images in class sub-folders "
                        "(torchvision ImageFolder layout <path>/<class>/<image>)"
                    )
                _report_folder_scan(key, source, path, dataset, scan)


@register_launch_check
def check_dataset_lists(cfg) -> None:
    """The dataset lists of every split the run reads, as VISSL's ``get_data_files`` will
    read them in each worker: ``DATASET_NAMES``, ``DATA_SOURCES`` and a non-empty
    ``DATA_PATHS`` / ``LABEL_PATHS`` of one length, and a dataset name that VISSL looks up
    in its dataset catalog (no ``DATA_PATHS``, or no ``LABEL_PATHS``: VISSL then reads the
    labels' path from the catalog) registered there, with the closest registered names
    (the workers would raise a bare ``KeyError`` / ``AssertionError``)."""
    import difflib

    from vissl.data.dataset_catalog import VisslDatasetCatalog

    for split in _splits_of_the_run(cfg):
        data = cfg.DATA[split]
        key = f"config.DATA.{split}"
        names = list(data.get("DATASET_NAMES") or [])
        sources = list(data.get("DATA_SOURCES") or [])
        paths = list(data.get("DATA_PATHS") or [])
        labels = list(data.get("LABEL_PATHS") or [])
        if len(names) != len(sources):
            raise ConfigError(
                f"{key}.DATASET_NAMES has {len(names)} entries ({names}) but {key}.DATA_SOURCES has "
                f"{len(sources)} ({sources}): give one name per data source"
            )
        for lst, what in ((paths, "DATA_PATHS"), (labels, "LABEL_PATHS")):
            if lst and len(lst) != len(sources):
                raise ConfigError(
                    f"{key}.{what} has {len(lst)} entries ({lst}) but {key}.DATA_SOURCES has {len(sources)} "
                    f"({sources}): give one path per data source, or none"
                )
        registered = VisslDatasetCatalog.list()
        for i, (name, source) in enumerate(zip(names, sources)):
            if source == "synthetic" or (paths and labels) or name in registered:
                continue
            missing = "DATA_PATHS" if not paths else "LABEL_PATHS"
            near = difflib.get_close_matches(str(name), registered, n=3, cutoff=0.6)
            raise ConfigError(
                f"{key}.DATASET_NAMES[{i}]={name!r} is not in VISSL's dataset catalog"
                + (f" (did you mean {', '.join(map(repr, near))}?)" if near else
                   f" (registered: {sorted(registered) if registered else 'none'})")
                + f", and {key}.{missing} is empty, so VISSL would look the {'data' if missing == 'DATA_PATHS' else 'labels'}"
                f" up there: set {key}.{missing} (for a disk_folder, LABEL_PATHS is the same folder) or "
                "register the dataset (VISSL's dataset_catalog.json)"
            )


# what the patch plugin_launch_checks calls (compat may not import this layer)
launch_patch.run_launch_checks.provide(run_launch_checks)
