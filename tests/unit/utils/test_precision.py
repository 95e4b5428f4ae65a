"""Mixed precision as users run it (issue: fp16-AMP-safe Sinkhorn).

Every numerical path -- Sinkhorn-Knopp, the SwAV loss -- runs under CUDA-like fp16
autocast emulated on CPU (``autocast_emulator.cuda_like_autocast``: the matmul family is cast to
fp16 as CUDA does, ``torch.mv`` included), under bf16, and plain CPU bf16 autocast, and
must give finite results equal to the fp32 computation outside autocast.  Inputs include
the case that turned every code into NaN on an H100: features near one direction and one
prototype opposite to them (a dead prototype), 64 x 3000 and 4096 x 3000.
"""
import pytest
import torch
import torch.nn.functional as F

from autocast_emulator import AMP_MODES, cuda_like_autocast, dead_prototype_scores, swav_loss_config
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp
from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss


def test_emulation_casts_mv_like_cuda():
    """The emulator must reproduce CUDA's behaviour, or the tests below could not fail."""
    a, v = torch.randn(4, 3), torch.randn(3)
    with cuda_like_autocast():
        assert torch.mv(a, v).dtype == torch.float16
        assert (a @ a.t()).dtype == torch.float16
        with torch.autocast("cpu", enabled=False):
            assert torch.mv(a, v).dtype == torch.float32


def naive_mv_sinkhorn(scores, epsilon=0.05, iters=3):
    """The same scaling-form iterates without our precision guard (what the code did
    before): under CUDA-like fp16 autocast its mv products run in fp16."""
    P = torch.exp((scores.float() - scores.float().amax(1, keepdim=True)) / epsilon)
    v = torch.ones(P.shape[0])
    for _ in range(iters):
        u = (1.0 / P.shape[1]) / torch.mv(P.t(), v).float().clamp_min(torch.finfo(torch.float32).tiny)
        v = (1.0 / P.shape[0]) / torch.mv(P, u).float().clamp_min(torch.finfo(torch.float32).tiny)
    q = P * u
    return q / q.sum(1, keepdim=True)


def test_dead_prototype_breaks_unguarded_fp16_iterates():
    """Shows the failure mode the guard removes: fp16 mv products give non-finite codes."""
    s = dead_prototype_scores(64, 3000)
    assert torch.isfinite(naive_mv_sinkhorn(s)).all()
    with cuda_like_autocast():
        assert not torch.isfinite(naive_mv_sinkhorn(s)).all()


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
@pytest.mark.parametrize("B,K", [(64, 3000), (4096, 3000)])
@pytest.mark.parametrize("kind", ["dead_prototype", "random"])
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sinkhorn_codes_equal_fp32_under_amp(mode, B, K, kind, score_dtype):
    g = torch.Generator().manual_seed(B + K)
    if kind == "dead_prototype":
        s = dead_prototype_scores(B, K, generator=g)
    else:
        z = F.normalize(torch.randn(B, 128, generator=g), dim=1)
        c = F.normalize(torch.randn(K, 128, generator=g), dim=1)
        s = z @ c.t()
    s = s.to(score_dtype)
    ref = sinkhorn_knopp(s, 0.05, 3)
    with AMP_MODES[mode]():
        got = sinkhorn_knopp(s, 0.05, 3)
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all()
    assert torch.allclose(got, ref, rtol=0, atol=1e-5), (got - ref).abs().max()
    assert torch.allclose(got.sum(1), torch.ones(B), atol=1e-5)


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
def test_sinkhorn_fp64_stays_fp64_under_amp(mode):
    s = dead_prototype_scores(64, 3000)
    ref = sinkhorn_knopp(s.double(), 0.05, 3, dtype=torch.float64)
    with AMP_MODES[mode]():
        got = sinkhorn_knopp(s, 0.05, 3, dtype=torch.float64)
    assert got.dtype == torch.float64
    assert torch.allclose(got, ref, rtol=0, atol=1e-10)


def _loss_with_state(cfg, protos, queue_rows):
    loss = SwAVPluginLoss(cfg)
    loss.set_prototypes([protos])
    if queue_rows is not None:
        loss.set_queue_active(True)
        for _ in range(2):  # fill the queue completely, so that it is scored
            loss.queues[0].push(queue_rows)
    return loss


@pytest.mark.parametrize("mode", sorted(AMP_MODES))
@pytest.mark.parametrize("queue", [False, True])
def test_swav_loss_under_amp_equals_fp32(mode, queue, tmp_path):
    """The head returns fp16/bf16 scores under AMP: the loss of those scores under autocast
    equals the fp32 computation (outside autocast) on the same rounded scores, finite, with
    a dead prototype in the batch."""
    B, K, V, D = 64, 3000, 4, 32
    low = torch.bfloat16 if "bf16" in mode else torch.float16
    cfg = swav_loss_config(num_crops=V, K=K, D=D, queue_len=2 * B if queue else 0, output_dir=str(tmp_path))
    g = torch.Generator().manual_seed(1)
    protos = torch.nn.Linear(D, K, bias=False)
    with torch.no_grad():
        protos.weight.copy_(F.normalize(torch.randn(K, D, generator=g), dim=1))
        protos.weight[0] = -protos.weight[1]
    emb = F.normalize(protos.weight[1].detach() + 0.05 * torch.randn(V * B, D, generator=g), dim=1)
    scores = (emb @ protos.weight.detach().t()).to(low)
    rows = [emb[:B], emb[B:2 * B]] if queue else None
    expected = _loss_with_state(cfg, protos, rows)([emb, scores.float()])
    with AMP_MODES[mode]():
        got = _loss_with_state(cfg, protos, rows)([emb, scores])
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), (got, expected)
