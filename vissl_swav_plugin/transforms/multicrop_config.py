"""Config parsing and validation for ``multicrop_plugin`` (SwAV paper Sec. 3.2, App. A.2).

:func:`validate_params` checks the transform's arguments (the keys of its entry in
``DATA.*.TRANSFORMS``) and returns them normalised to one value per crop group;
:func:`check_config_keys` rejects unknown or missing keys of a config dict.  Every error is
a :class:`MultiCropConfigError` whose message names the offending key, e.g.
``multicrop_plugin: 'crop_scales[0]' must lie in (0.0, 1.0], got [0.14, 1.2]``.

A parameter marked "per group" below may be one scalar (the same for every crop group)
or one value per group of ``num_crops``.
"""
import math
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys
from vissl_swav_plugin.transforms.standardize import DATASET, DEFAULT_MIN_STD, NORMALIZE_MODES, check_min_std

TRANSFORM_NAME = "multicrop_plugin"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# ``color_warmup_schedule``: ``step`` holds the warm-up strength, then switches to
# ``color_strength``; ``linear`` ramps from the one to the other over the warm-up
WARMUP_STEP, WARMUP_LINEAR = "step", "linear"
WARMUP_SCHEDULES = (WARMUP_STEP, WARMUP_LINEAR)
#: the ``device_augment`` values (``config.DATA.TRAIN.DEVICE_AUGMENT``, :mod:`.device_augment`)
DEVICE_AUGMENT_MODES = ("off", "normalize", "photometric", "decode")
#: the collator of ``photometric`` (``multicrop_collator`` keeping each crop's parameters)
DEVICE_COLLATOR = "multicrop_device_collator"
#: the collator of ``decode`` (each crop's parameters, each image once, undecoded)
DECODE_COLLATOR = "multicrop_decode_collator"
#: the collators the config inference sets in place of ``multicrop_collator``
DEVICE_COLLATORS = (DEVICE_COLLATOR, DECODE_COLLATOR)
# torchvision's RandomResizedCrop aspect-ratio range
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)

# the ``interpolation`` key -> PIL resampling filter
RESAMPLE = {
    "bilinear": Image.BILINEAR,
    "bicubic": Image.BICUBIC,
    "nearest": Image.NEAREST,
    "lanczos": Image.LANCZOS,
}

KNOWN_KEYS = {
    "num_crops",
    "size_crops",
    "crop_scales",
    "crop_ratios",
    "total_num_crops",
    "flip_p",
    "color_strength",
    "color_jitter_p",
    "grayscale_p",
    "blur_p",
    "blur_sigma",
    "blur_kernel_frac",
    "mean",
    "std",
    "to_tensor",
    "interpolation",
    "normalize",
    "min_std",
    "color_warmup_iters",
    "color_warmup_strength",
    "color_warmup_schedule",
    "device_augment",
    "jpeg_draft",
}
REQUIRED_KEYS = ("num_crops", "size_crops", "crop_scales")

Pair = Tuple[float, float]


class MultiCropConfigError(ConfigError):
    """A ``multicrop_plugin`` parameter is wrong; the message names the key (a
    :class:`~vissl_swav_plugin.config.checkers.ConfigError`, hence a ``ValueError``)."""


class MultiCropParams(NamedTuple):
    """Validated ``multicrop_plugin`` parameters; lists hold one entry per crop group."""

    counts: List[int]  #: crops per group (``num_crops``)
    sizes: List[int]  #: output side per group (``size_crops``)
    scales: List[Pair]  #: ``RandomResizedCrop`` area-fraction range per group
    ratios: List[Pair]  #: aspect-ratio range per group
    flip_p: List[float]  #: horizontal-flip probability per group
    strength: List[float]  #: colour-distortion strength s per group
    jitter_p: List[float]  #: colour-jitter probability per group
    gray_p: List[float]  #: random-grayscale probability per group
    blur_p: List[float]  #: Gaussian-blur probability per group
    sigma: List[Pair]  #: blur sigma range per group
    blur_kernel_frac: float  #: blur kernel size as a fraction of the crop size
    mean: Optional[Tuple[float, float, float]]  #: dataset mean (per RGB channel, [0, 1] units); None: per_image
    std: Optional[Tuple[float, float, float]]  #: dataset std (per RGB channel, > 0); None: per_image
    to_tensor: bool  #: return normalised tensors (else PIL crops)
    resample: int  #: PIL resampling filter for the crop resize
    normalize: str  #: ``dataset`` ((x - mean) / std) or ``per_image`` (each crop by its own statistics)
    min_std: Optional[float]  #: per_image: the std divisor's floor ([0, 1] units); None for dataset
    warmup_iters: int  #: training iterations at the start with ``warmup_strength`` (0: none; whole epochs)
    warmup_strength: Optional[List[float]]  #: colour-distortion strength per group during the warm-up
    warmup_schedule: str  #: ``step`` (the warm-up strength, then ``strength``) or ``linear`` (a ramp between them)
    device_augment: str = "off"  #: what the device does (``config.DATA.TRAIN.DEVICE_AUGMENT``, set by the config inference)
    jpeg_draft: bool = False  #: decode a JPEG at 1/2, 1/4 or 1/8 of its size where every crop allows it


