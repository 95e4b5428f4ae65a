"""``config.DATA.TRAIN.DEVICE_AUGMENT`` (``vissl_swav_plugin/transforms/device_augment.py``,
``device_step.py``): the device side against the workers' ops, the parameter draws against
``multicrop_plugin``'s distributions, the key's checks.  In-process; the VISSL runs are in
``tests/integration/transforms/test_device_augment_integration.py``.

Independent truths: the workers' own ops (``multicrop_ops``: PIL), the transform with
``device_augment: off`` (today's output) under the same numpy RNG state, scipy's KS,
chi-square and binomial tests.

Every op of the device side computes in float32 (no float64 tensor but the small host-side
parameter rows: ``test_no_float64_on_the_crops_device``), with autocast off (the same
results under each of ``autocast_emulator.AMP_MODES``).  Measured differences of the device
ops from the workers' ops, in 0-255 levels (random textured images, this file's seeds):
brightness, hue, PIL's Gaussian blur 0 (bit-equal: the hue and the box blur are float32
integer arithmetic below 2^24, exact; the hue also on every hue ratio, ties included, and the
blur on rows that tell PIL's C-float box weights from double ones); the truncated kernel of
small crops <= 1 level at exact rounding ties (PIL sums in float32, as the device does, in
another order); contrast <= 1 level (the workers estimate the mean from a box-reduced copy:
about 1% of the values differ); saturation and grayscale <= 1 level (float vs PIL's
fixed-point luma; < 0.1% of the pixels); the whole chain (jitter in random order, grayscale,
blur) <= 6 levels, with < 2% of the values differing at all and a mean difference < 0.05
levels (a 1-level difference before the hue can move PIL's 8-bit hue by one step, up to 6
levels).
"""
import numpy as np
import pytest
import torch
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from autocast_emulator import AMP_MODES
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.transforms import device_augment as da
from vissl_swav_plugin.transforms import device_step as ds
from vissl_swav_plugin.transforms import multicrop_ops as ops
from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin

RECIPE = dict(num_crops=[2, 6], size_crops=[224, 96], crop_scales=[[0.14, 1.0], [0.05, 0.14]])
SMALL = dict(num_crops=[2, 2], size_crops=[40, 24], crop_scales=[[0.14, 1.0], [0.05, 0.14]])


def textured(rng, w, h):
    """A random image of coloured blocks with noise (edges and flat parts, like photos)."""
    base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    a = np.kron(base, np.ones((8, 8, 1), np.uint8))[:h, :w]
    a = np.clip(a.astype(int) + rng.integers(-30, 31, a.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(a)


def as_tensor(im):
    """A PIL crop as float ``[1, 3, s, s]`` levels (an ``L`` crop in three channels)."""
    return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)[None].float()


def run(t, image, seed):
    np.random.seed(seed)
    return t(image)


def photometric(x, jitter=0, factors=(1.0, 1.0, 1.0, 0.0), order=(0, 1, 2, 3), gray=0, blur=0, sigma=0.0,
                radius=0):
    """The device side (``apply_photometric``) of the crops ``x`` with these parameters, each one
    value for every crop or one per crop; by default nothing (no jitter, grayscale or blur)."""
    p = da.pack_params(jitter, factors, order, gray, blur, np.broadcast_to(sigma, x.shape[:1]), radius)
    return da.apply_photometric(x, p)


def only(op, f):
    """The jitter parameters of op ``op`` alone with factor ``f``: first in the order, the others
    after it with their identity factors (exact no-ops on the device)."""
    factors = [1.0, 1.0, 1.0, 0.0]
    factors[op] = f
    return dict(jitter=1, factors=factors, order=[op] + [k for k in range(4) if k != op])


def device(t, out):
    """What the train step makes of one image's worker output: crops batched per position."""
    aug = da.DeviceAugmenter(t.mean, t.std, t.min_std, photometric=t.device_augment == "photometric")
    if t.device_augment == "photometric":
        crops = [c[0][None] for c in out]
        params = torch.stack([c[1] for c in out])[:, None]
        return [y[0] for y in aug(crops, params)]
    return [y[0] for y in aug([c[None] for c in out])]


# -- (a) normalize: the same uint8 crop converted on both sides ---------------------------
@pytest.mark.parametrize("extra", [{}, {"normalize": "per_image"}, {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]}])
def test_normalize_equals_todays_crops(extra):
    """Same seed, same image: ``device_augment: normalize`` + the device's normalisation equals
    today's float32 crops, crop by crop (bit-equal for the dataset mean / std: the same
    arithmetic; per-image standardisation within float rounding)."""
    rng = np.random.default_rng(0)
    off = MultiCropPlugin(**RECIPE, **extra)
    dev = MultiCropPlugin(**RECIPE, **extra, device_augment="normalize")
    for seed in range(4):
        image = textured(rng, 460, 410)
        today = run(off, image, seed)
        sent = run(dev, image, seed)
        assert all(c.dtype == torch.uint8 for c in sent)
        got = device(dev, sent)
        for a, b in zip(today, got):
            assert a.shape == b.shape and b.dtype == torch.float32
            if extra.get("normalize") == "per_image":
                torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
            else:
                assert torch.equal(a, b)


