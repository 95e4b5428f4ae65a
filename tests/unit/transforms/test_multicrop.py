"""multicrop_plugin: crop geometry, per-crop augmentations, VISSL pipeline / collator
compatibility and VISSL's built-in multi-crop SimCLR loss training with it (1 and 2
processes).

Independent truths used: torchvision's RandomResizedCrop sampling (crop-area / aspect
distributions), torchvision's ToTensor+Normalize / hflip / adjust_hue, exact float math for
brightness / contrast / saturation, a numpy truncated-Gaussian convolution, VISSL's own
ImgPilToMultiCrop chain and multicrop_collator."""

import numpy as np
import pytest
import torch
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from classy_vision.dataset.transforms import build_transform
from testkit import make_image_folder
from vissl_swav_plugin.transforms import multicrop as mc

PLAIN = dict(flip_p=0.0, color_strength=0.0, grayscale_p=0.0, blur_p=0.0, mean=[0, 0, 0], std=[1, 1, 1])


def ramp_image(width, height):
    """RGB image whose R value is the x coordinate and G the y coordinate (B = 128), so a
    crop's source box can be read back from its pixels (bilinear resampling reproduces a
    linear ramp exactly away from the image border)."""
    assert width <= 256 and height <= 256
    x = np.broadcast_to(np.arange(width, dtype=np.uint8)[None, :], (height, width))
    y = np.broadcast_to(np.arange(height, dtype=np.uint8)[:, None], (height, width))
    b = np.full((height, width), 128, np.uint8)
    return Image.fromarray(np.stack([x, y, b], axis=-1))


def recover_box(crop):
    """(left, top, width, height) of the source box of a crop of ``ramp_image``.

    ``crop``: (3, s, s) array of 0..255 values.  Output pixel i samples the source at
    ``left + (i + 0.5) * w / s - 0.5``: fit that line to the R (x) / G (y) values of the
    interior pixels (the two outermost ones may be clamped at the image border)."""
    crop = np.asarray(crop, dtype=np.float64)
    s = crop.shape[-1]
    idx = np.arange(2, s - 2)
    xs = crop[0][:, idx].mean(axis=0)  # R varies along columns
    ys = crop[1][idx, :].mean(axis=1)  # G varies along rows
    sx, ix = np.polyfit(idx + 0.5, xs, 1)
    sy, iy = np.polyfit(idx + 0.5, ys, 1)
    w, h = sx * s, sy * s
    return ix + 0.5, iy + 0.5, w, h


def build(**cfg):
    return build_transform({"name": "multicrop_plugin", **cfg})


def as255(t):
    return t.numpy() * 255.0


def colourful(size=64):
    x = np.linspace(0, 1, size)
    a = np.stack([np.outer(x, x), np.outer(1 - x, x), np.outer(x, 1 - x)], -1) * 255
    return Image.fromarray(a.astype(np.uint8))


# -- geometry ---------------------------------------------------------------------------
def test_counts_sizes_and_group_order():
    t = build(num_crops=[1, 2, 3], size_crops=[40, 24, 16],
              crop_scales=[[0.5, 1.0], [0.2, 0.3], [0.05, 0.1]], total_num_crops=6)
    out = t(colourful(80))
    assert [tuple(o.shape) for o in out] == [(3, 40, 40)] + [(3, 24, 24)] * 2 + [(3, 16, 16)] * 3
    assert all(o.dtype == torch.float32 for o in out)
    pil = build(num_crops=[2, 1], size_crops=[20, 12], crop_scales=[[0.3, 1], [0.1, 0.2]],
                to_tensor=False)(colourful(50).convert("L"))
    assert [(im.mode, im.size) for im in pil] == [("RGB", (20, 20))] * 2 + [("RGB", (12, 12))]


def _torchvision_areas(W, H, scale, ratio, n, seed):
    import torchvision.transforms as T

    torch.manual_seed(seed)
    img = Image.new("RGB", (W, H))
    out = []
    for _ in range(n):
        i, j, h, w = T.RandomResizedCrop.get_params(img, scale=list(scale), ratio=list(ratio))
        out.append((w * h / (W * H), w / h))
    return np.array(out)


