"""``multicrop_plugin``'s last steps on the training device: ``config.DATA.TRAIN.DEVICE_AUGMENT``.

The loader workers of a multi-crop run send, per batch of 64 at 2x224 + 6x96, about 120 MB
of float32 crops, which are pickled, pinned and copied, and they run every photometric op
on the CPU.  ``DEVICE_AUGMENT`` moves work to the device the model trains on:

* ``off`` (default): today's pipeline, unchanged (the workers send normalised float32 crops).
* ``normalize``: the workers run every op of ``multicrop_plugin`` (crop, flip, colour
  distortion, grayscale, blur) and send ``uint8`` crops (a quarter of the bytes); the device
  converts them to float and normalises them (``(x - 255 mean) / (255 std)``, or each crop
  by its own statistics with ``normalize: per_image``).  The arithmetic is that of the
  workers' :func:`~vissl_swav_plugin.transforms.multicrop_ops.to_normalized_tensors`, so the
  output is the same to the last bit on the CPU.
* ``photometric``: the workers crop, resize and flip (the flip stays there: it is part of
  the copy of the crop into its tensor, and every photometric op commutes with a horizontal
  flip, being per pixel, a global mean or a symmetric blur) and send ``uint8`` crops plus
  each crop's drawn photometric parameters (:data:`NUM_PARAMS` float64 numbers, layout
  below), drawn by ``multicrop_plugin`` itself (:meth:`MultiCropPlugin.sample_params`), so
  the distributions, the colour warm-up and the random stream are those of ``off``.  The
  device applies, batched per crop resolution: colour jitter in each crop's drawn order,
  grayscale, Gaussian blur, then the normalisation.  ``multicrop_plugin`` has no solarize.

How the device ops relate to the workers' ops (:mod:`~vissl_swav_plugin.transforms.multicrop_ops`,
measured by ``tests/unit/transforms/test_device_augment.py``):

* brightness, contrast, saturation: the same affine maps, in float32; where a factor is > 1
  (the only case that can leave [0, 255]) the result is rounded and clipped, as the workers
  materialise their composed map there.  Differences: the contrast mean is exact here (the
  workers estimate it from a box-reduced copy), and float32 rounding: at most 1 level.
* hue: PIL's 8-bit HSV round trip (hue and saturation truncated to 8 bits, the hue shifted
  modulo 256, PIL's rounding back to RGB) in float32 integer arithmetic, every value an
  integer below 2^24 (:func:`_hue_`): PIL's saturation and its way back to RGB are exact
  rational roundings (checked on all 2^24 inputs), its 8-bit hue, a function of ``r - g`` and
  ``g - b``, is looked up in a table of those differences: ``floor(255 hue)`` except where
  ``255 hue`` is an integer and Pillow's float steps land one level lower (64 of the 255 hues,
  measured once with the installed Pillow); equal to PIL's on all 2^24 colours.
* grayscale: ITU-R 601-2 luma, rounded: at most 1 level (PIL uses 16-bit fixed-point weights).
* blur: the workers' rule (:func:`~vissl_swav_plugin.transforms.multicrop_ops.gaussian_blur`):
  no blur for radius 0 or sigma <= 0.25; the truncated renormalised kernel for radius <= 2
  and 3 sigma > radius (PIL leaves the outer ``radius`` rows and columns unfiltered, as
  here), separable in float32: at most 1 level at rounding ties (PIL sums in float32 too);
  else PIL's Gaussian blur, three passes of an extended box blur per axis, each rounded to 8
  bits: its fixed-point weights (from a box radius and a division PIL computes in C float,
  as here) and each pass's ``(acc + 2^23) >> 24`` reproduced exactly in float32 by splitting
  the weights so that every partial sum is an integer below 2^24 (:func:`_box_blur_`), or,
  for a box of radius 0 (sigma below about 1.4), by a shorter pass whose float32 rounding the
  host checks against the integers on every input that pass can see (:func:`_rounds_exactly`;
  99.5% of such boxes, the others take the split weights): equal.
* the output is rounded to whole levels before the normalisation, as the workers' uint8 crops are.

Dtypes: every op on the crops' device is float32 (float64 runs at 1/32-1/64 of that rate on
most GPUs that are not datacenter parts, and a CPU does it at half the rate), and autocast is
off inside (a caller's autocast region changes nothing).  The parameter rows are read on the
host once, as Python numbers; the small tables (per-crop weights, the hue table) are built on
the host from them and go to the device as float32.  The ops are elementwise (no convolution
or matmul, which TF32 could round).  On a CPU the colour ops run on groups of crops that share
the step of their hue and the blur on batches of crops, each of about ``_CPU_CHUNK`` values,
so that the temporaries stay in the caches, and each crop is normalised in its last group,
before it is written out.

Parameter layout per crop (float64, one row per crop): ``jitter`` (0/1), the factors
``b, c, s, h``, the op order (4 entries, a permutation of 0..3: brightness, contrast,
saturation, hue), ``gray`` (0/1), ``blur`` (0/1), ``sigma``, ``radius`` (the blur kernel's
half-width, ``int(blur_kernel_frac * size) // 2``).
"""
import array
import contextlib
import math
import struct
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from vissl_swav_plugin.transforms.multicrop_config import DEVICE_AUGMENT_MODES

__all__ = [
    "KEY", "MODES", "OFF", "NORMALIZE", "PHOTOMETRIC", "NUM_PARAMS", "P_JITTER", "P_FACTORS", "P_ORDER",
    "P_GRAY", "P_BLUR", "P_SIGMA", "P_RADIUS", "DeviceAugmenter", "apply_photometric", "pack_params",
]

#: the config key (dotted, without ``config.``)
KEY = "DATA.TRAIN.DEVICE_AUGMENT"
OFF, NORMALIZE, PHOTOMETRIC = "off", "normalize", "photometric"
MODES = DEVICE_AUGMENT_MODES  # off, normalize, photometric, decode (device_decode)

P_JITTER = 0
P_FACTORS = slice(1, 5)
P_ORDER = slice(5, 9)
P_GRAY = 9
P_BLUR = 10
P_SIGMA = 11
P_RADIUS = 12
NUM_PARAMS = 13

