"""Fashion-MNIST through ``swav-plugin-prepare-data``: the functions of
``tools/prepare_fashion_mnist.py`` (the demo and the tests use them), i.e. the generic tool
(:mod:`.prepare_data`) with Fashion-MNIST's source, class names and catalog name.

    python tools/prepare_fashion_mnist.py --out data/fm [--limit-per-class N] [--size 32] [--rgb]
    # = swav-plugin-prepare-data --out data/fm --dataset fashion_mnist (same files)
"""
import sys

from . import prepare_data
from .data_sources import FASHION_MNIST_CLASSES as CLASS_NAMES
from .data_sources import FASHION_MNIST_SOURCE as DEFAULT_SOURCE
from .data_sources import DataToolError, find_idx, find_idx_split, load_idx_split, read_idx, read_idx_split
from .prepare_data import FORMATS, MARKER, select_indices, update_catalog

__all__ = ["CLASS_NAMES", "DEFAULT_SOURCE", "FORMATS", "MARKER", "DataToolError", "class_dir_name",
           "find_source", "find_sources", "load_split", "main", "prepare", "read_idx", "read_split",
           "select_indices", "update_catalog"]
TOOL = "prepare_fashion_mnist"

def class_dir_name(label: int) -> str:
    """The folder of Fashion-MNIST class ``label``: ``<label>_<name>`` (``0_tshirt_top``)."""
    return prepare_data.class_dir_name(label, CLASS_NAMES)

def find_source(source, split: str, kind: str):
    """The IDX file of ``split`` ('train' | 'val') and ``kind`` ('images-idx3' | 'labels-idx1');
    :class:`DataToolError` naming it (and the Debian package) when absent."""
    return find_idx(source, split, kind, prepare_data.FASHION_HINT)

def find_sources(source, splits=("train", "val")):
    """``{split: (images file, labels file)}``, found in the order train images, train labels,
    val images, val labels; :class:`DataToolError` naming the first one absent."""
    return {split: find_idx_split(source, split, prepare_data.FASHION_HINT) for split in splits}

def read_split(files):
    """:func:`load_split` of a split's ``(images file, labels file)`` (:func:`find_sources`):
    each file read once."""
    return read_idx_split(*files, len(CLASS_NAMES))

def load_split(source, split: str):
    """(images uint8 [N, 28, 28], labels int64 [N]) of a split ('train' | 'val'); labels
    outside 0..9 are an error."""
    return load_idx_split(source, split, len(CLASS_NAMES), prepare_data.FASHION_HINT)

def prepare(out, source=DEFAULT_SOURCE, splits=("train", "val"), limit_per_class=None, size=None, rgb=False,
            formats=FORMATS, catalog=None, name="fashion_mnist", force=False, verbose=True, preloaded=None):
    """:func:`.prepare_data.prepare` for Fashion-MNIST's IDX files (same arguments and summary;
    ``preloaded``: splits already read by :func:`read_split`, written without reading the files again)."""
    return prepare_data.prepare(out, source=source, splits=splits, limit_per_class=limit_per_class, size=size,
                                rgb=rgb, formats=formats, catalog=catalog, name=name, force=force,
                                verbose=verbose, kind="idx", dataset="fashion_mnist", tool=TOOL,
                                preloaded=preloaded)

def main(argv=None):
    """``tools/prepare_fashion_mnist.py``'s command line; returns the exit code."""
    return prepare_data.main(argv, dataset_default="fashion_mnist", tool=TOOL, kind_default="idx")

if __name__ == "__main__":
    sys.exit(main())
