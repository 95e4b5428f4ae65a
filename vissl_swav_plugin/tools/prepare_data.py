"""``swav-plugin-prepare-data``: an image dataset -> VISSL's ``disk_folder`` / ``disk_filelist``
layouts and a dataset catalog.

Sources (:mod:`.data_sources`): IDX files (MNIST layout), a NumPy ``.npz``, or a folder of
images with or without class sub-folders.  Without ``--source``, Fashion-MNIST from the
Debian package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``), exactly as
``tools/prepare_fashion_mnist.py`` (an alias of this tool with ``--dataset fashion_mnist``).

Output (``--out DIR``)::

    DIR/train/<label>_<name>/<index>.png    disk_folder (torchvision ImageFolder) layout: the
    DIR/val/<label>_<name>/<index>.png      class folders sort in label order (the label is
                                            zero-padded past 10 classes), so ImageFolder ids
                                            are the labels; <index> is the image's index in
                                            the source (a folder: in sorted order)
    DIR/filelist/{train,val}_images.npy     disk_filelist: absolute paths of those PNGs
    DIR/filelist/{train,val}_labels.npy     and their labels (int64)
    DIR/dataset_catalog.json                VISSL dataset catalog entries <name>_folder and
                                            <name>_filelist (VISSL's DATA.TEST reads "val")

A folder whose class names are the label numbers (MNIST digits) gets ``<label>/`` folders.
``--val-fraction F`` holds out a class-balanced, seeded fraction of a source that has no
val split.  ``--size N`` makes every image N x N (square images are resized, others scaled
to N on the shorter side and centre-cropped); ``--rgb`` saves 3-channel PNGs.

Use in VISSL either through the catalog::

    export VISSL_DATASET_CATALOG_PATH=DIR/dataset_catalog.json
    ... config.DATA.TRAIN.DATA_SOURCES=[disk_folder] config.DATA.TRAIN.LABEL_SOURCES=[disk_folder]
        config.DATA.TRAIN.DATASET_NAMES=[<name>_folder]

or with explicit paths: ``config.DATA.TRAIN.DATA_PATHS=[DIR/train] config.DATA.TRAIN.LABEL_PATHS=[DIR/train]``.

Re-running with the same arguments is a no-op ("up to date"); with other arguments the
splits this tool wrote before are replaced.  A non-empty split folder it did not write is
never touched (``--force`` replaces it).
"""
import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np

from . import data_sources as ds
from .data_sources import DataToolError

FORMATS = ("folder", "filelist")
SPLITS = ("train", "val")
MARKER = ".prepare_fashion_mnist.json"  # "this tool wrote the folder" (name kept from its first version)
FASHION_HINT = ("; install the Debian package dataset-fashion-mnist (apt-get install -y "
                "dataset-fashion-mnist) or pass --source DIR")


def class_dir_name(label: int, names) -> str:
    """The folder of class ``label``: ``<label>_<name>`` (``<label>`` when the name is the
    label's number), the label zero-padded to the width of the largest one."""
    label_str = f"{label:0{len(str(len(names) - 1))}d}"
    return label_str if names[label] == str(label) else f"{label_str}_{names[label]}"


