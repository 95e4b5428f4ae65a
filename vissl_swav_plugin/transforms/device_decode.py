"""``config.DATA.TRAIN.DEVICE_AUGMENT=decode``: the loader workers read files and draw parameters,
the training device does the rest.

What a worker does per image: read the file's bytes, parse its header for the size, draw every
crop's parameters with ``multicrop_plugin`` itself (:meth:`MultiCropPlugin.sample_params`: the
distributions, the colour warm-up and the random stream are those of ``off``), and send the
bytes with one parameter row per crop (:data:`NUM_DECODE_PARAMS` float64 numbers: the crop box
``left, top, right, bottom`` in the image's pixels, the flip, then the photometric row of
:func:`.device_augment.pack_params`).  A file that is not a JPEG in RGB or grayscale (a PNG, a
CMYK JPEG, a 16-bit image, ...), one that ``VISSL_SWAV_PLUGIN_EXIF=apply`` must rotate, or an
image from a source that yields decoded images, is decoded by the worker as today
(:func:`vissl_swav_plugin.compat.image_modes.open_encoded`) and sent as ``uint8`` pixels instead.

What the device does per batch (:class:`DeviceDecoder`, called by the train step of
:mod:`.device_step`): decode the JPEGs (``torchvision.io.decode_jpeg``: nvJPEG on CUDA, one
call for the batch, its inverse DCT not yet compared with libjpeg's on a card; libjpeg-turbo on
a CPU, the same pixels as PIL's decoder), crop and resize every crop with PIL's own resampling
arithmetic (:mod:`.pil_resample`: the workers' crops bit for bit), flip, then the photometric ops, the normalisation and the
batching per crop size as ``photometric`` does (:class:`.device_augment.DeviceAugmenter`).

A file that cannot be decoded is named as the workers name it
(:func:`vissl_swav_plugin.compat.data_safety.bad_image_error`: file, index, dataset, split), in the
training process; with ``VISSL_SWAV_PLUGIN_BAD_IMAGES=substitute`` its crops are VISSL's gray
substitute (level 128, the mean image every crop of which is gray) and its ``data_valid`` is -1,
with VISSL's warning naming the file.
"""
import logging
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from vissl_swav_plugin.compat.data_safety import bad_image_error, bad_image_policy
from vissl_swav_plugin.compat.image_modes import EncodedImage
from vissl_swav_plugin.transforms.device_augment import NUM_PARAMS
from vissl_swav_plugin.transforms.multicrop_config import DECODE_COLLATOR
from vissl_swav_plugin.transforms.pil_resample import resize_boxes

__all__ = ["D_BOX", "D_FLIP", "D_PHOTOMETRIC", "NUM_DECODE_PARAMS", "ENCODED_KEY", "PARAMS_KEY", "pack_decode_params",
           "image_source", "multicrop_decode_collator", "DeviceDecoder"]

D_BOX = slice(0, 4)
D_FLIP = 4
D_PHOTOMETRIC = slice(5, 5 + NUM_PARAMS)
NUM_DECODE_PARAMS = 5 + NUM_PARAMS
#: the batch key of the images (one per sample: an :class:`EncodedImage` or ``uint8 [3, H, W]`` pixels)
ENCODED_KEY = "encoded_images"
#: the batch key of the crops' parameter rows (``photometric`` and ``decode``)
PARAMS_KEY = "crop_params"
_GRAY = 128  # VISSL's substitute image (vissl.data.data_helper.get_mean_image)


def pack_decode_params(boxes, flips, photometric: torch.Tensor) -> torch.Tensor:
    """The ``[n, NUM_DECODE_PARAMS]`` float64 rows of ``n`` crops: boxes ``[n, 4]``, flips ``[n]``,
    the photometric rows ``[n, NUM_PARAMS]`` of :func:`.device_augment.pack_params`."""
    out = torch.empty((len(flips), NUM_DECODE_PARAMS), dtype=torch.float64)
    out[:, D_BOX] = torch.as_tensor(np.asarray(boxes), dtype=torch.float64)
    out[:, D_FLIP] = torch.as_tensor(np.asarray(flips), dtype=torch.float64)
    out[:, D_PHOTOMETRIC] = photometric
    return out


def image_source(image):
    """What a worker sends for one image: the :class:`EncodedImage` itself, or a decoded PIL
    image's pixels as ``uint8 [3, H, W]``."""
    if isinstance(image, EncodedImage):
        return image
    return torch.from_numpy(np.array(image.convert("RGB") if image.mode != "RGB" else image)).permute(2, 0, 1)


