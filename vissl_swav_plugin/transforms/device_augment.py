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
* hue: PIL's 8-bit HSV round trip reproduced (hue and saturation truncated to 8 bits, the
  hue shifted modulo 256, PIL's rounding back to RGB), in float64; equal to PIL's.
* grayscale: ITU-R 601-2 luma, rounded: at most 1 level (PIL uses 16-bit fixed-point weights).
* blur: the workers' rule (:func:`~vissl_swav_plugin.transforms.multicrop_ops.gaussian_blur`):
  no blur for radius 0 or sigma <= 0.25; the truncated renormalised kernel for radius <= 2
  and 3 sigma > radius (PIL leaves the outer ``radius`` rows and columns unfiltered, as
  here); else PIL's Gaussian blur, which is three passes of an extended box blur per axis,
  each rounded to 8 bits, reproduced here with PIL's fixed-point weights: equal, at most 1
  level where float and fixed point round differently.
* the output is rounded to whole levels before the normalisation, as the workers' uint8 crops are.

Parameter layout per crop (float64, one row per crop): ``jitter`` (0/1), the factors
``b, c, s, h``, the op order (4 entries, a permutation of 0..3: brightness, contrast,
saturation, hue), ``gray`` (0/1), ``blur`` (0/1), ``sigma``, ``radius`` (the blur kernel's
half-width, ``int(blur_kernel_frac * size) // 2``).
"""
import math
from typing import List, Optional, Sequence

import torch

from vissl_swav_plugin.transforms.multicrop_config import DEVICE_AUGMENT_MODES

__all__ = [
    "KEY", "MODES", "OFF", "NORMALIZE", "PHOTOMETRIC", "NUM_PARAMS", "P_JITTER", "P_FACTORS", "P_ORDER",
    "P_GRAY", "P_BLUR", "P_SIGMA", "P_RADIUS", "DeviceAugmenter", "adjust_brightness", "adjust_contrast",
    "adjust_saturation", "adjust_hue", "to_grayscale", "color_jitter", "gaussian_blur", "apply_photometric",
    "pack_params",
]

#: the config key (dotted, without ``config.``)
KEY = "DATA.TRAIN.DEVICE_AUGMENT"
OFF, NORMALIZE, PHOTOMETRIC = "off", "normalize", "photometric"
MODES = DEVICE_AUGMENT_MODES  # (OFF, NORMALIZE, PHOTOMETRIC)

P_JITTER = 0
P_FACTORS = slice(1, 5)
P_ORDER = slice(5, 9)
P_GRAY = 9
P_BLUR = 10
P_SIGMA = 11
P_RADIUS = 12
NUM_PARAMS = 13

_WR, _WG, _WB = 0.299, 0.587, 0.114


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


# -- the ops: x is float [n, 3, H, W] in 0..255 levels, factors one per crop ----------------
def _col(f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return f.to(dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)


def _luma(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0:1] * _WR + x[:, 1:2] * _WG + x[:, 2:3] * _WB


def _round_clip(x: torch.Tensor) -> torch.Tensor:
    """PIL's rounding of a float result to 8 bits: ``floor(v + 0.5)`` clipped to [0, 255]."""
    return torch.floor(x + 0.5).clamp_(0.0, 255.0)


def _clip_where(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Rounded and clipped where the factor is > 1 (the workers materialise their map there),
    else only clipped (a factor <= 1 keeps [0, 255], up to float rounding)."""
    big = _col(f, x) > 1.0
    return torch.where(big, _round_clip(x), x.clamp(0.0, 255.0))


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``x -> b x`` per crop."""
    return _clip_where(x * _col(f, x), f)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``x -> c x + (1 - c) m`` per crop, ``m`` the mean luma of the crop rounded to a level (as PIL's)."""
    c = _col(f, x)
    m = torch.floor(_luma(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return _clip_where(c * x + (1.0 - c) * m, f)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``x -> s x + (1 - s) luma(x)`` per crop."""
    s = _col(f, x)
    return _clip_where(s * x + (1.0 - s) * _luma(x), f)


def hue_shift(h: torch.Tensor) -> torch.Tensor:
    """The 8-bit hue shift of hue factors ``h`` (torchvision's / the workers' ``int(h * 255) & 255``)."""
    return torch.remainder(torch.trunc(h.double() * 255.0), 256.0)


def adjust_hue(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Shift the hue of each crop by ``h`` turns through PIL's 8-bit HSV (see the module
    docstring); ``x`` is rounded to whole levels first (the workers' crop is uint8 there).  A
    crop whose 8-bit shift is 0 is returned as it is, as the workers skip it."""
    dtype = x.dtype
    v = _round_clip(x).double()
    shift = hue_shift(h).to(v.device).view(-1, 1, 1)
    r, g, b = v.unbind(1)
    maxc = torch.maximum(r, torch.maximum(g, b))
    minc = torch.minimum(r, torch.minimum(g, b))
    flat = maxc == minc
    # PIL's rgb2hsv_row, with its C float (f32) / double (f64) steps
    cr = torch.where(flat, torch.ones_like(maxc), maxc - minc).float()
    s = cr / torch.where(maxc == 0, torch.ones_like(maxc), maxc).float()
    rc, gc, bc = ((maxc - ch).float() / cr for ch in (r, g, b))
    hh = torch.where(r == maxc, bc - gc,
                     torch.where(g == maxc, (2.0 + rc.double() - bc.double()).float(),
                                 (4.0 + gc.double() - rc.double()).float()))
    hh = torch.fmod(hh.double() / 6.0 + 1.0, 1.0).float()
    H = torch.where(flat, torch.zeros_like(maxc), torch.trunc(hh.double() * 255.0)).clamp_(0, 255)
    S = torch.where(flat, torch.zeros_like(maxc), torch.trunc(s.double() * 255.0)).clamp_(0, 255)
    H = torch.remainder(H + shift, 256.0)
    # PIL's hsv2rgb
    h6 = H * 6.0 / 255.0
    i = torch.floor(h6)
    f = (h6 - i).float()
    fs = (S / 255.0).float()
    p = torch.floor(maxc * (1.0 - fs.double()) + 0.5).clamp_(0, 255)
    q = torch.floor(maxc * (1.0 - (fs * f).double()) + 0.5).clamp_(0, 255)
    t = torch.floor(maxc * (1.0 - fs.double() * (1.0 - f.double())) + 0.5).clamp_(0, 255)
    i = torch.remainder(i, 6.0)
    sel = [(maxc, t, p), (q, maxc, p), (p, maxc, t), (p, q, maxc), (t, p, maxc), (maxc, p, q)]
    out = []
    for ch in range(3):
        val = sel[5][ch]
        for k in range(4, -1, -1):
            val = torch.where(i == k, sel[k][ch], val)
        out.append(torch.where(S == 0, maxc, val))
    # a zero shift is no op at all (the workers skip the round trip, which is not the identity)
    return torch.where(shift.view(-1, 1, 1, 1) == 0, x, torch.stack(out, 1).to(dtype))


def to_grayscale(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma rounded to a level, in all three channels."""
    return _round_clip(_luma(x)).expand(-1, 3, -1, -1).contiguous()


_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def color_jitter(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The colour jitter of each crop of ``x`` with its own factors ``[n, 4]`` (b, c, s, h) in
    its own order ``[n, 4]`` (a permutation of 0..3): batched over the crops that apply the
    same op at the same step."""
    x = x.clone()
    order = order.detach().to("cpu", torch.long)  # the index lists are made on the host: no device syncs
    factors = factors.detach().to("cpu", torch.float64)
    for step in range(4):
        for op in range(4):
            idx = torch.nonzero(order[:, step] == op).flatten()
            if idx.numel() == 0:
                continue
            on = idx.to(x.device)
            x[on] = _OPS[op](x[on], factors[idx, op])
    return x


def _kernel_weights(sigma: float, radius: int) -> torch.Tensor:
    xs = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-(xs * xs) / (2.0 * sigma * sigma))
    return g / g.sum()


def _pil_box_radius(sigma: float, passes: int = 3) -> float:
    """PIL's ``_gaussian_blur_radius``: the extended box radius of ``passes`` box blurs with
    the variance of a Gaussian of ``sigma`` (Gwosdek et al. 2011); computed in C float."""
    sigma2 = sigma * sigma / passes
    L = math.sqrt(12.0 * sigma2 + 1.0)
    l = math.floor((L - 1.0) / 2.0)
    a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2)
    a /= 6 * (sigma2 - (l + 1) * (l + 1))
    return float(torch.tensor(l + a, dtype=torch.float32))


def _box_weights(radius_f: float):
    """PIL's fixed-point weights of an extended box blur: ``(r, ww, fw)`` with
    ``ww = 2^24 / (2 r_f + 1)`` for the ``2r + 1`` inner taps and ``fw`` for the two outer ones."""
    r = int(radius_f)
    ww = int((1 << 24) / (radius_f * 2 + 1))
    fw = ((1 << 24) - (r * 2 + 1) * ww) // 2
    return r, ww, fw


def _shift_sum(xp: torch.Tensor, w: torch.Tensor, width: int) -> torch.Tensor:
    """``sum_d w[:, d] * xp[..., d:d + width]`` along the last axis, one weight row per
    image (``xp`` ``[m, H, width + K - 1]``, ``w`` ``[m, K]``; float64, exact for PIL's
    fixed-point weights)."""
    acc = torch.zeros(xp.shape[:-1] + (width,), dtype=xp.dtype, device=xp.device)
    for d in range(w.shape[1]):
        acc.add_(xp[..., d:d + width] * w[:, d].view(-1, 1, 1))
    return acc


def _box_rows(sigmas: Sequence[float]) -> torch.Tensor:
    """Per crop, PIL's extended-box weights for ``GaussianBlur(sigma)`` as one tap row
    ``[2R + 3]`` (``R`` the largest integer radius; zeros beyond a crop's own ``r + 1``)."""
    boxes = [_box_weights(_pil_box_radius(s)) for s in sigmas]
    big = max(r for r, _, _ in boxes)
    rows = torch.zeros((len(boxes), 2 * big + 3), dtype=torch.float64)
    for k, (r, ww, fw) in enumerate(boxes):
        rows[k, big - r:big + r + 3] = float(ww)
        rows[k, big - r] = rows[k, big + r + 2] = float(fw)
    return rows


def _pil_gaussian(x: torch.Tensor, sigmas: Sequence[float]) -> torch.Tensor:
    """PIL's ``GaussianBlur(sigma)`` of each crop of ``x`` ``[n, C, H, W]`` (whole levels), its
    own sigma each: three horizontal then three vertical passes of an extended box blur, edges
    replicated, each pass rounded as PIL's fixed point ``(acc + 2^23) >> 24``."""
    n, c, hgt, wid = x.shape
    w = _box_rows(sigmas).to(x.device).repeat_interleave(c, 0)
    pad = (w.shape[1] - 1) // 2
    y = x.double().reshape(n * c, hgt, wid)
    for _ in range(2):
        for _ in range(3):
            xp = torch.nn.functional.pad(y.unsqueeze(1), (pad, pad, 0, 0), mode="replicate").squeeze(1)
            y = torch.floor((_shift_sum(xp, w, y.shape[-1]) + float(1 << 23)) / float(1 << 24))
        y = y.transpose(1, 2)
    return y.reshape(n, c, hgt, wid).to(x.dtype)


def _truncated(x: torch.Tensor, sigmas: Sequence[float], radii: Sequence[int]) -> torch.Tensor:
    """Each crop blurred by the truncated renormalised Gaussian of its ``radius`` (PIL's
    ``Kernel`` filter: the outer ``radius`` rows and columns are left as they are), rounded."""
    n, c, hgt, wid = x.shape
    big = max(radii)
    g = torch.zeros((n, 2 * big + 1), dtype=torch.float64)
    for k, (s, r) in enumerate(zip(sigmas, radii)):
        g[k, big - r:big + r + 1] = _kernel_weights(s, r)
    g = g.to(x.device).repeat_interleave(c, 0)
    y = x.double().reshape(n * c, hgt, wid)
    y = _shift_sum(torch.nn.functional.pad(y.unsqueeze(1), (big, big, 0, 0), mode="replicate").squeeze(1), g, wid)
    y = _shift_sum(torch.nn.functional.pad(y.transpose(1, 2).unsqueeze(1), (big, big, 0, 0),
                                           mode="replicate").squeeze(1), g, hgt).transpose(1, 2)
    y = _round_clip(y).reshape(n, c, hgt, wid).to(x.dtype)
    rr = torch.as_tensor(list(radii), device=x.device).view(n, 1, 1, 1)
    i = torch.arange(hgt, device=x.device).view(1, 1, -1, 1)
    j = torch.arange(wid, device=x.device).view(1, 1, 1, -1)
    inner = (i >= rr) & (i < hgt - rr) & (j >= rr) & (j < wid - rr)
    return torch.where(inner, y, x)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """The workers' blur rule (module docstring), ``sigma`` and ``radius`` one per crop; the
    crops of each rule are one batch."""
    out = x.clone()
    sig = sigma.detach().double().cpu().tolist()
    rad = [int(v) for v in radius.detach().cpu().tolist()]
    kern = [k for k, (s, r) in enumerate(zip(sig, rad)) if r > 0 and s > 0.25 and r <= 2 and 3.0 * s > r]
    gauss = [k for k, (s, r) in enumerate(zip(sig, rad)) if r > 0 and s > 0.25 and not (r <= 2 and 3.0 * s > r)]
    if kern:
        idx = torch.tensor(kern, device=x.device)
        out[idx] = _truncated(x[idx], [sig[k] for k in kern], [rad[k] for k in kern])
    if gauss:
        idx = torch.tensor(gauss, device=x.device)
        out[idx] = _pil_gaussian(x[idx], [sig[k] for k in gauss])
    return out


def apply_photometric(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Colour jitter (drawn order), grayscale and blur of uint8 crops ``x`` ``[n, 3, s, s]``
    with their parameter rows ``params`` ``[n, NUM_PARAMS]`` (on any device: they are read on
    the host once); returns float32 in whole levels."""
    y = x.float()
    params = params.detach().to("cpu", torch.float64)  # read on the host once: the selections cause no device syncs

    def rows(col):
        idx = torch.nonzero(params[:, col] > 0.5).flatten()
        return idx, idx.to(x.device)

    jit, on = rows(P_JITTER)
    if jit.numel():
        y[on] = color_jitter(y[on], params[jit, P_FACTORS], params[jit, P_ORDER])
    gray, on = rows(P_GRAY)
    if gray.numel():
        y[on] = to_grayscale(y[on])
    y = _round_clip(y)  # the workers' crop is uint8 before the blur
    blur, on = rows(P_BLUR)
    if blur.numel():
        y[on] = gaussian_blur(y[on], params[blur, P_SIGMA], params[blur, P_RADIUS])
    return y


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
            y = self.normalize(apply_photometric(x, p), inplace=True)
            for k, part in zip(ks, y.split([crops[k].shape[0] for k in ks])):
                out[k] = part
        return out
