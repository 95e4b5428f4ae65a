"""benchmarks/bench_demo_trunk.py: ``--widths`` times the recipe's ResNet-10 at other widths (the
network really is that wide), and a malformed list is refused by name."""

import pytest
import torch

from testkit import load_script


def _module():
    return load_script("benchmarks/bench_demo_trunk.py")


@pytest.mark.parametrize("width", [8, 24])
def test_width_variant_is_a_resnet10_of_that_width(width):
    mod = _module()
    variants = mod.with_widths([width])
    assert set(variants) == set(mod.VARIANTS) | {f"r10-cl-fp32-w{width}"}
    step = mod.Step(f"r10-cl-fp32-w{width}", [(1, 28)], 2, variants)
    trunk, head = step.model
    feats = trunk(torch.zeros(2, 3, 28, 28))[0]
    assert feats.shape[1] == 8 * width                       # res5avg: 8 x WIDTH
    blocks = [m for m in trunk.modules() if type(m).__name__ == "BasicBlock"]
    assert len(blocks) == 4                                  # ResNet-10: one block per stage
    before = [p.detach().clone() for p in step.model.parameters()]
    assert step() > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, step.model.parameters()))


def test_default_variants_are_unchanged_by_widths():
    mod = _module()
    assert mod.parse_widths("") == []
    assert mod.parse_widths("24, 32") == [24, 32]
    assert mod.VARIANTS[mod.RECIPE] == (10, True, False, 16)
    assert mod.with_widths([]) == mod.VARIANTS


@pytest.mark.parametrize("bad", ["2x", "24,x", "0", "-8"])
def test_malformed_widths_are_refused(bad):
    with pytest.raises(SystemExit, match="--widths"):
        _module().parse_widths(bad)
