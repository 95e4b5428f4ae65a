"""Multi-crop augmentation (SwAV paper Sec. 3.2, App. A.2) as one registered transform.

Multi-crop (Caron et al. 2020, Sec. 3.2) compares each image's two standard-resolution
views with ``V`` extra low-resolution views that cover small parts of the image, so the
swapped prediction sees ``2 + V`` views at little extra cost.  ``multicrop_plugin`` turns
one PIL image into those ``sum(num_crops)`` views.  Each crop group has a count, an output
size, a ``RandomResizedCrop`` scale range and aspect-ratio range; every crop then gets,
independently, the augmentations of App. A.2 (SimCLR's): a horizontal flip, the colour
distortion (colour jitter ``0.8s, 0.8s, 0.8s, 0.2s`` in random order with probability 0.8,
random grayscale with probability 0.2) and a Gaussian blur (probability ``blur_p``, sigma
uniform in ``blur_sigma``, kernel ~10% of the crop size), and is finally turned into a
normalised float tensor.  The output is a list of ``3 x size x size`` tensors (large crops
first, in the configured group order), which is what VISSL's ``multicrop_collator``
consumes: the transform is registered as a "transform with copies" with VISSL's
``SSLTransformsWrapper`` so the crops are flattened into the sample (labels / indices
replicated per crop), exactly as for VISSL's own ``ImgPilToMultiCrop``.

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

It computes the same operations as VISSL's chain (``ImgPilToMultiCrop`` +
``RandomHorizontalFlip`` + ``ImgPilColorDistortion`` + ``ImgPilGaussianBlur`` +
``ToTensor`` + ``Normalize``), faster (see ``benchmarks/bench_multicrop.py``): all random
numbers of an image come from one numpy call; crop boxes are sampled for all crops at once
(torchvision's ``RandomResizedCrop`` rule, vectorised) and the per-crop work runs without
per-op Python dispatch (VISSL wraps each op of each crop); crop + resize is one PIL
``resize(box=...)`` call.  The per-crop ops (colour distortion, blur, flip + tensor
conversion) and how they stay exact are in :mod:`vissl_swav_plugin.transforms.multicrop_ops`.

Module layout: this module holds the registered transform, which samples the random
choices (:meth:`MultiCropPlugin.sample_params`) and registers it with Classy Vision /
VISSL; :mod:`vissl_swav_plugin.transforms.multicrop_config` parses and validates the config and
:mod:`vissl_swav_plugin.transforms.multicrop_ops` holds the per-crop ops.  The public names of both
(``MultiCropConfigError``, ``TRANSFORM_NAME``, ``color_jitter``, ...) are importable from
here too.
"""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from classy_vision.dataset.transforms import register_transform
from classy_vision.dataset.transforms.classy_transform import ClassyTransform
from PIL import Image

from vissl_swav_plugin.compat.image_modes import DECODE_ON_DEVICE, EncodedImage
from vissl_swav_plugin.transforms.multicrop_config import (
    DEFAULT_RATIO,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRANSFORM_NAME,
    WARMUP_LINEAR,
    WARMUP_STEP,
    MultiCropConfigError,
    check_config_keys,
    validate_params,
)
from vissl_swav_plugin.transforms.multicrop_ops import (
    color_jitter,
    gaussian_blur,
    to_normalized_tensors,
    to_rgb_crops,
    to_uint8_tensors,
)

__all__ = [
    "TRANSFORM_NAME",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DEFAULT_RATIO",
    "MultiCropConfigError",
    "MultiCropPlugin",
    "color_jitter",
]

# Layout of the uniform random numbers drawn per crop (one row of ``u`` per crop):
# 10 tries x (area, log-ratio), 2 for the position, then flip, jitter-apply, 4 jitter
# factors, 4 for the op order, grayscale, blur-apply, sigma.
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


def _first_iteration(epoch: int, iters_per_epoch: int) -> int:
    """The training iteration (0-based) at which epoch ``epoch`` of ``iters_per_epoch`` starts."""
    return int(epoch) * max(1, int(iters_per_epoch))


