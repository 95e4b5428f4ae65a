"""Per-image standardisation: ``multicrop_plugin``'s ``normalize: per_image``, the
``per_image_standardize_plugin`` evaluation transform, the online kNN hook's ``MIN_STD`` and
the demo's evaluation input.

Independent truths: the closed form ``(x - mean) / max(std, floor)`` computed in numpy
(float64); its invariance to ``a x + b`` (a > 0); the same transform with ``normalize:
dataset`` and mean 0 / std 1 (the crops are the same draws, standardised afterwards);
VISSL's own transform pipeline and dataset builder (a fresh interpreter's registry:
tests/integration/package/test_registration_integration.py)."""

import numpy as np
import pytest
import torch
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from classy_vision.dataset.transforms import build_transform
from testkit import compose, folder_data_overrides, make_image_folder
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.transforms.standardize import PerImageStandardize, standardize_

MC = dict(num_crops=[2, 3], size_crops=[28, 16], crop_scales=[[0.3, 1.0], [0.1, 0.3]], blur_p=0.5)


def closed_form(x, floor):
    """numpy float64: each sample minus its mean, over max(population std, floor)."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(len(x), -1)
    std = np.maximum(flat.std(1, keepdims=True), floor)
    return ((flat - flat.mean(1, keepdims=True)) / std).reshape(x.shape)


def gray_image(seed, size=28, lo=0, hi=255):
    a = np.random.RandomState(seed).randint(lo, hi + 1, size=(size, size)).astype(np.uint8)
    return Image.fromarray(a).convert("RGB")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standardize_matches_the_closed_form_with_the_floor(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 9, 7, generator=g, dtype=dtype)
    x[1] = 0.37                       # flat: std 0 -> all zeros, not NaN
    x[2] = 0.5 + 0.01 * x[2]          # std ~0.003 < floor: divided by the floor, not amplified
    x[3] *= 255.0                     # uint8 units with scale 255
    floor = 0.1
    want = closed_form(x.numpy(), floor)
    want[3] = closed_form(x[3:4].numpy() / 255.0, floor)[0]
    got = x.clone()
    standardize_(got[:3], floor)
    standardize_(got[3:4], floor, scale=255.0)
    standardize_(got[4:], floor)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    assert got[1].abs().max() < 1e-5  # flat image: zeros (up to the mean's rounding), not NaN
    assert got[2].abs().max() < 0.1   # |x - mean| <= 0.01 / 0.1


def test_standardize_handles_non_contiguous_input():
    x = torch.rand(4, 8, 8, 3).permute(0, 3, 1, 2)  # channels-last view
    want = closed_form(x.numpy(), 0.1)
    got = standardize_(x, 0.1)
    assert got is x
    np.testing.assert_allclose(x.numpy(), want, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_standardize_in_half_precision_stays_close_to_float32(dtype):
    """A user's pipeline may hand half-precision images: the statistics must not overflow
    or lose the image (fp16: values up to 255 squared stay finite through torch's std)."""
    x = torch.rand(5, 3, 16, 16) * 255.0
    want = standardize_(x.clone(), 0.1, scale=255.0)
    got = standardize_(x.to(dtype), 0.1, scale=255.0).float()
    assert torch.isfinite(got).all()
    tol = 0.05 if dtype is torch.bfloat16 else 0.01
    assert (got - want).abs().max() < tol


def test_brightness_and_contrast_do_not_change_the_standardised_image():
    x = torch.rand(3, 3, 12, 12) * 0.5 + 0.2
    a, b = 1.7, -0.15                 # stays inside [0, 1]: nothing clipped
    np.testing.assert_allclose(standardize_(a * x + b, 0.01).numpy(), standardize_(x.clone(), 0.01).numpy(),
                               atol=1e-5)


def test_per_image_crops_are_the_dataset_mode_crops_standardised():
    """Same random draws (seeded), ``normalize: dataset`` with mean 0 / std 1 gives x / 255;
    ``per_image`` must be exactly that, standardised crop by crop."""
    img = gray_image(1)
    plain = build_transform({"name": "multicrop_plugin", **MC, "mean": [0, 0, 0], "std": [1, 1, 1]})
    per = build_transform({"name": "multicrop_plugin", **MC, "normalize": "per_image", "min_std": 0.05})
    np.random.seed(3)
    a = plain(img)
    np.random.seed(3)
    b = per(img)
    assert [t.shape for t in a] == [t.shape for t in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(y.numpy(), closed_form(x[None].numpy(), 0.05)[0], atol=1e-4)


def test_per_image_output_ignores_the_images_brightness_and_contrast():
    """Without colour jitter, an image and ``a * image + b`` give the same crops up to the
    uint8 rounding of the resize (a dataset-normalised crop differs by ``a`` and ``b``); the
    floor is set below every crop's std so that it does not act."""
    base = np.random.RandomState(0).randint(40, 120, size=(28, 28)).astype(np.float64)
    img = Image.fromarray(base.astype(np.uint8)).convert("RGB")
    img2 = Image.fromarray((1.8 * base + 20).round().astype(np.uint8)).convert("RGB")
    kw = dict(MC, blur_p=0.0, color_strength=0.0, grayscale_p=0.0)
    per = build_transform({"name": "multicrop_plugin", **kw, "normalize": "per_image", "min_std": 0.01})
    ds = build_transform({"name": "multicrop_plugin", **kw})
    outs = {}
    for name, t in (("per", per), ("ds", ds)):
        for k, im in enumerate((img, img2)):
            np.random.seed(7)
            outs[name, k] = t(im)
    for x, y in zip(outs["per", 0], outs["per", 1]):
        assert (x - y).abs().max() < 0.15  # uint8 rounding over a crop std of ~0.1
    assert max((x - y).abs().max() for x, y in zip(outs["ds", 0], outs["ds", 1])) > 1.0


@pytest.mark.parametrize("kw,key", [
    (dict(normalize="per_crop"), "'normalize' must be one of"),
    (dict(normalize="per_image", mean=[0.5, 0.5, 0.5]), "'mean' cannot act with normalize: per_image"),
    (dict(normalize="per_image", std=[0.2, 0.2, 0.2]), "'std' cannot act with normalize: per_image"),
    (dict(min_std=0.1), "'min_std' acts only with normalize: per_image"),
    (dict(normalize="dataset", min_std=0.1), "'min_std' acts only with normalize: per_image"),
    (dict(normalize="per_image", min_std=0), "'min_std' must be a number > 0"),
    (dict(normalize="per_image", min_std=-1), "'min_std' must be a number > 0"),
    (dict(normalize="per_image", min_std="0.1"), "'min_std' must be a number > 0"),
    (dict(normalize="per_image", min_std=True), "'min_std' must be a number > 0"),
    (dict(normalize="per_image", to_tensor=False), "'normalize' per_image .* needs to_tensor: true"),
])
def test_settings_that_cannot_act_are_errors_naming_the_key(kw, key):
    from vissl_swav_plugin.transforms.multicrop import MultiCropConfigError

    with pytest.raises(MultiCropConfigError, match=key):
        build_transform({"name": "multicrop_plugin", **MC, **kw})


@pytest.mark.parametrize("extra,match", [
    (",normalize:per_image,mean:[0.5,0.5,0.5]", r"'mean' cannot act with normalize: per_image"),
    (",normalize:batch", r"'normalize' must be one of"),
    (",min_std:0.2", r"'min_std' acts only with normalize: per_image"),
])
def test_bad_normalize_settings_fail_when_composing(extra, match):
    mc = "{name:multicrop_plugin,num_crops:[2,2],size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]"
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.TRANSFORMS\[0\].*" + match):
        compose(["config=test/swav_plugin/quick_cpu", f"config.DATA.TRAIN.TRANSFORMS=[{mc}{extra}}}]"])


def test_eval_transform_matches_the_closed_form_and_checks_its_input():
    x = torch.rand(3, 10, 10)
    t = build_transform({"name": "per_image_standardize_plugin", "min_std": 0.2})
    assert isinstance(t, PerImageStandardize)
    before = x.clone()
    np.testing.assert_allclose(t(x).numpy(), closed_form(x[None].numpy(), 0.2)[0], atol=1e-5)
    assert torch.equal(x, before)  # the input is not modified
    with pytest.raises(TypeError, match="put it after ToTensor"):
        t(Image.new("RGB", (4, 4)))
    with pytest.raises(TypeError, match="float"):
        t(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="unknown key 'min_sd'.*did you mean 'min_std'"):
        build_transform({"name": "per_image_standardize_plugin", "min_sd": 0.2})
    with pytest.raises(ConfigError, match="'min_std' must be a number > 0"):
        build_transform({"name": "per_image_standardize_plugin", "min_std": 0})


def test_eval_transform_in_a_benchmark_config_through_vissls_dataset(tmp_path):
    """The Fashion-MNIST kNN benchmark with ``Normalize`` replaced by the plugin's transform:
    VISSL's own dataset builder gives the closed form of ``ToTensor``'s image."""
    from vissl.data import build_dataset

    folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=2, size=28)
    tf = "[{name:ToTensor},{name:per_image_standardize_plugin,min_std:0.1}]"
    cfg = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu",
                   *folder_data_overrides(folder, labels=True), f"config.DATA.TRAIN.TRANSFORMS={tf}"])
    ds = build_dataset(cfg, "TRAIN")
    sample = ds[0]
    x = sample["data"][0]
    raw = np.asarray(Image.open(ds.get_image_paths()[0][0]).convert("RGB"), dtype=np.float64).transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(x.numpy(), closed_form(raw[None], 0.1)[0], atol=1e-5)
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[1\].*unknown key 'minstd'"):
        compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", *folder_data_overrides(folder, labels=True),
                 "config.DATA.TRAIN.TRANSFORMS=[{name:ToTensor},{name:per_image_standardize_plugin,minstd:0.1}]"])


