"""Step 1 of the demo: the Fashion-MNIST subset as a VISSL ``disk_folder``.

The reading of the IDX files, the subset rule (the first N images of each class, in file
order) and the PNG / ImageFolder writing are those of ``tools/prepare_fashion_mnist.py``
(:mod:`vissl_swav_plugin.tools.fashion_mnist`), called here; this module adds the demo's folder naming,
the lock that lets concurrent demos / tests share a data folder, and the in-memory copies
of the same images used by the kNN evaluation.

The step walks down once: the four IDX files are found (a missing one is named before
anything is read or written), each is read once, and the ImageFolder and the in-memory
subsets are made from those arrays.
"""
import fcntl
from pathlib import Path

from .common import DemoError


def load_data_tool():
    """The Fashion-MNIST data tool (``tools/prepare_fashion_mnist.py``'s code).

    Returns:
        The module :mod:`vissl_swav_plugin.tools.fashion_mnist` (``prepare``, ``load_split``,
        ``find_sources``, ``read_split``, ``select_indices``, ``DataToolError``, ...).
    """
    from vissl_swav_plugin.tools import fashion_mnist

    return fashion_mnist


def prepare_data(source, data_dir, train_per_class, test_per_class):
    """Write (or reuse) the training subset as an ImageFolder and load the same images,
    and the test subset, into memory.

    Args:
        source: folder of the Fashion-MNIST IDX files (``train-*`` / ``t10k-*``, gzip'd or not).
        data_dir: parent of the ImageFolder, written to ``data_dir/fashion_mnist_<N>pc/train``.
        train_per_class: training images kept per class (the first ones in file order).
        test_per_class: test images kept per class (from the t10k files).

    Returns:
        ``dict(folder, train_x, train_y, train_index, test_x, test_y, test_index)``:
        ``folder`` the ImageFolder VISSL trains on, ``*_x`` uint8 images [N, 28, 28],
        ``*_y`` int64 labels, ``*_index`` their indices in the IDX files.

    Raises:
        DemoError: a missing / truncated / corrupt IDX file, an unwritable folder, or a
            folder holding another number of images than the subset.
    """
    tool = load_data_tool()
    try:
        return _prepare_data(tool, Path(source), Path(data_dir), train_per_class, test_per_class)
    except tool.DataToolError as e:  # missing / truncated / corrupt IDX files, unwritable folder
        raise DemoError(f"{e}\n(`make demo` installs Fashion-MNIST via tools/install_env.sh)") from None


def _prepare_data(tool, source, data_dir, train_per_class, test_per_class):
    files = tool.find_sources(source, ("train", "val"))  # name a missing file before anything is read or written
    arrays = {split: tool.read_split(paths) for split, paths in files.items()}  # each IDX file read once
    folder = data_dir / f"fashion_mnist_{train_per_class}pc"
    summary = write_image_folder(tool, source, folder, train_per_class, train=arrays["train"])
    train_x, train_y, keep = _subset(tool, *arrays["train"], train_per_class)
    test_x, test_y, keep_test = _subset(tool, *arrays["val"], test_per_class)
    n_written = sum(summary["splits"]["train"]["counts"])
    if n_written != len(keep):
        raise DemoError(f"{folder}: holds {n_written} training images, expected {len(keep)}")
    return dict(
        folder=Path(summary["splits"]["train"]["dir"]),
        train_x=train_x, train_y=train_y, train_index=keep,
        test_x=test_x, test_y=test_y, test_index=keep_test,
    )


def write_image_folder(tool, source, folder, per_class, train=None):
    """The training subset as ``folder/train/<label>_<name>/<index>.png``, one writer at a
    time (an exclusive ``flock`` on ``.<folder name>.lock`` next to it); a folder already
    complete with these settings is reused, an interrupted write is redone.  ``train``: the
    training split's ``(images, labels)`` already read from ``source`` (else the tool reads
    it when the folder has to be written).

    Returns:
        The data tool's summary (``summary["splits"]["train"]`` has ``dir`` and ``counts``).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f".{folder.name}.lock", "w")
    except OSError as e:  # read-only, not a folder, full disk: named, not a traceback
        raise DemoError(f"{folder}: cannot write the demo's image folder there ({e.strerror or e}); "
                        "give a writable folder with --data-dir") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return tool.prepare(folder, source=source, splits=("train",), limit_per_class=per_class,
                            formats=("folder",), verbose=False,
                            force=True,  # the folder is the demo's own: redo an interrupted write
                            preloaded=None if train is None else {"train": train})


def _subset(tool, images, labels, per_class):
    """(images, labels, indices) of the first ``per_class`` images of each class of a split."""
    keep = tool.select_indices(labels, per_class)
    return images[keep], labels[keep], keep
