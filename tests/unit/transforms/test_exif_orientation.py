"""EXIF orientation: by default read as stored, as the official SwAV code reads images
(PIL through torchvision's ImageFolder loader), with one warning per process naming the
file and the option; ``VISSL_SWAV_PLUGIN_EXIF=apply`` rotates them upright.  The truth:
torchvision's ``default_loader`` for the default, and the EXIF specification's meaning of
each orientation value written as numpy flips / rotations for the option."""
import logging

import numpy as np
import pytest
from PIL import Image
from testkit import compose, folder_data_overrides

from bad_inputs_cases import QUICK  # noqa: F401

# stored pixels S for an upright image U under each orientation value (EXIF 2.3, tag 0x0112:
# the viewer turns S into U); np.rot90(x, 1) turns counter-clockwise
STORED = {
    1: lambda u: u,
    2: lambda u: u[:, ::-1],
    3: lambda u: np.rot90(u, 2),
    4: lambda u: u[::-1],
    5: lambda u: u.transpose(1, 0, 2),
    6: lambda u: np.rot90(u, 1),
    7: lambda u: np.rot90(u, 2).transpose(1, 0, 2),
    8: lambda u: np.rot90(u, -1),
}


def _upright(seed=0):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(3, 5, 3), dtype=np.uint8)  # 3 x 5 blocks: no symmetry
    return np.kron(base, np.ones((16, 16, 1), dtype=np.uint8))  # 48 x 80


def _write(path, orientation, upright):
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(np.ascontiguousarray(STORED[orientation](upright))).save(path, quality=100, exif=exif)


def _nearest(img, candidates):
    got = np.asarray(img).astype(float)
    dists = {k: (np.abs(got - c.astype(float)).mean() if c.shape == got.shape else np.inf)
             for k, c in candidates.items()}
    return min(dists, key=dists.get)


def _dataset(root, monkeypatch, value):
    from vissl.data import build_dataset

    if value is None:
        monkeypatch.delenv("VISSL_SWAV_PLUGIN_EXIF", raising=False)
    else:
        monkeypatch.setenv("VISSL_SWAV_PLUGIN_EXIF", value)
    cfg = compose([QUICK, "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=1"]
                  + folder_data_overrides(root))
    return build_dataset(cfg, "TRAIN").data_objs[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("exif") / "imgs"
    (root / "class0").mkdir(parents=True)
    ups = {}
    for o in STORED:
        ups[o] = _upright(o)
        _write(root / "class0" / f"o{o}.jpg", o, ups[o])
    return root, ups


@pytest.mark.parametrize("orientation", list(STORED))
def test_default_reads_as_stored_like_torchvision_and_apply_rotates_upright(folder, monkeypatch, orientation):
    from torchvision.datasets.folder import default_loader

    root, ups = folder
    path = str(root / "class0" / f"o{orientation}.jpg")
    cands = {f"stored{o}": np.ascontiguousarray(f(ups[orientation])) for o, f in STORED.items()}
    cands["upright"] = ups[orientation]
    official = np.asarray(default_loader(path))
    for value in (None, "ignore", "apply"):
        ds = _dataset(root, monkeypatch, value)
        idx = [p for p, _ in ds.image_dataset.samples].index(path)
        img, ok = ds[idx]
        assert ok
        if value == "apply":
            assert _nearest(img, cands) in ("upright", "stored1")  # stored1 is the upright image
        else:
            assert np.abs(np.asarray(img).astype(int) - official.astype(int)).max() == 0
            assert _nearest(img, cands) == f"stored{orientation}"


def test_rotated_images_are_warned_once_naming_the_option(folder, monkeypatch, caplog):
    from vissl_swav_plugin.compat import image_modes

    root, _ = folder
    ds = _dataset(root, monkeypatch, None)
    image_modes._warned.clear()
    with caplog.at_level(logging.WARNING):
        for i in range(len(ds)):
            ds[i]
    warnings = [r.getMessage() for r in caplog.records if "EXIF orientation" in r.getMessage()]
    assert len(warnings) == 1 and "VISSL_SWAV_PLUGIN_EXIF=apply" in warnings[0]
    assert "o1.jpg" not in warnings[0]  # orientation 1 is upright: nothing to say
    image_modes._warned.clear()
    caplog.clear()
    ds = _dataset(root, monkeypatch, "apply")
    with caplog.at_level(logging.WARNING):
        for i in range(len(ds)):
            ds[i]
    assert "EXIF orientation" not in caplog.text


def test_an_unknown_value_is_an_error_naming_the_variable(folder, monkeypatch):
    with pytest.raises(ValueError, match=r"VISSL_SWAV_PLUGIN_EXIF='sideways': use one of ignore, apply"):
        _dataset(folder[0], monkeypatch, "sideways")


def test_the_launcher_warns_with_a_count_and_examples(folder, monkeypatch, caplog):
    from vissl_swav_plugin.config.registries import run_launch_checks

    root, _ = folder
    monkeypatch.delenv("VISSL_SWAV_PLUGIN_EXIF", raising=False)
    cfg = compose([QUICK, "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=1"]
                  + folder_data_overrides(root))
    with caplog.at_level(logging.WARNING):
        run_launch_checks(cfg)
    # 4 images sampled per class folder, in name order: o1 (upright), o2, o3, o4
    assert "3 of 4 images sampled" in caplog.text and "VISSL_SWAV_PLUGIN_EXIF=apply" in caplog.text
    assert "o2.jpg (orientation 2)" in caplog.text and "o1.jpg" not in caplog.text
    caplog.clear()
    monkeypatch.setenv("VISSL_SWAV_PLUGIN_EXIF", "apply")
    with caplog.at_level(logging.WARNING):
        run_launch_checks(cfg)
    assert "EXIF" not in caplog.text
