#!/usr/bin/env python
"""Turn Fashion-MNIST (IDX files) into VISSL's ``disk_folder`` / ``disk_filelist`` layouts.

Source: the Debian package ``dataset-fashion-mnist`` (``apt-get install -y
dataset-fashion-mnist``), files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` in
``/usr/share/datasets/fashion-mnist/`` (gzip'd or plain IDX files are both accepted).

Output (``--out DIR``)::

    DIR/train/<label>_<name>/<index>.png    disk_folder (torchvision ImageFolder) layout;
    DIR/val/<label>_<name>/<index>.png      the class folders sort in label order, so the
                                            ImageFolder ids are the Fashion-MNIST labels and
                                            <index> is the image's index in the IDX file
    DIR/filelist/{train,val}_images.npy     disk_filelist: absolute paths of those PNGs
    DIR/filelist/{train,val}_labels.npy     and their labels (int64)
    DIR/dataset_catalog.json                VISSL dataset catalog entries
                                            <name>_folder and <name>_filelist

"train" comes from the IDX training files and "val" from the t10k (test) files (VISSL's
``DATA.TEST`` reads the "val" split of a catalog entry).

Use in VISSL either through the catalog::

    export VISSL_DATASET_CATALOG_PATH=DIR/dataset_catalog.json
    ... config.DATA.TRAIN.DATA_SOURCES=[disk_folder] config.DATA.TRAIN.LABEL_SOURCES=[disk_folder]
        config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]

or with explicit paths (no catalog needed; VISSL needs LABEL_PATHS too)::

    ... config.DATA.TRAIN.DATA_SOURCES=[disk_folder] config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]
        config.DATA.TRAIN.DATA_PATHS=[DIR/train] config.DATA.TRAIN.LABEL_PATHS=[DIR/train]

usage: python tools/prepare_fashion_mnist.py --out DIR [--split train,val] [--limit-per-class N]
           [--size 32] [--rgb] [--format folder,filelist] [--catalog PATH] [--name fashion_mnist]

Re-running with the same arguments is a no-op ("up to date"); with other arguments the
splits this tool wrote before are replaced.  A non-empty split folder it did not write
is never touched (``--force`` replaces it).
"""
import argparse
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = [
    "tshirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
]
SPLIT_PREFIX = {"train": "train", "val": "t10k"}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
MARKER = ".prepare_fashion_mnist.json"
FORMATS = ("folder", "filelist")


class DataToolError(RuntimeError):
    """Bad input (missing / corrupt source file, bad argument); the message names it."""


def class_dir_name(label: int) -> str:
    return f"{label}_{CLASS_NAMES[label]}"


def _find_source(source: Path, split: str, kind: str) -> Path:
    base = f"{SPLIT_PREFIX[split]}-{kind}-ubyte"
    candidates = [source / f"{base}.gz", source / base]
    for c in candidates:
        if c.is_file():
            return c
    raise DataToolError(
        f"Fashion-MNIST source file not found: {candidates[0]} (nor {candidates[1].name}); "
        "install the Debian package dataset-fashion-mnist (apt-get install -y "
        "dataset-fashion-mnist) or pass --source DIR"
    )


def read_idx(path) -> np.ndarray:
    """Read an IDX file (gzip'd or not): uint8 images (N, rows, cols) or labels (N,)."""
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
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) if dims else 0
    if len(raw) - offset != expected:
        raise DataToolError(
            f"IDX file {path} is corrupt: header says {dims} ({expected} bytes), "
            f"found {len(raw) - offset} bytes of data"
        )
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(dims)


