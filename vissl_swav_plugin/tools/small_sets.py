"""Two more small grayscale image sets in Fashion-MNIST's layout, for ``tools/demo.py --source``:
the sets on which the demo's recipes are checked beside Fashion-MNIST (docs/demo.md; the studies:
docs/experiments/recipe.md, docs/experiments/collapse.md).

* ``animal_mnist``: Animal-MNIST (PyPI ``animal-mnist``, 10 classes, 10,000 images of 28x28),
  read from the installed package or its wheel (``pip download --no-deps animal-mnist``);
  a stratified split, 800 training and 200 test images per class.
* ``digits``: scikit-learn's ``load_digits`` (1,797 images of 8x8, values 0-16), scaled to
  0-255 and upscaled to 28x28 (bilinear); a stratified split, 140 training and 30 test
  images per class.

Each set is written as the four MNIST-layout IDX files (``train-images-idx3-ubyte.gz``,
``train-labels-idx1-ubyte.gz``, ``t10k-...``) that ``tools/demo.py --source DIR`` and
``swav-plugin-prepare-data --kind idx`` read.  The split is drawn with ``numpy``'s
``default_rng(seed)`` (seed 0 by default), so the same files come out on every machine.

    python tools/make_small_sets.py --out data/sets              # both sets
    python tools/make_small_sets.py --out data/sets --set digits
    python tools/demo.py --quick --source data/sets/animal_mnist --data-dir data/animal
"""
import argparse
import gzip
import importlib.util
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

from .data_sources import DataToolError

ANIMAL_MEMBERS = ("animal_mnist/data/Animal_MNIST/animal_data_version_3.gz",
                  "animal_mnist/data/Animal_MNIST/animal_label_version_3.gz")
SPLITS = {"animal_mnist": (800, 200), "digits": (140, 30)}  # (train, test) images per class


def write_idx(path, array):
    """Write a uint8 array (images ``[N, H, W]`` or labels ``[N]``) as a gzip'd IDX file."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.tobytes())


def stratified_split(labels, train_per_class, test_per_class, seed=0):
    """``(train_idx, test_idx)``: per class, a random ``train_per_class`` indices for training
    and the next ``test_per_class`` for test (drawn with ``default_rng(seed)``).

    Raises:
        DataToolError: a class has fewer than ``train_per_class + test_per_class`` images.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < train_per_class + test_per_class:
            raise DataToolError(f"class {c} has {len(idx)} images, fewer than {train_per_class} + {test_per_class}")
        train.extend(idx[:train_per_class])
        test.extend(idx[train_per_class:train_per_class + test_per_class])
    return np.array(train), np.array(test)


def _read_member(source, member):
    """Bytes of ``member`` (a path inside the package's distribution) from a wheel or a folder."""
    source = Path(source)
    if source.is_file():
        try:
            with zipfile.ZipFile(source) as z:
                return z.read(member)
        except (zipfile.BadZipFile, KeyError) as e:
            raise DataToolError(f"{source}: not an animal-mnist wheel holding {member} ({e})") from None
    path = source / member if (source / member).is_file() else source / Path(member).relative_to("animal_mnist")
    if not path.is_file():
        raise DataToolError(f"{path}: not found (--animal-mnist: the animal-mnist wheel, or the folder it "
                            "installs, `pip install --no-deps animal-mnist`)")
    return path.read_bytes()


def find_animal_mnist():
    """The installed ``animal_mnist`` package's folder, or None."""
    spec = importlib.util.find_spec("animal_mnist")
    return Path(spec.origin).parent if spec and spec.origin else None


def animal_mnist_arrays(source=None):
    """``(images uint8 [10000, 28, 28], labels uint8 [10000])`` of Animal-MNIST, from ``source``
    (a wheel or the installed package folder; default: the installed package)."""
    source = source or find_animal_mnist()
    if source is None:
        raise DataToolError("Animal-MNIST not found: `pip install --no-deps animal-mnist`, or give "
                            "--animal-mnist WHEEL (from `pip download --no-deps animal-mnist`)")
    try:
        images, labels = (pickle.loads(gzip.decompress(_read_member(source, m))) for m in ANIMAL_MEMBERS)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise DataToolError(f"{source}: cannot read Animal-MNIST's arrays ({e})") from None
    images, labels = np.asarray(images), np.asarray(labels)
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise DataToolError(f"{source}: unexpected Animal-MNIST arrays {images.shape} / {labels.shape}")
    return images.astype(np.uint8), labels.astype(np.uint8)


def digits_arrays():
    """``(images uint8 [1797, 28, 28], labels uint8 [1797])``: scikit-learn's digits, 0-16 scaled
    to 0-255 and upscaled from 8x8 to 28x28 (PIL bilinear)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    small = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)
    big = np.stack([np.asarray(Image.fromarray(x).resize((28, 28), Image.BILINEAR)) for x in small])
    return big, d.target.astype(np.uint8)


def make_set(name, out, seed=0, animal_source=None):
    """Write set ``name`` (``animal_mnist`` | ``digits``) as IDX files in ``out/name``; returns
    that folder."""
    images, labels = animal_mnist_arrays(animal_source) if name == "animal_mnist" else digits_arrays()
    train, test = stratified_split(labels, *SPLITS[name], seed=seed)
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, idx in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images[idx])
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels[idx])
    return folder


def main(argv=None):
    """``tools/make_small_sets.py``'s command line; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="parent folder; each set goes to OUT/<set>")
    ap.add_argument("--set", choices=sorted(SPLITS), action="append", help="set(s) to write (default: both)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the stratified split (default 0)")
    ap.add_argument("--animal-mnist", default=None, help="animal-mnist wheel or package folder "
                                                          "(default: the installed package)")
    args = ap.parse_args(argv)
    try:
        for name in args.set or sorted(SPLITS):
            folder = make_set(name, args.out, args.seed, args.animal_mnist)
            print(f"{name}: {folder} ({SPLITS[name][0]} train / {SPLITS[name][1]} test images per class)")
    except DataToolError as e:
        print(f"make_small_sets: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
