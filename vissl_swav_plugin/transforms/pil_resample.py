"""PIL's ``Image.resize(size, filter, box=...)`` of many crops at once, on any torch device.

The loader workers crop and resize each crop with PIL (``image.resize((s, s), filter, box)``);
``config.DATA.TRAIN.DEVICE_AUGMENT=decode`` does it on the training device.  PIL's resampler
(Pillow's ``Resample.c``) is separable: per output pixel ``j`` of an axis, the filter centred
at ``box0 + (j + 0.5) * scale`` with support ``support * max(scale, 1)`` gives weights on the
input pixels ``[xmin, xmin + xlen)`` (the taps may lie outside the box, inside the image),
normalised to sum 1 and turned into 22-bit fixed point ``k``; one pass runs on the rows (or columns)
the other needs and is rounded to 8 bits, then the other pass, rounded again.  The horizontal
pass comes first, except from Pillow 13 on where the image's height shrinks by more than twice
as many pixels as its width (``(H - out_h) > 2 (W - out_w)``, the whole image's sizes): there
the vertical pass does (the rounding in between differs, so the order is reproduced).
:func:`axis_weights` computes the weights exactly as Pillow does (numpy on the host, small), and
:func:`resize_boxes` applies them with batched matrix products in float32 that reproduce Pillow's
integer arithmetic exactly: a product of a 22-bit weight and an 8-bit value needs 30 bits, so each
weight is split as ``k = kh 2^11 + kl`` (``0 <= kl < 2^11``); ``sum kh x`` and ``sum kl x`` are
integers below 2^24, exact in float32 in any order of summation (up to 31 taps, i.e. a downscale
of 15x with the bilinear filter), and Pillow's ``(sum k x + 2^21) >> 22`` follows from them in
float32 steps that are all exact.  The crops equal PIL's, bit for bit
(``tests/unit/transforms/test_device_decode.py``).

``nearest`` is not Pillow's separable resampler but its affine scaler, which takes, per output
pixel, the input pixel under ``box0 + scale / 2 + j * scale`` (accumulated step by step in double
precision, as Pillow does): :func:`axis_weights` gives it as a one-hot weight, so the same code
serves it.
"""
import math
from typing import Sequence, Tuple

import numpy as np
import torch

__all__ = ["FILTERS", "axis_weights", "resize_boxes", "vertical_first"]

_PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed point for 8-bit images


def _bilinear(x):
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _bicubic(x):
    a = -0.5
    x = np.abs(x)
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
                    np.where(x < 2.0, (((x - 5.0) * x + 8.0) * x - 4.0) * a, 0.0))


def _sinc(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(np.pi * x) / (np.pi * x))


def _lanczos(x):
    return np.where((-3.0 <= x) & (x < 3.0), _sinc(x) * _sinc(x / 3.0), 0.0)


#: the ``multicrop_plugin`` ``interpolation`` names -> (Pillow's filter, its support); None: nearest
FILTERS = {"bilinear": (_bilinear, 1.0), "bicubic": (_bicubic, 2.0), "lanczos": (_lanczos, 3.0), "nearest": None}