def test_crop_area_and_aspect_match_torchvision_randomresizedcrop():
    """Recover every crop's source box from a coordinate-encoding image; the area
    fractions lie in the configured scale range and follow the same distribution as
    torchvision's RandomResizedCrop (two-sample KS test)."""
    from scipy.stats import ks_2samp

    W, H = 240, 200
    scales = [[0.3, 1.0], [0.05, 0.14]]
    ratios = [[0.75, 4 / 3], [0.5, 2.0]]
    t = build(num_crops=[2, 4], size_crops=[48, 24], crop_scales=scales, crop_ratios=ratios, **PLAIN)
    img = ramp_image(W, H)
    np.random.seed(0)
    boxes = {0: [], 1: []}
    for _ in range(60):
        for k, crop in enumerate(t(img)):
            boxes[0 if k < 2 else 1].append(recover_box(as255(crop)))
    for g in (0, 1):
        b = np.array(boxes[g])
        left, top, w, h = b.T
        assert (left > -1).all() and (top > -1).all()
        assert (left + w < W + 1).all() and (top + h < H + 1).all()
        area = w * h / (W * H)
        lo, hi = scales[g]
        tol = 0.01 + 0.03 * area  # rounding of the box (torchvision rounds w, h) + fit error
        assert (area > lo - tol).all() and (area < hi + tol).all(), (g, area.min(), area.max())
        aspect = w / h
        assert (aspect > ratios[g][0] * 0.95).all() and (aspect < ratios[g][1] * 1.05).all()
        ref = _torchvision_areas(W, H, scales[g], ratios[g], 2000, seed=g)
        assert ks_2samp(area, ref[:, 0]).pvalue > 1e-3
        assert ks_2samp(np.log(aspect), np.log(ref[:, 1])).pvalue > 1e-3


def test_identity_config_equals_totensor_normalize_and_hflip():
    import torchvision.transforms.functional as F

    img = colourful(32)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    kw = dict(num_crops=[1], size_crops=[32], crop_scales=[[1.0, 1.0]], crop_ratios=[1.0, 1.0],
              color_strength=0.0, grayscale_p=0.0, blur_p=0.0, mean=mean, std=std)
    ref = F.normalize(F.to_tensor(img), mean, std)
    assert torch.allclose(build(flip_p=0.0, **kw)(img)[0], ref, atol=1e-5)
    ref_flip = F.normalize(F.to_tensor(F.hflip(img)), mean, std)
    assert torch.allclose(build(flip_p=1.0, **kw)(img)[0], ref_flip, atol=1e-5)


# -- per-crop augmentations -------------------------------------------------------------
def _contingency(a, b):
    return np.array([[np.sum(~a & ~b), np.sum(~a & b)], [np.sum(a & ~b), np.sum(a & b)]])


def test_flip_and_grayscale_are_drawn_per_crop_with_configured_probability():
    """A per-image decision would make crop 0 and crop 1 always agree; per-crop ones are
    independent (each cell of the 2x2 table ~ p_a p_b N)."""
    img = ramp_image(64, 64)
    t = build(num_crops=[2], size_crops=[16], crop_scales=[[1.0, 1.0]], crop_ratios=[1.0, 1.0],
              flip_p=0.5, color_strength=0.0, grayscale_p=0.3, blur_p=0.0, mean=[0, 0, 0], std=[1, 1, 1])
    np.random.seed(1)
    flips, grays = [], []
    for _ in range(400):
        crops = [as255(c) for c in t(img)]
        flips.append([c[0, 8, 2] > c[0, 8, 13] for c in crops])  # R (= x) decreasing
        grays.append([np.abs(c[0] - c[2]).max() < 1 and np.abs(c[1] - c[2]).max() < 1 for c in crops])
    flips, grays = np.array(flips), np.array(grays)
    assert abs(flips.mean() - 0.5) < 0.05 and abs(grays.mean() - 0.3) < 0.05
    for m, p in ((flips, 0.5), (grays, 0.3)):
        expected = 400 * np.outer([1 - p, p], [1 - p, p])
        table = _contingency(m[:, 0], m[:, 1])
        assert (np.abs(table - expected) < 4 * np.sqrt(expected) + 5).all(), (table, expected)


def test_colour_jitter_differs_across_crops_and_applies_with_p():
    img = colourful(48)
    t = build(num_crops=[8], size_crops=[48], crop_scales=[[1.0, 1.0]], crop_ratios=[1.0, 1.0],
              flip_p=0.0, color_strength=1.0, color_jitter_p=0.8, grayscale_p=0.0, blur_p=0.0,
              mean=[0, 0, 0], std=[1, 1, 1])
    base = as255(build(num_crops=[1], size_crops=[48], crop_scales=[[1.0, 1.0]],
                       crop_ratios=[1.0, 1.0], **PLAIN)(img)[0])
    np.random.seed(2)
    changed = []
    for _ in range(50):
        crops = np.array([as255(c) for c in t(img)])
        diff = [np.abs(c - base).max() > 2 for c in crops]
        changed += diff
        jittered = crops[np.array(diff)].reshape(sum(diff), -1)
        # independent factors: no two jittered crops of the same image look alike
        d = np.abs(jittered[:, None, :] - jittered[None, :, :]).max(-1)
        assert (d[~np.eye(len(jittered), dtype=bool)] > 2).all()
    assert abs(np.mean(changed) - 0.8) < 0.07