# -- (b) each photometric op against the workers' op ---------------------------------------
def _diffs(pairs):
    return np.concatenate([(a - b).abs().flatten().numpy() for a, b in pairs])


@pytest.mark.parametrize("op, tol, frac", [(0, 0, 0.0), (1, 1, 0.02), (2, 1, 0.002), (3, 0, 0.0)])
def test_each_jitter_op_equals_the_workers_op(op, tol, frac):
    """Brightness (0), contrast (1), saturation (2), hue (3) with the same factor, on random
    images and factors over the recipe's ranges (and beyond 1, where clipping acts): the
    device side with that op alone (:func:`only`) equals the workers' op
    (``multicrop_ops.color_jitter`` with that one op) up to
    ``tol`` levels on at most ``frac`` of the values (module docstring)."""
    rng = np.random.default_rng(1 + op)
    pairs = []
    for _ in range(40):
        im = textured(rng, 48, 48)
        f = [rng.uniform(0.2, 1.8), rng.uniform(0.2, 1.8), rng.uniform(0.2, 1.8), rng.uniform(-0.5, 0.5)]
        if op == 3 and len(pairs) % 4 == 0:
            f[3] = rng.uniform(-0.9, 0.9) / 255  # a zero 8-bit shift: the workers leave the crop as it is
        cpu = as_tensor(ops.color_jitter(im, f, [op], False))
        dev = photometric(as_tensor(im), **only(op, f[op]))
        pairs.append((cpu, dev))
    d = _diffs(pairs)
    assert d.max() <= tol and (d > 0).mean() <= frac, (d.max(), (d > 0).mean())


def test_jitter_chain_and_grayscale_equal_the_workers_ops():
    """The whole colour distortion: four factors in a random order, then grayscale for some
    crops, batched over crops with different orders: <= 3 levels, < 1% of the values differ."""
    rng = np.random.default_rng(7)
    ims = [textured(rng, 40, 40) for _ in range(64)]
    f = np.column_stack([rng.uniform(0.2, 1.8, (64, 3)), rng.uniform(-0.2, 0.2, 64)])
    order = np.stack([rng.permutation(4) for _ in range(64)])
    gray = rng.random(64) < 0.3
    cpu = torch.cat([as_tensor(ops.color_jitter(im, f[k].tolist(), order[k].tolist(), bool(gray[k])))
                     for k, im in enumerate(ims)])
    dev = photometric(torch.cat([as_tensor(im) for im in ims]), jitter=1, factors=f, order=order, gray=gray)
    d = _diffs([(cpu, dev)])
    assert d.max() <= 6 and (d > 0).mean() < 0.02 and d.mean() < 0.05, (d.max(), (d > 0).mean(), d.mean())
    plain = torch.cat([as_tensor(im.convert("L")) for im in ims])  # the grayscale of unjittered crops
    d = _diffs([(plain, photometric(torch.cat([as_tensor(im) for im in ims]), gray=1))])
    assert d.max() <= 1 and (d > 0).mean() < 0.002


