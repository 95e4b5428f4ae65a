"""``config.DATA.TRAIN.DEVICE_AUGMENT=decode`` and ``multicrop_plugin``'s ``jpeg_draft``
(``vissl_swav_plugin/transforms/device_decode.py``, ``pil_resample.py``, ``compat/image_modes.py``):
in-process; the VISSL runs are in ``tests/integration/transforms/test_device_augment_integration.py``.

Independent truths: PIL itself (``Image.resize(size, filter, box)``, its JPEG decoder, its
``draft``), the workers' path (``device_augment: photometric`` gives each crop's uint8 pixels
after the crop, resize and flip, drawn by the same numpy RNG state), VISSL's dataset and
collator, data_safety's message for a bad file.

The device's crops equal PIL's bit for bit (this file's images and seeds): the JPEG decode
(torchvision's libjpeg-turbo and PIL's decoder give the same pixels) and the resize (Pillow's
fixed-point arithmetic reproduced exactly, its order of passes included).
"""
import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from autocast_emulator import AMP_MODES
from testkit import compose, folder_data_overrides, make_image_folder
from vissl_swav_plugin.compat import image_modes
from vissl_swav_plugin.compat.data_safety import BAD_IMAGES_ENV, BadImageError
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.transforms import device_decode as dd
from vissl_swav_plugin.transforms import device_step as ds
from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
from vissl_swav_plugin.transforms.multicrop_config import MultiCropConfigError
from vissl_swav_plugin.transforms.pil_resample import FILTERS, resize_boxes

SMALL = dict(num_crops=[2, 2], size_crops=[40, 24], crop_scales=[[0.14, 1.0], [0.05, 0.14]])
PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS,
               "nearest": Image.NEAREST}
TRANSFORM = ("[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[40,24],"
             "crop_scales:[[0.14,1],[0.05,0.14]]}]")


