"""Clear errors for bad image data in VISSL's ``disk_folder`` / ``disk_filelist`` datasets.

Compat patch ``shim_bad_image_errors`` (see :mod:`vissl_swav_plugin.compat`), applied
when the plugin registers (every process that imports ``vissl``, DataLoader workers
started with spawn/forkserver included).  What breaks in VISSL 0.1.6 and the fix:

Unreadable images (corrupt or truncated JPEG/PNG, a non-image file with an image
extension, an empty file)
    VISSL 0.1.6's ``DiskImageDataset.__getitem__`` either crashes with PIL's bare message
    (``disk_folder``: ``OSError: image file is truncated``, ``struct.error: unpack_from
    requires a buffer ...`` -- the image is decoded once *outside* VISSL's try block, to
    get its path, and a second time inside it, so every image is decoded twice) or
    (``disk_filelist``) logs a warning and silently trains on a 224 px gray image (or,
    with ``DATA.<split>.ENABLE_QUEUE_DATASET``, on a copy of an earlier image).  Now
    (default) the item raises :class:`BadImageError` naming the file, the dataset and the
    reason; in a DataLoader worker PyTorch re-raises it in the training process with that
    message.  ``disk_folder`` images are decoded once.
    ``VISSL_SWAV_PLUGIN_BAD_IMAGES=substitute`` gives VISSL's documented fallback for both
    sources instead (warning naming the file + substitute image, ``data_valid`` -1);
    ``VISSL_SWAV_PLUGIN_BAD_IMAGES=vissl`` runs VISSL's own ``__getitem__`` unchanged.  The
    setting is read when the dataset is built (and travels with it to the workers).

Image modes (16-bit, float, CMYK, palette, alpha, multi-frame, ...)
    VISSL's loaders convert every image with ``PIL.Image.convert("RGB")``, which clips
    instead of scaling: a 16-bit grayscale PNG becomes all white, a float TIFF all black.
    Every image is now converted by :func:`.image_modes.to_rgb` (the table there: 16-bit
    scaled by its full range, float [0, 1] x 255, out-of-range values stretched with a
    warning naming the file, the first frame of a multi-frame file with a warning, alpha
    dropped); a mode without a defined conversion or a float image with NaN / inf is a
    :class:`BadImageError` naming the file.

Images read undecoded
    With ``config.DATA.TRAIN.DEVICE_AUGMENT=decode`` or a ``multicrop_plugin`` with ``jpeg_draft``
    (:func:`.image_modes.wants_encoded`), a JPEG in RGB or grayscale is handed to the transform as
    an :class:`.image_modes.EncodedImage` (its bytes and its header's size): a damaged header fails
    here as above; a damaged body fails where it is decoded (the transform's reduced decode in the
    worker, or the device's decode, which names the file with :func:`bad_image_error`).

EXIF orientation
    Not applied (as the official SwAV code and torchvision's loader): an image carrying a
    non-identity orientation gets a warning, once per process, naming the file and
    ``VISSL_SWAV_PLUGIN_EXIF=apply``, which rotates images upright
    (``PIL.ImageOps.exif_transpose``); read when the dataset is built.

Missing or empty dataset folders
    VISSL raised ``AssertionError: Directory ... does not exist`` or torchvision's
    ``FileNotFoundError: Found no valid file for the classes class0`` (no path);
    :class:`DatasetError` now names the config key (``config.DATA.TRAIN.DATA_PATHS``),
    the source and the path.
"""
import logging
import os

from vissl_swav_plugin.compat.engine import original, patch, register
from vissl_swav_plugin.compat.image_modes import EXIF_ENV, EXIF_POLICIES, open_encoded, open_rgb, wants_encoded

BAD_IMAGES_ENV = "VISSL_SWAV_PLUGIN_BAD_IMAGES"
_originals = {}  # attribute -> VISSL's DiskImageDataset method before our patch


class BadImageError(RuntimeError):
    """An image file of the dataset cannot be decoded; the message names the file."""


class DatasetError(ValueError):
    """The dataset path of the config is missing or holds no images; names key and path."""


POLICIES = ("error", "substitute", "vissl")


def bad_image_policy() -> str:
    """``VISSL_SWAV_PLUGIN_BAD_IMAGES`` (``error`` default, ``substitute`` or ``vissl``)."""
    value = os.environ.get(BAD_IMAGES_ENV, "error").strip().lower() or "error"
    if value not in POLICIES:
        raise ValueError(f"{BAD_IMAGES_ENV}={value!r}: use one of {', '.join(POLICIES)}")
    return value


def exif_policy() -> str:
    """``VISSL_SWAV_PLUGIN_EXIF``: ``ignore`` (default, as the official code: pixels as
    stored, a warning for an image with an EXIF orientation) or ``apply`` (rotated upright
    with ``PIL.ImageOps.exif_transpose``)."""
    value = os.environ.get(EXIF_ENV, "ignore").strip().lower() or "ignore"
    if value not in EXIF_POLICIES:
        raise ValueError(f"{EXIF_ENV}={value!r}: use one of {', '.join(EXIF_POLICIES)}")
    return value