def select_indices(labels: np.ndarray, limit_per_class=None) -> np.ndarray:
    """Indices kept: the first ``limit_per_class`` images of each class, in source order."""
    if limit_per_class is None:
        return np.arange(len(labels))
    keep = [np.nonzero(labels == c)[0][:limit_per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


def split_off_val(labels: np.ndarray, fraction: float, seed: int = 0):
    """(train indices, val indices): a seeded ``fraction`` of each class held out (at
    least one image of every class with two or more)."""
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        idx = np.nonzero(labels == c)[0]
        n = min(len(idx) - 1, max(1, int(round(fraction * len(idx))))) if len(idx) > 1 else 0
        val.extend(rng.permutation(idx)[:n].tolist())
    val = np.sort(np.array(val, np.int64))
    return np.setdiff1d(np.arange(len(labels)), val), val


def detect_kind(source) -> str:
    """``npz`` for a ``.npz`` file, ``idx`` for a folder of ``*-ubyte[.gz]`` files, else ``folder``."""
    source = Path(source)
    if source.suffix == ".npz":
        return "npz"
    if source.is_dir() and any(p.name.endswith(("-ubyte", "-ubyte.gz")) for p in source.iterdir()):
        return "idx"
    return "idx" if not source.exists() and "mnist" in str(source).lower() else "folder"


class Source:
    """One dataset source: ``splits()`` names what it has, ``load(split)`` gives
    ``(items, labels)`` (items: an image array or a list of files), ``names(labels)`` its
    class names.  ``preloaded`` ({split: (items, labels)}, IDX sources) holds splits the
    caller has already read: ``load`` returns them instead of reading the files again."""

    def __init__(self, source, kind, dataset, class_names, val_fraction, seed, preloaded=None):
        self.path, self.kind, self.dataset = Path(source), kind, dataset
        self.given, self.val_fraction, self.seed = class_names, val_fraction, seed
        self.preloaded = dict(preloaded or {})
        self._cache, self._source_names, self.unlabelled = None, None, False
        self.hint = FASHION_HINT if dataset == "fashion_mnist" else ""

    def _read_all(self):
        if self._cache is None:
            reader = ds.load_npz if self.kind == "npz" else ds.scan_folder
            self._cache, self._source_names = reader(self.path)
            self.unlabelled = self._source_names is None and all(
                not lab.any() for _, lab in self._cache.values())
        return self._cache

    def splits(self):
        """The source's split names."""
        if self.kind == "idx":
            return list(SPLITS)
        return list(SPLITS) if ("val" in self._read_all() or self.val_fraction) else ["train"]

    def load(self, split):
        """The images and labels of ``split``."""
        if split in self.preloaded:
            return self.preloaded[split]
        if self.kind == "idx":
            n = len(self.given or ds.PRESETS.get(self.dataset) or []) or None
            return ds.load_idx_split(self.path, split, n, self.hint)
        splits = self._read_all()
        if "val" not in splits and self.val_fraction:
            items, labels = splits["train"]
            train, val = split_off_val(labels, self.val_fraction, self.seed)
            pick = val if split == "val" else train
            return _take(items, pick), labels[pick]
        return splits[split]

    def names(self, labels):
        """The class names for labels ``0 .. max(labels)`` (given, from the source, or the preset's)."""
        top = int(labels.max()) + 1 if labels.size else 1
        return ds.resolve_class_names(top, self.given, self._source_names, self.dataset, self.unlabelled)


def _take(items, idx):
    return items[idx] if isinstance(items, np.ndarray) else [items[i] for i in idx.tolist()]


def _fit(im, size):
    from PIL import Image

    if not size or im.size == (size, size):
        return im
    if im.width == im.height:
        return im.resize((size, size), Image.BICUBIC)
    scale = size / min(im.size)
    w, h = max(size, round(im.width * scale)), max(size, round(im.height * scale))
    im = im.resize((w, h), Image.BICUBIC)
    left, top = (w - size) // 2, (h - size) // 2
    return im.crop((left, top, left + size, top + size))


def _open(item):
    from PIL import Image, ImageOps

    if isinstance(item, np.ndarray):
        im = Image.fromarray(item, mode="L") if item.ndim == 2 else Image.fromarray(item)
    else:
        try:
            with Image.open(item) as f:
                im = ImageOps.exif_transpose(f)
                im.load()
        except OSError as e:
            raise DataToolError(f"cannot read image {item}: {e}") from None
    return im if im.mode in ("L", "RGB") else im.convert("RGB")


def write_split(items, labels, keep, split_dir: Path, size, rgb, names):
    """Write the kept images as ``split_dir/<class folder>/<index>.png``; returns their paths."""
    paths = []
    for c in range(len(names)):
        (split_dir / class_dir_name(c, names)).mkdir(parents=True, exist_ok=True)
    width = max(5, len(str(len(labels))))
    for i in keep.tolist():
        im = _fit(_open(items[i]), size)
        if rgb:
            im = im.convert("RGB")
        p = split_dir / class_dir_name(int(labels[i]), names) / f"{i:0{width}d}.png"
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
        for s in SPLITS:
            cur.setdefault(s, [])
        data[name] = cur
    catalog_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = catalog_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, catalog_path)
    return data


def _check_args(splits, formats, limit_per_class, size, val_fraction):
    for s in splits:
        if s not in SPLITS:
            raise DataToolError(f"--split: unknown split {s!r}; use train and/or val")
    for f in formats:
        if f not in FORMATS:
            raise DataToolError(f"--format: unknown format {f!r}; use folder and/or filelist")
    if not formats:
        raise DataToolError("--format: give at least one of folder, filelist")
    if limit_per_class is not None and limit_per_class < 1:
        raise DataToolError(f"--limit-per-class must be >= 1, got {limit_per_class}")
    if size is not None and size < 1:
        raise DataToolError(f"--size must be >= 1, got {size}")
    if val_fraction is not None and not 0 < val_fraction < 1:
        raise DataToolError(f"--val-fraction must be in (0, 1), got {val_fraction}")


def _dataset_name(source, dataset):
    if dataset == "fashion_mnist":
        return "fashion_mnist"
    return re.sub(r"[^0-9a-zA-Z]+", "_", Path(source).stem).strip("_").lower() or "images"


def prepare(out, source=ds.FASHION_MNIST_SOURCE, splits=None, limit_per_class=None, size=None, rgb=False,
            formats=FORMATS, catalog=None, name=None, force=False, verbose=True, *, kind="auto",
            dataset="auto", class_names=None, val_fraction=None, seed=0, tool="prepare-data", preloaded=None):
    """Write the requested splits of ``source`` under ``out`` (see the module docstring).

    Args:
        out: output folder.
        source: IDX folder, ``.npz`` file or image folder (default: Fashion-MNIST's IDX files).
        splits: ``train`` and/or ``val`` (default: every split the source has).
        limit_per_class: keep the first N images of each class (default all).
        size: make images SIZE x SIZE; rgb: save 3-channel PNGs.
        formats: ``folder`` and/or ``filelist``; catalog: the catalog json (default
            ``out/dataset_catalog.json``); name: catalog name prefix (default
            ``fashion_mnist`` for Fashion-MNIST, else the source's name).
        force: replace non-empty split folders this tool did not write.
        kind: ``idx`` | ``npz`` | ``folder`` | ``auto`` (:func:`detect_kind`).
        dataset: ``fashion_mnist`` | ``mnist`` | ``auto`` (Fashion-MNIST for an IDX folder
            whose folder name says "fashion") | None: the class-name preset.
        class_names: names (a list) overriding every other source of names.
        val_fraction: hold out this fraction of each class as "val" (sources without one).
        seed: seed of that hold-out; tool: the name messages start with.
        preloaded: ``{split: (images, labels)}`` of an IDX ``source`` the caller has already
            read (and checked) as :func:`.data_sources.load_idx_split` does: the splits are
            written from these arrays, the files are not read again (the demo reads its
            source once).  The folder's settings, and so its reuse, are unchanged.

    Returns:
        ``dict(out, splits={split: dict(dir, counts[, filelist])}, catalog, dataset_names, class_names)``.

    Raises:
        DataToolError: a bad argument or source; the message names it.
    """
    out, source = Path(out).resolve(), Path(source)
    kind = detect_kind(source) if kind == "auto" else kind
    if dataset == "auto":
        dataset = "fashion_mnist" if kind == "idx" and "fashion" in source.name.lower() else None
    name = name or _dataset_name(source, dataset)
    formats = list(dict.fromkeys(formats))
    if preloaded and kind != "idx":
        raise DataToolError(f"preloaded splits are for IDX sources, not kind {kind!r}")
    src = Source(source, kind, dataset, class_names, val_fraction, seed, preloaded)
    _check_args(list(splits or []), formats, limit_per_class, size, val_fraction)
    if not source.exists() and kind != "idx":
        raise DataToolError(f"source not found: {source}")
    splits = list(dict.fromkeys(splits or src.splits()))
    for s in splits:
        if s not in src.splits():
            raise DataToolError(f"--split: {source} has no {s!r} split (--val-fraction F makes one)")
    settings = dict(source=str(source.resolve()), limit_per_class=limit_per_class, size=size, rgb=bool(rgb),
                    formats=sorted(formats))
    if dataset != "fashion_mnist":  # Fashion-MNIST's settings (and so its marker) are those of the first version
        settings.update(kind=kind, dataset=dataset, class_names=class_names, val_fraction=val_fraction, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    marker_path = out / MARKER
    marker = json.loads(marker_path.read_text()) if marker_path.is_file() else {"splits": {}}
    summary = {"out": str(out), "splits": {}, "catalog": None, "class_names": None}
    entries = {f"{name}_folder": {}, f"{name}_filelist": {}}
    for split in splits:
        split_dir, flist_dir = out / split, out / "filelist"
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
            summary["class_names"] = done.get("class_names", summary["class_names"])
            if verbose:
                print(f"{tool}: {split_dir} up to date ({sum(counts)} images)")
        else:
            items, labels = src.load(split)  # errors name the missing file
            names = src.names(labels)
            if split_dir.exists() and any(split_dir.iterdir()):
                if done is None and not force:
                    raise DataToolError(
                        f"refusing to overwrite {split_dir}: it is not empty and was not written "
                        "by this tool (pass --force to replace it)"
                    )
                shutil.rmtree(split_dir)
            keep = select_indices(labels, limit_per_class)
            paths = write_split(items, labels, keep, split_dir, size, rgb, names)
            kept_labels = labels[keep]
            if "filelist" in formats:
                flist_dir.mkdir(parents=True, exist_ok=True)
                np.save(img_npy, np.array(paths))
                np.save(lbl_npy, kept_labels.astype(np.int64))
            counts = np.bincount(kept_labels, minlength=len(names)).tolist()
            marker["splits"][split] = {"settings": settings, "counts": counts}
            if dataset != "fashion_mnist":
                marker["splits"][split]["class_names"] = names
            summary["class_names"] = names
            marker_path.write_text(json.dumps(marker, indent=2) + "\n")
            if verbose:
                print(f"{tool}: wrote {len(keep)} images to {split_dir} (per class {counts})")
        summary["splits"][split] = {"dir": str(split_dir), "counts": counts}
        if "folder" in formats:
            entries[f"{name}_folder"][split] = [str(split_dir), str(split_dir)]
        if "filelist" in formats:
            entries[f"{name}_filelist"][split] = [str(img_npy), str(lbl_npy)]
            summary["splits"][split]["filelist"] = [str(img_npy), str(lbl_npy)]
    summary["class_names"] = summary["class_names"] or (ds.FASHION_MNIST_CLASSES if dataset == "fashion_mnist" else None)
    entries = {k: v for k, v in entries.items() if v}
    catalog_path = Path(catalog) if catalog else out / "dataset_catalog.json"
    update_catalog(catalog_path, entries)
    summary["catalog"] = str(catalog_path)
    summary["dataset_names"] = sorted(entries)
    if verbose:
        print(f"{tool}: catalog {catalog_path} has {sorted(entries)}; "
              f"export VISSL_DATASET_CATALOG_PATH={catalog_path}")
    return summary


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def build_parser(prog=None, dataset_default="auto"):
    """The tool's ``argparse`` parser (``dataset_default``: ``fashion_mnist`` for the alias)."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description="An image dataset (IDX files, .npz, image folder) -> VISSL disk_folder / "
                    "disk_filelist + dataset catalog",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--source", default=ds.FASHION_MNIST_SOURCE,
                    help=f"IDX folder, .npz file or image folder (default {ds.FASHION_MNIST_SOURCE})")
    ap.add_argument("--kind", default="auto", choices=("auto", "idx", "npz", "folder"),
                    help="source kind (default: from the source)")
    ap.add_argument("--dataset", default=dataset_default, choices=("auto", "none", *sorted(ds.PRESETS)),
                    help="class-name preset (default %(default)s: fashion_mnist for an IDX folder whose "
                         "folder name says 'fashion', else none: the source's names or the label numbers)")
    ap.add_argument("--class-names", default=None,
                    help="class names: a comma list, or a text file with one name per line")
    ap.add_argument("--split", default=None, help="comma list of train, val (default: those the source has)")
    ap.add_argument("--val-fraction", type=float, default=None,
                    help="hold out this fraction of each class as val (sources without a val split)")
    ap.add_argument("--seed", type=int, default=0, help="seed of --val-fraction (default 0)")
    ap.add_argument("--limit-per-class", type=int, default=None,
                    help="keep the first N images of each class (default: all)")
    ap.add_argument("--size", type=int, default=None,
                    help="make images SIZE x SIZE (bicubic; non-square: shorter side, centre crop)")
    ap.add_argument("--rgb", action="store_true", help="save 3-channel PNGs (default: the source's mode)")
    ap.add_argument("--format", default="folder,filelist", help="comma list of folder, filelist")
    ap.add_argument("--catalog", default=None,
                    help="dataset catalog json to create or update (default OUT/dataset_catalog.json)")
    ap.add_argument("--name", default=None,
                    help="catalog name prefix (default: fashion_mnist for Fashion-MNIST, else the source's name)")
    ap.add_argument("--force", action="store_true", help="replace non-empty split folders")
    return ap


def main(argv=None, prog=None, dataset_default="auto", tool="prepare-data", kind_default="auto"):
    """Command line (``swav-plugin-prepare-data --help``); returns the exit code (2: bad input)."""
    ap = build_parser(prog, dataset_default)
    ap.set_defaults(kind=kind_default)
    args = ap.parse_args(argv)
    kwargs = dict(splits=_csv(args.split) if args.split else None, limit_per_class=args.limit_per_class,
                  size=args.size, rgb=args.rgb, formats=_csv(args.format), catalog=args.catalog, name=args.name,
                  force=args.force, kind=args.kind, dataset=None if args.dataset == "none" else args.dataset,
                  val_fraction=args.val_fraction, seed=args.seed, tool=tool)
    try:
        prepare(args.out, source=args.source, class_names=ds.read_class_names(args.class_names), **kwargs)
        return 0
    except DataToolError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