def _exact_bcs(a, factors, order):
    """Float reference: each op on the exact previous result, clipped to [0, 255]."""
    x = a.astype(np.float64)
    w = np.array([0.299, 0.587, 0.114])
    b, c, s, _ = factors
    for op in order:
        if op == 0:
            x = x * b
        elif op == 1:
            m = np.floor((x @ w).mean() + 0.5)
            x = c * x + (1 - c) * m
        elif op == 2:
            g = (x @ w)[..., None]
            x = s * x + (1 - s) * g
        x = np.clip(x, 0, 255)
    return x


def test_colour_jitter_matches_exact_math_in_any_order():
    import torchvision.transforms.functional as F

    img = colourful(40)
    a = np.asarray(img)
    rng = np.random.default_rng(0)
    for _ in range(150):
        factors = list(rng.uniform(0.2, 1.8, 3)) + [0.0]
        order = [int(o) for o in rng.permutation(3)]
        gray = bool(rng.random() < 0.3)
        out = np.asarray(mc.color_jitter(img, factors, order, gray), np.float64)
        ref = _exact_bcs(a, factors, order)
        if gray:
            ref = ref @ np.array([0.299, 0.587, 0.114])
        d = np.abs(out - ref)
        # uint8 rounding at each clipping point, amplified by later factors (<= 1.8 each)
        assert d.max() <= 3.5 and d.mean() < 0.5, (factors, order, gray, d.max(), d.mean())
        tv = img
        for op in order:
            tv = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation][op](tv, factors[op])
        tv = np.asarray(tv.convert("L") if gray else tv, np.float64)
        assert d.mean() <= np.abs(tv - ref).mean() + 0.05  # at least as exact as torchvision


def test_hue_matches_torchvision_exactly():
    import torchvision.transforms.functional as F

    img = colourful(40)
    for h in (-0.2, -0.07, 0.013, 0.15, 0.2):
        ours = np.asarray(mc.color_jitter(img, [1, 1, 1, h], [3], False))
        assert np.array_equal(ours, np.asarray(F.adjust_hue(img, h)))


