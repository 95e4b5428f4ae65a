"""Every PIL image mode to an 8-bit RGB image with its real value range.

VISSL 0.1.6 (``DiskImageDataset``) and torchvision's ``ImageFolder`` loader turn every
image into RGB with ``PIL.Image.convert("RGB")``.  For 8-bit modes that is right; for the
others PIL *clips* to 0..255 instead of scaling: a 16-bit grayscale PNG (``I;16``, values
up to 65535) becomes all white, a float TIFF (``F``, values in [0, 1]) all black, and the
network trains on blank images without a word.  :func:`to_rgb` converts with the value
range of the mode (used by :mod:`.data_safety` for ``disk_folder`` and ``disk_filelist``):

==========================================  ============================================
mode                                        conversion
==========================================  ============================================
``1``, ``L``, ``P``, ``RGB``, ``RGBX``,     PIL's ``convert("RGB")`` (8 bits per channel:
``CMYK``, ``YCbCr``, ``LAB``, ``HSV``       already the real range)
``LA``, ``La``, ``PA``, ``RGBA``, ``RGBa``,  the colour channels; the alpha channel is
``P`` with transparency                     dropped (what VISSL and torchvision do), a
                                            premultiplied mode is un-premultiplied first
``I;16``, ``I;16L``, ``I;16B``, ``I;16N``   the type's full range: ``round(v / 257)``
                                            (65535 -> 255), gray to RGB
``I`` (32-bit integer)                      values in [0, 65535]: as 16-bit (``v / 257``;
                                            PIL used ``I`` for 16-bit PNGs); other values:
                                            min-max to 0..255 with a warning naming the file
``F`` (32-bit float)                        values in [0, 1]: ``x 255``; other values:
                                            min-max to 0..255 with a warning naming the file;
                                            NaN / inf: :class:`UnsupportedImageError`
multi-frame (animated GIF / PNG, multi-     the first frame, with a warning naming the file
page TIFF)                                  and the number of frames
anything else (e.g. ``BGR;16``)             :class:`UnsupportedImageError` naming the file
                                            and the mode
==========================================  ============================================

EXIF orientation (a camera's "rotate 90 degrees" tag) is not applied by default, as in the
official SwAV code (PIL through torchvision's ImageFolder): an image that carries one gets
a warning, once per process, naming the file and the option that applies it
(``VISSL_SWAV_PLUGIN_EXIF=apply``, read by :mod:`.data_safety`).

A fixed scale per mode (not a per-image stretch) keeps the brightness of the images of a
dataset comparable; a 12-bit sensor image stored as ``I;16`` is therefore dark (at most
4095 / 257 = 16), as it is in any viewer.  Each warning is given once per file and
process.  Example::

    from PIL import Image
    from vissl_swav_plugin.compat.image_modes import to_rgb
    rgb = to_rgb(Image.open("scan_16bit.png"), "scan_16bit.png")   # mode RGB, 0..255
"""
import logging

import numpy as np

logger = logging.getLogger(__name__)