_WR, _WG, _WB = 0.299, 0.587, 0.114

#: on the CPU, :func:`apply_photometric` runs the colour ops on groups of crops that share the
#: step of their hue, and the blur on batches of crops, of about this many values each, so that
#: the temporaries stay in the caches (several times faster per op than on a whole batch of
#: 224 px crops); on other devices the whole batch is one sequence of launches
_CPU_CHUNK = 1 << 19
_CPU_BLUR_CHUNK = 1 << 19
#: on the CPU, a set of crops made of at most this many runs of consecutive crops is processed
#: run by run (views) instead of gathered
_MAX_RUNS = 2


def pack_params(jitter, factors, order, gray, blur, sigma, radius) -> torch.Tensor:
    """The ``[n, NUM_PARAMS]`` float64 rows of ``n`` crops (per-crop sequences / arrays, as
    :meth:`MultiCropPlugin.sample_params` returns them; ``radius`` one int per crop)."""
    out = torch.empty((len(sigma), NUM_PARAMS), dtype=torch.float64)
    out[:, P_JITTER] = torch.as_tensor(jitter, dtype=torch.float64)
    out[:, P_FACTORS] = torch.as_tensor(factors, dtype=torch.float64)
    out[:, P_ORDER] = torch.as_tensor(order, dtype=torch.float64)
    out[:, P_GRAY] = torch.as_tensor(gray, dtype=torch.float64)
    out[:, P_BLUR] = torch.as_tensor(blur, dtype=torch.float64)
    out[:, P_SIGMA] = torch.as_tensor(sigma, dtype=torch.float64)
    out[:, P_RADIUS] = torch.as_tensor(radius, dtype=torch.float64)
    return out


# -- host-side helpers: parameters are read on the host once, as Python numbers ------------
def _host(v) -> list:
    """Per-crop values (a tensor on any device, or a sequence) as a flat list of Python numbers
    (copied to the host in their own dtype: no float64 tensor on the device)."""
    if torch.is_tensor(v):
        return v.detach().cpu().reshape(-1).tolist()
    return [float(a) for a in v]


_COL_DTYPES = {"f": torch.float32, "i": torch.int32}  # array typecode -> tensor dtype


def _col(values, x: torch.Tensor, typecode: str = "f") -> torch.Tensor:
    """Per-crop numbers as a ``[n, 1, 1, 1]`` column on ``x``'s device (built on the host):
    float32, or int32 with ``typecode="i"`` (``values`` then integers)."""
    vals = _host(values) if torch.is_tensor(values) else values
    col = torch.frombuffer(array.array(typecode, vals), dtype=_COL_DTYPES[typecode]).view(-1, 1, 1, 1)
    return col.to(x.device, non_blocking=True) if x.device.type != "cpu" else col


def _runs(idx: Sequence[int]) -> List[tuple]:
    """``idx`` (ascending) as maximal runs of consecutive crops: ``[(start, stop)]`` positions in ``idx``."""
    out, i0 = [], 0
    for i in range(1, len(idx) + 1):
        if i == len(idx) or idx[i] != idx[i - 1] + 1:
            out.append((i0, i))
            i0 = i
    return out


def _index(idx: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(idx), dtype=torch.long).to(device, non_blocking=True)


def _per_crop(y: torch.Tensor) -> bool:
    """Gathers of large crops on the CPU go one copy per crop (``index_select`` is slower there);
    small crops, or another device, one indexed op."""
    return y.device.type == "cpu" and y.numel() >= y.shape[0] << 16