@pytest.mark.parametrize("size", [224, 96, 40, 24, 16])
def test_blur_equals_the_workers_blur(size):
    """SimCLR's blur with the workers' rules (radius ``int(0.1 size) // 2``: PIL's Gaussian
    blur at 224 / 96 / 40, the truncated 3x3 kernel at 24 when 3 sigma > 1, none at 16), sigma
    over [0.1, 2], all crops of a size in one batched call: equal up to 1 level where the
    exact value is a rounding tie (PIL sums the 5x5 kernel in float32, here in float64: one
    value in 10^5 here)."""
    rng = np.random.default_rng(size)
    ims = [textured(rng, size, size) for _ in range(12)]
    sig = rng.uniform(0.1, 2.0, 12)
    r = int(0.1 * size) // 2
    cpu = torch.cat([as_tensor(ops.gaussian_blur(im, float(s), r)) for im, s in zip(ims, sig)])
    dev = photometric(torch.cat([as_tensor(im) for im in ims]), blur=1, sigma=sig, radius=r)
    d = (cpu - dev).abs()
    assert d.max() <= 1 and (d > 0).float().mean() < 1e-4


@pytest.mark.parametrize("cfg", [RECIPE, dict(SMALL, color_jitter_p=1.0, blur_p=1.0)])
def test_photometric_pipeline_matches_todays_crops(cfg):
    """Same seed, same image, every crop: ``photometric`` (worker crop + flip, device jitter,
    grayscale, blur, normalisation) against today's crops, in levels: <= 3 levels, < 1% of the
    values differ.  The flip stays in the workers (it commutes with every photometric op)."""
    rng = np.random.default_rng(3)
    off = MultiCropPlugin(**cfg)
    dev = MultiCropPlugin(**cfg, device_augment="photometric")
    std = torch.tensor(off.std).view(3, 1, 1) * 255.0
    diffs = []
    for seed in range(3):
        image = textured(rng, 450, 480)
        today = run(off, image, seed)
        sent = run(dev, image, seed)
        assert all(c.dtype == torch.uint8 and p.shape == (da.NUM_PARAMS,) for c, p in sent)
        for a, b in zip(today, device(dev, sent)):
            diffs.append(((a - b) * std).abs().flatten().numpy())
    d = np.concatenate(diffs)
    big = d > 0.01
    assert d.max() <= 6.01 and big.mean() < 0.02 and d.mean() < 0.05, (d.max(), big.mean(), d.mean())


