"""The demo's data step (:mod:`vissl_swav_plugin.demo.data`): it finds the four IDX files once,
reads each once, and writes the same ImageFolder, with the same reuse rules and the same
errors, as the walk it replaced (kept below as the reference: it found the files up to three
times and read the training files twice, through the data tool's public functions)."""
import builtins
import collections
import fcntl
import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest

from multicrop_helpers import FASHION_DIR, make_fake_fashion, write_idx
from vissl_swav_plugin.demo import data as demo_data
from vissl_swav_plugin.demo.common import DemoError
from vissl_swav_plugin.tools import fashion_mnist

IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


# -- the reference: the data step before it walked down once (verbatim, but for the names) ----
def old_prepare_data(source, data_dir, train_per_class, test_per_class):
    tool = fashion_mnist
    try:
        return _old_prepare_data(tool, Path(source), Path(data_dir), train_per_class, test_per_class)
    except tool.DataToolError as e:
        raise DemoError(f"{e}\n(`make demo` installs Fashion-MNIST via tools/install_env.sh)") from None


def _old_prepare_data(tool, source, data_dir, train_per_class, test_per_class):
    for split in ("train", "val"):
        for kind in ("images-idx3", "labels-idx1"):
            tool.find_source(source, split, kind)
    folder = data_dir / f"fashion_mnist_{train_per_class}pc"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = tool.prepare(folder, source=source, splits=("train",), limit_per_class=train_per_class,
                               formats=("folder",), verbose=False, force=True)
    subsets = []
    for split, per_class in (("train", train_per_class), ("val", test_per_class)):
        images, labels = tool.load_split(source, split)
        keep = tool.select_indices(labels, per_class)
        subsets.append((images[keep], labels[keep], keep))
    (train_x, train_y, keep), (test_x, test_y, keep_test) = subsets
    n_written = sum(summary["splits"]["train"]["counts"])
    if n_written != len(keep):
        raise DemoError(f"{folder}: holds {n_written} training images, expected {len(keep)}")
    return dict(folder=Path(summary["splits"]["train"]["dir"]), train_x=train_x, train_y=train_y,
                train_index=keep, test_x=test_x, test_y=test_y, test_index=keep_test)