def _err(key, msg):
    """A :class:`MultiCropConfigError` whose message names ``key``."""
    return MultiCropConfigError(f"{TRANSFORM_NAME}: '{key}' {msg}")


def _is_num(v):
    """A real number (Python or numpy), not a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _is_seq(v):
    """A list-like value (list, tuple or any sized indexable such as OmegaConf's ListConfig),
    not a string, bytes or dict."""
    return isinstance(v, (list, tuple)) or (hasattr(v, "__len__") and hasattr(v, "__getitem__") and not isinstance(v, (str, bytes, dict)))


def _int_list(value, key, minimum):
    """A non-empty list of integers >= ``minimum``, as Python ints."""
    if not _is_seq(value) or len(value) == 0:
        raise _err(key, f"must be a non-empty list of integers, got {value!r}")
    out = []
    for v in value:
        if not _is_num(v) or int(v) != v or v < minimum:
            raise _err(key, f"must contain integers >= {minimum}, got {list(value)!r}")
        out.append(int(v))
    return out


def _range(value, key, lo, hi, lo_open=False):
    """A [a, b] pair with lo <= a <= b <= hi (a > lo when lo_open)."""
    if not _is_seq(value) or len(value) != 2 or not all(_is_num(v) for v in value):
        raise _err(key, f"must be a pair [min, max] of numbers, got {value!r}")
    a, b = float(value[0]), float(value[1])
    if a > b:
        raise _err(key, f"must have min <= max, got {[a, b]}")
    if (a <= lo if lo_open else a < lo) or b > hi:
        left = "(" if lo_open else "["
        raise _err(key, f"must lie in {left}{lo}, {hi}], got {[a, b]}")
    return a, b


def _per_group(value, key, n, check):
    """Scalar (same for every group) or one entry per crop group."""
    if _is_seq(value) and not (len(value) == 2 and key == "blur_sigma" and _is_num(value[0])):
        if len(value) != n:
            raise _err(key, f"has {len(value)} entries but num_crops has {n} crop groups")
        return [check(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return [check(value, key)] * n


def _prob(v, key):
    """A probability in [0, 1], as a float."""
    if not _is_num(v) or not 0.0 <= float(v) <= 1.0:
        raise _err(key, f"must be a probability in [0, 1], got {v!r}")
    return float(v)


#: the largest colour-distortion strength s: torchvision's hue factor 0.2 * s must stay <= 0.5
MAX_COLOR_STRENGTH = 2.5


def _strength(v, key):
    """SimCLR's colour-distortion strength s in [0, MAX_COLOR_STRENGTH], as a float."""
    if not _is_num(v) or not 0.0 <= float(v) <= MAX_COLOR_STRENGTH:
        raise _err(key, f"must be a colour-distortion strength in [0, {MAX_COLOR_STRENGTH}], got {v!r}")
    return float(v)


def _open_pair(v, key):
    """A [min, max] pair with 0 < min <= max (aspect ratios, blur sigmas)."""
    return _range(v, key, 0.0, math.inf, lo_open=True)


def _scale(v, key):
    """A ``RandomResizedCrop`` area-fraction range [min, max] within (0, 1]."""
    return _range(v, key, 0.0, 1.0, lo_open=True)


def _triple(v, key):
    """Three numbers (one per RGB channel), as a tuple of floats."""
    if not _is_seq(v) or len(v) != 3 or not all(_is_num(x) for x in v):
        raise _err(key, f"must be 3 numbers (one per RGB channel), got {v!r}")
    return tuple(float(x) for x in v)


def _ratios(crop_ratios, n) -> List[Pair]:
    """``crop_ratios``: None (torchvision's default), one pair, or one pair per group."""
    if crop_ratios is None:
        return [DEFAULT_RATIO] * n
    if _is_seq(crop_ratios) and len(crop_ratios) == 2 and all(_is_num(v) for v in crop_ratios):
        return [_open_pair(crop_ratios, "crop_ratios")] * n
    if not _is_seq(crop_ratios) or len(crop_ratios) != n:
        raise _err(
            "crop_ratios",
            f"must be one [min, max] pair or one pair per crop group ({n}), got {crop_ratios!r}",
        )
    return [_open_pair(v, f"crop_ratios[{i}]") for i, v in enumerate(crop_ratios)]


def validate_params(
    num_crops: Sequence[int],
    size_crops: Sequence[int],
    crop_scales: Sequence[Sequence[float]],
    crop_ratios: Optional[Sequence],
    total_num_crops: Optional[int],
    flip_p: Any,
    color_strength: Any,
    color_jitter_p: Any,
    grayscale_p: Any,
    blur_p: Any,
    blur_sigma: Any,
    blur_kernel_frac: float,
    mean: Optional[Sequence[float]],
    std: Optional[Sequence[float]],
    to_tensor: bool,
    interpolation: str,
    normalize: str = DATASET,
    min_std: Optional[float] = None,
    color_warmup_iters: int = 0,
    color_warmup_strength: Any = None,
    color_warmup_schedule: str = WARMUP_STEP,
    device_augment: str = "off",
    jpeg_draft: bool = False,
) -> MultiCropParams:
    """Check the ``multicrop_plugin`` arguments and normalise them per crop group.

    Args:
        num_crops ... interpolation: the arguments of
            :class:`vissl_swav_plugin.transforms.multicrop.MultiCropPlugin` (see its docstring);
            ``flip_p``, ``color_strength``, ``color_jitter_p``, ``grayscale_p``,
            ``blur_p`` and ``blur_sigma`` are per group.  ``mean`` / ``std`` None means
            ImageNet's with ``normalize: dataset``; they cannot be given with ``per_image``,
            nor ``min_std`` with ``dataset``.  ``device_augment``: ``off``, ``normalize`` or
            ``photometric`` (:mod:`vissl_swav_plugin.transforms.device_augment`; the config
            inference copies ``config.DATA.TRAIN.DEVICE_AUGMENT`` here).

    Returns:
        A :class:`MultiCropParams` with one entry per crop group in its list fields.

    Raises:
        MultiCropConfigError: naming the first wrong key, e.g. ``'size_crops' has 1 entries
            but num_crops has 2: give one output size per crop group``.
    """
    counts = _int_list(num_crops, "num_crops", minimum=1)
    n = len(counts)
    sizes = _int_list(size_crops, "size_crops", minimum=1)
    if len(sizes) != n:
        raise _err(
            "size_crops",
            f"has {len(sizes)} entries but num_crops has {n}: "
            "give one output size per crop group",
        )
    if not _is_seq(crop_scales) or len(crop_scales) != n:
        got = len(crop_scales) if _is_seq(crop_scales) else crop_scales
        raise _err(
            "crop_scales",
            f"must give one [min, max] scale range per crop group ({n}), got {got!r}",
        )
    scales = [_scale(v, f"crop_scales[{i}]") for i, v in enumerate(crop_scales)]
    ratios = _ratios(crop_ratios, n)
    if total_num_crops is not None:
        if not _is_num(total_num_crops) or int(total_num_crops) != sum(counts):
            raise _err(
                "total_num_crops",
                f"is {total_num_crops!r} but sum(num_crops) = {sum(counts)} ({counts})",
            )
    flip = _per_group(flip_p, "flip_p", n, _prob)
    strength = _per_group(color_strength, "color_strength", n, _strength)
    jit_p = _per_group(color_jitter_p, "color_jitter_p", n, _prob)
    gray_p = _per_group(grayscale_p, "grayscale_p", n, _prob)
    blur = _per_group(blur_p, "blur_p", n, _prob)
    sigma = _per_group(blur_sigma, "blur_sigma", n, _open_pair)
    if not _is_num(blur_kernel_frac) or not 0.0 <= float(blur_kernel_frac) <= 1.0:
        raise _err("blur_kernel_frac", f"must be a number in [0, 1], got {blur_kernel_frac!r}")
    if not isinstance(to_tensor, (bool, np.bool_)):
        raise _err("to_tensor", f"must be true or false, got {to_tensor!r}")
    mean, std, min_std = _normalization(normalize, mean, std, min_std, bool(to_tensor))
    warm_iters, warm_strength, warm_schedule = _color_warmup(
        color_warmup_iters, color_warmup_strength, color_warmup_schedule, n)
    if interpolation not in RESAMPLE:
        raise _err("interpolation", f"must be one of {sorted(RESAMPLE)}, got {interpolation!r}")
    if device_augment not in DEVICE_AUGMENT_MODES:
        raise _err("device_augment", f"must be one of {list(DEVICE_AUGMENT_MODES)}, got {device_augment!r}")
    if device_augment != "off" and not to_tensor:
        raise _err("device_augment", f"{device_augment!r} sends uint8 tensors to the device: it needs to_tensor: true")
    if not isinstance(jpeg_draft, (bool, np.bool_)):
        raise _err("jpeg_draft", f"must be true or false, got {jpeg_draft!r}")
    if jpeg_draft and device_augment == "decode":
        raise _err("jpeg_draft", "decodes in the loader workers, but device_augment 'decode' decodes on the device: "
                                 "use one of them")
    return MultiCropParams(
        counts, sizes, scales, ratios, flip, strength, jit_p, gray_p, blur, sigma,
        blur_kernel_frac, mean, std, bool(to_tensor), RESAMPLE[interpolation], normalize, min_std,
        warm_iters, warm_strength, warm_schedule, device_augment, bool(jpeg_draft),
    )


def _normalization(normalize, mean, std, min_std, to_tensor):
    """``(mean, std, min_std)`` of the ``normalize`` mode; a key that cannot act in that mode
    is an error, not ignored."""
    if normalize not in NORMALIZE_MODES:
        raise _err("normalize", f"must be one of {list(NORMALIZE_MODES)}, got {normalize!r}")
    if normalize == DATASET:
        if min_std is not None:
            raise _err("min_std", "acts only with normalize: per_image (remove it, or set normalize: per_image)")
        mean = _triple(IMAGENET_MEAN if mean is None else mean, "mean")
        std = _triple(IMAGENET_STD if std is None else std, "std")
        if any(v <= 0 for v in std):
            raise _err("std", f"must be > 0, got {list(std)}")
        return mean, std, None
    for key, value in (("mean", mean), ("std", std)):
        if value is not None:
            raise _err(key, "cannot act with normalize: per_image (each crop is standardised by its own "
                            "mean and std): remove it")
    if not to_tensor:
        raise _err("normalize", "per_image standardises the output tensors: it needs to_tensor: true")
    min_std = DEFAULT_MIN_STD if min_std is None else min_std
    return None, None, check_min_std(min_std, "min_std", TRANSFORM_NAME, MultiCropConfigError)


def _color_warmup(iters, strength, schedule, n):
    """``(color_warmup_iters, color_warmup_strength per group or None, color_warmup_schedule)``;
    a strength or a non-default schedule without warm-up iterations, or warm-up iterations
    without a strength, cannot act: an error."""
    if not _is_num(iters) or int(iters) != iters or iters < 0:
        raise _err("color_warmup_iters", f"must be an integer >= 0 (training iterations), got {iters!r}")
    if schedule not in WARMUP_SCHEDULES:
        raise _err("color_warmup_schedule", f"must be one of {list(WARMUP_SCHEDULES)}, got {schedule!r}")
    if iters > 0 and strength is None:
        raise _err("color_warmup_strength", "is required with color_warmup_iters > 0 (the colour-distortion "
                                            "strength of those iterations, scalar or one per crop group)")
    if iters == 0 and strength is not None:
        raise _err("color_warmup_strength", "acts only with color_warmup_iters > 0: set both, or neither")
    if iters == 0 and schedule != WARMUP_STEP:
        raise _err("color_warmup_schedule", "acts only with color_warmup_iters > 0: remove it, or set the warm-up")
    if strength is None:
        return 0, None, schedule
    return int(iters), _per_group(strength, "color_warmup_strength", n, _strength), schedule


def check_config_keys(config: Mapping[str, Any], path: str = TRANSFORM_NAME) -> dict:
    """The keyword arguments of a ``multicrop_plugin`` config entry.

    Drops ``name`` and ``indices`` (the latter is handled by VISSL's
    ``SSLTransformsWrapper``), then rejects unknown keys and missing required ones.

    Args:
        config: the transform's entry of ``DATA.*.TRANSFORMS``.
        path: how errors name the entry, e.g. ``config.DATA.TRAIN.TRANSFORMS[0]``.

    Returns:
        A new dict of the remaining keys, ready for ``MultiCropPlugin(**kwargs)``.

    Raises:
        MultiCropConfigError: naming each unknown key (with the closest known one) or a
            missing required key.
    """
    config = dict(config)
    config.pop("name", None)
    config.pop("indices", None)  # handled by VISSL's SSLTransformsWrapper
    check_known_keys(config, KNOWN_KEYS, path, MultiCropConfigError)
    for key in REQUIRED_KEYS:
        if key not in config:
            raise MultiCropConfigError(f"{path}: '{key}' is required")
    return config
