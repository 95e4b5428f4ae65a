"""``config.DATA.TRAIN.DEVICE_AUGMENT`` in VISSL: the key, its inference, a collator and a train step.

* The key (``off`` | ``normalize`` | ``photometric`` | ``decode``, :mod:`.device_augment`,
  :mod:`.device_decode`) is declared to the
  check of VISSL's schema; on the command line:
  ``config.DATA.TRAIN.DEVICE_AUGMENT=normalize`` (no ``+`` needed: ``compat.amp.PLUGIN_CONFIG_KEYS``).
* The config inference (every launcher, when the config is composed) checks the value (a
  :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the key), copies it into the
  split's ``multicrop_plugin`` entry (``device_augment``: what the workers send) and sets
  ``TRAINER.TRAIN_STEP_NAME`` to :data:`TRAIN_STEP_NAME` (from ``standard_train_step``) and, for
  ``photometric``, ``DATA.TRAIN.COLLATE_FUNCTION`` to :data:`COLLATOR_NAME` (from
  ``multicrop_collator``), for ``decode`` to ``multicrop_decode_collator``; another value of either
  is refused, naming both keys.  ``decode`` needs ``multicrop_plugin`` as the only train transform
  (it receives the file undecoded), and a ``multicrop_plugin`` with ``jpeg_draft`` must come first.
* :func:`multicrop_device_collator`: VISSL's ``multicrop_collator`` for ``(crop, parameters)``
  pairs: the crops as VISSL stacks them, the parameter rows as ``batch["crop_params"]``
  (``[positions, N, NUM_PARAMS]``).
* :func:`device_augment_train_step`: takes the batch from the data iterator, moves it to the
  task's device (``non_blocking``; on CUDA VISSL's loader wrapper has already copied it), turns
  the uint8 crops into normalised float crops there (:class:`.device_augment.DeviceAugmenter`)
  and hands the batch to VISSL's ``standard_train_step`` through a one-batch iterator, so
  everything else (forward, loss, hooks, AMP, timers) is VISSL's own.  A batch that is not
  uint8 (a test phase, ``off``) passes through unchanged.  A ``decode`` batch is first decoded,
  cropped and resized by :class:`.device_decode.DeviceDecoder`.
"""
import logging
from typing import Any, Dict, List, Optional

import torch

from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.registries import register_global_inference, register_plugin_config_keys
from vissl_swav_plugin.compat.image_modes import DECODE_ON_DEVICE, DRAFT_KEY
from vissl_swav_plugin.transforms.device_augment import KEY, MODES, OFF, PHOTOMETRIC, DeviceAugmenter
from vissl_swav_plugin.transforms.device_decode import (
    ENCODED_KEY,
    PARAMS_KEY,
    DeviceDecoder,
    multicrop_decode_collator,
)
from vissl_swav_plugin.transforms.multicrop_config import (
    DECODE_COLLATOR,
    DEVICE_COLLATOR,
    TRANSFORM_NAME,
    check_config_keys,
)

__all__ = ["TRAIN_STEP_NAME", "COLLATOR_NAME", "PARAMS_KEY", "infer_device_augment", "multicrop_device_collator",
           "device_augment_train_step", "augment_batch", "augmenter_for", "augmenter_for_transform", "decoder_for",
           "decoder_for_transform"]

TRAIN_STEP_NAME = "device_augment_train_step"
COLLATOR_NAME = DEVICE_COLLATOR
STANDARD_STEP = "standard_train_step"
STANDARD_COLLATOR = "multicrop_collator"
def _transform_names(transforms) -> list:
    """The names of config transform entries, for an error message (an entry without one as it is)."""
    return [t.get("name") if hasattr(t, "get") else t for t in transforms]


#: the collator each mode needs in place of multicrop_collator
_COLLATORS = {PHOTOMETRIC: COLLATOR_NAME, DECODE_ON_DEVICE: DECODE_COLLATOR}
_STEP_KEY = "TRAINER.TRAIN_STEP_NAME"
_COLLATE_KEY = "DATA.TRAIN.COLLATE_FUNCTION"

register_plugin_config_keys(KEY)


