"""Per-image standardisation: every image (or crop) to zero mean and unit spread.

``multicrop_plugin`` normalises a crop with the dataset's mean and std by default, as the
official SwAV code does (``normalize: dataset``).  With ``normalize: per_image`` it
instead standardises each crop by its own statistics::

    x -> (x - mean(x)) / max(std(x), min_std)

over all channels and pixels of the crop (population std, ``[0, 1]`` pixel units, so
``min_std`` 0.1 keeps a flat background crop from being amplified more than 10x).  A
brightness or contrast change of the crop -- an affine map ``a x + b`` of its pixels with
``a > 0``, nothing clipped -- then leaves the network's input unchanged; the colour
jitter's brightness and contrast act only through clipping.  On gray images those are the
only parts of the jitter that act, and they were what made the swapped prediction lose to
the trivial solution on sklearn's 8x8 digits (docs/experiments/collapse.md).  The
dataset's mean/std are then not needed either (``swav-plugin-mean-std`` is unnecessary).

The same map must be applied when the trained trunk is evaluated: ``per_image_standardize_plugin``
is that step as a Classy Vision / VISSL transform for the benchmark configs, in place of
``Normalize`` after ``ToTensor``::

    - name: ToTensor
    - name: per_image_standardize_plugin
      min_std: 0.1            # the pre-training's multicrop_plugin min_std

:func:`standardize_` is the one implementation, used by both and by the demo's evaluation.
"""
import numbers
from typing import Any, Dict

import torch
from classy_vision.dataset.transforms import register_transform
from classy_vision.dataset.transforms.classy_transform import ClassyTransform

from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys

TRANSFORM_NAME = "per_image_standardize_plugin"
#: ``multicrop_plugin``'s ``normalize`` values: the reference's dataset mean/std, or per image
DATASET, PER_IMAGE = "dataset", "per_image"
NORMALIZE_MODES = (DATASET, PER_IMAGE)
#: the floor of the std divisor in [0, 1] pixel units
DEFAULT_MIN_STD = 0.1


def check_min_std(value, key: str = "min_std", where: str = TRANSFORM_NAME, error=ConfigError) -> float:
    """``value`` as a float, if it is a finite number > 0; else ``error`` (a ConfigError class)
    naming ``key``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 < float(value) < float("inf")
    if not ok:
        raise error(f"{where}: '{key}' must be a number > 0 (the std floor in [0, 1] pixel units), got {value!r}")
    return float(value)


def standardize_(x: torch.Tensor, min_std: float, scale: float = 1.0) -> torch.Tensor:
    """Standardise each ``x[i]`` in place: ``(x[i] - mean) / max(std, min_std * scale)``.

    Args:
        x: float tensor ``[N, ...]``; each sample's statistics run over all its other
            dimensions (channels and pixels).
        min_std: the divisor's floor in ``[0, 1]`` pixel units.
        scale: the unit of ``x``'s values (255 for uint8 values held as floats).

    Returns:
        ``x`` (standardised in place).
    """
    flat = x.view(x.shape[0], -1) if x.is_contiguous() else x.reshape(x.shape[0], -1)
    mean = flat.mean(1, keepdim=True)
    std = flat.std(1, keepdim=True, unbiased=False).clamp_min_(min_std * scale)
    flat.sub_(mean).div_(std)
    if flat.data_ptr() != x.data_ptr():  # reshape copied (non-contiguous input)
        x.copy_(flat.view_as(x))
    return x


@register_transform(TRANSFORM_NAME)
class PerImageStandardize(ClassyTransform):
    """``[C, H, W]`` float image (``ToTensor``'s ``[0, 1]`` units) -> the image minus its
    mean, divided by ``max(std, min_std)``: the evaluation side of ``multicrop_plugin``'s
    ``normalize: per_image``.

    Example: ``PerImageStandardize(0.1)(torch.rand(3, 28, 28))`` has mean 0 and std 1.
    """

    def __init__(self, min_std: float = DEFAULT_MIN_STD):
        self.min_std = check_min_std(min_std)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if not isinstance(image, torch.Tensor) or not image.is_floating_point() or image.dim() != 3:
            got = f"{type(image).__name__} {tuple(image.shape)} {image.dtype}" if isinstance(
                image, torch.Tensor) else type(image).__name__
            raise TypeError(f"{TRANSFORM_NAME} expects a float [C, H, W] tensor (put it after ToTensor), got {got}")
        return standardize_(image.clone()[None], self.min_std)[0]

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "PerImageStandardize":
        """Build from a ``DATA.*.TRANSFORMS`` entry; an unknown key is a ConfigError naming it."""
        return cls(**check_keys(config))


def check_keys(config, path: str = TRANSFORM_NAME) -> dict:
    """The keyword arguments of a ``per_image_standardize_plugin`` entry (``name`` and
    ``indices`` dropped); unknown keys and a bad ``min_std`` raise ConfigError naming them."""
    config = dict(config)
    config.pop("name", None)
    config.pop("indices", None)
    check_known_keys(config, {"min_std"}, path, ConfigError)
    if "min_std" in config:
        check_min_std(config["min_std"], where=path)
    return config
