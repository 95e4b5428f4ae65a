"""Per-crop augmentation ops of ``multicrop_plugin`` (SwAV paper App. A.2, SimCLR's recipe).

The SwAV paper (Caron et al. 2020, Sec. 3.2 "Multi-crop" and App. A.2 "Data augmentation")
augments every crop independently with the SimCLR recipe: random horizontal flip, colour
distortion (colour jitter ``0.8s, 0.8s, 0.8s, 0.2s`` for brightness / contrast /
saturation / hue in random order with probability 0.8, then random grayscale with
probability 0.2) and Gaussian blur, followed by ``ToTensor`` + ``Normalize``.  This module
holds those ops, written so that one crop costs a few C passes over its pixels;
:mod:`vissl_swav_plugin.transforms.multicrop` samples the random choices and calls them.

* :func:`color_jitter` -- brightness, contrast and saturation are affine maps of the RGB
  values; consecutive ops are composed into one 3x4 matrix and applied in a single C pass
  (PIL ``point`` with a lookup table when the map treats all channels alike,
  ``convert(matrix=...)`` otherwise).  An op can only leave [0, 255] (and need clipping)
  when its factor is > 1, so the map is applied ("materialised", with clipping) exactly
  there, which keeps the result equal to applying the ops one by one with clipping (and
  rounding instead of truncating, so it is closer to the exact result than torchvision's
  PIL ops).  The contrast mean comes from the composed map and a box-reduced copy instead
  of a grayscale copy + histogram.  Random grayscale folds into the same pass
  (``convert("L", matrix)``) and the crop stays single-channel until the tensor step.
  Hue is one HSV round trip with a lookup table on the H band (no numpy split/merge).
* :func:`gaussian_blur` -- SimCLR's blur: sigma ~ U(blur_sigma), kernel of
  ``blur_kernel_frac`` (10%) of the crop size, i.e. radius ``r = int(frac * size) // 2``.
  When ``r == 0`` (crops < 20 px) there is no blur, as in SimCLR; for sigma <= 0.25 the
  exact Gaussian changes no pixel by more than 0.17 levels, so it is skipped.  When the
  kernel is small (``r <= 2``) and would cut the Gaussian (``3 sigma > r``) the exact
  truncated, renormalised kernel is applied; otherwise PIL's Gaussian blur (the op VISSL
  and the SwAV code use) is used, which equals the truncated kernel up to the (< 1%)
  tails whenever ``3 sigma <= r`` (for ``r >= 3`` and ``3 sigma > r`` the tails beyond
  ``r`` are not cut).
* :func:`to_normalized_tensors` / :func:`to_rgb_crops` -- the final flip, uint8 -> float
  conversion and normalisation: one strided copy per crop plus one in-place affine op per
  crop size.
"""
import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageFilter

from vissl_swav_plugin.transforms.standardize import standardize_

__all__ = ["color_jitter", "gaussian_blur", "truncated_gaussian_kernel", "to_normalized_tensors", "to_rgb_crops",
           "to_uint8_tensors"]

# ITU-R 601-2 luma, the weights PIL (and torchvision) use for grayscale / saturation.
_WR, _WG, _WB = 0.299, 0.587, 0.114
# the identity affine map rgb -> rgb, flat row-major 3x4 (PIL's ``convert`` matrix layout)
_IDENT = (1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)
_ARANGE = np.arange(256.0)


def truncated_gaussian_kernel(sigma: float, radius: int) -> ImageFilter.Kernel:
    """The separable Gaussian ``g(x) g(y)``, ``g(x) ~ exp(-x^2 / (2 sigma^2))``, cut at
    ``|x|, |y| <= radius`` and renormalised to sum 1 (SimCLR's blur kernel).

    Args:
        sigma: standard deviation in pixels (> 0).
        radius: half-width of the kernel; the kernel is ``(2 radius + 1)^2`` (PIL supports
            radius 1 and 2, i.e. 3x3 and 5x5 kernels).

    Returns:
        A PIL ``ImageFilter.Kernel`` for ``Image.filter``.
    """
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-(x * x) / (2.0 * sigma * sigma))
    g /= g.sum()
    k = np.outer(g, g).ravel()
    size = 2 * radius + 1
    return ImageFilter.Kernel((size, size), k.tolist(), scale=float(k.sum()))


def gaussian_blur(im: Image.Image, sigma: float, radius: int) -> Image.Image:
    """SimCLR's Gaussian blur of one crop (see the module docstring for the rules).

    Args:
        im: the crop (``RGB`` or ``L``).
        sigma: the sampled standard deviation in pixels.
        radius: ``int(blur_kernel_frac * crop_size) // 2``; 0 means no blur.

    Returns:
        The blurred crop, or ``im`` itself when the blur would change nothing.
    """
    if radius <= 0 or sigma <= 0.25:
        # sigma <= 0.25: the neighbour weight is < 3.4e-4, so the exact Gaussian
        # changes no pixel by more than 0.17 levels -- identity after rounding
        return im
    if radius <= 2 and 3.0 * sigma > radius:
        return im.filter(truncated_gaussian_kernel(sigma, radius))
    return im.filter(ImageFilter.GaussianBlur(sigma))


