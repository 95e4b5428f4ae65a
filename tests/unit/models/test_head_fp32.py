"""``swav_plugin_head``'s ``fp32_head`` option: under autocast the head (projection, L2
normalisation, prototype scores) runs in fp32 on an fp32 copy of the trunk's features, while
the trunk keeps the autocast dtype; without autocast the option changes nothing.  Off by
default, as in the reference, whose head runs under AMP like the rest of the model."""
import pytest
import torch

from autocast_emulator import AMP_MODES
from vissl_swav_plugin.models.heads import DeepClusterV2PluginHead, SwAVPluginHead

DIMS, K = [32, 48, 16], [20, 7]


def _pair(cls=SwAVPluginHead):
    """Two heads with the same weights, the option off and on."""
    torch.manual_seed(0)
    off = cls(None, dims=DIMS, num_clusters=K)
    on = cls(None, dims=DIMS, num_clusters=K, fp32_head=True)
    on.load_state_dict(off.state_dict())
    return off.eval(), on.eval()


def _features(dtype=torch.float32):
    torch.manual_seed(1)
    return (torch.randn(24, DIMS[0]) * 2).to(dtype)


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
def test_under_autocast_the_head_equals_the_fp32_head_on_the_same_features(mode):
    """The outputs are fp32 and equal, to the last bit, the head without autocast applied to
    the features the trunk produced in the autocast dtype (rounded, then cast to fp32)."""
    off, on = _pair()
    low = torch.bfloat16 if "bf16" in mode else torch.float16
    x = _features(low)  # what an autocast trunk hands to the head
    with AMP_MODES[mode]():
        got = on(x)
    want = off(x.float())
    assert len(got) == 1 + len(K)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
def test_without_the_option_the_scores_carry_the_autocast_rounding(mode):
    """The default (the reference's behaviour): the prototype scores come out in the autocast
    dtype, off from the fp32 scores by that dtype's rounding -- what the option removes."""
    off, _ = _pair()
    low = torch.bfloat16 if "bf16" in mode else torch.float16
    x = _features(low)
    with AMP_MODES[mode]():
        got = off(x)
    want = off(x.float())
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == low
        err = (g.float() - w).abs().max().item()
        assert 0 < err < 8 * torch.finfo(low).eps  # rounded, not wrong


def test_without_autocast_the_option_changes_nothing():
    off, on = _pair()
    x = _features()
    for g, w in zip(on(x), off(x)):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_gradients_reach_the_low_precision_trunk_in_its_dtype():
    """Backward through the fp32 head gives the trunk's bf16 activations a bf16 gradient, and
    the head's parameters fp32 gradients equal to those of the fp32 head."""
    off, on = _pair()
    off.train(), on.train()
    x = _features(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = on(x)
    sum(o.float().square().sum() for o in out).backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    x32 = x.detach().float()
    sum(o.square().sum() for o in off(x32)).backward()
    for (name, p_on), (_, p_off) in zip(on.named_parameters(), off.named_parameters()):
        assert p_on.grad.dtype == torch.float32
        torch.testing.assert_close(p_on.grad, p_off.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_the_deepcluster_v2_head_takes_the_option_too():
    off, on = _pair(DeepClusterV2PluginHead)
    x = _features(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = on(x)
    for g, w in zip(got, off(x.float())):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0, atol=0)


SWITCHES = ("use_bn", "use_bias", "return_embeddings", "normalize_feats", "output_bn", "fp32_head")


@pytest.mark.parametrize("key", SWITCHES)
@pytest.mark.parametrize("value", ["false", "True", 1, 0, None, 1.0])
def test_a_switch_that_is_not_a_bool_is_refused_naming_the_key(key, value):
    """Every on/off parameter of the head (a quoted "false" is truthy and would switch it on)."""
    with pytest.raises(ValueError, match=rf"swav_plugin_head: '{key}' must be True or False, got "):
        SwAVPluginHead(None, dims=DIMS, num_clusters=K, **{key: value})


def test_the_switches_are_the_constructors_bool_parameters():
    """The launch-time check reads the switches from the constructor's annotations: the same set
    as the constructor itself refuses, also for the DeepCluster-v2 head (through **kwargs)."""
    from vissl_swav_plugin.checks.run_wide import constructor_bool_keys

    assert constructor_bool_keys(SwAVPluginHead) == set(SWITCHES)
    assert constructor_bool_keys(DeepClusterV2PluginHead) == set(SWITCHES)
