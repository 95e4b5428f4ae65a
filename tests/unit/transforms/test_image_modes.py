"""Every PIL image mode reaches the network as RGB with its real value range.

Each case writes an image in one mode with known content, loads it through VISSL's own
``DiskImageDataset`` (``disk_folder`` and ``disk_filelist``, built by VISSL's
``build_dataset`` as in a run, with the plugin's ``shim_bad_image_errors`` patch) and
compares the pixels (mean, std per channel, max difference) with the RGB values the mode
means.  Controls show VISSL's own loader clipping 16-bit and float images."""
import logging

import numpy as np
import pytest
from PIL import Image

from testkit import compose, folder_data_overrides

QUICK = "config=test/swav_plugin/quick_cpu"
H = W = 16
RAMP = np.linspace(0.0, 1.0, H * W).reshape(H, W)  # a known gray ramp in [0, 1]


def _rgb_blocks():
    rng = np.random.default_rng(3)
    return np.kron(rng.integers(0, 256, (4, 4, 3)), np.ones((4, 4, 1))).astype(np.uint8)


def _gray3(gray8):
    return np.repeat(np.asarray(gray8, dtype=np.uint8)[..., None], 3, axis=2)


def _palette_image(transparent):
    colours = np.array([[255, 0, 0], [0, 128, 255], [20, 200, 40], [250, 250, 10]], dtype=np.uint8)
    idx = (np.arange(H * W).reshape(H, W) // 7) % 4
    img = Image.fromarray(idx.astype(np.uint8), "P")
    img.putpalette(colours.flatten().tolist() + [0] * (768 - colours.size))
    if transparent:
        img.info["transparency"] = 0
    return img, colours[idx]


def _cases():
    """name -> (file name, writer(path), expected uint8 RGB array, warning fragment or None)."""
    rgb = _rgb_blocks()
    u16 = np.rint(RAMP * 65535).astype(np.uint16)
    exp16 = _gray3(np.rint(u16 / 257.0))
    cases = {}

    def add(name, fname, make, expected, warn=None, **save):
        cases[name] = (fname, lambda p: make().save(p, **save), expected, warn)

    checker = (np.indices((H, W)).sum(0) % 2).astype(bool)
    add("1", "bw.png", lambda: Image.fromarray(checker), _gray3(checker * 255))
    add("L", "gray.png", lambda: Image.fromarray(np.rint(RAMP * 255).astype(np.uint8)),
        _gray3(np.rint(RAMP * 255)))
    add("LA", "gray_alpha.png", lambda: Image.fromarray(
        np.stack([np.rint(RAMP * 255), np.full((H, W), 30)], -1).astype(np.uint8), "LA"), _gray3(np.rint(RAMP * 255)))
    add("RGB", "rgb.png", lambda: Image.fromarray(rgb), rgb)
    add("RGBA", "rgba.png", lambda: Image.fromarray(np.dstack([rgb, np.full((H, W), 0, np.uint8)]), "RGBA"), rgb)
    for transparent in (False, True):
        img, exp = _palette_image(transparent)
        add(f"P{'_transparent' if transparent else ''}", f"palette{int(transparent)}.png",
            (lambda i=img: i), exp)
    add("CMYK", "cmyk.tif", lambda: Image.fromarray(np.dstack([255 - rgb, np.zeros((H, W), np.uint8)]), "CMYK"), rgb)
    add("YCbCr", "ycbcr.tif", lambda: Image.fromarray(rgb).convert("YCbCr"),
        np.asarray(Image.fromarray(rgb).convert("YCbCr").convert("RGB")))
    lab = Image.fromarray(np.dstack([np.rint(RAMP * 255), np.full((H, W), 150), np.full((H, W), 110)])
                          .astype(np.uint8), "LAB")
    add("LAB", "lab.tif", lambda: lab, np.asarray(lab.convert("RGB")))
    add("I;16", "gray16.png", lambda: Image.fromarray(u16), exp16)
    add("I;16B", "gray16be.tif", lambda: Image.frombytes("I;16B", (W, H), u16.astype(">u2").tobytes()), exp16)
    add("I", "int32.tif", lambda: Image.fromarray(u16.astype(np.int32)), exp16)
    add("I_out_of_range", "int32_signed.tif", lambda: Image.fromarray((u16.astype(np.int32) - 40000) * 3),
        exp16, warn="stretched min-max")
    add("F", "float01.tif", lambda: Image.fromarray(RAMP.astype(np.float32)), _gray3(np.rint(RAMP * 255)))
    add("F_out_of_range", "float_wide.tif", lambda: Image.fromarray((RAMP * 5 - 2).astype(np.float32)),
        _gray3(np.rint(RAMP * 255)), warn="stretched min-max")
    frames = [Image.fromarray(rgb), Image.fromarray(255 - rgb)]
    add("GIF_animated", "anim.gif", lambda: frames[0].convert("L"), _gray3(np.asarray(frames[0].convert("L"))),
        warn="has 2 frames", save_all=True, append_images=[frames[1].convert("L")])
    add("TIFF_multipage", "pages.tif", lambda: frames[0], rgb, warn="has 2 frames", save_all=True,
        append_images=[frames[1]])
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """One image per case in an ImageFolder, and the same files as a disk_filelist."""
    from vissl.data import build_dataset

    root = tmp_path_factory.mktemp("modes")
    folder = root / "imgs" / "class0"
    folder.mkdir(parents=True)
    for fname, write, _, _ in CASES.values():
        write(folder / fname)
    filelist = root / "files.npy"
    np.save(filelist, np.array(sorted(str(p) for p in folder.iterdir())))
    overrides = [QUICK, "config.DATA.TRAIN.DATA_LIMIT=-1"]
    by_folder = build_dataset(compose(overrides + folder_data_overrides(root / "imgs")), "TRAIN").data_objs[0]
    by_list = build_dataset(compose(overrides + [
        "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]", "config.DATA.TRAIN.DATASET_NAMES=[modes_list]",
        f"config.DATA.TRAIN.DATA_PATHS=[{filelist}]", f"config.DATA.TRAIN.LABEL_PATHS=[{filelist}]"]),
        "TRAIN").data_objs[0]
    return folder, by_folder, by_list


def _load(ds, folder, fname):
    paths = ([p for p, _ in ds.image_dataset.samples] if ds.data_source == "disk_folder"
             else list(ds.get_image_paths()))
    img, ok = ds[paths.index(str(folder / fname))]
    assert ok and img.mode == "RGB"
    return np.asarray(img)


@pytest.mark.parametrize("source", ["disk_folder", "disk_filelist"])
@pytest.mark.parametrize("case", list(CASES))
def test_pixel_statistics_survive_every_mode(datasets, case, source, caplog):
    from vissl_swav_plugin.compat import image_modes

    folder, by_folder, by_list = datasets
    fname, _, expected, warn = CASES[case]
    if source == "disk_folder" and fname.endswith(".gif"):
        pytest.skip("torchvision's ImageFolder does not list .gif files (disk_filelist does)")
    with Image.open(folder / fname) as raw:
        print(case, "file mode:", raw.mode)
    image_modes._warned.clear()
    with caplog.at_level(logging.WARNING):
        got = _load(by_folder if source == "disk_folder" else by_list, folder, fname).astype(float)
    exp = expected.astype(float)
    assert got.shape == exp.shape
    assert np.allclose(got.mean((0, 1)), exp.mean((0, 1)), atol=1.0), (got.mean((0, 1)), exp.mean((0, 1)))
    assert np.allclose(got.std((0, 1)), exp.std((0, 1)), atol=1.0), (got.std((0, 1)), exp.std((0, 1)))
    assert np.abs(got - exp).max() <= 2  # LAB / YCbCr round-trips through 8 bits
    if warn:
        assert warn in caplog.text and str(folder / fname) in caplog.text
    else:
        assert str(folder / fname) not in caplog.text


def test_vissl_own_loader_clips_16_bit_and_float_images(datasets):
    """Control: with the patch off VISSL's ``convert("RGB")`` makes them blank."""
    from vissl_swav_plugin import compat

    folder, by_folder, _ = datasets
    with compat.disabled("shim_bad_image_errors"):
        white = _load(by_folder, folder, "gray16.png")
        black = _load(by_folder, folder, "float01.tif")
    assert (white == 255).mean() > 0.95 and black.max() <= 1  # the ramps are gone


def test_nan_float_image_is_an_error_naming_the_file(datasets, tmp_path):
    from vissl_swav_plugin.compat.data_safety import BadImageError

    folder, by_folder, _ = datasets
    bad = folder / "zz_nan.tif"
    values = RAMP.astype(np.float32)
    values[3, 3] = np.nan
    Image.fromarray(values).save(bad)
    try:
        by_folder._load_data(by_folder._path)  # re-list the folder: the new file is in it
        with pytest.raises(BadImageError, match=rf"cannot read image file {bad} .*1 NaN / inf value"):
            _load(by_folder, folder, bad.name)
    finally:
        bad.unlink()
        by_folder._load_data(by_folder._path)


@pytest.mark.parametrize("mode", ["HSV", "PA", "La", "RGBa", "RGBX", "I;16L", "I;16N"])
def test_modes_without_a_file_format_convert_too(mode):
    """Modes PIL cannot write to a file (or rarely does) still convert by the table."""
    from vissl_swav_plugin.compat.image_modes import to_rgb

    if mode.startswith("I;16"):
        u16 = np.rint(RAMP * 65535).astype("<u2")
        got = np.asarray(to_rgb(Image.frombytes(mode, (W, H), u16.tobytes())))
        assert np.abs(got.astype(int) - _gray3(np.rint(u16 / 257.0))).max() == 0
        return
    via = {"PA": ["P", "PA"], "La": ["L", "LA", "La"], "RGBa": ["RGBA", "RGBa"]}.get(mode, [mode])
    img = Image.fromarray(_rgb_blocks())
    for step in via:
        img = img.convert(step)
    got = np.asarray(to_rgb(img))
    ref = np.asarray(img.convert({"La": "LA", "RGBa": "RGBA"}.get(mode, mode)).convert("RGB"))
    assert got.shape == (H, W, 3) and np.abs(got.astype(int) - ref).max() <= 1


def test_unknown_mode_is_an_error_naming_the_file():
    from vissl_swav_plugin.compat.image_modes import UnsupportedImageError, to_rgb

    class Fake:  # a mode a future Pillow or a plugin might add
        mode, info = "BGR;16", {}

    with pytest.raises(UnsupportedImageError, match=r"image file x\.raw: image mode 'BGR;16' has no defined"):
        to_rgb(Fake(), "x.raw")