def photo(rng, w, h):
    """A photo-like image: smooth colour fields, a few sharp-edged discs, noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 90 * np.sin(rng.uniform(0.01, 0.05) * x + rng.uniform(0, 6)) *
                    np.cos(rng.uniform(0.01, 0.05) * y) for _ in range(3)], -1)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(5, max(w, h) / 3)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8))


def jpeg_bytes(im, **kw):
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def chw(im):
    return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)


def boxes_of_every_kind(rng, w, h, n):
    """Crop boxes: random ones, the whole image, boxes on each border and corner, tiny ones,
    thin ones (upscaled along one axis)."""
    out = [(0, 0, w, h), (0, 0, 5, 7), (w - 6, h - 3, w, h), (0, h // 3, w, h // 3 + 4), (w // 2, 0, w // 2 + 3, h)]
    while len(out) < n:
        bw, bh = int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))
        left, top = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        out.append((left, top, left + bw, top + bh))
    return out


# -- the resize: PIL's resample, on tensors -------------------------------------------------
@pytest.mark.parametrize("interpolation", sorted(FILTERS))
@pytest.mark.parametrize("size", [224, 96, 17])
def test_resize_equals_pil_for_every_box(interpolation, size):
    rng = np.random.default_rng(size)
    images = [photo(rng, w, h) for w, h in ((157, 203), (64, 31), (300, 300))]
    owners, boxes = [], []
    for k, im in enumerate(images):
        for box in boxes_of_every_kind(rng, *im.size, 12):
            owners.append(k)
            boxes.append(box)
    got = resize_boxes([chw(im) for im in images], owners, boxes, size, interpolation)
    want = torch.stack([chw(images[k].resize((size, size), PIL_FILTERS[interpolation], box=b))
                        for k, b in zip(owners, boxes)])
    assert got.dtype == torch.uint8 and got.shape == want.shape
    assert torch.equal(got, want), (got.int() - want.int()).abs().max()


def test_resize_in_chunks_and_under_autocast_is_the_same():
    rng = np.random.default_rng(1)
    images = [chw(photo(rng, 120, 90)), chw(photo(rng, 80, 140))]
    owners = [0, 1, 0, 1, 1]
    boxes = [(0, 0, 120, 90), (10, 20, 70, 130), (5, 5, 40, 60), (0, 0, 80, 140), (30, 0, 80, 50)]
    whole = resize_boxes(images, owners, boxes, 32, "bicubic")
    assert torch.equal(resize_boxes(images, owners, boxes, 32, "bicubic", max_bytes=1), whole)  # one crop a chunk
    for amp in AMP_MODES.values():
        with amp():
            assert torch.equal(resize_boxes(images, owners, boxes, 32, "bicubic"), whole)


# -- the worker's image: encoded where the device can decode it -----------------------------
def test_open_encoded_keeps_plain_jpegs_and_decodes_the_rest(tmp_path):
    rng = np.random.default_rng(2)
    im = photo(rng, 70, 50)
    files = {"rgb.jpg": jpeg_bytes(im), "gray.jpg": jpeg_bytes(im.convert("L")),
             "cmyk.jpg": jpeg_bytes(im.convert("CMYK")), "png.jpg": None}
    im.save(tmp_path / "png.jpg", "PNG")  # a PNG behind a .jpg name
    for name, data in files.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
    for name in files:
        got = image_modes.open_encoded(tmp_path / name)
        want = image_modes.open_rgb(tmp_path / name)
        if name in ("rgb.jpg", "gray.jpg"):
            assert isinstance(got, image_modes.EncodedImage) and got.size == want.size
            assert got.data == (tmp_path / name).read_bytes()
            assert np.array_equal(np.asarray(got.decode()), np.asarray(want))
        else:
            assert isinstance(got, Image.Image) and np.array_equal(np.asarray(got), np.asarray(want))


def test_exif_apply_decodes_a_rotated_jpeg_in_the_worker(tmp_path):
    im = photo(np.random.default_rng(3), 60, 40)
    exif = Image.Exif()
    exif[image_modes.EXIF_ORIENTATION_TAG] = 6
    path = tmp_path / "rot.jpg"
    im.save(path, "JPEG", exif=exif)
    assert isinstance(image_modes.open_encoded(path, exif="ignore"), image_modes.EncodedImage)
    applied = image_modes.open_encoded(path, exif="apply")
    assert isinstance(applied, Image.Image)
    assert np.array_equal(np.asarray(applied), np.asarray(image_modes.open_rgb(path, exif="apply")))


# -- the decode mode's crops: the workers' crops for the same draws -------------------------
def _sources(kind, im, path):
    if kind == "encoded":
        return image_modes.open_encoded(path)
    return im  # a decoded image (another data source, or a file the worker decoded)


@pytest.mark.parametrize("kind", ["encoded", "decoded"])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_device_crops_equal_the_workers_crops(tmp_path, kind, interpolation):
    """Per image, ``decode`` sends its parameter rows; the device's crop, resize and flip equal,
    bit for bit, the uint8 crops that ``photometric`` workers make from the same draws (the same
    numpy state): the JPEG decoded on the device as PIL decodes it, the boxes and flips of the
    draws.  Images wider and taller than they are high (Pillow 13 changes its pass order for
    tall ones)."""
    rng = np.random.default_rng(4)
    worker = MultiCropPlugin(**SMALL, interpolation=interpolation, device_augment="photometric")
    device_side = MultiCropPlugin(**SMALL, interpolation=interpolation, device_augment="decode")
    decoder = ds.decoder_for_transform(device_side)
    images, want = [], []
    for k, (w, h) in enumerate(((181, 133), (96, 160), (64, 64))):
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(jpeg_bytes(photo(rng, w, h)))
        pil = image_modes.open_rgb(path)
        np.random.seed(k)
        want.append([c[0] for c in worker(pil)])
        np.random.seed(k)
        images.append(device_side(_sources(kind, pil, path)))
    batch = dd.multicrop_decode_collator([{"data": out, "label": [0] * 4, "data_valid": [1] * 4,
                                           "data_idx": [k] * 4} for k, out in enumerate(images)])
    crops, photometric, substituted = decoder(batch[dd.ENCODED_KEY][0], batch[ds.PARAMS_KEY][0], "cpu")
    assert substituted == []
    for pos, got in enumerate(crops):
        ref = torch.stack([w[pos] for w in want])
        assert got.dtype == torch.uint8 and torch.equal(got, ref), (pos, (got.int() - ref.int()).abs().max())
    # the photometric rows are the workers' rows
    worker_rows = torch.stack([torch.stack([c[1] for c in out]) for out in [[(None, r[dd.D_PHOTOMETRIC]) for _, r in im]
                                                                             for im in images]], 1)
    assert torch.equal(photometric, worker_rows)


def test_decode_pipeline_matches_the_photometric_pipeline(tmp_path):
    """The whole device side (crops, photometric ops, normalisation) of ``decode`` equals
    ``photometric``'s for the same draws: the same uint8 crops go into the same ops."""
    rng = np.random.default_rng(5)
    modes = {m: MultiCropPlugin(**SMALL, device_augment=m) for m in ("photometric", "decode")}
    samples = {m: [] for m in modes}
    for k in range(6):
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(jpeg_bytes(photo(rng, 120, 100)))
        for m, t in modes.items():
            np.random.seed(100 + k)
            img = image_modes.open_encoded(path) if m == "decode" else image_modes.open_rgb(path)
            samples[m].append({"data": t(img), "label": [0] * 4, "data_valid": [1] * 4, "data_idx": [k] * 4})
    ref = ds.augment_batch(ds.multicrop_device_collator(samples["photometric"]),
                           ds.augmenter_for_transform(modes["photometric"]), torch.device("cpu"))
    got = ds.augment_batch(dd.multicrop_decode_collator(samples["decode"]),
                           ds.augmenter_for_transform(modes["decode"]), torch.device("cpu"),
                           ds.decoder_for_transform(modes["decode"]))
    for a, b in zip(ref["data"][0], got["data"][0]):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    for key in ("label", "data_valid", "data_idx"):
        assert torch.equal(ref[key][0], got[key][0])


