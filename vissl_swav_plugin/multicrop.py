"""Multi-crop augmentation (SwAV paper Sec. 3.2, appendix A.2) as one registered transform.

``multicrop_plugin`` turns one PIL image into ``sum(num_crops)`` views.  Each crop group
has a count, an output size, a ``RandomResizedCrop`` scale range and aspect-ratio range;
every crop then gets, independently, a horizontal flip, the SimCLR colour distortion
(colour jitter ``0.8s, 0.8s, 0.8s, 0.2s`` in random order with probability 0.8, random
grayscale with probability 0.2) and a Gaussian blur (probability ``blur_p``, sigma uniform
in ``blur_sigma``, kernel ~10% of the crop size), and is finally turned into a normalised
float tensor.  The output is a list of ``3 x size x size`` tensors (large crops first, in
the configured group order), which is what VISSL's ``multicrop_collator`` consumes: the
transform is registered as a "transform with copies" with VISSL's ``SSLTransformsWrapper``
so the crops are flattened into the sample (labels / indices replicated per crop), exactly
as for VISSL's own ``ImgPilToMultiCrop``.

Example (``DATA.TRAIN.TRANSFORMS``; the paper's 2x224 + 6x96 recipe)::

    - name: multicrop_plugin
      total_num_crops: 8              # lets VISSL's loss inference see the crop count
      num_crops: [2, 6]
      size_crops: [224, 96]
      crop_scales: [[0.14, 1.0], [0.05, 0.14]]
      flip_p: 0.5
      color_strength: 1.0
      blur_p: 0.5
      blur_sigma: [0.1, 2.0]
      mean: [0.485, 0.456, 0.406]
      std: [0.229, 0.224, 0.225]

Why it is faster than VISSL's chain (``ImgPilToMultiCrop`` + ``RandomHorizontalFlip`` +
``ImgPilColorDistortion`` + ``ImgPilGaussianBlur`` + ``ToTensor`` + ``Normalize``) while
computing the same operations (see ``benchmarks/bench_multicrop.py``):

* all random numbers of an image come from one numpy call; crop boxes are sampled for all
  crops at once (torchvision's ``RandomResizedCrop`` rule, vectorised) and the per-crop
  work runs without per-op Python dispatch (VISSL wraps each op of each crop);
* crop + resize is one PIL ``resize(box=...)`` call;
* brightness, contrast and saturation are affine maps of the RGB values; consecutive ops
  are composed into one 3x4 matrix and applied in a single C pass (PIL ``point`` with a
  lookup table when the map treats all channels alike, ``convert(matrix=...)``
  otherwise).  An op can only leave [0, 255] (and need clipping) when its factor is > 1,
  so the map is applied ("materialised", with clipping) exactly there, which keeps the
  result equal to applying the ops one by one with clipping (and rounding instead of
  truncating, so it is closer to the exact result than torchvision's PIL ops).  The
  contrast mean comes from the composed map and a box-reduced copy instead of a
  grayscale copy + histogram.  Random grayscale folds into the same pass
  (``convert("L", matrix)``) and the crop stays single-channel until the tensor step;
* hue is one HSV round trip with a lookup table on the H band (no numpy split/merge);
* flip, uint8 -> float conversion and normalisation are one strided copy per crop plus
  one in-place affine op per crop size.

The Gaussian blur follows SimCLR: sigma ~ U(blur_sigma), kernel of ``blur_kernel_frac``
(10%) of the crop size, i.e. radius ``r = int(frac * size) // 2``.  When ``r == 0`` (crops
< 20 px) there is no blur, as in SimCLR; for sigma <= 0.25 the exact Gaussian changes no
pixel by more than 0.17 levels, so it is skipped.  When the kernel is small (``r <= 2``)
and would cut the Gaussian (``3 sigma > r``) the exact truncated, renormalised kernel is
applied; otherwise PIL's Gaussian blur (the op VISSL and the SwAV code use) is used,
which equals the truncated kernel up to the (< 1%) tails whenever ``3 sigma <= r``
(for ``r >= 3`` and ``3 sigma > r`` the tails beyond ``r`` are not cut).
"""
import logging
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from classy_vision.dataset.transforms import register_transform
from classy_vision.dataset.transforms.classy_transform import ClassyTransform
from PIL import Image, ImageFilter

