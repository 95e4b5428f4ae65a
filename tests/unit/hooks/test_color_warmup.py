"""The colour-distortion warm-up: ``multicrop_plugin``'s ``color_warmup_iters`` /
``color_warmup_strength`` and :class:`vissl_swav_plugin.hooks.color_warmup.ColorWarmupHook`.

Independent truths: a transform built at the warm-up strength (its sampled jitter for the
same random numbers); the closed form of which epochs start within N iterations; the images a
VISSL data loader's *worker process* produces after the hook ran (a flat gray image stays
flat without colour jitter, and varies across crops with it)."""
import math

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from classy_vision.dataset.transforms import build_transform
from testkit import compose
from vissl_swav_plugin.hooks.color_warmup import color_warmup_hooks
from vissl_swav_plugin.config.checkers import ConfigError
from color_warmup_cases import sampled  # noqa: F401

MC = dict(num_crops=[2, 3], size_crops=[28, 16], crop_scales=[[0.3, 1.0], [0.1, 0.3]], color_strength=0.5)


def build(**kw):
    return build_transform({"name": "multicrop_plugin", **MC, **kw})


@pytest.mark.parametrize("warm,ipe", [(0.25, 78), ([0.0, 0.5], 10), (1.0, 1), (0.25, 500)])
def test_schedule_uses_the_warmup_strength_for_the_epochs_starting_within_n_iterations(warm, ipe):
    n = 200
    t = build(color_warmup_iters=n, color_warmup_strength=warm)
    at_warm = build(color_strength=warm)
    at_main = build()
    warm_epochs = math.ceil(n / ipe)  # closed form: epochs e with e * ipe < n
    for epoch in range(warm_epochs + 3):
        strength = t.set_epoch(epoch, ipe)
        ref = at_warm if epoch < warm_epochs else at_main
        assert strength == ref.current_color_strength, epoch
        for seed in (0, 1):
            (j, f), (rj, rf) = sampled(t, seed), sampled(ref, seed)
            assert np.array_equal(j, rj) and np.allclose(f, rf), (epoch, seed)
    # a transform used without the hook keeps the warm-up strength it starts with
    assert build(color_warmup_iters=n, color_warmup_strength=warm).current_color_strength == \
        at_warm.current_color_strength


@pytest.mark.parametrize("warm,ipe", [(0.0, 78), ([0.0, 0.25], 10), ([0.1, 0.5], 7), (0.0, 1), (0.2, 500)])
def test_linear_schedule_ramps_from_the_warmup_strength_at_each_epochs_first_iteration(warm, ipe):
    """``color_warmup_schedule: linear``: the epoch starting at iteration i = e * ipe < N
    samples exactly as a transform built at ``w + (s - w) i / N`` (per group); from the first
    epoch starting at or after N, as the transform at ``color_strength``."""
    n, main = 200, [0.5, 0.5]
    w = [warm, warm] if np.isscalar(warm) else list(warm)
    t = build(color_warmup_iters=n, color_warmup_strength=warm, color_warmup_schedule="linear")
    seen = []
    for epoch in range(math.ceil(n / ipe) + 3):
        i = epoch * ipe
        expect = [a + (b - a) * min(i, n) / n for a, b in zip(w, main)]  # closed form of the ramp
        strength = t.set_epoch(epoch, ipe)
        assert np.allclose(strength, expect, atol=1e-12), (epoch, strength, expect)
        ref = build(color_strength=expect)
        for seed in (0, 1):
            (j, f), (rj, rf) = sampled(t, seed), sampled(ref, seed)
            assert np.array_equal(j, rj) and np.allclose(f, rf), (epoch, seed)
        seen.append(strength[0])
    assert all(a <= b for a, b in zip(seen, seen[1:])) and seen[-1] == 0.5  # rises, ends at color_strength
    if ipe < n:
        assert w[0] < seen[1] < 0.5  # a ramp, not the step schedule
    # the step schedule (default) holds the warm-up strength over the same epochs
    step = build(color_warmup_iters=n, color_warmup_strength=warm)
    assert step.color_warmup_schedule == "step" and step.set_epoch(1, ipe) == (w if ipe < n else main)


@pytest.mark.parametrize("kw,match", [
    (dict(color_warmup_iters=10, color_warmup_strength=0.0, color_warmup_schedule="cosine"),
     r"'color_warmup_schedule' must be one of \['step', 'linear'\]"),
    (dict(color_warmup_schedule="linear"), "'color_warmup_schedule' acts only with color_warmup_iters > 0"),
    (dict(color_warmup_iters=100), "'color_warmup_strength' is required with color_warmup_iters > 0"),
    (dict(color_warmup_strength=0.25), "'color_warmup_strength' acts only with color_warmup_iters > 0"),
    (dict(color_warmup_iters=0, color_warmup_strength=0.25), "acts only with color_warmup_iters > 0"),
    (dict(color_warmup_iters=-1, color_warmup_strength=0.25), "'color_warmup_iters' must be an integer >= 0"),
    (dict(color_warmup_iters=1.5, color_warmup_strength=0.25), "'color_warmup_iters' must be an integer >= 0"),
    (dict(color_warmup_iters=10, color_warmup_strength=[0.1, 0.2, 0.3]),
     "'color_warmup_strength' has 3 entries but num_crops has 2"),
    (dict(color_warmup_iters=10, color_warmup_strength=3.0), r"'color_warmup_strength' must be a colour-distortion"),
])
def test_settings_that_cannot_act_or_are_wrong_name_the_key(kw, match):
    from vissl_swav_plugin.transforms.multicrop import MultiCropConfigError

    with pytest.raises(MultiCropConfigError, match=match):
        build(**kw)


def test_bad_warmup_fails_when_composing_and_the_hook_follows_the_config():
    mc = "{name:multicrop_plugin,num_crops:[2,2],size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]"
    quick = "config=test/swav_plugin/quick_cpu"
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[0\].*'color_warmup_strength' is required"):
        compose([quick, f"config.DATA.TRAIN.TRANSFORMS=[{mc},color_warmup_iters:5}}]"])
    on = compose([quick, f"config.DATA.TRAIN.TRANSFORMS=[{mc},color_warmup_iters:5,color_warmup_strength:0.1}}]"])
    assert [type(h).__name__ for h in color_warmup_hooks(on)] == ["ColorWarmupHook"]
    assert color_warmup_hooks(compose([quick, f"config.DATA.TRAIN.TRANSFORMS=[{mc}}}]"])) == []
    demo = compose(["config=pretrain/swav/swav_fashion_mnist_cpu"])
    assert len(color_warmup_hooks(demo)) == 1
