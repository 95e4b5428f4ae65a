"""``swav_plugin_head``'s ``output_bn`` option: a BatchNorm without affine parameters on the
projection's output, before the L2 normalisation (off by default, as in the reference)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from testkit import compose
from vissl_swav_plugin.models.heads import SwAVPluginHead


def _linears(head):
    return [m for m in head.projection_head if isinstance(m, nn.Linear)]


def test_default_is_the_reference_layout():
    """Linear -> BN -> ReLU -> Linear, nothing after the last linear layer (the paper's
    and the official code's projection head)."""
    head = SwAVPluginHead(None, dims=[16, 32, 8], num_clusters=[10])
    kinds = [type(m) for m in head.projection_head]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]


@pytest.mark.parametrize("dims", [[16, 8], [16, 32, 8], [16, 32, 24, 8]])
def test_output_bn_standardises_the_projection_over_the_batch(dims):
    """In training mode the embedding before normalisation is (y - mean_b y) / sqrt(var_b y + eps)
    per dimension, y being the last linear layer's output (closed form)."""
    torch.manual_seed(0)
    head = SwAVPluginHead(None, dims=dims, num_clusters=[10], output_bn=True, normalize_feats=False).train()
    x = torch.randn(64, dims[0]) * 3 + 1
    last = _linears(head)[-1]
    captured = {}
    last.register_forward_hook(lambda m, i, o: captured.__setitem__("y", o.detach().clone()))
    z = head(x)[0]
    y = captured["y"]
    expected = (y - y.mean(0)) / torch.sqrt(y.var(0, unbiased=False) + 1e-5)
    torch.testing.assert_close(z, expected, rtol=1e-4, atol=1e-5)
    bn = head.projection_head[-1]
    assert isinstance(bn, nn.BatchNorm1d) and bn.weight is None and bn.bias is None


def test_output_bn_removes_an_input_independent_offset():
    """The motivation: a shift of the last layer's bias (a part of z shared by every sample)
    changes the normalised embeddings and the prototype scores without output_bn, and
    nothing with it."""
    x = torch.randn(32, 16)
    for output_bn, should_change in ((False, True), (True, False)):
        torch.manual_seed(1)
        head = SwAVPluginHead(None, dims=[16, 32, 8], num_clusters=[10], output_bn=output_bn).train()
        before = [t.detach().clone() for t in head(x)]
        with torch.no_grad():
            _linears(head)[-1].bias.add_(torch.full((8,), 5.0))
        after = head(x)
        for b, a in zip(before, after):
            assert (not torch.allclose(b, a, atol=1e-4)) == should_change
        z = after[0]
        torch.testing.assert_close(z.norm(dim=1), torch.ones(len(x)))  # still on the unit sphere
        torch.testing.assert_close(after[1], F.linear(z, head.prototypes0.weight))


def test_output_bn_is_a_known_head_key():
    """The config check (unknown head keys are errors) accepts the key and points a typo to it."""
    from vissl_swav_plugin.config.checkers import ConfigError

    base = ["config=test/swav_plugin/quick_cpu", "config.MODEL.TRUNK.NAME=resnet_small_plugin",
            "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}"]
    head = "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],num_clusters:[20],%s:True}]]"
    cfg = compose(base + [head % "output_bn"])
    assert cfg.MODEL.HEAD.PARAMS[0][1]["output_bn"] is True
    with pytest.raises(ConfigError, match=r"output_bnn.*did you mean 'output_bn'"):
        compose(base + [head % "output_bnn"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_output_bn_under_cuda_like_autocast(dtype):
    """Under CUDA-like autocast (the matmul family in fp16 / bf16) the head with output_bn stays
    finite, on the unit sphere, and close to its fp32 output (the BatchNorm sees low-precision
    linear outputs, as on a GPU with AMP)."""
    from autocast_emulator import cuda_like_autocast

    torch.manual_seed(2)
    head = SwAVPluginHead(None, dims=[64, 128, 32], num_clusters=[50], output_bn=True).train()
    x = torch.randn(128, 64) * 4 + 2
    ref = [t.detach() for t in head(x)]
    with cuda_like_autocast(dtype):
        low = [t.detach() for t in head(x)]
    assert low[-1].dtype == dtype  # the prototype scores were computed in low precision (emulation acted)
    z = low[0].float()
    assert torch.isfinite(z).all() and torch.isfinite(low[1].float()).all()
    torch.testing.assert_close(z.norm(dim=1), torch.ones(len(x)), atol=1e-2, rtol=0)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    torch.testing.assert_close(z, ref[0], atol=tol, rtol=0)
    torch.testing.assert_close(low[1].float(), ref[1], atol=tol, rtol=0)
