"""swav-plugin-prepare-data (vissl_swav_plugin/tools/prepare_data.py) on IDX / .npz / image
folders, with each dataset's own class names; swav-plugin-mean-std and the named
NORMALIZE keys it writes."""
import json

import numpy as np
import pytest
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from multicrop_helpers import make_fake_fashion
from testkit import compose, make_image_folder
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.tools import mean_std, prepare_data
from vissl_swav_plugin.tools.data_sources import FASHION_MNIST_CLASSES, DataToolError


def class_dirs(split_dir):
    return sorted(p.name for p in split_dir.iterdir())


def test_mnist_style_idx_gets_digits_never_fashion_names(tmp_path):
    make_fake_fashion(tmp_path / "mnist", n_train=40, n_val=20)  # same IDX layout as MNIST
    s = prepare_data.prepare(tmp_path / "out", source=tmp_path / "mnist", limit_per_class=2, verbose=False)
    assert s["class_names"] == [str(d) for d in range(10)]
    assert class_dirs(tmp_path / "out" / "train") == [str(d) for d in range(10)]
    assert s["dataset_names"] == ["mnist_filelist", "mnist_folder"]
    assert not set(FASHION_MNIST_CLASSES) & set(s["class_names"])
    # the same files with --dataset fashion_mnist get Fashion-MNIST's names; --class-names wins
    s = prepare_data.prepare(tmp_path / "fm", source=tmp_path / "mnist", limit_per_class=1, verbose=False,
                             dataset="fashion_mnist")
    assert class_dirs(tmp_path / "fm" / "train")[0] == "0_tshirt_top"
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    assert prepare_data.main(["--source", str(tmp_path / "mnist"), "--out", str(tmp_path / "named"),
                              "--class-names", str(names), "--limit-per-class", "1"]) == 0
    assert class_dirs(tmp_path / "named" / "val")[3] == "3_c3"
    with pytest.raises(DataToolError, match="labels outside 0..2"):  # 3 names, 10 labels
        prepare_data.prepare(tmp_path / "few", source=tmp_path / "mnist", class_names=["a", "b", "c"],
                             verbose=False)


