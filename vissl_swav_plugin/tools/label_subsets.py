"""Labelled subsets (e.g. 1% and 10% of the labels) of a VISSL ``disk_filelist`` dataset,
for semi-supervised fine-tuning (paper App. A: fine-tuning with 1% / 10% of the labels).

For each percentage p, every class c keeps ``max(1, round(p / 100 * n_c))`` of its n_c
training images, drawn uniformly without replacement with ``--seed`` (class-balanced, as
the SimCLR ImageNet splits are to within a few images).  The subsets of one seed are nested:
the 1% images are among the 10% images.  Output::

    OUT/<name>_per01_images.npy   image paths (disk_filelist), in source order
    OUT/<name>_per01_labels.npy   their labels (int64)
    OUT/<name>_per01_indices.npy  their indices in the source filelist
    ...                            one triple per percentage (per01, per10, per05, per50 ...)

and catalog entries ``<name>_per01`` ... (train = the subset, val = the source entry's val
split when it has one) in the dataset catalog (``--catalog``, default: the source catalog).

usage (console script ``swav-plugin-label-subsets``; ``python tools/make_label_subsets.py`` in a
checkout is the same)::

    swav-plugin-label-subsets --catalog DIR/dataset_catalog.json \\
        --dataset fashion_mnist_filelist --percent 1,10 [--seed 0] [--out DIR/subsets] [--name fashion_mnist]
    swav-plugin-label-subsets --images train_images.npy --labels train_labels.npy \\
        --percent 1,10 --out OUT --catalog OUT/dataset_catalog.json --name mydata

With Fashion-MNIST (``tools/prepare_fashion_mnist.py --out DIR``), the defaults give
``fashion_mnist_per01`` / ``fashion_mnist_per10``, the dataset names of
``configs/config/benchmark/swav_plugin/semi_sup_{1,10}pct_fashion_mnist_cpu.yaml``.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np


class SubsetToolError(ValueError):
    """Bad argument or input file; the message names it."""


def _load(path, what):
    p = Path(path)
    if not p.is_file():
        raise SubsetToolError(f"{what} file not found: {p}")
    try:
        return np.load(p, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - name the file
        raise SubsetToolError(f"cannot read {what} file {p}: {e}") from e


def percent_tag(p: float) -> str:
    """1 -> 'per01', 10 -> 'per10', 0.5 -> 'per00_5' (VISSL's names: per01, per10, per05)."""
    whole, frac = divmod(float(p), 1.0)
    tag = f"per{int(whole):02d}"
    if frac:
        tag += "_" + f"{frac:.6f}".split(".")[1].rstrip("0")
    return tag


def select_subsets(labels: np.ndarray, percents, seed: int = 0):
    """{percent: sorted indices}; per class max(1, round(p% of the class)), nested by size."""
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.default_rng(seed)
    order = {}  # one random permutation per class: prefixes give nested subsets
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        order[int(c)] = idx[rng.permutation(len(idx))]
    out = {}
    for p in percents:
        keep = []
        for perm in order.values():
            n = max(1, int(round(p / 100.0 * len(perm))))
            keep.append(perm[:n])
        out[p] = np.sort(np.concatenate(keep))
    return out


def make_subsets(images, labels, percents, out, name, seed=0, catalog=None, val_split=None):
    """Write the subsets of :func:`select_subsets` (image paths, labels, indices: one ``.npy``
    triple per percentage under ``out``) and, with ``catalog``, add their entries to that
    dataset catalog (created if absent).  Returns ``{entry name: {"images": n, "per_class":
    [...]}}``.  Raises :class:`SubsetToolError` for mismatched inputs or a percentage
    outside (0, 100]."""
    images = np.asarray(images)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if len(images) != len(labels):
        raise SubsetToolError(f"{len(images)} images but {len(labels)} labels")
    for p in percents:
        if not 0 < p <= 100:
            raise SubsetToolError(f"--percent values must be in (0, 100], got {p}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries, summary = {}, {}
    for p, idx in select_subsets(labels, percents, seed).items():
        tag = f"{name}_{percent_tag(p)}"
        img_f, lbl_f, ind_f = (out / f"{tag}_{k}.npy" for k in ("images", "labels", "indices"))
        np.save(img_f, images[idx])
        np.save(lbl_f, labels[idx])
        np.save(ind_f, idx.astype(np.int64))
        entries[tag] = {"train": [str(img_f.resolve()), str(lbl_f.resolve())]}
        if val_split is not None:
            entries[tag]["val"] = list(val_split)
        summary[tag] = {"images": len(idx), "per_class": np.bincount(labels[idx]).tolist()}
    if catalog is not None:
        catalog = Path(catalog)
        data = json.loads(catalog.read_text()) if catalog.is_file() else {}
        data.update(entries)
        catalog.write_text(json.dumps(data, indent=2) + "\n")
    return summary


def main(argv=None):
    """Console script ``swav-plugin-label-subsets``: exit 0, or 2 with the error on stderr."""
    ap = argparse.ArgumentParser(description="class-balanced p% label subsets of a disk_filelist dataset")
    ap.add_argument("--catalog", help="dataset catalog json (read for --dataset, updated with the subsets)")
    ap.add_argument("--dataset", help="catalog entry whose train split is the source (a disk_filelist)")
    ap.add_argument("--images", help="source image-path .npy (instead of --dataset)")
    ap.add_argument("--labels", help="source label .npy (instead of --dataset)")
    ap.add_argument("--percent", default="1,10", help="comma list of percentages (default 1,10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="output folder (default: subsets/ beside the catalog)")
    ap.add_argument("--name", help="name prefix (default: the dataset name without _filelist)")
    args = ap.parse_args(argv)
    try:
        try:
            percents = [float(v) for v in args.percent.split(",") if v.strip()]
        except ValueError:
            raise SubsetToolError(f"--percent must be a comma list of numbers, got {args.percent!r}") from None
        percents = [int(p) if p == int(p) else p for p in percents]
        val_split = None
        if args.dataset:
            if not args.catalog:
                raise SubsetToolError("--dataset needs --catalog")
            cat_path = Path(args.catalog)
            if not cat_path.is_file():
                raise SubsetToolError(f"catalog not found: {cat_path}")
            catalog = json.loads(cat_path.read_text())
            if args.dataset not in catalog:
                raise SubsetToolError(f"--dataset {args.dataset!r} is not in {cat_path} (has {sorted(catalog)})")
            entry = catalog[args.dataset]
            if "train" not in entry:
                raise SubsetToolError(f"catalog entry {args.dataset!r} has no train split")
            img_f, lbl_f = entry["train"]
            if not str(img_f).endswith(".npy") or not str(lbl_f).endswith(".npy"):
                raise SubsetToolError(f"catalog entry {args.dataset!r} is not a disk_filelist (.npy) entry")
            val_split = entry.get("val")
            name = args.name or args.dataset.replace("_filelist", "")
            out = args.out or cat_path.parent / "subsets"
        elif args.images and args.labels:
            img_f, lbl_f = args.images, args.labels
            if not args.out or not args.name:
                raise SubsetToolError("--images/--labels need --out and --name")
            name, out = args.name, args.out
        else:
            raise SubsetToolError("give --catalog + --dataset, or --images + --labels")
        summary = make_subsets(_load(img_f, "images"), _load(lbl_f, "labels"), percents, out, name,
                               seed=args.seed, catalog=args.catalog, val_split=val_split)
    except SubsetToolError as e:
        print(f"make_label_subsets: error: {e}", file=sys.stderr)
        return 2
    for tag, s in summary.items():
        print(f"make_label_subsets: {tag}: {s['images']} images, per class {s['per_class']}")
    if args.catalog:
        print(f"make_label_subsets: catalog {args.catalog} updated with {sorted(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
