"""Readers of the image datasets ``swav-plugin-prepare-data`` turns into VISSL layouts, and
the class names each one gets.

Three kinds of source (``kind``), each read as splits of ``(images, labels)``:

* ``idx``: a folder of IDX files in the MNIST layout, ``{train,t10k}-images-idx3-ubyte[.gz]``
  and ``{train,t10k}-labels-idx1-ubyte[.gz]`` (MNIST, Fashion-MNIST, KMNIST, ...); "train"
  comes from ``train-*``, "val" from ``t10k-*``;
* ``npz``: a NumPy ``.npz`` file with arrays ``x``/``y`` or ``images``/``labels`` (one split,
  "train"), or ``x_train``/``y_train`` with ``x_test``/``y_test`` (or ``x_val``/``y_val``):
  "train" and "val"; images uint8 or float in [0, 1], ``[N, H, W]``, ``[N, H, W, C]`` or
  ``[N, C, H, W]``; labels optional (all 0 when absent); an optional ``class_names`` array;
* ``folder``: a folder of images, with class sub-folders (``root/<class>/**/<image>``, as
  torchvision's ImageFolder; the sorted folder names are the classes) or without (every
  image at the top level or below, one class ``unlabelled``); ``root/train`` and
  ``root/val`` (or ``root/test``) folders are read as those splits.

Class names (:func:`resolve_class_names`): ``--class-names`` (a comma list, or a text file
with one name per line) wins; else the source's own (folder names, an npz's
``class_names``); else the dataset preset's: Fashion-MNIST's ten names for ``fashion_mnist``
only, the digits ``0``-``9`` for ``mnist``; else the label numbers themselves.
Fashion-MNIST's names are never given to another dataset.
"""
import gzip
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

FASHION_MNIST_SOURCE = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = [
    "tshirt_top", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle_boot",
]
PRESETS = {"fashion_mnist": FASHION_MNIST_CLASSES, "mnist": [str(d) for d in range(10)]}
IDX_PREFIX = {"train": "train", "val": "t10k"}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
UNLABELLED = "unlabelled"


class DataToolError(RuntimeError):
    """Bad input (missing / corrupt source file, bad argument); the message names it."""


def read_idx(path) -> np.ndarray:
    """Read an IDX file (gzip'd or not).

    Args:
        path: the file (``.gz`` suffix: gzip).

    Returns:
        uint8 array: images ``[N, rows, cols]`` or labels ``[N]``.

    Raises:
        DataToolError: missing, truncated or not an unsigned-byte IDX file.
    """
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataToolError(f"IDX file not found: {path}") from None
    except (OSError, EOFError) as e:
        raise DataToolError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 8:
        raise DataToolError(f"IDX file {path} is truncated ({len(raw)} bytes)")
    magic = int.from_bytes(raw[0:4], "big")
    if magic not in (IMAGES_MAGIC, LABELS_MAGIC) or raw[2] != 8:
        raise DataToolError(f"{path} is not an unsigned-byte IDX file (magic {magic:#010x})")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(raw[3])]
    offset = 4 + 4 * len(dims)
    expected = int(np.prod(dims)) if dims else 0
    if len(raw) - offset != expected:
        raise DataToolError(
            f"IDX file {path} is corrupt: header says {dims} ({expected} bytes), "
            f"found {len(raw) - offset} bytes of data"
        )
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(dims)


def find_idx(source, split: str, kind: str, hint: str = "") -> Path:
    """The IDX file of ``split`` ('train' | 'val') and ``kind`` ('images-idx3' | 'labels-idx1')
    in ``source``, gzip'd or not; :class:`DataToolError` naming it (plus ``hint``) if absent."""
    base = f"{IDX_PREFIX[split]}-{kind}-ubyte"
    candidates = [Path(source) / f"{base}.gz", Path(source) / base]
    for c in candidates:
        if c.is_file():
            return c
    raise DataToolError(f"IDX source file not found: {candidates[0]} (nor {candidates[1].name}){hint}")


def find_idx_split(source, split: str, hint: str = "") -> Tuple[Path, Path]:
    """(images file, labels file) of an IDX split, found by :func:`find_idx` (images first)."""
    return find_idx(source, split, "images-idx3", hint), find_idx(source, split, "labels-idx1", hint)


def load_idx_split(source, split: str, num_classes: Optional[int] = None, hint: str = ""):
    """(images uint8 [N, H, W], labels int64 [N]) of an IDX split; labels must lie in
    ``0..num_classes-1`` when ``num_classes`` is given."""
    return read_idx_split(*find_idx_split(source, split, hint), num_classes)


