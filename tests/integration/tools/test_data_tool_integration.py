"""tools/prepare_fashion_mnist.py: IDX -> VISSL disk_folder / disk_filelist + catalog,
loaded back through VISSL's own datasets and compared with the IDX source.  The tool's ``main``
runs in the test process (exit code: its return value; errors: its stderr, from capsys); the
catalog read from VISSL_DATASET_CATALOG_PATH, which VISSL reads once at import, is a fresh
process.  A training that reads its catalog (with a loader worker) is
tests/integration/transforms/test_multicrop_integration.py's SimCLR run.

The in-process tests are in ``tests/unit/tools/test_data_tool.py``.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from multicrop_helpers import FASHION_DIR, make_fake_fashion, write_idx
from testkit import REPO, compose, vissl_run_state
from data_tool_cases import tool  # noqa: F401


@pytest.fixture
def run_tool(tmp_path, capsys):
    """``python tools/prepare_fashion_mnist.py ARGS`` in this process: ``(exit code, stderr)``."""
    def run(*args):
        capsys.readouterr()
        with vissl_run_state(tmp_path):
            code = tool.main([str(a) for a in args])
        return code, capsys.readouterr().err

    return run


def vissl_dataset(tmp_path, source, data_path, label_path, split="TRAIN"):
    from vissl.data import build_dataset

    cfg = compose([
        "config=test/swav_plugin/quick_cpu",
        f"config.DATA.{split}.DATA_SOURCES=[{source}]",
        f"config.DATA.{split}.LABEL_SOURCES=[{source}]",
        f"config.DATA.{split}.DATASET_NAMES=[fashion_mnist_{source}]",
        f"config.DATA.{split}.DATA_PATHS=[{data_path}]",
        f"config.DATA.{split}.LABEL_PATHS=[{label_path}]",
        f"config.DATA.{split}.DATA_LIMIT=-1",
        f"config.DATA.{split}.TRANSFORMS=[{{name:ToTensor}}]",
        f"config.DATA.{split}.COLLATE_FUNCTION=default_collate",
        f"config.CHECKPOINT.DIR={tmp_path}/ck",
    ])
    return build_dataset(cfg, split)


def check_against_idx(ds, images, labels, limit):
    """Every item VISSL returns is an IDX image (as RGB) with its IDX label; the kept
    images are the first `limit` of each class in file order."""
    expect = np.sort(np.concatenate([np.nonzero(labels == c)[0][:limit] for c in range(10)]))
    assert len(ds) == len(expect)
    got = []
    for i in range(len(ds)):
        item = ds[i]
        img = (item["data"][0].numpy() * 255).round().astype(np.uint8)  # ToTensor of the RGB PNG
        lbl = int(item["label"][0])
        assert (img[0] == img[1]).all() and (img[0] == img[2]).all()
        matches = [j for j in expect if np.array_equal(images[j], img[0])]
        assert matches, f"item {i} is not one of the selected IDX images"
        assert labels[matches[0]] == lbl
        got.append(matches[0])
    assert sorted(got) == expect.tolist()


def test_fake_idx_to_disk_folder_and_filelist_loaded_by_vissl(tmp_path, run_tool):
    src = make_fake_fashion(tmp_path / "src", n_train=40, n_val=30)
    out = tmp_path / "out"
    code, err = run_tool("--source", tmp_path / "src", "--out", out, "--limit-per-class", 2)
    assert code == 0, err
    imgs, labels = src["train"]
    # layout: DIR/train/<label>_<name>/<index>.png, class folders sort in label order
    classes = sorted(p.name for p in (out / "train").iterdir())
    assert classes == [tool.class_dir_name(c) for c in range(10)]
    assert all(len(list((out / "train" / c).iterdir())) == 2 for c in classes)
    for split, (simgs, slabels) in (("TRAIN", src["train"]), ("TEST", src["t10k"])):
        d = out / ("train" if split == "TRAIN" else "val")
        check_against_idx(vissl_dataset(tmp_path, "disk_folder", d, d, split), simgs, slabels, 2)
        name = "train" if split == "TRAIN" else "val"
        fl, ll = out / "filelist" / f"{name}_images.npy", out / "filelist" / f"{name}_labels.npy"
        check_against_idx(vissl_dataset(tmp_path, "disk_filelist", fl, ll, split), simgs, slabels, 2)
    cat = json.loads((out / "dataset_catalog.json").read_text())
    assert cat["fashion_mnist_folder"]["train"] == [str(out / "train")] * 2
    assert cat["fashion_mnist_filelist"]["val"] == [str(out / "filelist" / "val_images.npy"),
                                                    str(out / "filelist" / "val_labels.npy")]


def test_catalog_is_resolved_by_vissl_dataset_names(tmp_path, run_tool):
    """A fresh process with VISSL_DATASET_CATALOG_PATH resolves DATASET_NAMES only (no
    DATA_PATHS) through VISSL's VisslDatasetCatalog."""
    make_fake_fashion(tmp_path / "src", n_train=30, n_val=20)
    out = tmp_path / "out"
    assert run_tool("--source", tmp_path / "src", "--out", out, "--limit-per-class", 1)[0] == 0
    script = f"""
import sys, json; sys.path.insert(0, {str(REPO / 'tests' / 'helpers')!r})
from testkit import compose
from vissl.data import build_dataset
from vissl.data.dataset_catalog import VisslDatasetCatalog
cfg = compose(["config=test/swav_plugin/quick_cpu",
    "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.LABEL_SOURCES=[disk_folder]",
    "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]", "config.DATA.TRAIN.DATA_LIMIT=-1",
    "config.DATA.TRAIN.TRANSFORMS=[{{name:ToTensor}}]", "config.CHECKPOINT.DIR={tmp_path}/ck"])
ds = build_dataset(cfg, "TRAIN")
print(json.dumps({{"names": VisslDatasetCatalog.list(), "labels": [int(ds[i]["label"][0]) for i in range(len(ds))]}}))
"""
    env = dict(os.environ, VISSL_DATASET_CATALOG_PATH=str(out / "dataset_catalog.json"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"fashion_mnist_folder", "fashion_mnist_filelist"} <= set(res["names"])
    assert res["labels"] == list(range(10))  # one per class, ImageFolder order = label order


def test_errors_name_the_file_or_argument(tmp_path, run_tool):
    code, err = run_tool("--source", tmp_path / "nowhere", "--out", tmp_path / "o")
    assert code == 2 and str(tmp_path / "nowhere" / "train-images-idx3-ubyte.gz") in err
    assert "dataset-fashion-mnist" in err
    make_fake_fashion(tmp_path / "src", n_train=20, n_val=10)
    bad = tmp_path / "src" / "train-labels-idx1-ubyte.gz"
    write_idx(bad, np.zeros(7, np.uint8))  # 7 labels for 20 images
    code, err = run_tool("--source", tmp_path / "src", "--out", tmp_path / "o", "--split", "train")
    assert code == 2 and str(bad) in err
    bad.write_bytes(b"\x00\x00\x08\x01\x00\x00")  # truncated, not gzip
    with pytest.raises(tool.DataToolError, match=str(bad)):
        tool.read_idx(bad)
    code, err = run_tool("--source", tmp_path / "src", "--out", tmp_path / "o", "--split", "test")
    assert code == 2 and "--split" in err
    foreign = tmp_path / "o2" / "val"
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_text("not ours")
    code, err = run_tool("--source", tmp_path / "src", "--out", tmp_path / "o2", "--split", "val")
    assert code == 2 and str(foreign) in err and (foreign / "keep.txt").exists()


@pytest.mark.skipif(not (FASHION_DIR / "train-labels-idx1-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist not installed (make test installs it)")
def test_real_fashion_mnist_subset_matches_idx(tmp_path, run_tool):
    out = tmp_path / "fm"
    code, err = run_tool("--out", out, "--limit-per-class", 5)
    assert code == 0, err
    for split, prefix in (("TRAIN", "train"), ("TEST", "t10k")):
        images = tool.read_idx(FASHION_DIR / f"{prefix}-images-idx3-ubyte.gz")
        labels = tool.read_idx(FASHION_DIR / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
        assert images.shape[1:] == (28, 28) and len(images) == len(labels)
        d = out / ("train" if split == "TRAIN" else "val")
        ds = vissl_dataset(tmp_path, "disk_folder", d, d, split)
        check_against_idx(ds, images, labels, 5)