def axis_weights(in_size: int, in0: float, in1: float, out_size: int, interpolation: str) -> Tuple[int, np.ndarray]:
    """Pillow's weights of one axis: ``(first, W)`` with ``W`` ``[out_size, n]`` int64 fixed point
    such that output pixel ``j`` is ``(sum_i W[j, i] * x[first + i] + 2^21) >> 22``, clipped to
    [0, 255] (one-hot ``2^22`` for ``nearest``)."""
    scale = (in1 - in0) / out_size
    spec = FILTERS[interpolation]
    if spec is None:  # Pillow's affine scaler: xo = box0 + scale / 2, then xo += scale per pixel
        steps = np.full(out_size, scale)
        steps[0] = in0 + scale * 0.5
        idx = np.clip(np.cumsum(steps).astype(np.int64), 0, in_size - 1)
        first = int(idx.min())
        w = np.zeros((out_size, int(idx.max()) - first + 1), dtype=np.int64)
        w[np.arange(out_size), idx - first] = 1 << _PRECISION_BITS
        return first, w
    centers = in0 + (np.arange(out_size) + 0.5) * scale
    fn, support = spec
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    xmin = np.maximum((centers - support + 0.5).astype(np.int64), 0)  # C's (int) truncation: values >= 0 here
    xmax = np.minimum((centers + support + 0.5).astype(np.int64), in_size)
    taps = np.arange(ksize)
    k = fn((taps[None, :] + xmin[:, None] - centers[:, None] + 0.5) / filterscale)
    k = np.where(taps[None, :] < (xmax - xmin)[:, None], k, 0.0)
    ww = k.sum(axis=1, keepdims=True)
    k = np.where(ww != 0.0, k / np.where(ww != 0.0, ww, 1.0), k)
    one = float(1 << _PRECISION_BITS)
    k = np.where(k < 0, np.trunc(-0.5 + k * one), np.trunc(0.5 + k * one)).astype(np.int64)  # (int)(+-0.5 + k 2^22)
    first = int(xmin.min())
    w = np.zeros((out_size, int((xmin + ksize).max()) - first), dtype=np.int64)
    rows = np.repeat(np.arange(out_size), ksize)
    w[rows, (xmin[:, None] - first + taps[None, :]).ravel()] = k.ravel()
    return first, w[:, : int(xmax.max()) - first]


def _pillow_major() -> int:
    import PIL

    return int(PIL.__version__.split(".")[0])


#: Pillow runs the vertical pass first where the height shrinks much more (from 13.0 on)
_VERTICAL_FIRST_RULE = _pillow_major() >= 13


def vertical_first(height: int, width: int, out_h: int, out_w: int) -> bool:
    """Whether Pillow resamples an image of ``height x width`` to ``out_h x out_w`` vertically
    first (its ``ImagingResampleInner``: the image's, not the box's, sizes)."""
    return _VERTICAL_FIRST_RULE and (height - out_h) > 0 and (height - out_h) > 2 * (width - out_w)


_SPLIT = float(1 << 11)
_ONE = float(1 << _PRECISION_BITS)
_HALF = float(1 << (_PRECISION_BITS - 1))


def _split(w: np.ndarray):
    """``(kh, kl)`` float32 with ``w = kh 2^11 + kl``, ``0 <= kl < 2^11`` (both exact in float32)."""
    hi = np.floor_divide(w, 1 << 11)
    return hi.astype(np.float32), (w - hi * (1 << 11)).astype(np.float32)