@register_transform(TRANSFORM_NAME)
class MultiCropPlugin(ClassyTransform):
    """PIL image -> list of augmented crops (normalised tensors by default): the SwAV
    paper's multi-crop (Sec. 3.2) with the per-crop augmentations of App. A.2.

    Crop ``k`` of group ``i`` is a ``RandomResizedCrop`` (area fraction uniform in
    ``crop_scales[i]``, log aspect ratio uniform in ``log(crop_ratios[i])``, resized to
    ``size_crops[i]``), then, each drawn independently per crop: colour jitter with
    probability ``color_jitter_p`` (factors ``1 +- 0.8s`` for brightness / contrast /
    saturation, hue ``+- 0.2s``, ops in random order), grayscale with probability
    ``grayscale_p``, Gaussian blur with probability ``blur_p``, horizontal flip with
    probability ``flip_p``; finally ``(x - mean) / std`` (or, with ``normalize: per_image``,
    each crop standardised by its own mean and std).

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
        mean, std: normalisation (per channel, in [0, 1] units; default ImageNet's) with
            ``normalize: dataset``.
        normalize: ``dataset`` (default, the official code's): ``(x - mean) / std``;
            ``per_image``: each crop ``(x - its mean) / max(its std, min_std)`` over all its
            channels and pixels (:mod:`vissl_swav_plugin.transforms.standardize`; brightness and
            contrast changes then leave the input unchanged).
        min_std: ``per_image`` only: the std divisor's floor in [0, 1] units (default 0.1).
        color_warmup_iters: the training epochs that start within the first
            ``color_warmup_iters`` iterations (default 0: none) use ``color_warmup_strength``
            (scalar or one per group) instead of ``color_strength``
            (:mod:`vissl_swav_plugin.hooks.color_warmup`: a weaker distortion of the global crops at
            the start kept low-detail images from collapsing).
        color_warmup_schedule: ``step`` (default): ``color_warmup_strength`` for those
            epochs, then ``color_strength``; ``linear``: the epoch that starts at iteration
            ``i < color_warmup_iters`` uses ``w + (s - w) i / color_warmup_iters`` per group
            (``w`` the warm-up strength, ``s`` ``color_strength``): a ramp, so what the network
            learned at the weak strength is not all taken away at once.
        to_tensor: True (default) returns normalised float tensors; False returns PIL
            crops (flipped and colour-augmented) for further PIL transforms.
        interpolation: resize filter, ``bilinear`` (default) | ``bicubic`` | ...
        device_augment: ``off`` (default) | ``normalize``: uint8 tensors after every op, the
            device normalises | ``photometric``: ``(uint8 crop, parameter row)`` pairs after the
            crop, resize and flip, the device does the rest
            (:mod:`vissl_swav_plugin.transforms.device_augment`).  Set by the config inference
            from ``config.DATA.TRAIN.DEVICE_AUGMENT``; do not set it by hand.  ``decode``:
            ``(image, parameter row)`` pairs, the image undecoded where it is a JPEG
            (:mod:`vissl_swav_plugin.transforms.device_decode`): the device decodes, crops, resizes
            and does the rest.
        jpeg_draft: False (default, the official code's full decode) | True: a JPEG read from
            disk is decoded by the worker at 1/2, 1/4 or 1/8 of its size (JPEG's reduced-size
            decode, PIL's ``draft``) when every crop's box is at least that many times its output
            side, the boxes drawn on the full size as always; a crop differs from the full
            decode's by the smoothing of the DCT's downscale.  Needs ``multicrop_plugin`` first in
            the transforms (it receives the file undecoded).

    Raises:
        MultiCropConfigError: a wrong argument; the message names the key.

    Example::

        t = MultiCropPlugin(num_crops=[2, 6], size_crops=[224, 96],
                            crop_scales=[[0.14, 1], [0.05, 0.14]])
        views = t(pil_image)  # 8 tensors: 2 x [3, 224, 224], then 6 x [3, 96, 96]
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
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        to_tensor: bool = True,
        interpolation: str = "bilinear",
        normalize: str = "dataset",
        min_std: Optional[float] = None,
        color_warmup_iters: int = 0,
        color_warmup_strength: Any = None,
        color_warmup_schedule: str = WARMUP_STEP,
        device_augment: str = "off",
        jpeg_draft: bool = False,
    ):
        p = validate_params(
            num_crops, size_crops, crop_scales, crop_ratios, total_num_crops, flip_p,
            color_strength, color_jitter_p, grayscale_p, blur_p, blur_sigma, blur_kernel_frac,
            mean, std, to_tensor, interpolation, normalize, min_std, color_warmup_iters,
            color_warmup_strength, color_warmup_schedule, device_augment, jpeg_draft,
        )
        self.device_augment = p.device_augment
        self.jpeg_draft = p.jpeg_draft
        self.interpolation = interpolation
        counts, sizes, scales, ratios = p.counts, p.sizes, p.scales, p.ratios
        self.num_crops = counts
        self.size_crops = sizes
        self.crop_scales = scales
        self.crop_ratios = ratios
        self.total_num_crops = sum(counts)
        self.to_tensor = p.to_tensor
        self.resample = p.resample
        self.mean, self.std = p.mean, p.std
        self.normalize, self.min_std = p.normalize, p.min_std

        # per-crop parameter arrays (crop k belongs to group g[k])
        g = np.repeat(np.arange(len(counts)), counts)
        self._group = g
        self._size = [sizes[i] for i in g]
        self._scale_lo = np.array([scales[i][0] for i in g])[:, None]
        self._scale_span = np.array([scales[i][1] - scales[i][0] for i in g])[:, None]
        lr = np.log(np.array([ratios[i] for i in g]))
        self._logr_lo = lr[:, :1]
        self._logr_span = lr[:, 1:] - lr[:, :1]
        self._ratio_lo = np.array([ratios[i][0] for i in g])
        self._ratio_hi = np.array([ratios[i][1] for i in g])
        self._flip_p = np.array([p.flip_p[i] for i in g])
        self._gray_p = np.array([p.gray_p[i] for i in g])
        self._blur_p = np.array([p.blur_p[i] for i in g])
        self._sig_lo = np.array([p.sigma[i][0] for i in g])
        self._sig_span = np.array([p.sigma[i][1] - p.sigma[i][0] for i in g])
        # colour-distortion strength per group: the warm-up's for the first epochs (set_epoch)
        self.color_strength, self.color_warmup_iters = p.strength, p.warmup_iters
        self.color_warmup_strength, self.color_warmup_schedule = p.warmup_strength, p.warmup_schedule
        self._jitter_p_groups = p.jitter_p
        self.set_epoch(0, 1)  # the warm-up's strength when there is one
        self._radius = [int(p.blur_kernel_frac * s) // 2 for s in self._size]
        # groups of equal output size, in order of first appearance
        self._size_groups: Dict[int, List[int]] = {}
        for k, s in enumerate(self._size):
            self._size_groups.setdefault(s, []).append(k)
        self._offset = self._inv = None
        if p.mean is not None:  # normalize: dataset
            m = torch.tensor(p.mean, dtype=torch.float32).view(1, 3, 1, 1)
            sd = torch.tensor(p.std, dtype=torch.float32).view(1, 3, 1, 1)
            self._offset = m * 255.0  # x_uint8 -> (x / 255 - mean) / std
            self._inv = 1.0 / (sd * 255.0)

    def _set_strength(self, strength: Sequence[float]) -> None:
        """Jitter probability and factor ranges per crop for a strength per group
        (torchvision ``ColorJitter(0.8s, 0.8s, 0.8s, 0.2s)``; s = 0: no jitter)."""
        g = self._group
        self._jit_p = np.array([self._jitter_p_groups[i] if strength[i] > 0 else 0.0 for i in g])
        st = np.array([strength[i] for i in g])
        lo = np.maximum(0.0, 1.0 - 0.8 * st)
        self._fac_lo = np.stack([lo, lo, lo, -0.2 * st], axis=1)
        self._fac_span = np.stack([1.0 + 0.8 * st - lo] * 3 + [0.4 * st], axis=1)
        self.current_color_strength = list(strength)

    def in_color_warmup(self, epoch: int, iters_per_epoch: int) -> bool:
        """Whether training epoch ``epoch`` (0-based) of ``iters_per_epoch`` iterations starts
        within the first ``color_warmup_iters`` iterations (so the warm-up lasts whole epochs:
        ``ceil(color_warmup_iters / iters_per_epoch)`` of them)."""
        return self.color_warmup_iters > 0 and _first_iteration(epoch, iters_per_epoch) < self.color_warmup_iters

    def set_epoch(self, epoch: int, iters_per_epoch: int) -> List[float]:
        """Use the colour-distortion strength of training epoch ``epoch`` (0-based) of
        ``iters_per_epoch`` iterations: while :meth:`in_color_warmup`,
        ``color_warmup_strength`` (``color_warmup_schedule: step``) or the ramp from it to
        ``color_strength`` at the epoch's first iteration (``linear``); then
        ``color_strength``.  Called by :class:`vissl_swav_plugin.hooks.color_warmup.ColorWarmupHook`
        before each epoch's data iterator is built (the state its workers get for that epoch,
        :meth:`epoch_state`); a transform
        used without it keeps the warm-up strength.  Returns the strength per group."""
        if not self.in_color_warmup(epoch, iters_per_epoch):
            self._set_strength(self.color_strength)
        elif self.color_warmup_schedule == WARMUP_LINEAR:
            f = _first_iteration(epoch, iters_per_epoch) / self.color_warmup_iters
            self._set_strength([w + (s - w) * f for w, s in zip(self.color_warmup_strength, self.color_strength)])
        else:
            self._set_strength(self.color_warmup_strength)
        return self.current_color_strength

    def epoch_state(self) -> List[float]:
        """What :meth:`set_epoch` changed: the colour-distortion strength per crop group.  The
        loader carries it to persistent worker processes
        (:mod:`vissl_swav_plugin.compat.persistent_workers`)."""
        return list(self.current_color_strength)

    def load_epoch_state(self, state: Sequence[float]) -> None:
        """Use the strength per crop group of :meth:`epoch_state` (in a loader worker)."""
        self._set_strength([float(s) for s in state])

    # -- sampling -------------------------------------------------------------------
    def _crop_boxes(self, width: int, height: int, u: np.ndarray) -> np.ndarray:
        """torchvision's ``RandomResizedCrop.get_params`` for every crop at once.

        Per crop, up to 10 tries of (area fraction, log aspect ratio); the first box that
        fits the image wins, placed uniformly at random.  If none fits, torchvision's
        fallback: the central crop with the aspect ratio clamped to the allowed range.

        Args:
            width, height: image size in pixels.
            u: uniform random numbers, ``[total_num_crops, _U_COUNT]``.

        Returns:
            ``[total_num_crops, 4]`` int boxes ``(left, top, right, bottom)``.
        """
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
        """All random choices for one image (exposed for tests / inspection).

        Args:
            width, height: image size in pixels.
            u: optional ``[total_num_crops, _U_COUNT]`` uniform numbers in [0, 1) (the
                layout is in the comment at the top of this module); drawn with
                ``np.random`` when omitted (VISSL seeds it per data-loader worker).

        Returns:
            A dict of per-crop arrays, one row per crop (large crops first):
            ``boxes`` ``[n, 4]`` crop boxes (left, top, right, bottom); ``flip``,
            ``jitter``, ``gray``, ``blur`` booleans; ``factors`` ``[n, 4]`` jitter
            factors (brightness, contrast, saturation, hue); ``order`` ``[n, 4]`` op
            order (a permutation of 0..3); ``sigma`` blur sigmas.
        """
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
    # SimCLR's blur of one crop, also reachable as ``t._blur(img, sigma, radius)``
    _blur = staticmethod(gaussian_blur)

    def _crop(self, img: Image.Image, k: int, box, jitter, factors, order, gray, blur, sigma):
        """Crop ``k``: crop + resize, colour distortion / grayscale, blur (not flipped yet)."""
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
        """All crops of one image.

        Args:
            image: a PIL image (converted to ``RGB`` if it is not).

        Returns:
            ``total_num_crops`` crops in group order: ``float32`` tensors ``[3, s, s]``
            (``to_tensor: true``) or ``RGB`` PIL images.

        Raises:
            TypeError: ``image`` is not a PIL image (e.g. a tensor from an earlier
                ``ToTensor``).
        """
        encoded = isinstance(image, EncodedImage)
        if not encoded and not isinstance(image, Image.Image):
            raise TypeError(
                f"{TRANSFORM_NAME} expects a PIL image (put it first in DATA.*.TRANSFORMS), "
                f"got {type(image).__name__}"
            )
        if not encoded and image.mode != "RGB":
            image = image.convert("RGB")
        p = self.sample_params(image.width, image.height)
        flips = p["flip"].tolist()
        if self.device_augment == DECODE_ON_DEVICE:
            return self._for_device_decode(image, p)
        if encoded:
            image, p = self._decode(image, p)
        if self.device_augment == "photometric":
            return self._geometric_only(image, p, flips)
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
            return to_rgb_crops(crops, flips)
        if self.device_augment == "normalize":
            return to_uint8_tensors(crops, flips, self._size_groups)
        return to_normalized_tensors(crops, flips, self._size_groups, self._offset, self._inv, self.min_std)

    def draft_reduction(self, boxes: np.ndarray) -> int:
        """The JPEG decode's reduction (1, 2, 4 or 8) for crop ``boxes`` ``[n, 4]`` with
        ``jpeg_draft``: the largest that leaves every box at least as many pixels as its output
        side in both directions (1 without ``jpeg_draft``)."""
        if not self.jpeg_draft:
            return 1
        side = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
        room = float(np.min(side / np.asarray(self._size)))
        return next((k for k in (8, 4, 2) if room >= k), 1)

    def _decode(self, image: EncodedImage, p):
        """An undecoded image decoded in the worker (with ``jpeg_draft`` at the reduction the
        crops allow) and the crop boxes in the decoded image's pixels."""
        rgb = image.decode(self.draft_reduction(p["boxes"]))
        if rgb.size != image.size:
            sx, sy = rgb.width / image.width, rgb.height / image.height
            p = {**p, "boxes": p["boxes"] * np.array([sx, sy, sx, sy])}
        return rgb, p

    def _for_device_decode(self, image, p) -> List[tuple]:
        """``device_augment: decode``: per crop, ``(image, parameter row)``, the same image object
        in every pair (:func:`vissl_swav_plugin.transforms.device_decode.image_source`) and the row of
        :func:`vissl_swav_plugin.transforms.device_decode.pack_decode_params`."""
        from vissl_swav_plugin.transforms.device_augment import pack_params
        from vissl_swav_plugin.transforms.device_decode import image_source, pack_decode_params

        photometric = pack_params(p["jitter"], p["factors"], p["order"], p["gray"], p["blur"], p["sigma"],
                                  self._radius)
        rows = pack_decode_params(p["boxes"], p["flip"], photometric)
        source = image_source(image)
        return [(source, row) for row in rows.unbind(0)]

    def _geometric_only(self, image: Image.Image, p, flips) -> List[tuple]:
        """``device_augment: photometric``: per crop, ``(uint8 [3, s, s] crop, parameter row)``:
        the crop resized and flipped, and its drawn photometric parameters
        (:func:`vissl_swav_plugin.transforms.device_augment.pack_params`)."""
        from vissl_swav_plugin.transforms.device_augment import pack_params

        boxes = map(tuple, p["boxes"].tolist())
        crops = [image.resize((self._size[k], self._size[k]), self.resample, box=box) for k, box in enumerate(boxes)]
        tensors = to_uint8_tensors(crops, flips, self._size_groups)
        params = pack_params(p["jitter"], p["factors"], p["order"], p["gray"], p["blur"], p["sigma"], self._radius)
        return list(zip(tensors, params.unbind(0)))

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "MultiCropPlugin":
        """Build the transform from its ``DATA.*.TRANSFORMS`` entry (Classy Vision's
        ``build_transform`` calls this).

        Args:
            config: ``{"name": "multicrop_plugin", "num_crops": ..., ...}``; ``name`` and
                ``indices`` are ignored, every other key is an ``__init__`` argument.

        Returns:
            The configured :class:`MultiCropPlugin`.

        Raises:
            MultiCropConfigError: an unknown key, a missing required key
                (``num_crops``, ``size_crops``, ``crop_scales``) or a wrong value; the
                message names the key.
        """
        return cls(**check_config_keys(config))


def _register_with_vissl():
    """Tell VISSL's SSLTransformsWrapper that this transform returns several copies
    (so the crops are flattened into the sample like ImgPilToMultiCrop's), and tell
    the plugin's config inference how many crops it makes."""
    from vissl.data.ssl_transforms import ssl_transforms_wrapper as w

    copies = w.DEFAULT_TRANSFORM_TYPES["TRANSFORMS_WITH_COPIES"]
    if TRANSFORM_NAME not in copies:
        copies.append(TRANSFORM_NAME)
    from vissl_swav_plugin.config.registries import register_crop_counter

    register_crop_counter(TRANSFORM_NAME)(lambda t: sum(int(v) for v in t["num_crops"]))


_register_with_vissl()