# -- (b') float32: exact where PIL is, no float64, autocast ---------------------------------
def test_hue_equals_pils_on_every_hue():
    """PIL's 8-bit hue round trip bit for bit (``multicrop_ops``, one hue op) on every colour
    whose largest channel is 255 (so every hue ratio, among them every hue of exactly k / 255,
    where Pillow's float steps truncate one level lower for some k) and on 2^16 random colours,
    for shifts up and down."""
    a = np.arange(256)
    g, b = np.meshgrid(a, a, indexing="ij")
    full = np.full_like(g, 255)
    tops = [np.stack(c, -1).reshape(-1, 3) for c in ((full, g, b), (g, full, b), (g, b, full))]
    cols = np.concatenate(tops + [np.random.default_rng(9).integers(0, 256, (65536, 3))]).astype(np.uint8)
    im = Image.fromarray(cols[:len(cols) // 512 * 512].reshape(-1, 512, 3))
    for shift in (1, 37, 100, 128, 200, 255):
        h = shift / 255 + 1e-9 if shift < 128 else (shift - 256) / 255 - 1e-9
        assert int(h * 255) & 255 == shift
        cpu = as_tensor(ops.color_jitter(im, [1.0, 1.0, 1.0, h], [3], False))
        dev = photometric(as_tensor(im), **only(3, h))
        assert torch.equal(cpu, dev), (shift, int((cpu != dev).sum()))


def test_box_blur_equals_pils_bit_for_bit():
    """PIL's ``GaussianBlur`` (three extended-box passes per axis, fixed-point weights from a
    radius and a division in C float) on 3000 random rows of 64 px, each repeated down 6 rows
    (so the vertical passes keep them) with its own sigma in (0.25, 2]: bit-equal.  About 1% of
    such rows tell the C-float weights from weights computed in double (which differ for
    about half of the sigmas)."""
    rng = np.random.default_rng(11)
    n = 3000
    rows = rng.integers(0, 256, (n, 3, 1, 64), dtype=np.uint8)
    sig = rng.uniform(0.26, 2.0, n)
    x = np.ascontiguousarray(np.broadcast_to(rows, (n, 3, 6, 64)))
    cpu = torch.cat([as_tensor(ops.gaussian_blur(Image.fromarray(c.transpose(1, 2, 0)), float(s), 3))
                     for c, s in zip(x, sig)])
    dev = photometric(torch.from_numpy(x).float(), blur=1, sigma=sig, radius=3)
    assert torch.equal(cpu, dev), int((cpu != dev).sum())


def test_rounded_box_pass_equals_pils_fixed_point_pass():
    """The short pass of a box of radius 0 (``S + round(fw / 2^24 (E - 2 S))``, the product in
    float32 rounded half to even, as the device computes it) for the boxes that
    ``_rounds_exactly`` passes: equal to PIL's fixed-point pass ``(ww S + fw E + 2^23) >> 24``
    (Pillow's ``BoxBlur.c``) on every centre ``S`` and outer sum ``E`` of 8-bit levels, for 400
    sigmas; and the check is not vacuous: among the boxes it rejects, most differ somewhere."""
    sig = np.linspace(0.2501, 1.414, 2000)
    boxes = [da._box_weights(da._pil_box_radius(float(s))) for s in sig]
    assert all(r == 0 for r, _, _ in boxes)
    ok = da._rounds_exactly(boxes)
    s = torch.arange(256, dtype=torch.long)[:, None]
    e = torch.arange(511, dtype=torch.long)[None, :]

    def differs(box):
        _, ww, fw = box
        pil = torch.div(ww * s + fw * e + (1 << 23), 1 << 24, rounding_mode="floor")
        short = s.float() + torch.round((e - 2 * s).float() * torch.tensor(fw / 2 ** 24, dtype=torch.float32))
        return bool((short.long() != pil).any())

    passed = [b for b, good in zip(boxes, ok) if good]
    rejected = [b for b, good in zip(boxes, ok) if not good]
    assert len(passed) > 0.95 * len(boxes) and rejected
    assert not any(differs(b) for b in passed[::len(passed) // 400])
    assert sum(differs(b) for b in rejected) > len(rejected) / 2


def _param_batch(n=12, size=40, seed=21):
    """uint8 crops and parameter rows that take every path of the device side: jitter in random
    orders (factors on both sides of 1; one crop with a zero 8-bit hue shift, one unjittered),
    grayscale, and no blur (sigma <= 0.25), PIL's box blur (3 sigma <= radius 2) and the
    truncated kernel."""
    rng = np.random.default_rng(seed)
    x = torch.cat([as_tensor(textured(rng, size, size)) for _ in range(n)]).to(torch.uint8)
    factors = np.column_stack([rng.uniform(0.2, 1.8, (n, 3)), rng.uniform(-0.5, 0.5, n)])
    factors[0, 3] = 0.5 / 255
    order = np.stack([rng.permutation(4) for _ in range(n)])
    jitter = (np.arange(n) != 1).astype(float)
    gray = (np.arange(n) % 3 == 0).astype(float)
    blur = (np.arange(n) % 4 != 1).astype(float)
    sigma = np.linspace(0.1, 2.0, n)
    return x, da.pack_params(jitter, factors, order, gray, blur, sigma, [int(0.1 * size) // 2] * n)


def test_no_float64_on_the_crops_device():
    """Every op ``apply_photometric`` dispatches, recorded (``TorchDispatchMode``): no float64
    result but the host-side copies of the parameter rows (no larger than ``params``), while the
    crop-sized work is float32.  (The crops here are on the CPU, so the host's small tensors
    are told apart by size: each crop alone has 30x the parameters' values.)"""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    x, p = _param_batch()
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.extend((str(func), t.dtype, t.numel()) for t in tree_leaves(out) if torch.is_tensor(t))
            return out

    with Record():
        y = da.apply_photometric(x, p)
    assert y.dtype == torch.float32
    wide = [op for op in seen if op[1] == torch.float64 and op[2] > p.numel()]
    assert not wide, wide[:5]
    assert sum(1 for op in seen if op[1] == torch.float32 and op[2] >= x[0].numel()) > 100


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
def test_photometric_is_the_same_under_autocast(mode):
    """Under each precision setting users run (``autocast_emulator.AMP_MODES``: CPU bf16
    autocast, CUDA-like fp16 / bf16 with the matmul family cast) ``apply_photometric`` and the
    augmenter give exactly the plain float32 results."""
    x, p = _param_batch()
    aug = da.DeviceAugmenter([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], photometric=True)
    plain = da.apply_photometric(x, p)
    plain_aug = aug([x[:6], x[6:]], torch.stack([p[:6], p[6:]]))
    with AMP_MODES[mode]():
        amp = da.apply_photometric(x, p)
        amp_aug = aug([x[:6], x[6:]], torch.stack([p[:6], p[6:]]))
    assert amp.dtype == torch.float32 and torch.equal(amp, plain)
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(amp_aug, plain_aug))


# -- (c) the parameter draws --------------------------------------------------------------
N_IMAGES = 1000


@pytest.fixture(scope="module")
def draws():
    """The parameter rows ``photometric`` sends for 1000 images x 8 crops (fixed seed), and the
    draws of ``device_augment: off`` (``sample_params``) under the same RNG states."""
    cfg = dict(num_crops=[2, 6], size_crops=[16, 8], crop_scales=[[0.14, 1.0], [0.05, 0.14]], blur_p=0.5)
    t = MultiCropPlugin(**cfg, device_augment="photometric")
    ref = MultiCropPlugin(**cfg)
    image = Image.new("RGB", (60, 50), (90, 120, 150))
    rows, same = [], True
    for i in range(N_IMAGES):
        np.random.seed(i)
        rows.append(torch.stack([p for _, p in t(image)]))
        if i < 50:
            np.random.seed(i)
            p = ref.sample_params(60, 50)
            r = rows[-1].numpy()
            same &= bool(np.array_equal(r[:, da.P_FACTORS], p["factors"]) and np.array_equal(r[:, da.P_ORDER], p["order"])
                         and np.array_equal(r[:, da.P_SIGMA], p["sigma"]) and np.array_equal(r[:, da.P_JITTER], p["jitter"])
                         and np.array_equal(r[:, da.P_GRAY], p["gray"]) and np.array_equal(r[:, da.P_BLUR], p["blur"]))
    return torch.cat(rows).numpy(), same


ALPHA = 1e-3


def test_draws_are_multicrop_plugins_draws(draws):
    """Under the same numpy RNG state, the rows sent are exactly ``sample_params``' draws."""
    assert draws[1]


def _ks(x, lo, hi):
    from scipy import stats

    return stats.kstest(x, stats.uniform(lo, hi - lo).cdf).pvalue


def test_factor_and_sigma_draws_follow_the_distributions(draws):
    """KS tests at significance ALPHA = 0.001 of the jitter factors (jittered crops, about
    6400: brightness / contrast / saturation U(0.2, 1.8), hue U(-0.2, 0.2) at strength 1) and
    the blur sigma (8000: U(0.1, 2.0)).  Power: the KS critical value at n = 6400 is
    1.95 / sqrt(n) = 0.024; against the range shifted by 5% of its width (sup distance 0.05)
    the power is > 0.999; the test below shows that it rejects exactly that alternative."""
    rows = draws[0]
    jit = rows[rows[:, da.P_JITTER] > 0.5]
    fac = jit[:, da.P_FACTORS]
    for j, (lo, hi) in enumerate([(0.2, 1.8)] * 3 + [(-0.2, 0.2)]):
        assert _ks(fac[:, j], lo, hi) > ALPHA, j
        shifted = fac[:, j] + 0.05 * (hi - lo)
        assert _ks(shifted, lo, hi) < ALPHA, j  # the stated alternative is rejected
    assert _ks(rows[:, da.P_SIGMA], 0.1, 2.0) > ALPHA
    assert _ks(rows[:, da.P_SIGMA] * 1.05, 0.1, 2.0) < ALPHA


def test_bernoulli_and_order_draws_follow_the_distributions(draws):
    """Binomial tests at ALPHA = 0.001 of jitter (p 0.8), grayscale (0.2) and blur (0.5) over
    8000 crops: detects a probability off by 0.03 with power > 0.99 (normal approximation,
    z_(1 - ALPHA/2) = 3.29, sd <= 0.0056).  A chi-square test of the jitter order over the 24
    permutations (about 6400 jittered crops): against half of the permutations 20% more likely
    and half 20% less (noncentrality n 0.04 = 256) the power at ALPHA is > 0.999 (computed with
    scipy's noncentral chi-square below)."""
    from scipy import stats

    rows = draws[0]
    n = len(rows)
    for col, p in [(da.P_JITTER, 0.8), (da.P_GRAY, 0.2), (da.P_BLUR, 0.5)]:
        k = int(rows[:, col].sum())
        assert stats.binomtest(k, n, p).pvalue > ALPHA, col
        assert stats.binomtest(k, n, p + 0.03).pvalue < ALPHA or stats.binomtest(k, n, p - 0.03).pvalue < ALPHA
    jit = rows[rows[:, da.P_JITTER] > 0.5][:, da.P_ORDER].astype(int)
    assert all(sorted(o) == [0, 1, 2, 3] for o in jit[:200])
    codes = jit @ np.array([64, 16, 4, 1])
    _, counts = np.unique(codes, return_counts=True)
    assert len(counts) == 24
    assert stats.chisquare(counts).pvalue > ALPHA
    crit = stats.chi2.ppf(1 - ALPHA, 23)
    assert stats.ncx2.sf(crit, 23, len(jit) * 0.04) > 0.999


# -- the collator and the batch conversion --------------------------------------------------
def test_collator_and_augment_batch():
    """``multicrop_device_collator`` keeps each crop's parameters in crop-major order (as VISSL's
    collator orders the crops), and ``augment_batch`` turns a collated batch into today's."""
    from vissl.data.collators.multicrop_collator import multicrop_collator

    rng = np.random.default_rng(5)
    images = [textured(rng, 70, 60) for _ in range(3)]
    off = MultiCropPlugin(**SMALL)
    dev = MultiCropPlugin(**SMALL, device_augment="photometric")
    nrm = MultiCropPlugin(**SMALL, device_augment="normalize")

    def samples(t):
        return [{"data": run(t, im, i), "label": [i] * 4, "data_valid": [1] * 4, "data_idx": [i] * 4}
                for i, im in enumerate(images)]

    today = multicrop_collator(samples(off))
    batch = ds.multicrop_device_collator(samples(dev))
    params = batch[ds.PARAMS_KEY][0]
    assert params.shape == (4, 3, da.NUM_PARAMS)
    np.random.seed(1)
    assert torch.equal(params[:, 1], torch.stack([p for _, p in dev(images[1])]))
    got = ds.augment_batch(batch, ds.augmenter_for_transform(dev), torch.device("cpu"))
    assert ds.PARAMS_KEY not in got
    assert torch.equal(got["data_idx"][0], today["data_idx"][0])
    for a, b in zip(today["data"][0], got["data"][0]):
        assert a.shape == b.shape and ((a - b).abs() * 255 * 0.23).max() < 3.5
    got = ds.augment_batch(multicrop_collator(samples(nrm)), ds.augmenter_for_transform(nrm), torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(today["data"][0], got["data"][0]))
    same = ds.augment_batch(dict(today), ds.augmenter_for_transform(nrm), torch.device("cpu"))["data"][0]
    assert all(a is b for a, b in zip(same, today["data"][0]))  # float crops (a test phase, off) pass through


# -- (e) the key's checks ------------------------------------------------------------------
TF = "[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]}]"


def _compose(*extra):
    from testkit import compose

    return compose(["config=test/swav_plugin/quick_cpu", f"config.DATA.TRAIN.TRANSFORMS={TF}", *extra])


def test_key_sets_the_train_step_and_collator():
    cfg = _compose("+config.DATA.TRAIN.DEVICE_AUGMENT=photometric")
    assert cfg.TRAINER.TRAIN_STEP_NAME == ds.TRAIN_STEP_NAME
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == ds.COLLATOR_NAME
    assert cfg.DATA.TRAIN.TRANSFORMS[0]["device_augment"] == "photometric"
    cfg = _compose()
    assert cfg.TRAINER.TRAIN_STEP_NAME == "standard_train_step" and "device_augment" not in cfg.DATA.TRAIN.TRANSFORMS[0]


@pytest.mark.parametrize("extra, words", [
    (["+config.DATA.TRAIN.DEVICE_AUGMENT=gpu"], ["config.DATA.TRAIN.DEVICE_AUGMENT", "'gpu'"]),
    (["+config.DATA.TRAIN.DEVICE_AUGMNT=normalize"], ["DEVICE_AUGMNT", "did you mean 'DEVICE_AUGMENT'"]),
    (["+config.DATA.TRAIN.DEVICE_AUGMENT=normalize", "config.TRAINER.TRAIN_STEP_NAME=my_step"],
     ["config.DATA.TRAIN.DEVICE_AUGMENT", "config.TRAINER.TRAIN_STEP_NAME"]),
    (["+config.DATA.TRAIN.DEVICE_AUGMENT=photometric", "config.DATA.TRAIN.COLLATE_FUNCTION=multicrop_mixup_collator"],
     ["config.DATA.TRAIN.DEVICE_AUGMENT", "config.DATA.TRAIN.COLLATE_FUNCTION"]),
    (["+config.DATA.TRAIN.TRANSFORMS.0.device_augment=normalize"],
     ["config.DATA.TRAIN.DEVICE_AUGMENT", "device_augment"]),
    (["+config.DATA.TRAIN.DEVICE_AUGMENT=normalize", "config.DATA.TRAIN.TRANSFORMS=[" + TF[1:-1] + ",{name:ToTensor}]"],
     ["config.DATA.TRAIN.DEVICE_AUGMENT", "last transform"]),
])
def test_bad_settings_are_refused_naming_the_keys(extra, words):
    with pytest.raises(ConfigError) as e:
        _compose(*extra)
    assert all(w in str(e.value) for w in words), str(e.value)