TRANSFORM_NAME = "multicrop_plugin"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)

# ITU-R 601-2 luma, the weights PIL (and torchvision) use for grayscale / saturation.
_RESAMPLE = {
    "bilinear": Image.BILINEAR,
    "bicubic": Image.BICUBIC,
    "nearest": Image.NEAREST,
    "lanczos": Image.LANCZOS,
}

# random numbers per crop: 10 tries x (area, log-ratio), 2 for the position, then
# flip, jitter-apply, 4 jitter factors, 4 for the op order, grayscale, blur-apply, sigma
_TRIES = 10
_U_AREA, _U_RATIO, _U_POS = 0, _TRIES, 2 * _TRIES
_U_FLIP = 2 * _TRIES + 2
_U_JIT = _U_FLIP + 1
_U_FAC = _U_JIT + 1
_U_ORDER = _U_FAC + 4
_U_GRAY = _U_ORDER + 4
_U_BLUR = _U_GRAY + 1
_U_SIGMA = _U_BLUR + 1
_U_COUNT = _U_SIGMA + 1

_KNOWN_KEYS = {
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
}


class MultiCropConfigError(ValueError):
    """A ``multicrop_plugin`` parameter is wrong; the message names the key."""


def _err(key, msg):
    return MultiCropConfigError(f"{TRANSFORM_NAME}: '{key}' {msg}")


def _is_num(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _is_seq(v):
    return isinstance(v, (list, tuple)) or (hasattr(v, "__len__") and hasattr(v, "__getitem__") and not isinstance(v, (str, bytes, dict)))


def _int_list(value, key, minimum):
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
    if not _is_num(v) or not 0.0 <= float(v) <= 1.0:
        raise _err(key, f"must be a probability in [0, 1], got {v!r}")
    return float(v)


def _strength(v, key):
    # torchvision's hue factor 0.2 * s must stay <= 0.5
    if not _is_num(v) or not 0.0 <= float(v) <= 2.5:
        raise _err(key, f"must be a colour-distortion strength in [0, 2.5], got {v!r}")
    return float(v)


def _ratio(v, key):
    a, b = _range(v, key, 0.0, math.inf, lo_open=True)
    return a, b


def _sigma(v, key):
    return _range(v, key, 0.0, math.inf, lo_open=True)


def _scale(v, key):
    return _range(v, key, 0.0, 1.0, lo_open=True)


def _blur_kernel(sigma: float, radius: int) -> ImageFilter.Kernel:
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-(x * x) / (2.0 * sigma * sigma))
    g /= g.sum()
    k = np.outer(g, g).ravel()
    size = 2 * radius + 1
    return ImageFilter.Kernel((size, size), k.tolist(), scale=float(k.sum()))


class _HueLuts:
    """Lookup tables for an HSV image that shift the H band by ``shift`` (mod 256)."""

    def __init__(self):
        self._cache = {}
        self._ident = list(range(256))

    def get(self, shift: int):
        lut = self._cache.get(shift)
        if lut is None:
            lut = [(i + shift) & 255 for i in range(256)] + self._ident + self._ident
            self._cache[shift] = lut
        return lut


_HUE_LUTS = _HueLuts()


def _point(im: Image.Image, lut: List[int]) -> Image.Image:
    """``im.point(lut)`` for an integer table, without Pillow's per-call Python rounding
    of all 768 entries (the table is already integral); falls back to the public call."""
    try:
        return im._new(im.im.point(lut, None))
    except (AttributeError, TypeError):  # pragma: no cover - other Pillow internals
        return im.point(lut)


_WR, _WG, _WB = 0.299, 0.587, 0.114
_IDENT = (1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)


_ARANGE = np.arange(256.0)