def _clip8(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """Pillow's ``clip8((sum k x + 2^21) >> 22)`` from ``hi = sum kh x`` and ``lo = sum kl x``
    (integers < 2^24): ``hi = a 2^11 + b``, ``lo = p 2^22 + q``, the result
    ``a + p + floor((b 2^11 + 2^21 + q) / 2^22)``, every step exact in float32."""
    a = torch.floor(hi / _SPLIT)
    b = hi - a * _SPLIT
    p = torch.floor(lo / _ONE)
    q = lo - p * _ONE
    return (a + p + torch.floor((b * _SPLIT + _HALF + q) / _ONE)).clamp_(0.0, 255.0)


def resize_boxes(images: Sequence[torch.Tensor], owners: Sequence[int], boxes: Sequence[Sequence[int]], size: int,
                 interpolation: str = "bilinear", max_bytes: int = 1 << 28) -> torch.Tensor:
    """``PIL.Image.resize((size, size), filter, box)`` of crops of uint8 images on their device.

    Args:
        images: ``[3, H, W]`` uint8 tensors, all on one device.
        owners: per crop, the index of its image in ``images``.
        boxes: per crop, ``(left, top, right, bottom)`` in that image's pixels.
        size: the output side of every crop.
        interpolation: a key of :data:`FILTERS`.
        max_bytes: the float32 working buffers' budget; more crops are done in chunks.

    Returns:
        ``[n, 3, size, size]`` uint8 on the images' device.
    """
    n = len(owners)
    device = images[0].device if images else torch.device("cpu")
    out = torch.empty((n, 3, size, size), dtype=torch.uint8, device=device)
    if n == 0:
        return out
    plans = {False: [], True: []}  # by pass order
    for k, (owner, (left, top, right, bottom)) in enumerate(zip(owners, boxes)):
        _, h, w = images[owner].shape
        x0, wx = axis_weights(w, float(left), float(right), size, interpolation)
        y0, wy = axis_weights(h, float(top), float(bottom), size, interpolation)
        nearest = FILTERS[interpolation] is None  # one pass of lookups: no rounding in between
        plans[not nearest and vertical_first(h, w, size, size)].append((k, owner, x0, wx, y0, wy))
    for vfirst, group in plans.items():
        start = 0
        while start < len(group):
            stop, rmax, cmax = start, 0, 0
            while stop < len(group):  # a chunk whose padded regions and products fit the budget
                r, c = max(rmax, group[stop][5].shape[1]), max(cmax, group[stop][3].shape[1])
                if stop > start and 4 * (stop + 1 - start) * 3 * (r * c + (r + c) * size + size * size) > max_bytes:
                    break
                rmax, cmax, stop = r, c, stop + 1
            chunk = group[start:stop]
            index = torch.tensor([p[0] for p in chunk], device=device)
            out[index] = _resize_chunk(images, [p[1:] for p in chunk], size, rmax, cmax, device, vfirst)
            start = stop
    return out


def _resize_chunk(images, plans, size, rmax, cmax, device, vfirst) -> torch.Tensor:
    m = len(plans)
    region = torch.zeros((m, 3, rmax, cmax), dtype=torch.float32, device=device)
    wx = np.zeros((m, size, cmax), dtype=np.int64)
    wy = np.zeros((m, size, rmax), dtype=np.int64)
    for i, (owner, x0, wxi, y0, wyi) in enumerate(plans):
        rows, cols = wyi.shape[1], wxi.shape[1]
        region[i, :, :rows, :cols] = images[owner][:, y0:y0 + rows, x0:x0 + cols]
        wx[i, :, :cols] = wxi
        wy[i, :, :rows] = wyi
    # [m, cmax, size] (right factor of the horizontal pass) and [m, size, rmax] (left of the vertical)
    wx_t = [torch.from_numpy(v).to(device, non_blocking=True).transpose(1, 2) for v in _split(wx)]
    wy_t = [torch.from_numpy(v).to(device, non_blocking=True) for v in _split(wy)]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 keeps 10 mantissa bits: the sums would not be exact
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            if vfirst:
                # vertical pass on every column: [m, size, rmax] @ [m, rmax, 3 * cmax]
                cols = region.permute(0, 2, 1, 3).reshape(m, rmax, 3 * cmax)
                tmp = _clip8(*(torch.bmm(w, cols) for w in wy_t)).view(m, size, 3, cmax).permute(0, 2, 1, 3)
                # horizontal pass: [m, 3 * size, cmax] @ [m, cmax, size]
                tmp = tmp.reshape(m, 3 * size, cmax)
                res = _clip8(*(torch.bmm(tmp, w) for w in wx_t)).view(m, 3, size, size)
            else:
                # horizontal pass on every row: [m, 3 * rmax, cmax] @ [m, cmax, size]
                rows = region.view(m, 3 * rmax, cmax)
                tmp = _clip8(*(torch.bmm(rows, w) for w in wx_t))
                # vertical pass: [m, size, rmax] @ [m, rmax, 3 * size]
                tmp = tmp.view(m, 3, rmax, size).permute(0, 2, 1, 3).reshape(m, rmax, 3 * size)
                res = _clip8(*(torch.bmm(w, tmp) for w in wy_t)).view(m, size, 3, size).permute(0, 2, 1, 3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return res.to(torch.uint8)