def test_named_normalize_keys_skip_a_per_image_multicrop():
    """``DATA.<split>.NORMALIZE`` copies mean/std into transforms that take them; a per-image
    multicrop takes none, so a split with only that transform is an error, not ignored."""
    mc = ("{name:multicrop_plugin,num_crops:[2,2],size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]],"
          "normalize:per_image}")
    with pytest.raises(ConfigError, match=r"DATA\.TRAIN\.NORMALIZE is set but no transform"):
        compose(["config=test/swav_plugin/quick_cpu", f"config.DATA.TRAIN.TRANSFORMS=[{mc}]",
                 "+config.DATA.TRAIN.NORMALIZE={MEAN:[0.5,0.5,0.5],STD:[0.2,0.2,0.2]}"])


def test_online_knn_min_std():
    from vissl_swav_plugin.hooks.online_knn import online_knn_config

    base = ["config=test/swav_plugin/quick_cpu"]
    c = online_knn_config(compose(base + ["+config.HOOKS.ONLINE_KNN={MIN_STD:0.1}"]))
    assert c["MIN_STD"] == 0.1
    with pytest.raises(ConfigError, match=r"HOOKS\.ONLINE_KNN\.MEAN cannot act with MIN_STD"):
        compose(base + ["+config.HOOKS.ONLINE_KNN={MIN_STD:0.1,MEAN:[0.5,0.5,0.5]}"])
    with pytest.raises(ConfigError, match=r"'MIN_STD' must be a number > 0"):
        compose(base + ["+config.HOOKS.ONLINE_KNN={MIN_STD:-0.1}"])