def load_split(source, split: str):
    """(images uint8 [N, 28, 28], labels int64 [N]) of a split ('train' | 'val')."""
    source = Path(source)
    ipath = _find_source(source, split, "images-idx3")
    lpath = _find_source(source, split, "labels-idx1")
    images = read_idx(ipath)
    labels = read_idx(lpath).astype(np.int64)
    if images.ndim != 3:
        raise DataToolError(f"{ipath}: expected 3-D image data, got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataToolError(
            f"{lpath}: {labels.shape} labels do not match the {len(images)} images of {ipath}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASS_NAMES)):
        raise DataToolError(f"{lpath}: labels outside 0..{len(CLASS_NAMES) - 1}")
    return images, labels


def select_indices(labels: np.ndarray, limit_per_class=None) -> np.ndarray:
    """Indices kept: the first ``limit_per_class`` images of each class, in file order."""
    if limit_per_class is None:
        return np.arange(len(labels))
    keep = []
    for c in range(len(CLASS_NAMES)):
        keep.append(np.nonzero(labels == c)[0][:limit_per_class])
    return np.sort(np.concatenate(keep))


def _settings(args_dict):
    return {k: args_dict[k] for k in ("source", "limit_per_class", "size", "rgb", "formats")}


def _write_split(images, labels, keep, split_dir: Path, size, rgb):
    from PIL import Image

    paths = []
    for c in range(len(CLASS_NAMES)):
        (split_dir / class_dir_name(c)).mkdir(parents=True, exist_ok=True)
    width = max(5, len(str(len(labels))))
    for i in keep.tolist():
        im = Image.fromarray(images[i], mode="L")
        if size and size != im.width:
            im = im.resize((size, size), Image.BICUBIC)
        if rgb:
            im = im.convert("RGB")
        p = split_dir / class_dir_name(int(labels[i])) / f"{i:0{width}d}.png"
        im.save(p)
        paths.append(str(p.resolve()))
    return paths


def update_catalog(catalog_path: Path, entries: dict):
    """Merge ``entries`` ({name: {split: [data, labels]}}) into a VISSL catalog json."""
    data = {}
    if catalog_path.exists():
        try:
            data = json.loads(catalog_path.read_text())
        except json.JSONDecodeError as e:
            raise DataToolError(f"dataset catalog {catalog_path} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise DataToolError(f"dataset catalog {catalog_path} must hold a JSON object")
    for name, splits in entries.items():
        cur = data.get(name) if isinstance(data.get(name), dict) else {}
        cur.update(splits)
        for s in ("train", "val"):
            cur.setdefault(s, [])
        data[name] = cur
    catalog_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = catalog_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, catalog_path)
    return data


def prepare(
    out,
    source=DEFAULT_SOURCE,
    splits=("train", "val"),
    limit_per_class=None,
    size=None,
    rgb=False,
    formats=FORMATS,
    catalog=None,
    name="fashion_mnist",
    force=False,
    verbose=True,
):
    """Write the requested splits under ``out``; returns a summary dict."""
    out = Path(out).resolve()
    source = Path(source)
    splits = list(dict.fromkeys(splits))
    for s in splits:
        if s not in SPLIT_PREFIX:
            raise DataToolError(f"--split: unknown split {s!r}; use train and/or val")
    formats = list(dict.fromkeys(formats))
    for f in formats:
        if f not in FORMATS:
            raise DataToolError(f"--format: unknown format {f!r}; use folder and/or filelist")
    if not formats:
        raise DataToolError("--format: give at least one of folder, filelist")
    if limit_per_class is not None and limit_per_class < 1:
        raise DataToolError(f"--limit-per-class must be >= 1, got {limit_per_class}")
    if size is not None and size < 1:
        raise DataToolError(f"--size must be >= 1, got {size}")
    settings = _settings(
        dict(source=str(source.resolve()), limit_per_class=limit_per_class, size=size, rgb=bool(rgb),
             formats=sorted(formats))
    )
    out.mkdir(parents=True, exist_ok=True)
    marker_path = out / MARKER
    marker = json.loads(marker_path.read_text()) if marker_path.is_file() else {"splits": {}}
    summary = {"out": str(out), "splits": {}, "catalog": None}
    entries = {f"{name}_folder": {}, f"{name}_filelist": {}}
    for split in splits:
        split_dir = out / split
        flist_dir = out / "filelist"
        img_npy, lbl_npy = flist_dir / f"{split}_images.npy", flist_dir / f"{split}_labels.npy"
        done = marker["splits"].get(split)
        up_to_date = (
            done is not None
            and done.get("settings") == settings
            and split_dir.is_dir()
            and ("filelist" not in formats or (img_npy.is_file() and lbl_npy.is_file()))
        )
        if up_to_date:
            counts = done["counts"]
            if verbose:
                print(f"prepare_fashion_mnist: {split_dir} up to date ({sum(counts)} images)")
        else:
            images, labels = load_split(source, split)  # errors name the missing file
            if split_dir.exists() and any(split_dir.iterdir()):
                if done is None and not force:
                    raise DataToolError(
                        f"refusing to overwrite {split_dir}: it is not empty and was not written "
                        "by this tool (pass --force to replace it)"
                    )
                shutil.rmtree(split_dir)
            keep = select_indices(labels, limit_per_class)
            paths = _write_split(images, labels, keep, split_dir, size, rgb)
            kept_labels = labels[keep]
            if "filelist" in formats:
                flist_dir.mkdir(parents=True, exist_ok=True)
                np.save(img_npy, np.array(paths))
                np.save(lbl_npy, kept_labels.astype(np.int64))
            counts = np.bincount(kept_labels, minlength=len(CLASS_NAMES)).tolist()
            marker["splits"][split] = {"settings": settings, "counts": counts}
            marker_path.write_text(json.dumps(marker, indent=2) + "\n")
            if verbose:
                print(f"prepare_fashion_mnist: wrote {len(keep)} images to {split_dir} (per class {counts})")
        summary["splits"][split] = {"dir": str(split_dir), "counts": counts}
        if "folder" in formats:
            entries[f"{name}_folder"][split] = [str(split_dir), str(split_dir)]
        if "filelist" in formats:
            entries[f"{name}_filelist"][split] = [str(img_npy), str(lbl_npy)]
            summary["splits"][split]["filelist"] = [str(img_npy), str(lbl_npy)]
    entries = {k: v for k, v in entries.items() if v}
    catalog_path = Path(catalog) if catalog else out / "dataset_catalog.json"
    update_catalog(catalog_path, entries)
    summary["catalog"] = str(catalog_path)
    summary["dataset_names"] = sorted(entries)
    if verbose:
        print(f"prepare_fashion_mnist: catalog {catalog_path} has {sorted(entries)}; "
              f"export VISSL_DATASET_CATALOG_PATH={catalog_path}")
    return summary


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Fashion-MNIST IDX files -> VISSL disk_folder / disk_filelist + dataset catalog",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--source", default=DEFAULT_SOURCE, help=f"IDX directory (default {DEFAULT_SOURCE})")
    ap.add_argument("--split", default="train,val", help="comma list of train, val (default both)")
    ap.add_argument("--limit-per-class", type=int, default=None,
                    help="keep the first N images of each class (default: all)")
    ap.add_argument("--size", type=int, default=None, help="upscale to SIZE x SIZE (bicubic); default 28")
    ap.add_argument("--rgb", action="store_true", help="save 3-channel PNGs (default grayscale)")
    ap.add_argument("--format", default="folder,filelist", help="comma list of folder, filelist")
    ap.add_argument("--catalog", default=None,
                    help="dataset catalog json to create or update (default OUT/dataset_catalog.json)")
    ap.add_argument("--name", default="fashion_mnist", help="catalog name prefix (default fashion_mnist)")
    ap.add_argument("--force", action="store_true", help="replace non-empty split folders")
    args = ap.parse_args(argv)
    try:
        prepare(
            args.out,
            source=args.source,
            splits=_csv(args.split),
            limit_per_class=args.limit_per_class,
            size=args.size,
            rgb=args.rgb,
            formats=_csv(args.format),
            catalog=args.catalog,
            name=args.name,
            force=args.force,
        )
    except DataToolError as e:
        print(f"prepare_fashion_mnist: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