# -- helpers -----------------------------------------------------------------------------------
def tree(root):
    """{relative path: sha256} of every file under ``root``; the catalog's absolute paths
    are written relative to ``root`` (two output folders differ only there)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dataset_catalog.json":
                data = data.replace(str(Path(root).resolve()).encode(), b"<ROOT>")
            out[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


def mtimes(root):
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in Path(root).rglob("*") if p.is_file()}


def assert_same_data(a, b, root_a, root_b):
    assert Path(a["folder"]).relative_to(root_a) == Path(b["folder"]).relative_to(root_b)
    for key in ("train_x", "train_y", "train_index", "test_x", "test_y", "test_index"):
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


@pytest.fixture
def counted(monkeypatch):
    """Counters of the opens (reads) and ``is_file`` look-ups (finds) of IDX files."""
    opens, finds = collections.Counter(), collections.Counter()
    real_open, real_is_file = builtins.open, Path.is_file

    def counting_open(file, *args, **kwargs):  # gzip.open opens through builtins.open too
        if "-ubyte" in str(file):
            opens[Path(file).name] += 1
        return real_open(file, *args, **kwargs)

    def counting_is_file(self):
        if "-ubyte" in self.name:
            finds[self.name] += 1
        return real_is_file(self)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(Path, "is_file", counting_is_file)
    return opens, finds


def sources(tmp_path):
    """(name, IDX folder): the fixture, and the real Fashion-MNIST where it is installed."""
    make_fake_fashion(tmp_path / "src", n_train=60, n_val=40)
    found = [("fixture", tmp_path / "src")]
    return found + ([("fashion-mnist", FASHION_DIR)] if FASHION_DIR.is_dir() else [])


# -- the tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "reused"])
def test_each_idx_file_is_found_once_and_read_once(tmp_path, counted, fresh):
    opens, finds = counted
    src = tmp_path / "src"
    make_fake_fashion(src, n_train=60, n_val=40)
    if not fresh:
        demo_data.prepare_data(src, tmp_path / "data", 2, 1)
    opens.clear()
    finds.clear()
    demo_data.prepare_data(src, tmp_path / "data", 2, 1)
    assert dict(opens) == {f: 1 for f in IDX_FILES}
    assert dict(finds) == {f: 1 for f in IDX_FILES}
    # the reference read the training files twice when it wrote the folder
    opens.clear()
    old_prepare_data(src, tmp_path / ("old_fresh" if fresh else "data"), 2, 1)
    assert opens["train-images-idx3-ubyte.gz"] == (2 if fresh else 1)


def test_same_files_byte_for_byte_and_same_reuse_rules(tmp_path):
    """The fixture and, where installed, the real Fashion-MNIST (a small subset): the new and
    the old step write the same files into two folders, reuse them on a second call, and
    replace them for another subset size."""
    for name, src in sources(tmp_path):
        new_dir, old_dir = tmp_path / name / "new", tmp_path / name / "old"
        new, old = demo_data.prepare_data(src, new_dir, 3, 2), old_prepare_data(src, old_dir, 3, 2)
        assert_same_data(new, old, new_dir, old_dir)
        assert len(list(new_dir.rglob("*.png"))) == 30
        assert tree(new_dir) == tree(old_dir), name
        before = mtimes(new_dir)
        demo_data.prepare_data(src, new_dir, 3, 2)  # reused: no image rewritten
        after = mtimes(new_dir)
        assert {k: v for k, v in after.items() if k.endswith(".png")} == \
               {k: v for k, v in before.items() if k.endswith(".png")}
        # an interrupted write (a missing image) is redone, by both
        for d in (new_dir, old_dir):
            next(d.rglob("*.png")).unlink()
            (d / "fashion_mnist_3pc" / ".prepare_fashion_mnist.json").unlink()
        demo_data.prepare_data(src, new_dir, 3, 2), old_prepare_data(src, old_dir, 3, 2)
        assert tree(new_dir) == tree(old_dir) and len(list(new_dir.rglob("*.png"))) == 30
        # another subset size is a folder of its own
        new, old = demo_data.prepare_data(src, new_dir, 1, 1), old_prepare_data(src, old_dir, 1, 1)
        assert_same_data(new, old, new_dir, old_dir)
        assert tree(new_dir) == tree(old_dir)


def _truncate(path):
    path.write_bytes(gzip.compress(b"\0\0\x08"))


def _not_gzip(path):
    path.write_bytes(b"garbage")


def _labels_out_of_range(path):
    write_idx(path, np.full(40, 12, np.uint8))


BAD_SOURCES = [(f, "missing", Path.unlink) for f in IDX_FILES] + [
    ("train-images-idx3-ubyte.gz", "truncated", _truncate),
    ("train-labels-idx1-ubyte.gz", "not gzip", _not_gzip),
    ("t10k-images-idx3-ubyte.gz", "truncated", _truncate),
    ("t10k-labels-idx1-ubyte.gz", "labels out of range", _labels_out_of_range),
]


@pytest.mark.parametrize("file,what,spoil", BAD_SOURCES, ids=[f"{w}-{f.split('-')[0]}-{f.split('-')[1]}"
                                                              for f, w, _ in BAD_SOURCES])
def test_bad_sources_give_the_same_errors(tmp_path, file, what, spoil):
    make_fake_fashion(tmp_path / "src", n_train=60, n_val=40)
    spoil(tmp_path / "src" / file)
    with pytest.raises(DemoError) as new:
        demo_data.prepare_data(tmp_path / "src", tmp_path / "new", 2, 1)
    with pytest.raises(DemoError) as old:
        old_prepare_data(tmp_path / "src", tmp_path / "old", 2, 1)
    assert str(new.value) == str(old.value)
    assert file in str(new.value) and "make demo" in str(new.value)
    # the source is read before anything is written (the reference had begun the folder)
    assert not (tmp_path / "new").exists()


def test_the_data_tool_still_reads_by_itself(tmp_path, counted):
    """``prepare`` without ``preloaded`` (the command line) reads the source itself, once per file."""
    opens, _ = counted
    make_fake_fashion(tmp_path / "src", n_train=60, n_val=40)
    opens.clear()
    fashion_mnist.prepare(tmp_path / "out", source=tmp_path / "src", limit_per_class=1, verbose=False)
    assert dict(opens) == {f: 1 for f in IDX_FILES}
    with pytest.raises(fashion_mnist.DataToolError, match="preloaded splits are for IDX sources"):
        from vissl_swav_plugin.tools import prepare_data

        prepare_data.prepare(tmp_path / "o2", source=tmp_path / "src", kind="folder",
                             preloaded={"train": (np.zeros((1, 2, 2), np.uint8), np.zeros(1, np.int64))})


@pytest.mark.parametrize("spoil", ["data_dir_is_a_file", "lock_is_a_folder"])
def test_a_folder_the_demo_cannot_write_is_named(tmp_path, spoil):
    """An OSError where the demo writes its image folder (a read-only place, a file in the way)
    is a DemoError naming the folder and --data-dir, not a traceback; nothing is written."""
    make_fake_fashion(tmp_path / "src", n_train=60, n_val=40)
    data_dir = tmp_path / "data"
    if spoil == "data_dir_is_a_file":
        data_dir.write_text("not a folder")
        folder = data_dir / "fashion_mnist_2pc"
    else:
        (data_dir / ".fashion_mnist_2pc.lock").mkdir(parents=True)
        folder = data_dir / "fashion_mnist_2pc"
    with pytest.raises(DemoError) as e:
        demo_data.prepare_data(tmp_path / "src", data_dir, 2, 2)
    assert str(e.value).startswith(f"{folder}: cannot write the demo's image folder there (")
    assert "--data-dir" in str(e.value)
    assert not folder.is_dir() or not list(folder.rglob("*.png"))