def test_online_knn_eval_images_are_standardised(tmp_path):
    from vissl_swav_plugin.hooks.online_knn import DEFAULTS, image_folder

    folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=1, size=28)
    ds = image_folder(str(folder), dict(DEFAULTS, RESIZE=28, CROP_SIZE=28, MIN_STD=0.1))
    x, _ = ds[0]
    raw = np.asarray(Image.open(ds.samples[0][0]).convert("RGB"), dtype=np.float64).transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(x.numpy(), closed_form(raw[None], 0.1)[0], atol=1e-5)


def test_demo_evaluation_input_is_the_training_crop_of_the_whole_image():
    """The demo's kNN features see what the training saw for a crop covering the whole image
    (scale 1, ratio 1, no flip, no jitter), in both normalisation modes."""
    from vissl_swav_plugin.demo.evaluation import to_input

    imgs = np.stack([np.asarray(gray_image(s).convert("L")) for s in range(3)])
    whole = dict(num_crops=[1], size_crops=[28], crop_scales=[[1.0, 1.0]], crop_ratios=[1.0, 1.0],
                 flip_p=0.0, color_strength=0.0, grayscale_p=0.0, blur_p=0.0)
    for extra, norm in ((dict(normalize="per_image", min_std=0.1), dict(mean=None, std=None, min_std=0.1)),
                        (dict(mean=[0.3] * 3, std=[0.4] * 3), dict(mean=[0.3] * 3, std=[0.4] * 3, min_std=None))):
        t = build_transform({"name": "multicrop_plugin", **whole, **extra})
        train = torch.stack([t(Image.fromarray(a).convert("RGB"))[0] for a in imgs])
        np.testing.assert_allclose(to_input(imgs, norm).numpy(), train.numpy(), atol=1e-5)


def test_demo_reads_the_normalisation_from_the_training_transform():
    from types import SimpleNamespace

    from vissl_swav_plugin.demo.evaluation import transform_stats

    def cfg(t):
        return SimpleNamespace(DATA=SimpleNamespace(TRAIN=SimpleNamespace(TRANSFORMS=t)))

    mc = {"name": "multicrop_plugin", "num_crops": [2], "size_crops": [28], "crop_scales": [[0.3, 1.0]]}
    assert transform_stats(cfg([{**mc, "normalize": "per_image"}])) == dict(mean=None, std=None, min_std=0.1)
    got = transform_stats(cfg([{**mc, "mean": [0.2] * 3, "std": [0.3] * 3}]))
    assert got == dict(mean=[0.2] * 3, std=[0.3] * 3, min_std=None)
    assert transform_stats(cfg([mc]))["mean"] == pytest.approx([0.485, 0.456, 0.406])  # ImageNet's