def _gather(dst: Optional[torch.Tensor], y: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
    """``y[idx]`` (``idx`` a host list) into ``dst`` (a new tensor when None; any dtype of ``y``
    converted): one copy per large crop on the CPU (:func:`_per_crop`), else an index gather."""
    if dst is None:
        dst = torch.empty((len(idx),) + tuple(y.shape[1:]), dtype=torch.float32, device=y.device)
    if _per_crop(y):
        for j, k in enumerate(idx):
            dst[j].copy_(y[k])
    else:
        dst.copy_(y.index_select(0, _index(idx, y.device)))
    return dst


def _scatter(y: torch.Tensor, idx: Sequence[int], src: torch.Tensor) -> None:
    """``y[idx] = src``: one copy per crop on the CPU (``index_copy_`` is slower there, for
    crops of 96 px as of 224 px), else an index scatter."""
    if y.device.type == "cpu":
        for j, k in enumerate(idx):
            y[k].copy_(src[j])
    else:
        y.index_copy_(0, _index(idx, y.device), src)


def _run_on(y: torch.Tensor, idx: Sequence[int], fn: Callable, items: Optional[Sequence] = None, *shared) -> None:
    """``fn(z, items, *shared)`` on the crops ``idx`` (host list, ascending) of ``y``, in place
    (``items``: one entry per crop of ``idx``, split alike): a run of consecutive crops is a
    view (on the CPU up to ``_MAX_RUNS`` runs each on its own); other sets are gathered and
    written back."""
    if not idx:
        return
    runs = _runs(idx)
    if len(runs) == 1 or (len(runs) <= _MAX_RUNS and y.device.type == "cpu"):
        for i0, i1 in runs:
            fn(y[idx[i0]:idx[i1 - 1] + 1], None if items is None else items[i0:i1], *shared)
        return
    z = _gather(None, y, idx)
    fn(z, items, *shared)
    _scatter(y, idx, z)


@contextlib.contextmanager
def _autocast_off(device_type: str):
    """Autocast disabled for ``device_type`` (the ops here are all float32; a caller's autocast
    region must not reach them)."""
    try:
        ctx = torch.autocast(device_type=device_type, enabled=False)
    except (RuntimeError, ValueError):  # pragma: no cover - a device type without autocast
        ctx = contextlib.nullcontext()
    with ctx:
        yield


_CONSTS = {}


def _k(v: float, ref: torch.Tensor) -> torch.Tensor:
    """The float32 constant ``v`` as a one-element tensor on ``ref``'s device (cached): an op with
    a tensor operand skips the wrapping of a Python number into a tensor (about 3 us a call on
    a CPU, which adds up over the few thousand small ops of a batch)."""
    key = (v, ref.device)
    t = _CONSTS.get(key)
    if t is None:
        with torch.inference_mode(False):  # a normal tensor even when first made under inference mode
            t = _CONSTS[key] = torch.full((1,), v, dtype=torch.float32, device=ref.device)
    return t


def _cols(rows: Sequence[Sequence[float]], x: torch.Tensor) -> torch.Tensor:
    """Several per-crop columns at once: ``[len(rows), n, 1, 1, 1]`` float32 on ``x``'s device."""
    flat = array.array("f", [v for row in rows for v in row])
    out = torch.frombuffer(flat, dtype=torch.float32).view(len(rows), -1, 1, 1, 1)
    return out.to(x.device, non_blocking=True) if x.device.type != "cpu" else out


# -- the ops: x is float32 [n, 3, H, W] in 0..255 levels, factors one per crop ---------------
def _luma(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0:1] * _k(_WR, x) + x[:, 1:2] * _k(_WG, x) + x[:, 2:3] * _k(_WB, x)


def _round_clip(x: torch.Tensor) -> torch.Tensor:
    """PIL's rounding of a float result to 8 bits: ``floor(v + 0.5)`` clipped to [0, 255]."""
    return torch.floor(x + _k(0.5, x)).clamp_(0.0, 255.0)


def _round_clip_(x: torch.Tensor, _items=None) -> torch.Tensor:
    return x.add_(_k(0.5, x)).floor_().clamp_(0.0, 255.0)


def _round_where_(z: torch.Tensor, big: Sequence[bool]) -> None:
    """Clipped to [0, 255] and rounded to levels in place where ``big`` (per crop).

    The workers materialise their composed map (rounded, clipped) after an op whose factor is
    > 1, the only case that can leave [0, 255], and keep composing otherwise: so does the
    device.  After an op with a factor <= 1 the values stay in [0, 255] up to float rounding
    (a few 1e-5 above 255 at most), which the next clip or the final rounding removes, so they
    are left unclipped.  Rounding is ``floor(v + 0.5)``, on the runs of rounded crops (views),
    or for a scattered mix off the CPU a lerp with weight 0 or 1 (exact)."""
    if all(big):
        z.add_(_k(0.5, z)).floor_().clamp_(0.0, 255.0)
    elif any(big):
        on = [j for j, b in enumerate(big) if b]
        runs = _runs(on)
        if z.device.type == "cpu" or len(runs) <= _MAX_RUNS:  # the rounded crops' runs, as views
            for i0, i1 in runs:
                z[on[i0]:on[i1 - 1] + 1].add_(_k(0.5, z)).floor_().clamp_(0.0, 255.0)
        else:
            z.clamp_(0.0, 255.0)
            z.lerp_(torch.floor(z + _k(0.5, z)), _col([float(v) for v in big], z))


def _brightness_(z: torch.Tensor, fs: Sequence[float]) -> None:
    z.mul_(_col(fs, z))
    _round_where_(z, [f > 1.0 for f in fs])


def _contrast_(z: torch.Tensor, fs: Sequence[float]) -> None:
    cols = _cols([fs, [1.0 - f for f in fs]], z)
    # the mean luma (the luma of the channel means), rounded to a level as PIL's
    lum = z.sum(dim=(2, 3), keepdim=True).mul_(_lum_weights(z)).sum(dim=1, keepdim=True)
    z.mul_(cols[0]).add_(lum.add_(_k(0.5, z)).floor_().mul_(cols[1]))  # c x + (1 - c) m
    _round_where_(z, [f > 1.0 for f in fs])


def _lum_weights(z: torch.Tensor) -> torch.Tensor:
    """``[1, 3, 1, 1]``: the luma weights over the pixel count of ``z``'s crops (cached)."""
    key = ("luma", z.shape[2] * z.shape[3], z.device)
    t = _CONSTS.get(key)
    if t is None:
        w = [v / (z.shape[2] * z.shape[3]) for v in (_WR, _WG, _WB)]
        with torch.inference_mode(False):
            t = _CONSTS[key] = torch.tensor(w, dtype=torch.float32).view(1, 3, 1, 1).to(z.device)
    return t


def _saturation_(z: torch.Tensor, fs: Sequence[float]) -> None:
    cols = _cols([fs] + [[(1.0 - f) * w for f in fs] for w in (_WR, _WG, _WB)], z)
    gray = z[:, 0:1] * cols[1]  # (1 - s) luma, one fused weight per channel
    gray.addcmul_(z[:, 1:2], cols[2])
    gray.addcmul_(z[:, 2:3], cols[3])
    z.mul_(cols[0]).add_(gray)
    _round_where_(z, [f > 1.0 for f in fs])


def _affine_(z: torch.Tensor, items: Sequence[tuple]) -> None:
    """Brightness, contrast or saturation of each crop of ``z`` in place, its own ``(op,
    factor)`` (op 0, 1, 2; None: the crop is left as it is), in one pass over the crops:
    ``z -> f z + t`` with ``t = 0``, ``(1 - c) m`` or ``(1 - s) luma(z)`` per crop, so that the
    arithmetic of each crop is that of its own op (a crop's terms of the other ops are exact
    zeros).  One op for all crops takes its own, cheaper form."""
    ops = {op for op, _ in items}
    if len(ops) == 1 and None not in ops:
        _AFFINE[items[0][0]](z, [f for _, f in items])
        return
    fs = [1.0 if op is None else f for op, f in items]
    rows = [fs]
    if 2 in ops:
        rows += [[(1.0 - f) * w if op == 2 else 0.0 for op, f in items] for w in (_WR, _WG, _WB)]
    if 1 in ops:
        rows.append([1.0 - f if op == 1 else 0.0 for op, f in items])
    cols = _cols(rows, z)
    t = None
    if 2 in ops:
        t = z[:, 0:1] * cols[1]
        t.addcmul_(z[:, 1:2], cols[2])
        t.addcmul_(z[:, 2:3], cols[3])
    if 1 in ops:
        lum = z.sum(dim=(2, 3), keepdim=True).mul_(_lum_weights(z)).sum(dim=1, keepdim=True)
        off = lum.add_(_k(0.5, z)).floor_().mul_(cols[-1])
        t = off if t is None else t.add_(off)
    z.mul_(cols[0])
    if t is not None:
        z.add_(t)
    _round_where_(z, [op is not None and f > 1.0 for op, f in items])


# -- hue: PIL's 8-bit HSV round trip in float32 integer arithmetic ------------------------------
_HUE_TABLES = {}  # device -> (hue [511 * 511] int32, packed weights [511] float32)
_HUE_TIES: List[Optional[List[int]]] = [None]


def _pil_hue_ties() -> List[int]:
    """``bad[k]``: 1 where Pillow's ``rgb2hsv`` gives ``k - 1`` for a hue of exactly ``k / 255``
    (its float steps land just below the integer), else 0.  Those steps depend on the hue's
    ratio only (``maxc - x`` over ``maxc - minc``, each divided once), so one colour per ``k``
    (value 255, chroma 255) measures it, with the Pillow the workers use (64 of the 255 hues
    with Pillow 13)."""
    if _HUE_TIES[0] is None:
        from PIL import Image

        reps = []
        for k in range(255):
            m = 6 * k  # the hue's numerator over 6 * 255 (chroma 255)
            reps.append((255, m, 0) if m <= 255 else (510 - m, 255, 0) if m <= 510 else
                        (0, 255, m - 510) if m <= 765 else (0, 1020 - m, 255) if m <= 1020 else
                        (m - 1020, 0, 255) if m <= 1275 else (255, 0, 1530 - m))
        im = Image.new("RGB", (len(reps), 1))
        im.putdata(reps)
        bad = [k - p[0] for k, p in enumerate(im.convert("HSV").getdata())] + [0]
        if any(b not in (0, 1) for b in bad):  # pragma: no cover - a Pillow with other hue arithmetic
            raise RuntimeError(f"{KEY}={PHOTOMETRIC}: Pillow's 8-bit hue is not the one this module reproduces")
        _HUE_TIES[0] = bad
    return _HUE_TIES[0]


def _hue_tables(device):
    """``(hue, weights)`` on ``device``, built once per device from integers
    (:func:`_make_hue_tables`): ``hue`` ``[511 * 511]`` int32, PIL's 8-bit hue of the colours
    with ``r - g = i - 255`` and ``g - b = j - 255`` at ``511 i + j`` (a hue is a function of
    those two differences; ties as Pillow's, :func:`_pil_hue_ties`); ``weights`` ``[511]``
    float32, at ``k`` the weights ``w0 + 256 w1 + 65536 w2`` of the three output channels
    (``round(v (1 - S w / 65025))``, see :func:`_hue_`) for the hue ``k mod 256`` (an 8-bit hue
    plus a shift 0..255): two gathers per pixel."""
    t = _HUE_TABLES.get(device)
    if t is None:
        with torch.inference_mode(False):
            hue, w = _make_hue_tables()
            t = _HUE_TABLES[device] = (hue.to(device=device, dtype=torch.int32),
                                       w.to(device=device, dtype=torch.float32))
    return t


def _make_hue_tables():
    """The tables of :func:`_hue_tables`, in integers on the host."""
    bad = torch.tensor(_pil_hue_ties(), dtype=torch.long)
    d = torch.arange(-255, 256)
    r, g = d[:, None] + d[None, :], d[None, :].expand(511, 511)  # b = 0: only differences count
    b = torch.zeros_like(r)
    mx = torch.maximum(torch.maximum(r, g), b)
    cr = mx - torch.minimum(torch.minimum(r, g), b)
    # PIL's rgb2hsv: the hue's numerator over 6 cr, red tested first, then green
    num = torch.where(r == mx, g - b, torch.where(g == mx, 2 * cr + b - r, 4 * cr + r - g))
    den = 6 * cr.clamp(min=1)
    q = torch.div(255 * num, den, rounding_mode="floor")  # floor(255 hue), in [-43, 213)
    h0 = torch.where(q >= 0, q, q + 255).clamp(0, 255)
    hue = torch.where((255 * num) % den == 0, h0 - bad[h0], h0)  # a tie: Pillow's float steps
    # PIL's hsv2rgb: channel c is v, p, q or t; with K = (6 H + 255 n_c) mod 1530 (n = 5, 3, 1)
    # its weight is min(K, 1020 - K) clipped to [0, 255] (255: p, n: q, 255 - n: t, 0: v)
    k = (6 * (torch.arange(511) & 255)[None] + 255 * torch.tensor([5, 3, 1])[:, None]) % 1530
    w = torch.minimum(k, 1020 - k).clamp(0, 255)
    return hue.reshape(-1), w[0] + 256 * w[1] + 65536 * w[2]


def _hue_(z: torch.Tensor, shifts: Sequence[int], rounded: bool = False) -> None:
    """The 8-bit hue round trip of every crop of ``z`` in place (``shifts`` 1..255, one per
    crop; ``rounded``: ``z`` holds whole levels already).

    Every value is an integer below 2^24, so each float32 step is exact (a division is
    correctly rounded, and a quotient that is not an integer lies at least 1/65025 from one):

    * the 8-bit hue from the table of the differences ``r - g``, ``g - b`` (:func:`_hue_tables`),
      plus the crop's shift: the index of each channel's weight ``w``;
    * ``v = max``, ``cr = max - min``, ``S = floor(255 cr / v)`` (PIL's, checked on all 2^24
      colours);
    * ``out = floor((65025 v + 32512 - v S w) / 65025)`` = ``round(v (1 - S w / 65025))``, PIL's
      ``hsv2rgb`` (checked on all 2^24 HSV triples); the division is a product with the float32
      ``1 / 65025``, whose floor equals the quotient's for every integer below 2^24.
    """
    m, _, hgt, wid = z.shape
    hue_tab, w_tab = _hue_tables(z.device)
    if not rounded:
        _round_clip_(z)  # the workers' crop is uint8 before the round trip
    r, g, b = z.unbind(1)
    idx = g - b  # + 511 (r - g) + 511 * 255 + 255: integers, exact
    idx.add_(r, alpha=511.0).add_(g, alpha=-511.0).add_(_k(511.0 * 255 + 255, z))
    hue = torch.index_select(hue_tab, 0, idx.view(-1).int())
    hue = hue.view(m, hgt, wid).add_(_col(shifts, z, "i").view(-1, 1, 1)).view(-1)
    packed = torch.index_select(w_tab, 0, hue).view(m, hgt, wid)  # w0 + 256 w1 + 65536 w2: one gather
    w = torch.empty((3, m, hgt, wid), dtype=z.dtype, device=z.device)  # unpacked, exactly (powers of 2)
    q = packed.mul(_k(1.0 / 256.0, z)).floor_()
    torch.addcmul(packed, q, _k(-256.0, z), out=w[0])
    torch.mul(q, _k(1.0 / 256.0, z), out=w[2]).floor_()
    torch.addcmul(q, w[2], _k(-256.0, z), out=w[1])
    mx = torch.maximum(r, g)
    torch.maximum(mx, b, out=mx)
    cr = torch.minimum(r, g)
    torch.minimum(cr, b, out=cr)
    torch.sub(mx, cr, out=cr)
    sat = cr.mul_(_k(255.0, z)).div_(torch.clamp(mx, min=1.0, out=idx)).floor_()  # idx: free again
    a = torch.add(_k(32512.0, z), mx, alpha=65025.0)
    vs = mx.mul_(sat)
    torch.addcmul(a, vs, w, value=-1.0, out=z.transpose(0, 1))
    z.mul_(_k(1.0 / 65025.0, z)).floor_()  # floor(N / 65025), exact for every integer N < 2^24


def _gray_(z: torch.Tensor, _items=None) -> None:
    z.copy_(_round_clip(_luma(z)).expand_as(z))


_AFFINE = (_brightness_, _contrast_, _saturation_)


def _color_jitter_(y: torch.Tensor, crops: Sequence[int], factors: Sequence[Sequence[float]],
                   orders: Sequence[Sequence[int]], rounded: bool = False) -> List[bool]:
    """The colour jitter of the crops ``crops`` of ``y`` in place, each with its factors
    ``(b, c, s, h)`` in its order (host lists), step by step: the crops whose op at a step is
    brightness, contrast or saturation in one batch (:func:`_affine_`), those whose op is the
    hue in another; a zero 8-bit hue shift is no op (the workers skip it).  ``rounded``: the
    crops start in whole levels (then the hue's rounding is skipped while they stay so).
    Returns, per crop, whether it ends in whole levels."""
    shifts = [int(f[3] * 255) & 255 for f in factors]
    whole = [rounded] * len(crops)  # the crop holds whole levels (an op with a factor > 1 rounds)
    for step in range(4):
        ops = [o[step] for o in orders]
        aff = [j for j in range(len(crops)) if ops[j] != 3]
        if aff:
            _run_on(y, [crops[j] for j in aff], _affine_, [(ops[j], factors[j][ops[j]]) for j in aff])
            for j in aff:
                whole[j] = factors[j][ops[j]] > 1.0
        hue = [j for j in range(len(crops)) if ops[j] == 3 and shifts[j]]
        if hue:
            _run_on(y, [crops[j] for j in hue], _hue_, [shifts[j] for j in hue], all(whole[j] for j in hue))
            for j in hue:
                whole[j] = True
    return whole


# -- blur ----------------------------------------------------------------------------------
def _f32(v) -> float:
    """``v`` rounded to C float (float32, to nearest), as a Python number."""
    return struct.unpack("f", struct.pack("f", v))[0]


def _kernel_weights(sigma: float, radius: int) -> List[float]:
    """The workers' truncated, renormalised Gaussian (float64 on the host)."""
    g = [math.exp(-(d * d) / (2.0 * sigma * sigma)) for d in range(-radius, radius + 1)]
    total = sum(g)
    return [v / total for v in g]


def _pil_box_radius(sigma: float, passes: int = 3) -> float:
    """PIL's ``_gaussian_blur_radius``: the extended box radius of ``passes`` box blurs with
    the variance of a Gaussian of ``sigma`` (Gwosdek et al. 2011), step by step in C float as
    Pillow computes it (``sigma`` reaches C as a float; ``sqrt`` and ``floor`` in double)."""
    f = _f32
    r = f(sigma)
    sigma2 = f(f(r * r) / passes)
    L = f(math.sqrt(12.0 * sigma2 + 1.0))
    l = f(math.floor((L - 1.0) / 2.0))
    a = f(f(f(2 * l) + 1) * f(f(l * f(l + 1)) - f(3 * sigma2)))
    a = f(a / f(6 * f(sigma2 - f(f(l + 1) * f(l + 1)))))
    return f(l + a)


def _box_weights(radius_f: float):
    """PIL's fixed-point weights of an extended box blur: ``(r, ww, fw)`` with
    ``ww = (UINT32)(2^24 / (2 r_f + 1))`` (a C float division) for the ``2r + 1`` inner taps
    and ``fw`` for the two outer ones."""
    r = int(radius_f)
    ww = int(_f32(float(1 << 24) / _f32(radius_f * 2 + 1)))
    fw = ((1 << 24) - (r * 2 + 1) * ww) // 2
    return r, ww, fw


def _rounds_exactly(boxes: Sequence) -> List[bool]:
    """For boxes of integer radius 0 (``(0, ww, fw)``): whether PIL's pass equals ``S +
    round(fw / 2^24 D)`` with ``D = E - 2 S``, the product in float32 and rounded half to even,
    for every ``D`` in [-510, 510] and ``S`` in [0, 255], checked exhaustively on the host.

    With ``ww + 2 fw + e = 2^24`` (``e`` = 0 or 1, the parity of ``ww``) the pass is
    ``floor((ww S + fw E + 2^23) / 2^24) = S + floor((fw D - e S + 2^23) / 2^24)``; the float32
    steps are those of the device (the product correctly rounded, then rounded to an integer;
    numpy's float32 on the host rounds alike), so where they agree with the integers for every
    ``D``, and ``e S`` changes no floor, the device's pass is PIL's bit for bit (99.5% of the
    sigmas of a radius-0 box)."""
    d = np.arange(-510, 511)
    fw = np.array([f for _, _, f in boxes], dtype=np.int64)[:, None]
    odd = np.array([w & 1 for _, w, _ in boxes], dtype=bool)[:, None]
    n = fw * d + (1 << 23)
    fast = np.rint((fw.astype(np.float32) * np.float32(2.0 ** -24)) * d.astype(np.float32))  # as the device
    ok = (fast.astype(np.int64) == n >> 24) & (~odd | ((n & ((1 << 24) - 1)) >= 255))
    return ok.all(axis=1).tolist()


def _box_blur_(y: torch.Tensor, idx: Sequence[int], boxes: Sequence, r: int, rounded: bool = False,
               finish: Optional[Callable] = None) -> None:
    """PIL's ``GaussianBlur`` of the crops ``idx`` of ``y`` (whole levels) in place, all of
    integer box radius ``r`` (``boxes``: their ``(r, ww, fw)``): three horizontal, then three
    vertical passes of PIL's extended box blur, edges replicated, each ``floor((ww S + fw E +
    2^23) / 2^24)`` with ``S`` the sum of the ``2r + 1`` inner taps and ``E`` of the two outer
    ones (integers).

    With ``ww = wh 2^k + wl`` (likewise ``fw``) that is ``floor(hi + floor(lo / 2^k + 2^(23-k))
    2^(k-24))`` for the integers ``hi = wh S + fh E`` and ``lo = wl S + fl E`` (``k`` such
    that ``lo < 2^23``): every float32 value below is an integer, or one scaled by a power of
    two, below 2^24, so each step is exact whatever the rounding of fused multiply-adds.

    The crops are copied once into a buffer padded by ``r + 1`` on all sides, seen as one flat
    row per crop, so that every tap of either axis is a contiguous slice (a pass also computes
    garbage at the pad positions, which the edge copies overwrite before a pass reads them),
    and each pass writes its result into the buffer in place.

    ``rounded`` (radius 0, every box passing :func:`_rounds_exactly`): each pass is ``S +
    round(fw / 2^24 (E - 2 S))`` instead, five ops instead of nine.  ``finish`` (in place) is
    applied to the blurred crops in the buffer, before they are copied back."""
    m, ch, hgt, wid = len(idx), y.shape[1], y.shape[2], y.shape[3]
    p = r + 1
    k = 23 - (255 * (2 * r + 3) - 1).bit_length()  # lo = wl S + fl E < 2^23
    if k < 8:  # pragma: no cover - box radius > 62 (sigma > ~60 px): float weights, within 1 level at ties
        k = 0
    mask = (1 << k) - 1

    def col(v):
        return _col(v, y).view(-1, 1)

    if rounded:
        beta = col([fw * 2.0 ** -24 for _, _, fw in boxes])
    else:
        wh = col([(ww >> k) * 2.0 ** (k - 24) for _, ww, _ in boxes])
        fh = col([(fw >> k) * 2.0 ** (k - 24) for _, _, fw in boxes])
        wl = col([(ww & mask) * 2.0 ** -k for _, ww, _ in boxes])
        fl = col([(fw & mask) * 2.0 ** -k for _, _, fw in boxes])
    c, scale = _k(2.0 ** (23 - k), y), 2.0 ** (k - 24)
    buf = torch.empty((m, ch, hgt + 2 * p, wid + 2 * p), dtype=y.dtype, device=y.device)
    mid = buf[:, :, p:p + hgt, p:p + wid]
    _transfer(mid, y, idx, into=True)
    flat = buf.view(m, -1)
    edge, lo, inner = (torch.empty((m, flat.shape[1]), dtype=y.dtype, device=y.device) for _ in range(3))
    for dim, step in ((-1, 1), (-2, wid + 2 * p)):  # step: the flat distance of neighbouring taps
        span = flat.shape[1] - 2 * p * step
        tap = [flat.narrow(1, j * step, span) for j in range(2 * p + 1)]
        e, i_, l_ = edge[:, :span], inner[:, :span], lo[:, :span]
        lead = buf.narrow(dim, 0, p)
        tail = buf.narrow(dim, p + buf.shape[dim] - 2 * p, p)
        first = buf.narrow(dim, p, 1).expand_as(lead)
        last = buf.narrow(dim, buf.shape[dim] - p - 1, 1).expand_as(tail)
        for _ in range(3):
            lead.copy_(first)  # edges replicated (PIL's extended edges)
            tail.copy_(last)
            torch.add(tap[0], tap[2 * p], out=e)
            if rounded:  # S + round(beta (E - 2 S)): the interior (and garbage at the pads)
                e.add_(tap[1], alpha=-2.0).mul_(beta).round_()
                tap[1].add_(e)
                continue
            s = tap[1]
            if r:
                s = torch.add(tap[1], tap[2], out=i_)
                for j in range(3, 2 * r + 2):
                    s.add_(tap[j])
            torch.mul(e, fl, out=l_)
            l_.addcmul_(s, wl).add_(c).floor_()
            e.mul_(fh).addcmul_(s, wh).add_(l_, alpha=scale)
            torch.floor(e, out=tap[p])  # the interior (and garbage at the pads)
    if finish is not None:
        finish(mid)
    _transfer(mid, y, idx, into=False)


def _transfer(buf: torch.Tensor, y: torch.Tensor, idx: Sequence[int], into: bool) -> None:
    """``buf[j] = y[idx[j]]`` (``into``) or back: one copy for a run of consecutive crops."""
    a = idx[0]
    if idx[-1] - a + 1 == len(idx):
        dst, src = (buf, y[a:a + len(idx)]) if into else (y[a:a + len(idx)], buf)
        dst.copy_(src)
    elif into:
        _gather(buf, y, idx)
    else:
        _scatter(y, idx, buf)


def _truncated_(z: torch.Tensor, sigmas: Sequence[float], r: int) -> None:
    """Each crop of ``z`` blurred by the truncated renormalised Gaussian of radius ``r`` in
    place, rounded (PIL's ``Kernel`` filter: the outer ``r`` rows and columns stay as they
    are); separable, in float32."""
    _, _, hgt, wid = z.shape
    if hgt <= 2 * r or wid <= 2 * r:
        return
    g = [_kernel_weights(s, r) for s in sigmas]
    taps = [_col([w[j] for w in g], z) for j in range(2 * r + 1)]
    h = z[..., 0:wid - 2 * r] * taps[0]
    for j in range(1, 2 * r + 1):
        h.addcmul_(z[..., j:j + wid - 2 * r], taps[j])
    v = h[..., 0:hgt - 2 * r, :] * taps[0]
    for j in range(1, 2 * r + 1):
        v.addcmul_(h[..., j:j + hgt - 2 * r, :], taps[j])
    z[..., r:hgt - r, r:wid - r] = _round_clip_(v)


def _blurs(sigma: float, radius: int) -> bool:
    """Whether the workers' rule blurs a crop that drew a blur: not for radius 0 or sigma <= 0.25."""
    return radius > 0 and sigma > 0.25


def _blur_groups(crops: Sequence[int], sigmas: Sequence[float], radii: Sequence[int]):
    """The workers' blur rule (module docstring) for each crop: ``{("kernel", r): [(crop,
    sigma)], ("box", r): [(crop, (r, ww, fw))], ("rounded", 0): [(crop, (0, ww, fw))]}`` (no
    entry: no blur; ``rounded``: the boxes of radius 0 that :func:`_rounds_exactly` passes)."""
    groups = {}
    for k, s, r in zip(crops, sigmas, radii):
        if not _blurs(s, r):
            continue
        if r <= 2 and 3.0 * s > r:
            groups.setdefault(("kernel", r), []).append((k, s))
        else:
            box = _box_weights(_pil_box_radius(s))
            groups.setdefault(("box", box[0]), []).append((k, box))
    zero = groups.pop(("box", 0), [])
    for item, ok in zip(zero, _rounds_exactly([b for _, b in zero]) if zero else []):
        groups.setdefault(("rounded" if ok else "box", 0), []).append(item)
    return groups


def _blur_(y: torch.Tensor, crops: Sequence[int], sigmas: Sequence[float], radii: Sequence[int],
           per: Optional[int] = None, finish: Optional[Callable] = None) -> None:
    """The workers' blur rule on the crops ``crops`` of ``y`` in place, in batches of one rule
    and radius (of at most ``per`` crops); ``finish`` (in place) on each batch once blurred."""
    for (rule, r), items in sorted(_blur_groups(crops, sigmas, radii).items()):
        step = per or len(items)
        for i in range(0, len(items), step):
            part = items[i:i + step]
            ks = [k for k, _ in part]
            if rule == "kernel":
                _run_on(y, ks, _truncated_, [v for _, v in part], r)
                if finish is not None:
                    _run_on(y, ks, _then, None, finish)
            else:
                _box_blur_(y, ks, [v for _, v in part], r, rule == "rounded", finish)


def _then(z: torch.Tensor, _items, fn: Callable) -> None:
    """``fn(z)``, in :func:`_run_on`'s calling convention."""
    fn(z)


# -- the whole device side ----------------------------------------------------------------------
def _colour_(y: torch.Tensor, rows: Sequence[Sequence[float]], rounded: bool) -> None:
    """Colour jitter, grayscale and the rounding to levels of the crops of ``y`` (float32 levels;
    ``rounded``: whole levels) in place, with their parameter rows (host lists)."""
    whole = [rounded] * len(rows)  # the crop holds whole levels
    jit = [k for k, row in enumerate(rows) if row[P_JITTER] > 0.5]
    if jit:
        ends = _color_jitter_(y, jit, [rows[k][P_FACTORS] for k in jit],
                              [[int(v) for v in rows[k][P_ORDER]] for k in jit], rounded)
        for k, w in zip(jit, ends):
            whole[k] = w
    gray = [k for k, row in enumerate(rows) if row[P_GRAY] > 0.5]
    _run_on(y, gray, _gray_)
    for k in gray:
        whole[k] = True
    rest = [k for k, w in enumerate(whole) if not w]
    if rest:  # the workers' crop is uint8 before the blur
        if len(_runs(rest)) <= _MAX_RUNS:
            _run_on(y, rest, _round_clip_)
        else:
            _round_clip_(y)


def _blurred(rows: Sequence[Sequence[float]]) -> List[int]:
    """The crops that the blur changes: those that drew one, less those the workers' rule skips."""
    return [k for k, row in enumerate(rows) if row[P_BLUR] > 0.5 and _blurs(row[P_SIGMA], int(row[P_RADIUS]))]


def _blur_rows_(y: torch.Tensor, rows: Sequence[Sequence[float]], per: Optional[int] = None,
                finish: Optional[Callable] = None) -> None:
    """The blur of the crops of ``y`` that draw one (their parameter rows ``rows``), then
    ``finish`` (in place) on each blurred crop.  A grayscale crop's three channels are equal:
    its first is blurred and copied to the others."""
    blurred = _blurred(rows)
    for gray in (False, True):
        blur = [k for k in blurred if (rows[k][P_GRAY] > 0.5) == gray]
        if not blur:
            continue
        if not gray:
            _blur_(y, blur, [rows[k][P_SIGMA] for k in blur], [int(rows[k][P_RADIUS]) for k in blur], per, finish)
            continue
        _blur_(y[:, 0:1], blur, [rows[k][P_SIGMA] for k in blur], [int(rows[k][P_RADIUS]) for k in blur], per)
        if y.device.type == "cpu":
            for k in blur:
                _spread_(y[k:k + 1])
                if finish is not None:
                    finish(y[k:k + 1])
        else:
            _run_on(y, blur, _spread_)
            if finish is not None:
                _run_on(y, blur, _then, None, finish)


def _spread_(z: torch.Tensor, _items=None) -> None:
    """The first channel of each crop of ``z`` into the other two, in place."""
    z[:, 1:].copy_(z[:, 0:1].expand(-1, z.shape[1] - 1, -1, -1))


def _cpu_chunks(rows: Sequence[Sequence[float]], per: int, blurred: Sequence[int] = ()) -> List[List[int]]:
    """The crops in groups for the CPU's colour ops: sorted by the step of their hue (then
    grayscale, then whether ``blurred``), cut where that step changes or at ``per`` crops, so
    that at each step of the jitter the group is one batch of the hue or one of brightness /
    contrast / saturation, the grayscale set is a run, and the unblurred crops are two runs at
    most."""
    blurred = set(blurred)
    keys = {}
    for k, row in enumerate(rows):
        jit = row[P_JITTER] > 0.5
        order = [int(v) for v in row[P_ORDER]]
        keys[k] = (not jit, order.index(3) if jit and 3 in order else -1, row[P_GRAY] > 0.5, k in blurred, k)
    chunks, last = [], None
    for k in sorted(keys, key=keys.get):
        if keys[k][:2] != last or len(chunks[-1]) >= per:
            chunks.append([])
            last = keys[k][:2]
        chunks[-1].append(k)
    return chunks


def apply_photometric(x: torch.Tensor, params: torch.Tensor, finish: Optional[Callable] = None) -> torch.Tensor:
    """Colour jitter (drawn order), grayscale and blur of uint8 crops ``x`` ``[n, 3, s, s]``
    with their parameter rows ``params`` ``[n, NUM_PARAMS]`` (on any device: they are read on
    the host once); returns float32 in whole levels, or what ``finish`` (a function of a float32
    ``[m, 3, s, s]`` batch of such crops, in place, one crop's result independent of the
    others: :meth:`DeviceAugmenter.normalize`) makes of them.  Every op on ``x``'s device is
    float32, with autocast off.  On the CPU the colour ops go in groups of about ``_CPU_CHUNK``
    values that share the step of their hue (:func:`_cpu_chunks`), and the blur in batches of
    about as many values, so that the temporaries stay in the caches, and ``finish`` runs on
    each crop's last batch, before it is written out; elsewhere each is one batch."""
    rows = params.detach().cpu().tolist()  # read on the host once: the selections cause no device syncs
    cpu = x.device.type == "cpu"
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    rounded = not x.is_floating_point()  # uint8 crops: whole levels
    if x.shape[0] == 0:
        return out
    with _autocast_off(x.device.type), torch.inference_mode():  # no autograd bookkeeping per op
        if not cpu:
            out.copy_(x)
            _colour_(out, rows, rounded)
            _blur_rows_(out, rows)
            if finish is not None:
                finish(out)
            return out
        per = max(1, _CPU_CHUNK // max(1, x[0].numel()))
        blurred = set(_blurred(rows))
        for idx in _cpu_chunks(rows, per, blurred):
            sub = [rows[k] for k in idx]
            done = [j for j, k in enumerate(idx) if k not in blurred]  # their last op: finish now
            a, b = idx[0], idx[-1] + 1
            if idx == list(range(a, b)):
                y = out[a:b]
                y.copy_(x[a:b])
                _colour_(y, sub, rounded)
                if finish is not None:
                    _run_on(y, done, _then, None, finish)
                continue
            y = _gather(None, x, idx)
            _colour_(y, sub, rounded)
            if finish is not None:
                _run_on(y, done, _then, None, finish)
            _scatter(out, idx, y)
        _blur_rows_(out, rows, max(1, _CPU_BLUR_CHUNK // max(1, x[0].numel())), finish)
    return out


class DeviceAugmenter:
    """The device side of ``DEVICE_AUGMENT``: uint8 crops (one ``[N, 3, s, s]`` tensor per crop
    position, as VISSL's ``multicrop_collator`` stacks them) -> normalised float32 crops.

    Args:
        mean, std: per channel in [0, 1] units (``normalize: dataset``); None with ``min_std``.
        min_std: ``normalize: per_image``: each crop standardised by its own statistics.
        photometric: apply :func:`apply_photometric` first (``params`` required).
    """

    def __init__(self, mean: Optional[Sequence[float]], std: Optional[Sequence[float]],
                 min_std: Optional[float] = None, photometric: bool = False):
        self.min_std = min_std
        self.photometric = photometric
        self._offset = self._inv = None
        if min_std is None:
            m = torch.tensor(list(mean), dtype=torch.float32).view(1, 3, 1, 1)
            sd = torch.tensor(list(std), dtype=torch.float32).view(1, 3, 1, 1)
            self._offset, self._inv = m * 255.0, 1.0 / (sd * 255.0)
        self._cache = {}

    def _consts(self, device):
        c = self._cache.get(device)
        if c is None:
            c = self._cache[device] = (self._offset.to(device), self._inv.to(device))
        return c

    def normalize(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """uint8 (or float32 in levels) ``[n, 3, s, s]`` -> normalised float32, the workers'
        arithmetic (``inplace``: a float32 ``x`` is overwritten)."""
        y = x if inplace and x.dtype == torch.float32 else (x.float() if x.dtype != torch.float32 else x.clone())
        if self.min_std is not None:
            from vissl_swav_plugin.transforms.standardize import standardize_

            return standardize_(y, self.min_std, scale=255.0)
        offset, inv = self._consts(y.device)
        return y.sub_(offset).mul_(inv)

    def _normalize_(self, y: torch.Tensor) -> None:
        """float32 levels -> normalised, in place (``apply_photometric``'s ``finish``)."""
        self.normalize(y, inplace=True)

    def __call__(self, crops: Sequence[torch.Tensor], params: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        """``crops``: one uint8 tensor ``[N, 3, s, s]`` per crop position; ``params``
        ``[positions, N, NUM_PARAMS]`` (photometric).  Positions of equal size are processed
        as one batch."""
        if not self.photometric:
            return [self.normalize(c) for c in crops]
        if params is None:
            raise ValueError(f"{KEY}={PHOTOMETRIC}: the batch carries no crop parameters")
        out: List[Optional[torch.Tensor]] = [None] * len(crops)
        by_size = {}
        for k, c in enumerate(crops):
            by_size.setdefault(tuple(c.shape[1:]), []).append(k)
        for ks in by_size.values():
            x = torch.cat([crops[k] for k in ks]) if len(ks) > 1 else crops[ks[0]]
            p = torch.cat([params[k] for k in ks]) if len(ks) > 1 else params[ks[0]]
            y = apply_photometric(x, p, finish=self._normalize_)
            for k, part in zip(ks, y.split([crops[k].shape[0] for k in ks])):
                out[k] = part
        return out