# -- a file the device cannot decode --------------------------------------------------------
def _decode_batch(tmp_path, damage):
    rng = np.random.default_rng(6)
    t = MultiCropPlugin(**SMALL, device_augment="decode")
    samples = []
    for k in range(3):
        path = tmp_path / f"img{k}.jpg"
        data = jpeg_bytes(photo(rng, 90, 70))
        path.write_bytes(data[: len(data) // 3] if k == damage else data)
        samples.append({"data": t(image_modes.open_encoded(path)), "label": [0] * 4, "data_valid": [1] * 4,
                        "data_idx": [10 + k] * 4})
    return t, dd.multicrop_decode_collator(samples)


def test_a_damaged_jpeg_is_named_as_the_workers_name_it(tmp_path, monkeypatch):
    monkeypatch.delenv(BAD_IMAGES_ENV, raising=False)
    t, batch = _decode_batch(tmp_path, damage=1)
    decoder = dd.DeviceDecoder(t._size, "bilinear", "my_images")
    with pytest.raises(BadImageError) as e:
        ds.augment_batch(batch, ds.augmenter_for_transform(t), torch.device("cpu"), decoder)
    msg = str(e.value)
    assert str(tmp_path / "img1.jpg") in msg and "index 11 of dataset my_images" in msg
    assert "config.DATA.TRAIN" in msg and BAD_IMAGES_ENV in msg


def test_substitute_gives_gray_crops_and_marks_them_invalid(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(BAD_IMAGES_ENV, "substitute")
    t, batch = _decode_batch(tmp_path, damage=2)
    decoder = ds.decoder_for_transform(t)
    crops, _, substituted = decoder(batch[dd.ENCODED_KEY][0], batch[ds.PARAMS_KEY][0], "cpu")
    assert substituted == [2]
    assert all(bool((c[2] == 128).all()) and not bool((c[:2] == 128).all()) for c in crops)
    with caplog.at_level(logging.WARNING):
        out = ds.augment_batch(batch, ds.augmenter_for_transform(t), torch.device("cpu"), decoder)
    assert str(tmp_path / "img2.jpg") in caplog.text
    valid = out["data_valid"][0].view(4, 3)  # crop-major: [position, image]
    assert valid[:, 2].eq(-1).all() and valid[:, :2].eq(1).all()


# -- through VISSL's dataset, collator and train-step batches ------------------------------
def test_vissl_dataset_and_train_batches_give_the_decoded_crops(tmp_path):
    """VISSL's ``disk_folder`` dataset hands ``multicrop_plugin`` the undecoded JPEG, its collator
    and ``train_batches`` (what precise BN and a memory bank read) give the same normalised crops
    as the train step's conversion."""
    from vissl.data import build_dataset
    from vissl.data.collators import get_collator

    root = make_image_folder(tmp_path / "imgs", per_class=3, size=48, ext="jpg")
    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.DATA.TRAIN.TRANSFORMS={TRANSFORM}",
                   *folder_data_overrides(root), "config.DATA.TRAIN.DATA_LIMIT=-1",
                   "config.DATA.TRAIN.DEVICE_AUGMENT=decode"])
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == "multicrop_decode_collator"
    assert cfg.TRAINER.TRAIN_STEP_NAME == ds.TRAIN_STEP_NAME
    dataset = build_dataset(cfg=cfg, split="TRAIN")
    collate = get_collator(cfg.DATA.TRAIN.COLLATE_FUNCTION, {})
    np.random.seed(0)
    batch = collate([dataset[i] for i in range(4)])
    assert all(isinstance(im, image_modes.EncodedImage) for im in batch[dd.ENCODED_KEY][0])

    class Task:
        config = cfg
        device = torch.device("cpu")
        dataloaders = {"train": [dict(batch)]}

    (seen,) = list(ds.train_batches(Task()))
    direct = ds.augment_batch(dict(batch), ds.augmenter_for(cfg), torch.device("cpu"), ds.decoder_for(cfg))
    assert [tuple(c.shape) for c in seen["data"][0]] == [(4, 3, 40, 40)] * 2 + [(4, 3, 24, 24)] * 2
    for a, b in zip(seen["data"][0], direct["data"][0]):
        assert a.dtype == torch.float32 and torch.equal(a, b)


# -- the config ----------------------------------------------------------------------------
def _compose_decode(*extra):
    return compose(["config=test/swav_plugin/quick_cpu", "config.DATA.TRAIN.DEVICE_AUGMENT=decode", *extra])


@pytest.mark.parametrize("extra, words", [
    ([f"config.DATA.TRAIN.TRANSFORMS=[{{name:ImgPilToRawTensor}},{TRANSFORM[1:-1]}]"],
     ["DEVICE_AUGMENT", "only transform", "ImgPilToRawTensor"]),
    ([f"config.DATA.TRAIN.TRANSFORMS={TRANSFORM}", "config.DATA.TRAIN.COLLATE_FUNCTION=simclr_collator"],
     ["COLLATE_FUNCTION", "multicrop_decode_collator"]),
])
def test_decode_refuses_what_it_cannot_do_naming_the_keys(extra, words):
    with pytest.raises(ConfigError) as e:
        _compose_decode(*extra)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_jpeg_draft_must_be_first_and_not_with_decode():
    draft_first = TRANSFORM.replace("total_num_crops", "jpeg_draft:true,total_num_crops")
    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.DATA.TRAIN.TRANSFORMS={draft_first}"])
    assert image_modes.wants_encoded(cfg, "TRAIN") and not image_modes.wants_encoded(cfg, "TEST")
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[1\]\.jpeg_draft.*first transform"):
        compose(["config=test/swav_plugin/quick_cpu",
                 f"config.DATA.TRAIN.TRANSFORMS=[{{name:ImgPilToRawTensor}},{draft_first[1:-1]}]"])
    with pytest.raises(MultiCropConfigError, match="jpeg_draft.*decode"):
        MultiCropPlugin(**SMALL, device_augment="decode", jpeg_draft=True)
    with pytest.raises(MultiCropConfigError, match="jpeg_draft.*true or false"):
        MultiCropPlugin(**SMALL, jpeg_draft="yes")


# -- jpeg_draft: the reduced decode where every crop allows it -----------------------------
def test_draft_reduction_is_the_largest_every_crop_allows():
    t = MultiCropPlugin(num_crops=[1, 1], size_crops=[100, 50], crop_scales=[[0.5, 1], [0.1, 0.2]], jpeg_draft=True)
    assert t.draft_reduction(np.array([[0, 0, 800, 900], [0, 0, 400, 420]])) == 8
    assert t.draft_reduction(np.array([[0, 0, 800, 399], [0, 0, 400, 420]])) == 2
    assert t.draft_reduction(np.array([[0, 0, 800, 900], [0, 0, 99, 420]])) == 1
    assert MultiCropPlugin(num_crops=[1, 1], size_crops=[100, 50], crop_scales=[[0.5, 1], [0.1, 0.2]]
                           ).draft_reduction(np.array([[0, 0, 800, 900], [0, 0, 400, 420]])) == 1


def test_jpeg_draft_draws_as_the_full_decode_and_stays_close_to_its_crops(tmp_path):
    """The boxes are drawn on the full size (the same draws as without the option); PIL's draft
    decode then serves crops whose boxes are >= 2x their output side: they stay close to the
    full decode's crops (the DCT's downscale smooths a little)."""
    rng = np.random.default_rng(7)
    path = tmp_path / "big.jpg"
    path.write_bytes(jpeg_bytes(photo(rng, 1600, 1200)))
    recipe = dict(num_crops=[2, 2], size_crops=[64, 32], crop_scales=[[0.4, 1.0], [0.1, 0.2]], to_tensor=False,
                  color_jitter_p=0.0, grayscale_p=0.0, blur_p=0.0)
    full, draft = MultiCropPlugin(**recipe), MultiCropPlugin(**recipe, jpeg_draft=True)
    diffs, reductions = [], []
    for seed in range(6):
        np.random.seed(seed)
        boxes = draft.sample_params(1600, 1200)["boxes"]
        reductions.append(draft.draft_reduction(boxes))
        np.random.seed(seed)
        a = full(image_modes.open_rgb(path))
        np.random.seed(seed)
        b = draft(image_modes.open_encoded(path))
        diffs += [np.abs(np.asarray(x, float) - np.asarray(y, float)) for x, y in zip(a, b)]
    assert max(reductions) >= 4  # the option acted
    d = np.concatenate([x.ravel() for x in diffs])
    assert d.mean() < 2.0 and np.percentile(d, 99) <= 12, (d.mean(), np.percentile(d, 99))