def _mode(cfg) -> str:
    value = (cfg.DATA.get("TRAIN") or {}).get("DEVICE_AUGMENT", OFF)
    if value is False:  # YAML reads a bare `off` as false
        value = OFF
    if not isinstance(value, str) or value not in MODES:
        raise ConfigError(f"config.{KEY} must be one of {list(MODES)}, got {value!r}")
    return value


@register_global_inference("device_augment")
def infer_device_augment(cfg):
    """Check ``DATA.TRAIN.DEVICE_AUGMENT`` and set what it needs (module docstring).

    Raises:
        ConfigError: a bad value; a ``multicrop_plugin`` ``device_augment`` that differs from
            the key (or is set in ``DATA.TEST``); ``DEVICE_AUGMENT`` without exactly one
            ``multicrop_plugin``, last in ``DATA.TRAIN.TRANSFORMS``; a train step or collator of
            the user's that conflicts (naming both keys).
    """
    mode = _mode(cfg)
    for split in ("TRAIN", "TEST"):
        for i, t in enumerate((cfg.DATA.get(split) or {}).get("TRANSFORMS") or []):
            if hasattr(t, "get") and t.get("name") == TRANSFORM_NAME and t.get(DRAFT_KEY) is True and i > 0:
                raise ConfigError(
                    f"config.DATA.{split}.TRANSFORMS[{i}].{DRAFT_KEY}: true hands {TRANSFORM_NAME} the undecoded "
                    f"file, so it must be the first transform; before it: "
                    f"{_transform_names(cfg.DATA[split].TRANSFORMS[:i])}")
            if not hasattr(t, "get") or t.get("name") != TRANSFORM_NAME or "device_augment" not in t:
                continue
            want = mode if split == "TRAIN" else OFF
            if t["device_augment"] is False:  # YAML reads a bare `off` as false
                t["device_augment"] = OFF
            if t["device_augment"] != want:
                raise ConfigError(
                    f"config.DATA.{split}.TRANSFORMS[{i}].device_augment={t['device_augment']!r} differs from "
                    f"config.{KEY}={want!r}" + (" (the key acts on DATA.TRAIN only)" if split == "TEST" else "")
                    + f": set config.{KEY} and leave the transform's key to the config inference")
    if mode == OFF:
        return cfg
    transforms = list(cfg.DATA.TRAIN.get("TRANSFORMS") or [])
    hits = [i for i, t in enumerate(transforms) if hasattr(t, "get") and t.get("name") == TRANSFORM_NAME]
    if len(hits) != 1 or hits[0] != len(transforms) - 1:
        raise ConfigError(
            f"config.{KEY}={mode!r} needs exactly one {TRANSFORM_NAME}, the last transform of "
            f"config.DATA.TRAIN.TRANSFORMS (its crops go to the device as uint8); got "
            f"{_transform_names(transforms)}")
    if mode == DECODE_ON_DEVICE and len(transforms) != 1:
        raise ConfigError(
            f"config.{KEY}={mode!r} hands {TRANSFORM_NAME} the undecoded file, so it must be the only transform "
            f"of config.DATA.TRAIN.TRANSFORMS; got {_transform_names(transforms)}")
    entry = transforms[hits[0]]
    if entry.get("to_tensor", True) is not True:
        raise ConfigError(f"config.{KEY}={mode!r} needs config.DATA.TRAIN.TRANSFORMS[{hits[0]}].to_tensor: true")
    entry["device_augment"] = mode
    step = cfg.TRAINER.TRAIN_STEP_NAME
    if step == STANDARD_STEP:
        cfg.TRAINER.TRAIN_STEP_NAME = TRAIN_STEP_NAME
    elif step != TRAIN_STEP_NAME:
        raise ConfigError(f"config.{KEY}={mode!r} runs its own train step ({TRAIN_STEP_NAME}, which wraps "
                          f"{STANDARD_STEP}) but config.{_STEP_KEY}={step!r}: use {STANDARD_STEP} or {KEY}=off")
    collator = cfg.DATA.TRAIN.COLLATE_FUNCTION
    if mode in _COLLATORS:
        own = _COLLATORS[mode]
        if collator == STANDARD_COLLATOR:
            cfg.DATA.TRAIN.COLLATE_FUNCTION = own
        elif collator != own:
            raise ConfigError(f"config.{KEY}={mode!r} collates with {own} (multicrop_collator keeping "
                              f"each crop's parameters) but config.{_COLLATE_KEY}={collator!r}: use "
                              f"{STANDARD_COLLATOR} or {KEY}=off")
    elif collator != STANDARD_COLLATOR:
        raise ConfigError(f"config.{KEY}={mode!r} sends uint8 crops, which only {STANDARD_COLLATOR} passes on "
                          f"unchanged, but config.{_COLLATE_KEY}={collator!r}: use {STANDARD_COLLATOR} or {KEY}=off")
    logging.info(f"config.{KEY}={mode}: train step {cfg.TRAINER.TRAIN_STEP_NAME}, "
                 f"collator {cfg.DATA.TRAIN.COLLATE_FUNCTION}")
    return cfg