def multicrop_decode_collator(batch: List[Dict[str, Any]]) -> Dict[str, Any]:
    """VISSL's ``multicrop_collator`` for samples whose crops are ``(image, parameter row)`` pairs
    (``DEVICE_AUGMENT=decode``): labels, ``data_valid`` and ``data_idx`` as it collates them;
    ``crop_params`` ``[positions, N, NUM_DECODE_PARAMS]``; the images once per sample under
    :data:`ENCODED_KEY`; ``data`` is empty until the device fills it."""
    from vissl.data.collators.multicrop_collator import multicrop_collator

    rows, images = [], []
    for sample in batch:
        crops = sample["data"]
        if not crops or not all(isinstance(c, (tuple, list)) and len(c) == 2 for c in crops):
            raise TypeError(f"{DECODE_COLLATOR}: each crop must be an (image, parameters) pair "
                            "(multicrop_plugin with device_augment: decode)")
        rows.append({**sample, "data": [c[1] for c in crops]})
        images.append(crops[0][0])
    out = multicrop_collator(rows)
    out[PARAMS_KEY] = [torch.stack(out["data"][0])]  # [positions, N, NUM_DECODE_PARAMS]
    out["data"] = [[]]
    out[ENCODED_KEY] = [images]
    return out


def _to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _reason(e: Exception) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class DeviceDecoder:
    """The device side of ``DEVICE_AUGMENT=decode`` before the photometric ops: images ->
    ``uint8`` crops, one ``[N, 3, s, s]`` tensor per crop position.

    Args:
        sizes: the output side of each crop position (``multicrop_plugin``'s crop order).
        interpolation: the transform's ``interpolation`` (:data:`.pil_resample.FILTERS`).
        dataset_name: for the error naming a bad file.
    """

    def __init__(self, sizes: Sequence[int], interpolation: str = "bilinear", dataset_name: str = ""):
        self.sizes = [int(s) for s in sizes]
        self.interpolation = interpolation
        self.dataset_name = dataset_name

    def decode(self, images: Sequence[Any], device, data_idx: Optional[Sequence[int]] = None):
        """``[3, H, W]`` uint8 tensors on ``device``, and the indices of images substituted by the
        gray image (``VISSL_SWAV_PLUGIN_BAD_IMAGES=substitute``)."""
        device = torch.device(device)
        out: List[Optional[torch.Tensor]] = [None] * len(images)
        jpegs = [i for i, im in enumerate(images) if isinstance(im, EncodedImage)]
        for i, im in enumerate(images):
            if i not in jpegs:
                out[i] = im.to(device, non_blocking=True)
        bad = {}
        if jpegs:
            from torchvision.io import ImageReadMode, decode_jpeg

            data = [_to_tensor(images[i].data) for i in jpegs]
            try:
                decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:  # one damaged file fails the call: find it
                decoded = []
                for i, d in zip(jpegs, data):
                    try:
                        decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                    except RuntimeError as e:
                        decoded.append(None)
                        bad[i] = _reason(e)
            for i, img in zip(jpegs, decoded):
                if img is not None and tuple(img.shape[1:]) != (images[i].height, images[i].width):
                    bad[i] = (f"decoded as {img.shape[2]}x{img.shape[1]} pixels, its header says "
                              f"{images[i].width}x{images[i].height}")
                    img = None
                out[i] = img
        if bad:
            policy = bad_image_policy()
            for i, reason in bad.items():
                idx = data_idx[i] if data_idx is not None else i
                if policy != "substitute":
                    raise bad_image_error(images[i].path, idx, self.dataset_name, "TRAIN", reason)
                logging.warning(f"Couldn't load: {images[i].path}. Exception: \n{reason}")
                out[i] = torch.full((3, images[i].height, images[i].width), _GRAY, dtype=torch.uint8, device=device)
        return out, sorted(bad)

    def __call__(self, images: Sequence[Any], params: torch.Tensor, device,
                 data_idx: Optional[Sequence[int]] = None):
        """``(crops, photometric, substituted)``: one uint8 ``[N, 3, s, s]`` tensor per position,
        the photometric rows ``[positions, N, NUM_PARAMS]`` (on the host) and the indices of the
        substituted images.  ``params`` ``[positions, N, NUM_DECODE_PARAMS]``."""
        params = params.detach().to("cpu", torch.float64)
        if params.shape[0] != len(self.sizes):
            raise ValueError(f"the batch has {params.shape[0]} crop positions, multicrop_plugin makes {len(self.sizes)}")
        decoded, substituted = self.decode(images, device, data_idx)
        n = len(images)
        crops: List[Optional[torch.Tensor]] = [None] * len(self.sizes)
        by_size: Dict[int, List[int]] = {}
        for pos, s in enumerate(self.sizes):
            by_size.setdefault(s, []).append(pos)
        for s, positions in by_size.items():  # one resize call per crop size
            owners = [i for _ in positions for i in range(n)]
            boxes = [tuple(int(v) for v in params[pos, i, D_BOX].tolist()) for pos in positions for i in range(n)]
            flips = torch.cat([params[pos, :, D_FLIP] > 0.5 for pos in positions]).to(decoded[0].device)
            res = resize_boxes(decoded, owners, boxes, s, self.interpolation)
            res = torch.where(flips.view(-1, 1, 1, 1), res.flip(-1), res)
            for k, pos in enumerate(positions):
                crops[pos] = res[k * n:(k + 1) * n]
        return crops, params[:, :, D_PHOTOMETRIC], substituted