def test_small_kernel_blur_is_the_truncated_gaussian():
    """r <= 2 (crops < 60 px) with 3 sigma > r: SimCLR's truncated kernel, exactly."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)
    img = Image.fromarray(a)
    t = build(num_crops=[1], size_crops=[30], crop_scales=[[1, 1]])
    assert t._radius == [1]  # int(0.1 * 30) // 2
    for sigma in (0.6, 1.0, 2.0):
        out = np.asarray(t._blur(img, sigma, 1), np.float64)
        x = np.arange(-1, 2)
        g = np.exp(-x ** 2 / (2 * sigma ** 2))
        g /= g.sum()
        ref = np.zeros_like(out)
        af = a.astype(np.float64)
        for dy in range(3):
            for dx in range(3):
                ref[1:-1, 1:-1] += g[dy] * g[dx] * af[dy:dy + 28, dx:dx + 28]
        assert np.abs(out[1:-1, 1:-1] - ref[1:-1, 1:-1]).max() <= 1.0
    # tiny sigma: identity; radius 0 (< 20 px crops): never blurred
    assert np.array_equal(np.asarray(t._blur(img, 0.2, 1)), a)
    assert np.array_equal(np.asarray(t._blur(img, 2.0, 0)), a)


def test_blur_applied_per_crop_with_p():
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    t = build(num_crops=[4], size_crops=[64], crop_scales=[[1, 1]], crop_ratios=[1, 1],
              flip_p=0.0, color_strength=0.0, grayscale_p=0.0, blur_p=0.5, blur_sigma=[1.0, 2.0],
              mean=[0, 0, 0], std=[1, 1, 1])
    raw = np.asarray(img, np.float64).transpose(2, 0, 1)
    np.random.seed(3)
    blurred = []
    for _ in range(100):
        blurred.append([np.abs(as255(c) - raw).mean() > 5 for c in t(img)])
    blurred = np.array(blurred)
    assert abs(blurred.mean() - 0.5) < 0.06
    assert 0 < blurred.all(axis=1).sum() < 100 and blurred.any(axis=1).sum() > 80


# -- config validation ------------------------------------------------------------------
BASE = dict(num_crops=[2, 6], size_crops=[224, 96], crop_scales=[[0.14, 1], [0.05, 0.14]])


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(size_crops=[224]), "size_crops"),
        (dict(num_crops=[2, 0]), "num_crops"),
        (dict(crop_scales=[[0.14, 1.2], [0.05, 0.14]]), "crop_scales[0]"),
        (dict(crop_scales=[[0.0, 1.0], [0.05, 0.14]]), "crop_scales[0]"),
        (dict(crop_scales=[[0.14, 1.0]]), "crop_scales"),
        (dict(crop_scales=[[0.5, 0.2], [0.05, 0.14]]), "crop_scales[0]"),
        (dict(total_num_crops=7), "total_num_crops"),
        (dict(flip_p=1.5), "flip_p"),
        (dict(blur_p=[0.5, 0.5, 0.5]), "blur_p"),
        (dict(color_strength=-1), "color_strength"),
        (dict(std=[0.2, 0.0, 0.2]), "std"),
        (dict(mean=[0.5, 0.5]), "mean"),
        (dict(crop_ratios=[[0.75, 1.33]]), "crop_ratios"),
        (dict(blur_sigma=[2.0, 0.1]), "blur_sigma"),
        (dict(interpolation="cubic"), "interpolation"),
        (dict(sizes=[1]), "sizes"),
    ],
)
def test_bad_params_raise_naming_the_key(change, key):
    with pytest.raises(mc.MultiCropConfigError) as err:
        build(**{**BASE, **change})
    assert f"'{key}'" in str(err.value) or f"['{key}']" in str(err.value), str(err.value)


def test_missing_required_key_is_named():
    with pytest.raises(mc.MultiCropConfigError, match="'crop_scales' is required"):
        build(num_crops=[2], size_crops=[32])


# -- VISSL pipeline / collator ----------------------------------------------------------
def _samples(transform, images):
    return [transform({"data": [im], "label": [i % 3], "data_valid": [1], "data_idx": [i]})
            for i, im in enumerate(images)]


def test_vissl_wrapper_and_multicrop_collator_same_structure_as_vissl_chain():
    from vissl.data.collators.multicrop_collator import multicrop_collator
    from vissl.data.ssl_transforms import get_transform

    spec = dict(total_num_crops=5, num_crops=[2, 3], size_crops=[32, 16],
                crop_scales=[[0.14, 1.0], [0.05, 0.14]])
    ours = get_transform([{"name": "multicrop_plugin", **spec}])
    theirs = get_transform([{"name": "ImgPilToMultiCrop", **spec}, {"name": "ToTensor"}])
    images = [colourful(40), colourful(48), colourful(36), colourful(44)]
    so, st = _samples(ours, images), _samples(theirs, images)
    for a, b in zip(so, st):
        assert a.keys() == b.keys()
        assert [x.shape for x in a["data"]] == [x.shape for x in b["data"]]
        assert a["label"] == b["label"] and a["data_idx"] == b["data_idx"]
        assert a["data_valid"] == b["data_valid"]
    bo, bt = multicrop_collator(so), multicrop_collator(st)
    assert bo.keys() == bt.keys()
    assert [x.shape for x in bo["data"][0]] == [x.shape for x in bt["data"][0]]
    assert [tuple(x.shape) for x in bo["data"][0]] == [(4, 3, 32, 32)] * 2 + [(4, 3, 16, 16)] * 3
    for key in ("label", "data_valid", "data_idx"):
        assert torch.equal(bo[key][0], bt[key][0])


def test_vissl_dataset_and_config_inference(tmp_path):
    """Through VISSL's own dataset (disk_folder) and config inference."""
    from testkit import compose, folder_data_overrides
    from vissl.data import build_dataset
    from vissl.data.collators.multicrop_collator import multicrop_collator

    # 8 images: one batch of 4 per process (fewer is rejected when the config is composed)
    folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=4, size=32)
    cfg = compose(
        ["config=test/swav_plugin/quick_cpu", *folder_data_overrides(folder),
         "config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,num_crops:[2,3],size_crops:[32,16],"
         "crop_scales:[[0.14,1.0],[0.05,0.14]]}]",
         "config.DATA.TRAIN.DATA_LIMIT=-1", f"config.CHECKPOINT.DIR={tmp_path}/ck"]
    )
    assert cfg.LOSS.swav_plugin_loss.num_crops == 5  # counted from our transform
    ds = build_dataset(cfg, "TRAIN")
    batch = multicrop_collator([ds[i] for i in range(4)])
    assert [tuple(x.shape) for x in batch["data"][0]] == [(4, 3, 32, 32)] * 2 + [(4, 3, 16, 16)] * 3
    assert batch["data_idx"][0].tolist() == [0, 1, 2, 3] * 5