def multicrop_device_collator(batch: List[Dict[str, Any]]) -> Dict[str, Any]:
    """VISSL's ``multicrop_collator`` for samples whose crops are ``(uint8 crop, parameter row)``
    pairs (``device_augment: photometric``): the crops collated by it, crop-major as always,
    and ``crop_params``: ``[tensor [positions, N, NUM_PARAMS]]`` in the same order."""
    from vissl.data.collators.multicrop_collator import multicrop_collator

    plain, params = [], []
    for sample in batch:
        crops = sample["data"]
        if not all(isinstance(c, (tuple, list)) and len(c) == 2 for c in crops):
            raise TypeError(f"{COLLATOR_NAME}: each crop must be a (crop, parameters) pair "
                            f"({TRANSFORM_NAME} with device_augment: photometric)")
        plain.append({**sample, "data": [c[0] for c in crops]})
        params.append(torch.stack([c[1] for c in crops]))
    out = multicrop_collator(plain)
    out[PARAMS_KEY] = [torch.stack(params, 1)]  # [positions, N, NUM_PARAMS]
    return out


def augmenter_for(config) -> DeviceAugmenter:
    """The :class:`DeviceAugmenter` of a composed config: the mean / std (or per-image floor) of
    its ``DATA.TRAIN`` ``multicrop_plugin`` as the workers' transform resolves them."""
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin

    entry = [t for t in config.DATA.TRAIN.TRANSFORMS if t.get("name") == TRANSFORM_NAME][-1]
    return augmenter_for_transform(MultiCropPlugin(**check_config_keys(entry)))


def augmenter_for_transform(t) -> DeviceAugmenter:
    """The :class:`DeviceAugmenter` of a ``MultiCropPlugin`` ``t`` (its mean / std or floor, its mode)."""
    return DeviceAugmenter(t.mean, t.std, t.min_std, photometric=t.device_augment in (PHOTOMETRIC, DECODE_ON_DEVICE))


def decoder_for_transform(t, dataset_name: str = "") -> DeviceDecoder:
    """The :class:`DeviceDecoder` of a ``MultiCropPlugin`` ``t``: its crop sizes and interpolation."""
    return DeviceDecoder(t._size, t.interpolation, dataset_name)


def decoder_for(config) -> DeviceDecoder:
    """The :class:`DeviceDecoder` of a composed config's ``DATA.TRAIN`` ``multicrop_plugin``."""
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin

    entry = [t for t in config.DATA.TRAIN.TRANSFORMS if t.get("name") == TRANSFORM_NAME][-1]
    names = list(config.DATA.TRAIN.get("DATASET_NAMES") or [])
    return decoder_for_transform(MultiCropPlugin(**check_config_keys(entry)), names[0] if names else "")