def read_idx_split(ipath, lpath, num_classes: Optional[int] = None):
    """:func:`load_idx_split` for files already found (:func:`find_idx_split`): each file is
    read once, then the images must be 3-D, one label per image, labels in
    ``0..num_classes-1`` when ``num_classes`` is given."""
    images, labels = read_idx(ipath), read_idx(lpath).astype(np.int64)
    if images.ndim != 3:
        raise DataToolError(f"{ipath}: expected 3-D image data, got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataToolError(f"{lpath}: {labels.shape} labels do not match the {len(images)} images of {ipath}")
    if num_classes is not None and labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataToolError(f"{lpath}: labels outside 0..{num_classes - 1}")
    return images, labels


def as_uint8_images(arr: np.ndarray, what: str) -> np.ndarray:
    """Images as uint8 ``[N, H, W]`` or ``[N, H, W, C]`` (C 1/3/4): floats in [0, 1] are
    scaled by 255, channels-first arrays transposed; :class:`DataToolError` otherwise."""
    arr = np.asarray(arr)
    if arr.ndim == 4 and arr.shape[1] in (1, 3, 4) and arr.shape[3] not in (1, 3, 4):
        arr = arr.transpose(0, 2, 3, 1)
    if arr.ndim == 4 and arr.shape[3] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (3, 4) or (arr.ndim == 4 and arr.shape[3] not in (3, 4)):
        raise DataToolError(f"{what}: expected images [N, H, W(, C)], got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return arr
    if np.issubdtype(arr.dtype, np.floating) and arr.size and arr.min() >= 0 and arr.max() <= 1:
        return np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8)
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise DataToolError(f"{what}: {arr.dtype} values outside [0, 255] (and not floats in [0, 1])")
    return arr.astype(np.uint8)


def load_npz(path) -> Tuple[Dict[str, tuple], Optional[List[str]]]:
    """Splits ``{"train": (images, labels), ["val": ...]}`` and the ``class_names`` of an npz."""
    path = Path(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataToolError(f"cannot read {path} as a NumPy .npz file: {e}") from None
    keys = set(data.files)
    layouts = {"train": [("x_train", "y_train"), ("x", "y"), ("images", "labels")],
               "val": [("x_test", "y_test"), ("x_val", "y_val")]}
    splits = {}
    for split, pairs in layouts.items():
        for xk, yk in pairs:
            if xk in keys:
                images = as_uint8_images(data[xk], f"{path}:{xk}")
                labels = data[yk].astype(np.int64).reshape(-1) if yk in keys else np.zeros(len(images), np.int64)
                if len(labels) != len(images):
                    raise DataToolError(f"{path}: {len(labels)} labels in {yk} for {len(images)} images in {xk}")
                splits[split] = (images, labels)
                break
    if "train" not in splits:
        raise DataToolError(f"{path}: no image array (x, images or x_train) among {sorted(keys)}")
    names = [str(n) for n in data["class_names"].tolist()] if "class_names" in keys else None
    return splits, names


def _images_under(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def scan_folder(root) -> Tuple[Dict[str, tuple], Optional[List[str]]]:
    """Splits ``{split: (paths, labels)}`` and class names of an image folder (see the
    module docstring); :class:`DataToolError` for a missing or empty folder."""
    root = Path(root)
    if not root.is_dir():
        raise DataToolError(f"image folder not found: {root}")
    named = {d.name: d for d in root.iterdir() if d.is_dir()}
    val_dir = named.get("val") or named.get("test")
    split_dirs = {"train": named["train"], "val": val_dir} if "train" in named and val_dir else {"train": root}
    classes = sorted({d.name for s in split_dirs.values() for d in s.iterdir() if d.is_dir() and _images_under(d)})
    splits = {}
    for split, sdir in split_dirs.items():
        if classes:
            loose = [p for p in sdir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
            if loose:
                raise DataToolError(f"{sdir} mixes images ({loose[0].name}, ...) with class folders; "
                                    "move them into a class folder")
            pairs = [(p, c) for c, name in enumerate(classes) if (sdir / name).is_dir()
                     for p in _images_under(sdir / name)]
        else:
            pairs = [(p, 0) for p in _images_under(sdir)]
        if not pairs:
            raise DataToolError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found in {sdir}")
        splits[split] = ([p for p, _ in pairs], np.array([c for _, c in pairs], np.int64))
    return splits, (classes or None)


def read_class_names(value: Optional[str]) -> Optional[List[str]]:
    """``--class-names``: a comma list, or the path of a text file with one name per line."""
    if not value:
        return None
    path = Path(value)
    if path.is_file():
        names = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    else:
        names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise DataToolError(f"--class-names {value!r}: no names")
    return names


def resolve_class_names(num_labels: int, given: Optional[Sequence[str]] = None,
                        source_names: Optional[Sequence[str]] = None, dataset: Optional[str] = None,
                        unlabelled: bool = False) -> List[str]:
    """The class names of a dataset whose labels are ``0..num_labels-1``.

    Args:
        num_labels: 1 + the largest label present (at least the number of names needed).
        given: names from ``--class-names`` (win).
        source_names: the source's own (folder names, an npz's ``class_names``).
        dataset: a preset name (``fashion_mnist``, ``mnist``) or None.
        unlabelled: the source has no labels (a single class ``unlabelled``).

    Returns:
        The names, one per label (at least ``num_labels``).

    Raises:
        DataToolError: fewer names than labels, or an unknown preset.
    """
    if dataset is not None and dataset not in PRESETS:
        raise DataToolError(f"--dataset: unknown dataset {dataset!r}; use one of {sorted(PRESETS)} or omit it")
    for names, origin in ((given, "--class-names"), (source_names, "the source"),
                          (PRESETS.get(dataset), f"--dataset {dataset}")):
        if names:
            if len(names) < num_labels:
                raise DataToolError(f"{origin} gives {len(names)} class names for labels 0..{num_labels - 1}")
            return [str(n) for n in names]
    if unlabelled:
        return [UNLABELLED]
    return [str(i) for i in range(num_labels)]