def test_npz_sources(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8)
    y = np.arange(30) % 3
    np.savez(tmp_path / "pets.npz", images=x, labels=y, class_names=np.array(["cat", "dog", "fox"]))
    s = prepare_data.prepare(tmp_path / "o1", source=tmp_path / "pets.npz", verbose=False, val_fraction=0.2)
    assert class_dirs(tmp_path / "o1" / "train") == ["0_cat", "1_dog", "2_fox"]
    assert s["splits"]["train"]["counts"] == [8, 8, 8] and s["splits"]["val"]["counts"] == [2, 2, 2]
    png = sorted((tmp_path / "o1" / "train" / "1_dog").iterdir())[0]
    assert np.array_equal(np.asarray(Image.open(png)), x[int(png.stem)])  # index = position in the npz
    # Keras-style split arrays, float images in [0, 1], channels first; labels 0..11: padded folders
    xf = rng.random((24, 1, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "k.npz", x_train=xf, y_train=np.arange(24) % 12, x_test=xf[:12], y_test=np.arange(12))
    s = prepare_data.prepare(tmp_path / "o2", source=tmp_path / "k.npz", size=12, verbose=False)
    assert class_dirs(tmp_path / "o2" / "val")[:3] == ["00", "01", "02"] and len(s["splits"]) == 2
    assert Image.open(next((tmp_path / "o2" / "train").rglob("*.png"))).size == (12, 12)
    np.savez(tmp_path / "bad.npz", foo=x)
    with pytest.raises(DataToolError, match="no image array"):
        prepare_data.prepare(tmp_path / "o3", source=tmp_path / "bad.npz", verbose=False)


def test_image_folders_with_and_without_classes(tmp_path):
    make_image_folder(tmp_path / "shop", classes=3, per_class=6, size=24)
    s = prepare_data.prepare(tmp_path / "o", source=tmp_path / "shop", size=16, val_fraction=0.5, verbose=False)
    assert class_dirs(tmp_path / "o" / "train") == ["0_class0", "1_class1", "2_class2"]
    assert s["splits"]["val"]["counts"] == [3, 3, 3]
    cat = json.loads((tmp_path / "o" / "dataset_catalog.json").read_text())
    assert cat["shop_folder"]["val"] == [str(tmp_path / "o" / "val")] * 2
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGBA", (40, 20), (10, 200, 30, 128)).save(flat / "a.png")  # non-square, RGBA
    Image.new("L", (20, 20), 7).save(flat / "b.jpg")
    s = prepare_data.prepare(tmp_path / "of", source=flat, size=10, verbose=False)
    assert s["class_names"] == ["unlabelled"] and list(s["splits"]) == ["train"]
    im = Image.open(sorted((tmp_path / "of" / "train" / "0_unlabelled").iterdir())[0])
    assert im.size == (10, 10) and im.mode == "RGB"
    with pytest.raises(DataToolError, match="has no 'val' split"):
        prepare_data.prepare(tmp_path / "of2", source=flat, splits=["val"], verbose=False)
    (flat / "c.png").write_bytes(b"not a png")
    with pytest.raises(DataToolError, match="c.png"):
        prepare_data.prepare(tmp_path / "of3", source=flat, verbose=False)


def test_mean_std_tool_and_named_normalize_keys(tmp_path, monkeypatch, capsys):
    make_image_folder(tmp_path / "imgs", classes=2, per_class=3, size=8)
    Image.new("L", (8, 8), 51).save(tmp_path / "imgs" / "class0" / "gray.png")  # read as RGB (51, 51, 51)
    px = np.concatenate([np.asarray(Image.open(p).convert("RGB"), np.float64).reshape(-1, 3) / 255
                         for p in sorted((tmp_path / "imgs").rglob("*.png"))])
    monkeypatch.chdir(tmp_path)
    assert mean_std.main(["imgs", "--name", "mine"]) == 0
    assert "+config/dataset_stats=mine" in capsys.readouterr().out
    cfg = compose(["config=pretrain/swav/swav_fashion_mnist_cpu", "+config/dataset_stats=mine"])
    t = cfg.DATA.TRAIN.TRANSFORMS[0]
    assert t["name"] == "multicrop_plugin"
    np.testing.assert_allclose(t["mean"], px.mean(0), atol=1e-4)
    np.testing.assert_allclose(t["std"], px.std(0), atol=1e-4)
    assert mean_std.main(["imgs", "--limit", "2", "--print-only"]) == 0
    cfg = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu",
                   "+config.DATA.TEST.NORMALIZE={MEAN:[0.1,0.2,0.3],STD:[0.4,0.5,0.6]}"])
    assert cfg.DATA.TEST.TRANSFORMS[3]["mean"] == [0.1, 0.2, 0.3]
    assert cfg.DATA.TRAIN.TRANSFORMS[3]["mean"] == [0.286, 0.286, 0.286]  # TRAIN untouched
    for bad, msg in (("{MEAN:[0.1,0.2],STD:[1,1,1]}", "DATA.TRAIN.NORMALIZE.MEAN must be a list of 3"),
                     ("{MEAN:[0.1,0.2,0.3],STD:[1,0,1]}", "STD must be > 0")):
        with pytest.raises(ConfigError, match=msg):
            compose(["config=test/swav_plugin/quick_cpu", f"+config.DATA.TRAIN.NORMALIZE={bad}"])
    with pytest.raises(ConfigError, match="no transform of config.DATA.TRAIN.TRANSFORMS takes a mean/std"):
        compose(["config=test/swav_plugin/quick_cpu", "config.DATA.TRAIN.TRANSFORMS=[{name:ToTensor}]",
                 "+config.DATA.TRAIN.NORMALIZE={MEAN:[0.1,0.2,0.3],STD:[1,1,1]}"])