def _to(x, device):
    if torch.is_tensor(x):
        return x.to(device, non_blocking=True)
    if isinstance(x, list):
        return [_to(v, device) for v in x]
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def augment_batch(batch: Dict[str, Any], augmenter: DeviceAugmenter, device,
                  decoder: Optional[DeviceDecoder] = None) -> Dict[str, Any]:
    """``batch`` on ``device`` with its uint8 crops (``batch["data"][0]``, one tensor per crop
    position) replaced by normalised float32 crops; ``crop_params`` removed.  A ``decode`` batch
    (its images under ``encoded_images``) is first decoded, cropped and resized by ``decoder``.
    A batch without uint8 crops is returned as it is (moved)."""
    params = batch.pop(PARAMS_KEY, None)
    images = batch.pop(ENCODED_KEY, None)
    batch = _to(batch, device)
    if images is not None:
        if decoder is None:
            raise ValueError(f"config.{KEY}={DECODE_ON_DEVICE}: the batch holds undecoded images, but no decoder")
        n = len(images[0])
        idx = batch["data_idx"][0][:n].tolist()  # crop-major: the first position's samples
        crops, photometric, substituted = decoder(images[0], params[0], device, idx)
        for i in substituted:  # VISSL's substitute: data_valid -1 on every crop of the image
            batch["data_valid"][0][i::n] = -1
        batch["data"] = [augmenter(crops, photometric)] + list(batch["data"][1:])
        return batch
    crops = batch["data"][0]
    if isinstance(crops, list) and crops and all(torch.is_tensor(c) and c.dtype == torch.uint8 for c in crops):
        p = params[0] if params is not None else None  # read on the host by the augmenter
        batch["data"] = [augmenter(crops, p)] + list(batch["data"][1:])
    return batch


class _OneBatch:
    """The iterator ``standard_train_step`` reads: the next batch of ``source``, augmented."""

    def __init__(self, source, fn):
        self.source, self.fn = source, fn

    def __iter__(self):
        return self

    def __next__(self):
        return self.fn(next(self.source))

    def __len__(self):  # Classy Vision's num_batches_per_phase
        return len(self.source)

    def __getattr__(self, name):
        return getattr(self.source, name)


def _task_device_side(task):
    """``(augmenter, decoder)`` of the task's config, made once (the decoder is None but with
    ``decode``)."""
    side = getattr(task, "_plugin_device_side", None)
    if side is None:
        mode = _mode(task.config)
        side = task._plugin_device_side = (augmenter_for(task.config),
                                           decoder_for(task.config) if mode == DECODE_ON_DEVICE else None)
        logging.info(f"{TRAIN_STEP_NAME}: config.{KEY}={mode} on "
                     f"{getattr(task, 'device', 'cpu')}, collator {task.config.DATA.TRAIN.COLLATE_FUNCTION}")
    return side


def train_batches(task):
    """The training loader's batches as the model sees them, for code that reads the loader
    outside the train step (precise BN's statistics pass, a memory bank's first pass): with
    ``DATA.TRAIN.DEVICE_AUGMENT`` on, each batch converted on ``task.device`` as the train step
    converts it (the loader sends uint8 crops); otherwise the loader itself."""
    loader = task.dataloaders["train"]
    config = getattr(task, "config", None)  # a task built by VISSL has one; a stand-in may not
    if config is None or _mode(config) == OFF:
        return loader
    (augmenter, decoder), device = _task_device_side(task), getattr(task, "device", torch.device("cpu"))
    return (augment_batch(b, augmenter, device, decoder) for b in loader)


def device_augment_train_step(task):
    """VISSL's ``standard_train_step`` on batches augmented on ``task.device`` (module docstring)."""
    from vissl.trainer.train_steps import get_train_step

    augmenter, decoder = _task_device_side(task)
    device = getattr(task, "device", torch.device("cpu"))
    source = task.data_iterator
    task.data_iterator = _OneBatch(source, lambda b: augment_batch(b, augmenter, device, decoder) if task.train else b)
    try:
        return get_train_step(STANDARD_STEP)(task)
    finally:
        task.data_iterator = source


def _register_with_vissl():
    from vissl.data.collators import COLLATOR_REGISTRY, register_collator
    from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, register_train_step

    if COLLATOR_NAME not in COLLATOR_REGISTRY:
        register_collator(COLLATOR_NAME)(multicrop_device_collator)
    if DECODE_COLLATOR not in COLLATOR_REGISTRY:
        register_collator(DECODE_COLLATOR)(multicrop_decode_collator)
    if TRAIN_STEP_NAME not in TRAIN_STEP_REGISTRY:
        register_train_step(TRAIN_STEP_NAME)(device_augment_train_step)


_register_with_vissl()
