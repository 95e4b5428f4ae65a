"""``swav-plugin-mean-std``: per-channel mean and std of a folder of images, as a config.

Every image under the folder (any depth: class sub-folders or not) is read as VISSL reads
it -- ``PIL.Image.convert("RGB")``, whatever its mode (L, P, RGBA, 16-bit) -- and its
pixels are added to running per-channel sums in float64 (one image in memory at a time).
With ``N`` pixels per channel and values ``x`` in [0, 1]::

    mean = sum(x) / N        std = sqrt(sum(x^2) / N - mean^2)     (population std)

The result is written as a config file of the group ``config/dataset_stats``
(:mod:`vissl_swav_plugin.config.dataset_stats`), by default in the working directory's
``configs/``, which VISSL's Hydra search path reads first::

    swav-plugin-mean-std data/mine/train --name mine        # -> ./configs/config/dataset_stats/mine.yaml
    swav-plugin-train config=pretrain/swav/swav_fashion_mnist_cpu +config/dataset_stats=mine ...

``--limit N`` reads only the first N images (sorted paths; evenly spaced with ``--spread``).
"""
import argparse
import re
import sys
from pathlib import Path

import numpy as np

from .data_sources import IMAGE_SUFFIXES, DataToolError

def image_files(root, limit=None, spread=False):
    """The image files under ``root`` (sorted); the first ``limit``, or ``limit`` evenly
    spaced ones with ``spread``."""
    root = Path(root)
    if not root.is_dir():
        raise DataToolError(f"image folder not found: {root}")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise DataToolError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root}")
    if limit is not None and limit < len(files):
        if spread:
            files = [files[i] for i in np.linspace(0, len(files) - 1, limit).round().astype(int)]
        else:
            files = files[:limit]
    return files


def mean_std(files):
    """Per-channel mean and std (RGB, [0, 1] units) of the pixels of ``files``.

    Args:
        files: image paths (read one at a time, converted to RGB as VISSL does).

    Returns:
        ``dict(mean=[r, g, b], std=[r, g, b], images=n, pixels=N)``.

    Raises:
        DataToolError: an unreadable image (named).
    """
    from PIL import Image

    total = np.zeros(3)
    total_sq = np.zeros(3)
    pixels = 0
    for path in files:
        try:
            with Image.open(path) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255.0
        except OSError as e:
            raise DataToolError(f"cannot read image {path}: {e}") from None
        total += arr.sum(0)
        total_sq += (arr * arr).sum(0)
        pixels += arr.shape[0]
    mean = total / pixels
    std = np.sqrt(np.maximum(total_sq / pixels - mean * mean, 0.0))
    return dict(mean=[round(float(v), 4) for v in mean], std=[round(float(v), 4) for v in std],
                images=len(files), pixels=pixels)


def stats_yaml(stats, name, source) -> str:
    """The ``config/dataset_stats/<name>.yaml`` text: ``DATA.{TRAIN,TEST}.NORMALIZE``."""
    norm = f"{{MEAN: {stats['mean']}, STD: {stats['std']}}}"
    return (
        "# @package _global_\n"
        f"# Per-channel mean/std (RGB, [0, 1] units) of {source}: {stats['images']} images,\n"
        f"# {stats['pixels']} pixels per channel; written by swav-plugin-mean-std.\n"
        f"# Use: +config/dataset_stats={name}  (sets the mean/std of multicrop_plugin and Normalize)\n"
        "config:\n  DATA:\n"
        f"    TRAIN:\n      NORMALIZE: {norm}\n"
        f"    TEST:\n      NORMALIZE: {norm}\n"
    )


def main(argv=None):
    """Command line (``swav-plugin-mean-std --help``); returns the exit code (2: bad input)."""
    ap = argparse.ArgumentParser(
        description="Per-channel mean/std of a folder of images, written as the config "
                    "configs/config/dataset_stats/<name>.yaml (use: +config/dataset_stats=<name>)")
    ap.add_argument("folder", help="folder of images (class sub-folders or not; read recursively)")
    ap.add_argument("--name", default=None, help="config name (default: the folder's name)")
    ap.add_argument("--configs", default="configs",
                    help="configs root to write into (default ./configs, read first by VISSL)")
    ap.add_argument("--limit", type=int, default=None, help="read at most N images (default all)")
    ap.add_argument("--spread", action="store_true", help="with --limit: evenly spaced images, not the first")
    ap.add_argument("--print-only", action="store_true", help="print the overrides, write no file")
    args = ap.parse_args(argv)
    try:
        if args.limit is not None and args.limit < 1:
            raise DataToolError(f"--limit must be >= 1, got {args.limit}")
        folder = Path(args.folder)
        name = args.name or re.sub(r"[^0-9a-zA-Z_]+", "_", folder.resolve().name).strip("_") or "images"
        stats = mean_std(image_files(folder, args.limit, args.spread))
    except DataToolError as e:
        print(f"mean-std: error: {e}", file=sys.stderr)
        return 2
    print(f"mean-std: {stats['images']} images, {stats['pixels']} pixels: mean {stats['mean']} std {stats['std']}")
    norm = f"{{MEAN:{stats['mean']},STD:{stats['std']}}}".replace(" ", "")
    print(f"mean-std: overrides: +config.DATA.TRAIN.NORMALIZE={norm} +config.DATA.TEST.NORMALIZE={norm}")
    if not args.print_only:
        path = Path(args.configs) / "config" / "dataset_stats" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stats_yaml(stats, name, folder.resolve()))
        print(f"mean-std: wrote {path}; use +config/dataset_stats={name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