EIGHT_BIT = ("1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "LA", "PA", "RGBA")
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
PREMULTIPLIED = {"La": "LA", "RGBa": "RGBA"}
_warned = set()  # (reason, path) already warned in this process


class UnsupportedImageError(ValueError):
    """An image whose mode or values have no defined RGB conversion; names the file.

    Attributes:
        path: the file; reason: what is wrong (the message without the file name).
    """

    def __init__(self, path, reason: str):
        super().__init__(f"image file {path}: {reason}")
        self.path, self.reason = path, reason


def _warn_once(kind: str, path, message: str) -> None:
    if (kind, str(path)) not in _warned:
        _warned.add((kind, str(path)))
        logger.warning(message)


def _gray_to_rgb(gray8: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.repeat(gray8[..., None], 3, axis=2), "RGB")


def _rescale(values: np.ndarray, low: float, high: float) -> np.ndarray:
    scaled = (values.astype(np.float64) - low) * (255.0 / (high - low)) if high > low else values * 0.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _min_max(values: np.ndarray, path, mode: str) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    _warn_once("range", path, (
        f"image file {path}: mode {mode} values span [{low:g}, {high:g}], outside the range this "
        f"mode is read with ({'[0, 1]' if mode == 'F' else '[0, 65535]'}); it is stretched min-max "
        "to 0..255 (brightness relative to this image only)"))
    return _rescale(values, low, high)


def _wide_to_rgb(img, path):
    """Modes I;16*, I and F: one channel of more than 8 bits."""
    values = np.asarray(img)
    if img.mode in SIXTEEN_BIT:
        return _gray_to_rgb(_rescale(values, 0.0, 65535.0))
    if img.mode == "I":
        if values.size and values.min() >= 0 and values.max() <= 65535:
            return _gray_to_rgb(_rescale(values, 0.0, 65535.0))
        return _gray_to_rgb(_min_max(values, path, "I"))
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise UnsupportedImageError(
            path, f"mode F (float) image holds {bad} NaN / inf value(s), which have no defined "
            "brightness")
    if values.size and values.min() >= 0.0 and values.max() <= 1.0:
        return _gray_to_rgb(_rescale(values, 0.0, 1.0))
    return _gray_to_rgb(_min_max(values, path, "F"))


def to_rgb(img, path=""):
    """Convert an open PIL image (any mode) to 8-bit RGB with its real value range.

    Args:
        img: a ``PIL.Image.Image`` as returned by ``Image.open`` (not yet loaded is fine).
        path: the file name, for warnings and errors.
    Returns:
        A ``PIL.Image.Image`` of mode ``RGB``.
    Raises:
        UnsupportedImageError: a mode without a defined conversion, or NaN / inf pixels.
    """
    frames = getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1
    if frames > 1:
        img.seek(0)
        _warn_once("frames", path, f"image file {path} has {frames} frames (animated or multi-page); "
                                   "only the first frame is used")
    mode = img.mode
    if mode == "RGB":
        img.load()
        return img
    if mode in PREMULTIPLIED:
        return img.convert(PREMULTIPLIED[mode]).convert("RGB")
    if mode == "P" and "transparency" in img.info:
        return img.convert("RGBA").convert("RGB")  # PIL warns if converted straight to RGB
    if mode in EIGHT_BIT:
        return img.convert("RGB")
    if mode in SIXTEEN_BIT or mode in ("I", "F"):
        return _wide_to_rgb(img, path)
    raise UnsupportedImageError(
        path, f"image mode {mode!r} has no defined conversion to RGB (supported: "
        f"{', '.join(EIGHT_BIT + tuple(PREMULTIPLIED) + SIXTEEN_BIT + ('I', 'F'))})")


EXIF_ORIENTATION_TAG = 0x0112
EXIF_POLICIES = ("ignore", "apply")
EXIF_ENV = "VISSL_SWAV_PLUGIN_EXIF"


def exif_orientation(img) -> int:
    """The EXIF orientation (1..8) of an open PIL image; 1 (upright) when it has none."""
    try:
        return int(img.getexif().get(EXIF_ORIENTATION_TAG, 1) or 1)
    except Exception:  # a damaged EXIF block: the pixels are still read as stored
        return 1


def _handle_exif(img, path, exif: str):
    orientation = exif_orientation(img)
    if orientation == 1:
        return img
    if exif == "apply":
        from PIL import ImageOps

        return ImageOps.exif_transpose(img)
    _warn_once("exif", "", (
        f"image file {path} carries EXIF orientation {orientation} (the camera's rotation / flip): "
        "it is read as stored, not rotated, as the official SwAV code and torchvision's ImageFolder "
        f"read it (warned once per process; other such images may follow). {EXIF_ENV}=apply rotates "
        "images by their EXIF orientation"))
    return img


def open_rgb(path, opener=open, exif: str = "ignore"):
    """Open ``path`` (``opener(path, "rb")``, e.g. iopath's ``g_pathmgr.open``) as RGB.

    Args:
        exif: ``"ignore"`` (default, as torchvision's loader: the pixels as stored; a
            warning, once per process, for an image with a non-identity EXIF orientation)
            or ``"apply"`` (``PIL.ImageOps.exif_transpose``: rotated / flipped upright).
    Returns:
        The image as :func:`to_rgb` converts it, fully decoded (the file is closed).
    """
    from PIL import Image

    with opener(path, "rb") as f:
        img = _handle_exif(Image.open(f), path, exif)
        rgb = to_rgb(img, path)
        rgb.load()
        return rgb


#: ``config.DATA.TRAIN.DEVICE_AUGMENT`` value whose workers send JPEG files undecoded
#: (:mod:`vissl_swav_plugin.transforms.device_decode`) and the ``multicrop_plugin`` key that decodes
#: JPEGs at a reduced size where every crop allows it: with either, :mod:`.data_safety` hands the
#: transform an :class:`EncodedImage` instead of a decoded image
DECODE_ON_DEVICE = "decode"
DRAFT_KEY = "jpeg_draft"
#: the JPEG modes that torchvision's ``decode_jpeg(..., mode=RGB)`` turns into PIL's RGB pixels
_DEVICE_JPEG_MODES = ("RGB", "L")


class EncodedImage:
    """An image file's bytes and pixel size, not decoded (its header only was read): what a
    loader worker hands to ``multicrop_plugin`` when the crops' parameters are drawn before the
    decode (the device decodes it, or the worker decodes it at the size the crops allow).

    Attributes:
        path: the file, for error messages.
        data: the file's bytes (a JPEG in RGB or grayscale).
        size: ``(width, height)`` in pixels, as ``PIL.Image.size``.
    """

    __slots__ = ("path", "data", "size")

    def __init__(self, path, data: bytes, size):
        self.path, self.data, self.size = str(path), data, (int(size[0]), int(size[1]))

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    def decode(self, reduce: int = 1):
        """The RGB image as :func:`open_rgb` gives it; ``reduce`` 2, 4 or 8: JPEG's reduced-size
        decode (PIL's ``draft``: the DCT scaled to about ``size / reduce``, much cheaper than a
        full decode; ``reduce`` 1: the full image)."""
        import io

        from PIL import Image

        img = Image.open(io.BytesIO(self.data))
        if reduce > 1:
            img.draft("RGB", (-(-self.width // reduce), -(-self.height // reduce)))
        rgb = to_rgb(img, self.path)
        rgb.load()
        return rgb

    def __repr__(self):
        return f"EncodedImage({self.path!r}, {len(self.data)} bytes, size={self.size})"


def open_encoded(path, opener=open, exif: str = "ignore"):
    """:func:`open_rgb`'s image, left encoded where it can be: an :class:`EncodedImage` for a JPEG
    in RGB or grayscale whose EXIF orientation needs nothing (``exif`` ``ignore``, or orientation
    1); any other file decoded by :func:`open_rgb`'s rules (a PIL RGB image).  Only the header
    is parsed for an encoded one, so a file whose body is damaged fails where it is decoded."""
    import io

    from PIL import Image

    with opener(path, "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data))
    if img.format == "JPEG" and img.mode in _DEVICE_JPEG_MODES:
        if exif_orientation(img) == 1 or exif != "apply":
            _handle_exif(img, path, exif)  # the warning of an orientation left as stored
            return EncodedImage(path, data, img.size)
    rgb = to_rgb(_handle_exif(img, path, exif), path)
    rgb.load()
    return rgb


def wants_encoded(cfg, split: str) -> bool:
    """Whether the ``split`` dataset of a composed VISSL config hands :class:`EncodedImage` to its
    transform: ``DEVICE_AUGMENT`` ``decode`` (TRAIN), or a ``multicrop_plugin`` with ``jpeg_draft``."""
    data = (cfg.get("DATA") or {}).get(split) or {}
    if split == "TRAIN" and data.get("DEVICE_AUGMENT") == DECODE_ON_DEVICE:
        return True
    return any(hasattr(t, "get") and t.get("name") == "multicrop_plugin" and t.get(DRAFT_KEY) is True
               for t in data.get("TRANSFORMS") or [])