class _HueLuts:
    """Lookup tables for an HSV image that shift the H band by ``shift`` (mod 256)."""

    def __init__(self):
        self._cache = {}
        self._ident = list(range(256))

    def get(self, shift: int):
        """The 768-entry ``point`` table: H shifted by ``shift``, S and V unchanged."""
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
    """SimCLR colour distortion of one RGB crop (SwAV App. A.2): colour jitter, then
    optionally grayscale.

    Each op is applied to the previous result and clipped to [0, 255], as torchvision's
    ``ColorJitter`` does: brightness ``x -> b x``, contrast ``x -> c x + (1 - c) mean(gray(x))``,
    saturation ``x -> s x + (1 - s) gray(x)`` (gray = ITU-R 601-2 luma) and hue (shift of the
    HSV hue by ``h`` turns).  The pending affine map ``rgb -> A rgb + t`` is kept as a flat
    row-major 3x4 tuple ``(a00, a01, a02, t0, a10, ...)`` (PIL's ``convert`` matrix layout)
    and applied only where clipping can occur.

    Args:
        im: ``RGB`` crop.
        factors: ``(b, c, s, h)`` in torchvision's convention (``b, c, s`` >= 0 multiply,
            ``h`` in [-0.5, 0.5]).
        order: permutation of ``0=brightness, 1=contrast, 2=saturation, 3=hue`` (any subset
            may be given; each listed op is applied once, in this order).
        to_gray: convert to grayscale afterwards (returned as an ``L`` image).

    Returns:
        The distorted crop, ``RGB`` or (``to_gray``) ``L``.

    Example::

        out = color_jitter(crop, [1.2, 0.8, 1.0, 0.05], [3, 0, 2, 1], to_gray=False)
    """
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


def to_rgb_crops(crops: Sequence[Image.Image], flips: Sequence[bool]) -> List[Image.Image]:
    """The PIL output of ``multicrop_plugin`` (``to_tensor: false``): each crop flipped
    left-right where ``flips`` says so and returned as ``RGB`` (grayscale crops are
    expanded to three equal channels).

    Args:
        crops: augmented crops (``RGB`` or ``L``).
        flips: one flag per crop.

    Returns:
        The list of ``RGB`` crops, in the same order.
    """
    out = []
    for im, fl in zip(crops, flips):
        if fl:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        out.append(im.convert("RGB") if im.mode != "RGB" else im)
    return out


def _crop_batches(crops, flips, size_groups, dtype):
    """``RandomHorizontalFlip`` + the copy of every crop into one ``[n, 3, s, s]`` batch of
    ``dtype`` per side (an ``L`` crop in all three channels): ``[(batch, crop indices)]``."""
    out = []
    for s, idx in size_groups.items():
        batch = torch.empty((len(idx), 3, s, s), dtype=dtype)
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
        out.append((batch, idx))
    return out


def _in_crop_order(batches, n):
    out: List[Optional[torch.Tensor]] = [None] * n
    for batch, idx in batches:
        for k, t in zip(idx, batch.unbind(0)):
            out[k] = t
    return out


def to_uint8_tensors(
    crops: Sequence[Image.Image], flips: Sequence[bool], size_groups: Dict[int, List[int]]
) -> List[torch.Tensor]:
    """``RandomHorizontalFlip`` + the copy into ``uint8`` tensors ``[3, s, s]`` (an ``L`` crop
    in all three channels): what the workers send with ``DEVICE_AUGMENT`` (the same copy as
    :func:`to_normalized_tensors`, without the float conversion; views of one batch per size)."""
    return _in_crop_order(_crop_batches(crops, flips, size_groups, torch.uint8), len(crops))


def to_normalized_tensors(
    crops: Sequence[Image.Image],
    flips: Sequence[bool],
    size_groups: Dict[int, List[int]],
    offset: Optional[torch.Tensor],
    inv: Optional[torch.Tensor],
    min_std: Optional[float] = None,
) -> List[torch.Tensor]:
    """``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize`` for all crops of an image:
    ``(flip(x_uint8) - 255 mean) / (255 std)`` per channel.

    Crops of equal size are written into one ``[n, 3, s, s]`` float batch (one strided
    copy per crop, an ``L`` crop broadcast to three channels) and normalised with one
    in-place op per batch; the returned tensors are views of those batches.

    Args:
        crops: the augmented square crops (``RGB`` or ``L``).
        flips: one flag per crop: mirror it left-right.
        size_groups: ``{side: [crop indices of that side]}`` covering every crop.
        offset: ``255 * mean`` shaped ``[1, 3, 1, 1]`` (None with ``min_std``).
        inv: ``1 / (255 * std)`` shaped ``[1, 3, 1, 1]`` (None with ``min_std``).
        min_std: given: standardise each crop by its own statistics instead
            (:func:`vissl_swav_plugin.transforms.standardize.standardize_`, floor ``min_std``).

    Returns:
        One ``float32`` tensor ``[3, s, s]`` per crop, in the order of ``crops``.
    """
    batches = _crop_batches(crops, flips, size_groups, torch.float32)
    for batch, _ in batches:
        if min_std is not None:
            standardize_(batch, min_std, scale=255.0)
        else:
            batch.sub_(offset).mul_(inv)
    return _in_crop_order(batches, len(crops))