def _materialize(im: Image.Image, A) -> Image.Image:
    """Apply the affine map ``A`` (3x4, flat) with rounding and clipping, in one C pass.
    A map that treats all channels alike (brightness / contrast only) is a 256-entry
    lookup table (``point``, ~2.5x cheaper than a matrix ``convert``)."""
    if A[1] == A[2] == A[4] == A[6] == A[8] == A[9] == 0.0 and A[0] == A[5] == A[10] and A[3] == A[7] == A[11]:
        lut = np.clip(np.floor(A[0] * _ARANGE + (A[3] + 0.5)), 0, 255).astype(np.int64).tolist()
        return _point(im, lut * 3)
    return im.convert("RGB", A)


def _channel_means(im: Image.Image):
    """Per-channel means of an RGB image: one C pass (box-reduce to >= 8x8 pixels, whose
    rounding errors average out), then a tiny numpy mean."""
    f = max(1, min(im.width, im.height) // 8)
    small = im.reduce(f) if f > 1 else im
    return np.frombuffer(small.tobytes(), np.uint8).reshape(-1, 3).mean(axis=0).tolist()


def color_jitter(
    im: Image.Image, factors: Sequence[float], order: Sequence[int], to_gray: bool
) -> Image.Image:
    """SimCLR colour jitter on an RGB image: brightness / contrast / saturation / hue
    (``factors`` = b, c, s, h in torchvision's convention) applied in ``order``
    (0=brightness, 1=contrast, 2=saturation, 3=hue), each with clipping to [0, 255];
    then optionally grayscale (returned as an ``L`` image).

    The pending affine map ``rgb -> A rgb + t`` is kept as a flat row-major 3x4 tuple
    ``(a00, a01, a02, t0, a10, ...)`` (PIL's ``convert`` matrix layout)."""
    b, c, s, h = factors
    A = _IDENT
    mu = None  # channel means of `im` (lazily)
    for op in order:
        if op == 3:  # hue: HSV round trip with the H band shifted
            shift = int(h * 255) & 255  # torchvision: np.int32(h * 255).astype(uint8)
            if shift:
                if A is not _IDENT:
                    im = _materialize(im, A)
                    A = _IDENT
                im = _point(im.convert("HSV"), _HUE_LUTS.get(shift)).convert("RGB")
                mu = None
            continue
        if op == 0:  # brightness: x -> b x
            f = b
            A = tuple(f * v for v in A)
        elif op == 1:  # contrast: x -> c x + (1 - c) mean(gray(x))
            f = c
            if mu is None:
                mu = _channel_means(im)
            m0, m1, m2 = mu
            # gray mean of the pending image = luma . (A mu + t), rounded as PIL does
            g = [_WR * A[j] + _WG * A[4 + j] + _WB * A[8 + j] for j in range(4)]
            mean = math.floor(g[0] * m0 + g[1] * m1 + g[2] * m2 + g[3] + 0.5)
            off = (1.0 - f) * mean
            A = (f * A[0], f * A[1], f * A[2], f * A[3] + off,
                 f * A[4], f * A[5], f * A[6], f * A[7] + off,
                 f * A[8], f * A[9], f * A[10], f * A[11] + off)
        else:  # saturation: x -> s x + (1 - s) gray(x)
            f = s
            q = 1.0 - f
            g = [q * (_WR * A[j] + _WG * A[4 + j] + _WB * A[8 + j]) for j in range(4)]
            A = tuple(f * A[i] + g[i & 3] for i in range(12))
        if f > 1.0:  # only a factor > 1 can leave [0, 255]: clip here, as the op does
            im = _materialize(im, A)
            A, mu = _IDENT, None
    if to_gray:
        g = tuple(_WR * A[j] + _WG * A[4 + j] + _WB * A[8 + j] for j in range(4))
        return im.convert("L", g)
    if A is not _IDENT:
        im = _materialize(im, A)
    return im


@register_transform(TRANSFORM_NAME)
class MultiCropPlugin(ClassyTransform):
    """PIL image -> list of augmented crops (normalised tensors by default).

    Args:
        num_crops: crops per group, e.g. ``[2, 6]``.
        size_crops: output side per group, e.g. ``[224, 96]``.
        crop_scales: ``RandomResizedCrop`` area-fraction range per group,
            e.g. ``[[0.14, 1], [0.05, 0.14]]``; each in (0, 1].
        crop_ratios: aspect-ratio range, one pair for all groups or one per group
            (default torchvision's ``[3/4, 4/3]``).
        total_num_crops: optional, must equal ``sum(num_crops)``.  Give it when using
            VISSL's built-in losses: VISSL infers their ``num_crops`` from this key.
        flip_p, color_strength, color_jitter_p, grayscale_p, blur_p: scalar, or one
            value per group.  ``color_strength`` is SimCLR's s (jitter 0.8s, 0.8s, 0.8s,
            0.2s); 0 disables the jitter.
        blur_sigma: Gaussian sigma range in pixels of the crop (default ``[0.1, 2.0]``),
            one pair or one per group.
        blur_kernel_frac: kernel size as a fraction of the crop size (default 0.1).
        mean, std: normalisation (per channel, in [0, 1] units).
        to_tensor: True (default) returns normalised float tensors; False returns PIL
            crops (flipped and colour-augmented) for further PIL transforms.
        interpolation: resize filter, ``bilinear`` (default) | ``bicubic`` | ...
    """

    def __init__(
        self,
        num_crops: Sequence[int],
        size_crops: Sequence[int],
        crop_scales: Sequence[Sequence[float]],
        crop_ratios: Optional[Sequence] = None,
        total_num_crops: Optional[int] = None,
        flip_p: Any = 0.5,
        color_strength: Any = 1.0,
        color_jitter_p: Any = 0.8,
        grayscale_p: Any = 0.2,
        blur_p: Any = 0.5,
        blur_sigma: Any = (0.1, 2.0),
        blur_kernel_frac: float = 0.1,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        to_tensor: bool = True,
        interpolation: str = "bilinear",
    ):
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
        if crop_ratios is None:
            ratios = [DEFAULT_RATIO] * n
        elif _is_seq(crop_ratios) and len(crop_ratios) == 2 and all(_is_num(v) for v in crop_ratios):
            ratios = [_ratio(crop_ratios, "crop_ratios")] * n
        else:
            if not _is_seq(crop_ratios) or len(crop_ratios) != n:
                raise _err(
                    "crop_ratios",
                    f"must be one [min, max] pair or one pair per crop group ({n}), got {crop_ratios!r}",
                )
            ratios = [_ratio(v, f"crop_ratios[{i}]") for i, v in enumerate(crop_ratios)]
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
        sigma = _per_group(blur_sigma, "blur_sigma", n, _sigma)
        if not _is_num(blur_kernel_frac) or not 0.0 <= float(blur_kernel_frac) <= 1.0:
            raise _err("blur_kernel_frac", f"must be a number in [0, 1], got {blur_kernel_frac!r}")
        mean = self._triple(mean, "mean")
        std = self._triple(std, "std")
        if any(v <= 0 for v in std):
            raise _err("std", f"must be > 0, got {list(std)}")
        if not isinstance(to_tensor, (bool, np.bool_)):
            raise _err("to_tensor", f"must be true or false, got {to_tensor!r}")
        if interpolation not in _RESAMPLE:
            raise _err("interpolation", f"must be one of {sorted(_RESAMPLE)}, got {interpolation!r}")

        self.num_crops = counts
        self.size_crops = sizes
        self.crop_scales = scales
        self.crop_ratios = ratios
        self.total_num_crops = sum(counts)
        self.to_tensor = bool(to_tensor)
        self.resample = _RESAMPLE[interpolation]
        self.mean, self.std = mean, std

        # per-crop parameter arrays (crop k belongs to group g[k])
        g = np.repeat(np.arange(n), counts)
        self._group = g
        self._size = [sizes[i] for i in g]
        self._scale_lo = np.array([scales[i][0] for i in g])[:, None]
        self._scale_span = np.array([scales[i][1] - scales[i][0] for i in g])[:, None]
        lr = np.log(np.array([ratios[i] for i in g]))
        self._logr_lo = lr[:, :1]
        self._logr_span = lr[:, 1:] - lr[:, :1]
        self._ratio_lo = np.array([ratios[i][0] for i in g])
        self._ratio_hi = np.array([ratios[i][1] for i in g])
        self._flip_p = np.array([flip[i] for i in g])
        self._jit_p = np.array([jit_p[i] if strength[i] > 0 else 0.0 for i in g])
        self._gray_p = np.array([gray_p[i] for i in g])
        self._blur_p = np.array([blur[i] for i in g])
        self._sig_lo = np.array([sigma[i][0] for i in g])
        self._sig_span = np.array([sigma[i][1] - sigma[i][0] for i in g])
        # jitter factor ranges (torchvision ColorJitter(0.8s, 0.8s, 0.8s, 0.2s))
        st = np.array([strength[i] for i in g])
        lo = np.maximum(0.0, 1.0 - 0.8 * st)
        self._fac_lo = np.stack([lo, lo, lo, -0.2 * st], axis=1)
        self._fac_span = np.stack([1.0 + 0.8 * st - lo] * 3 + [0.4 * st], axis=1)
        self._radius = [int(blur_kernel_frac * s) // 2 for s in self._size]
        # groups of equal output size, in order of first appearance
        self._size_groups: Dict[int, List[int]] = {}
        for k, s in enumerate(self._size):
            self._size_groups.setdefault(s, []).append(k)
        m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        sd = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self._offset = m * 255.0  # x_uint8 -> (x / 255 - mean) / std
        self._inv = 1.0 / (sd * 255.0)

    @staticmethod
    def _triple(v, key):
        if not _is_seq(v) or len(v) != 3 or not all(_is_num(x) for x in v):
            raise _err(key, f"must be 3 numbers (one per RGB channel), got {v!r}")
        return tuple(float(x) for x in v)

    # -- sampling -------------------------------------------------------------------
    def _crop_boxes(self, width: int, height: int, u: np.ndarray) -> np.ndarray:
        """torchvision RandomResizedCrop.get_params for every crop at once.

        Returns (n, 4) int boxes (left, top, right, bottom)."""
        area = float(width * height)
        target = area * (self._scale_lo + self._scale_span * u[:, _U_AREA:_U_AREA + _TRIES])
        aspect = np.exp(self._logr_lo + self._logr_span * u[:, _U_RATIO:_U_RATIO + _TRIES])
        w = np.rint(np.sqrt(target * aspect))
        h = np.rint(np.sqrt(target / aspect))
        ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = np.argmax(ok, axis=1)
        rows = np.arange(len(first))
        cw = w[rows, first]
        ch = h[rows, first]
        found = ok[rows, first]
        if not found.all():  # torchvision's fallback: central crop, ratio clamped
            in_ratio = width / height
            for k in np.nonzero(~found)[0]:
                if in_ratio < self._ratio_lo[k]:
                    fw, fh = width, int(round(width / self._ratio_lo[k]))
                elif in_ratio > self._ratio_hi[k]:
                    fw, fh = int(round(height * self._ratio_hi[k])), height
                else:
                    fw, fh = width, height
                cw[k], ch[k] = fw, fh
        top = np.floor(u[:, _U_POS] * (height - ch + 1))
        left = np.floor(u[:, _U_POS + 1] * (width - cw + 1))
        top[~found] = (height - ch[~found]) // 2
        left[~found] = (width - cw[~found]) // 2
        return np.stack([left, top, left + cw, top + ch], axis=1).astype(np.int64)

    def sample_params(self, width: int, height: int, u: Optional[np.ndarray] = None):
        """All random choices for one image (exposed for tests / inspection)."""
        if u is None:
            u = np.random.random_sample((self.total_num_crops, _U_COUNT))
        boxes = self._crop_boxes(width, height, u)
        factors = self._fac_lo + self._fac_span * u[:, _U_FAC:_U_FAC + 4]
        return {
            "boxes": boxes,
            "flip": u[:, _U_FLIP] < self._flip_p,
            "jitter": u[:, _U_JIT] < self._jit_p,
            "factors": factors,
            "order": np.argsort(u[:, _U_ORDER:_U_ORDER + 4], axis=1),
            "gray": u[:, _U_GRAY] < self._gray_p,
            "blur": u[:, _U_BLUR] < self._blur_p,
            "sigma": self._sig_lo + self._sig_span * u[:, _U_SIGMA],
        }

    # -- per-crop work --------------------------------------------------------------
    def _blur(self, im: Image.Image, sigma: float, radius: int) -> Image.Image:
        if radius <= 0 or sigma <= 0.25:
            # sigma <= 0.25: the neighbour weight is < 3.4e-4, so the exact Gaussian
            # changes no pixel by more than 0.17 levels -- identity after rounding
            return im
        if radius <= 2 and 3.0 * sigma > radius:
            return im.filter(_blur_kernel(sigma, radius))
        return im.filter(ImageFilter.GaussianBlur(sigma))

    def _crop(self, img: Image.Image, k: int, box, jitter, factors, order, gray, blur, sigma):
        s = self._size[k]
        im = img.resize((s, s), self.resample, box=box)
        if jitter:
            im = color_jitter(im, factors, order, gray)
        elif gray:
            im = im.convert("L")
        if blur:
            im = self._blur(im, sigma, self._radius[k])
        return im

    def __call__(self, image: Image.Image):
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"{TRANSFORM_NAME} expects a PIL image (put it first in DATA.*.TRANSFORMS), "
                f"got {type(image).__name__}"
            )
        if image.mode != "RGB":
            image = image.convert("RGB")
        p = self.sample_params(image.width, image.height)
        flips = p["flip"].tolist()
        crops = [
            self._crop(image, k, *args)
            for k, args in enumerate(
                zip(
                    map(tuple, p["boxes"].tolist()),
                    p["jitter"].tolist(),
                    p["factors"].tolist(),
                    p["order"].tolist(),
                    p["gray"].tolist(),
                    p["blur"].tolist(),
                    p["sigma"].tolist(),
                )
            )
        ]
        if not self.to_tensor:
            out = []
            for im, fl in zip(crops, flips):
                if fl:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
                out.append(im.convert("RGB") if im.mode != "RGB" else im)
            return out
        out: List[Optional[torch.Tensor]] = [None] * self.total_num_crops
        for s, idx in self._size_groups.items():
            batch = torch.empty((len(idx), 3, s, s), dtype=torch.float32)
            dst = batch.numpy()
            for j, k in enumerate(idx):
                im = crops[k]
                if im.mode == "L":
                    a = np.frombuffer(im.tobytes(), np.uint8).reshape(1, s, s)
                else:
                    a = np.frombuffer(im.tobytes(), np.uint8).reshape(s, s, 3).transpose(2, 0, 1)
                if flips[k]:
                    a = a[:, :, ::-1]
                np.copyto(dst[j], a, casting="unsafe")
            batch.sub_(self._offset).mul_(self._inv)
            out_views = batch.unbind(0)
            for j, k in enumerate(idx):
                out[k] = out_views[j]
        return out

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "MultiCropPlugin":
        config = dict(config)
        config.pop("name", None)
        config.pop("indices", None)  # handled by VISSL's SSLTransformsWrapper
        unknown = sorted(set(config) - _KNOWN_KEYS)
        if unknown:
            raise MultiCropConfigError(
                f"{TRANSFORM_NAME}: unknown key(s) {unknown}; known keys: {sorted(_KNOWN_KEYS)}"
            )
        for key in ("num_crops", "size_crops", "crop_scales"):
            if key not in config:
                raise _err(key, "is required")
        return cls(**config)


def _register_with_vissl():
    """Tell VISSL's SSLTransformsWrapper that this transform returns several copies
    (so the crops are flattened into the sample like ImgPilToMultiCrop's), and tell
    the plugin's config inference how many crops it makes."""
    from vissl.data.ssl_transforms import ssl_transforms_wrapper as w

    copies = w.DEFAULT_TRANSFORM_TYPES["TRANSFORMS_WITH_COPIES"]
    if TRANSFORM_NAME not in copies:
        copies.append(TRANSFORM_NAME)
    try:
        from vissl_swav_plugin.config_validation import register_crop_counter
    except ImportError:  # pragma: no cover - config_validation is part of the package
        logging.getLogger(__name__).debug("config_validation not available")
        return
    register_crop_counter(TRANSFORM_NAME)(lambda t: sum(int(v) for v in t["num_crops"]))


_register_with_vissl()