def _policy(ds) -> str:
    # fixed when the dataset is built (in the training process; workers get it pickled)
    return getattr(ds, "_vissl_swav_plugin_bad_images", None) or bad_image_policy()


def _image_path(ds, idx):
    if ds.data_source == "disk_folder":
        return ds.image_dataset.samples[idx][0]
    path = ds.image_dataset[idx]
    return ds._replace_img_path_prefix(path, replace_prefix=ds._remove_prefix, new_prefix=ds._new_prefix)


def _init(self, cfg, data_source, path, split, dataset_name):
    try:
        _originals["__init__"](self, cfg, data_source, path, split, dataset_name)
    except (AssertionError, FileNotFoundError, NotADirectoryError) as e:
        key = f"config.DATA.{split}.DATA_PATHS"
        if not os.path.exists(str(path)):
            problem = "does not exist"
        elif data_source == "disk_folder" and os.path.isdir(str(path)):
            problem = (f"holds no images in class sub-folders (torchvision ImageFolder layout "
                       f"<path>/<class>/<image>): {e}")
        else:
            problem = f"cannot be used: {e}"
        raise DatasetError(f"{key}: {data_source} path {path} (dataset {dataset_name}) {problem}") from e
    self._vissl_swav_plugin_bad_images = bad_image_policy()
    self._vissl_swav_plugin_exif = exif_policy()
    # the transform draws the crops before the decode (image_modes.wants_encoded)
    self._vissl_swav_plugin_encoded = wants_encoded(cfg, split)
    if self._vissl_swav_plugin_bad_images == "error" and getattr(self, "enable_queue_dataset", False):
        # a failure raises, so there is nothing to substitute from the queue
        self.enable_queue_dataset = False


def bad_image_error(path, idx, dataset_name, split, reason) -> BadImageError:
    """The error of an image file that cannot be decoded, naming the file, its index, the dataset
    and the split (also raised where ``DEVICE_AUGMENT=decode`` decodes on the device)."""
    return BadImageError(
        f"cannot read image file {path} (index {idx} of dataset {dataset_name}, "
        f"config.DATA.{split}): {reason}. Remove or replace the file, or set "
        f"{BAD_IMAGES_ENV}=substitute to train on VISSL's gray substitute image instead"
    )


def _bad_image_error(ds, idx, path, reason):
    return bad_image_error(path, idx, ds.dataset_name, ds.split, reason)


def _substitute(ds, path, exc):
    """VISSL's documented fallback: a seen image from the queue, else a gray image."""
    from vissl.data.data_helper import get_mean_image

    logging.warning(f"Couldn't load: {path}. Exception: \n{exc}")
    img, ok = (ds.on_failure() if ds.enable_queue_dataset else (None, False))
    if img is None:
        img = get_mean_image(ds.cfg["DATA"][ds.split].DEFAULT_GRAY_IMG_SIZE)
    return img, ok


def _getitem_checked(self, idx):
    """Both sources: the image is decoded once and converted to RGB with its real value
    range (:func:`.image_modes.to_rgb`); a failure follows the bad-image policy.

    VISSL 0.1.6 ``disk_folder`` reads ``self.image_dataset[idx]`` (which decodes the image)
    *outside* its try block to get a path, then decodes it a second time inside: every
    image is decoded twice and a bad one crashes with PIL's message (``image file is
    truncated``, ``struct.error``, ...) instead of reaching VISSL's fallback.  Both
    sources convert with ``convert("RGB")``, which clips 16-bit and float images."""
    from iopath.common.file_io import g_pathmgr

    if not self.is_initialized:
        self._load_data(self._path)
        self.is_initialized = True
    if not self.queue_init and self.enable_queue_dataset:
        self._init_queues()
    path = _image_path(self, idx)
    try:
        exif = getattr(self, "_vissl_swav_plugin_exif", None) or exif_policy()
        opener = open_encoded if getattr(self, "_vissl_swav_plugin_encoded", False) else open_rgb
        img = opener(path, g_pathmgr.open, exif)
    except Exception as e:
        if _policy(self) == "error":
            text = getattr(e, "reason", None) or (str(e).strip().splitlines() or [""])[0]
            raise _bad_image_error(self, idx, path, f"{type(e).__name__}: {text}" if text else
                                   type(e).__name__) from e
        return _substitute(self, path, e)
    if self.enable_queue_dataset:
        self.on_sucess(img)
    return img, True


def _getitem(self, idx):
    if _policy(self) == "vissl":
        return _originals["__getitem__"](self, idx)
    return _getitem_checked(self, idx)


@register
def shim_bad_image_errors():
    """vissl/data/disk_dataset.py, DiskImageDataset.__init__ (bare AssertionError /
    FileNotFoundError for a bad DATA_PATHS) and __getitem__ (see the module docstring).
    """
    from vissl.data.disk_dataset import DiskImageDataset

    for attr, replacement in (("__init__", _init), ("__getitem__", _getitem)):
        patch("shim_bad_image_errors", DiskImageDataset, attr, replacement)
        _originals[attr] = original("shim_bad_image_errors", DiskImageDataset, attr)
