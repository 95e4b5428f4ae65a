"""The SwAV loss against VISSL's built-in ``swav_loss`` and the paper's equations."""
import pytest
import torch
import torch.nn as nn
from vissl.config import AttrDict
from vissl.losses.swav_loss import SwAVLoss as VisslSwAVLoss

from reference_swav import paper_sinkhorn, reference_swav_loss
from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss


def plugin_cfg(num_crops, K, D, local_queue=0, crops_for_assign=(0, 1), double=True, **kw):
    cfg = {
        "temperature": 0.1, "epsilon": 0.05, "num_iters": 3,
        "crops_for_assign": list(crops_for_assign), "num_crops": num_crops,
        "num_prototypes": [K] if isinstance(K, int) else list(K), "embedding_dim": D,
        "use_double_precision": double, "hard_assignment": False,
        "temp_hard_assignment_iters": 0, "distributed_sinkhorn": True,
        "normalize_prototypes": True, "freeze_prototypes_niters": 0, "output_dir": "/tmp",
        "queue": {"queue_length": local_queue, "start_epoch": 0, "local_queue_length": local_queue},
    }
    cfg.update(kw)
    return AttrDict(cfg)


def vissl_loss(num_crops, K, D, local_queue=0, crops_for_assign=(0, 1)):
    from classy_vision.generic.distributed_util import set_cuda_device_index

    set_cuda_device_index(-1)  # CPU, as VISSL's launcher sets it for MACHINE.DEVICE=cpu
    return VisslSwAVLoss(AttrDict({
        "temperature": 0.1, "epsilon": 0.05, "num_iters": 3, "use_double_precision": True,
        "crops_for_assign": list(crops_for_assign), "num_crops": num_crops,
        "num_prototypes": [K] if isinstance(K, int) else list(K), "embedding_dim": D,
        "temp_hard_assignment_iters": 0, "output_dir": "/tmp", "normalize_last_layer": True,
        "queue": {"queue_length": local_queue, "start_iter": 0, "local_queue_length": local_queue},
    }))


def make_output(num_crops, bs, D, Ks, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = nn.functional.normalize(torch.randn(num_crops * bs, D, generator=g, dtype=torch.float64), dim=1)
    protos = [nn.functional.normalize(torch.randn(K, D, generator=g, dtype=torch.float64), dim=1) for K in Ks]
    scores = [(emb @ w.T).requires_grad_(True) for w in protos]
    return emb, protos, scores


@pytest.mark.parametrize("num_crops,Ks", [(2, [30]), (8, [30]), (8, [30, 20])])
def test_equals_vissl_swav_loss_without_queue(num_crops, Ks):
    bs, D = 16, 12
    emb, _, scores = make_output(num_crops, bs, D, Ks)
    ours = SwAVPluginLoss(plugin_cfg(num_crops, Ks, D))([emb, *scores], None)
    (g_ours,) = torch.autograd.grad(ours, scores[0])
    theirs = vissl_loss(num_crops, Ks, D)([emb, *scores], None)
    (g_theirs,) = torch.autograd.grad(theirs, scores[0])
    assert abs(ours.item() - theirs.item()) < 1e-6
    assert torch.allclose(g_ours, g_theirs, atol=1e-9)


@pytest.mark.parametrize("num_crops", [2, 8])
def test_equals_vissl_swav_loss_with_queue(num_crops):
    bs, D, K, qlen = 8, 12, 30, 24
    emb, protos, scores = make_output(num_crops, bs, D, [K], seed=1)
    g = torch.Generator().manual_seed(7)
    queue_emb = nn.functional.normalize(torch.randn(2, qlen, D, generator=g, dtype=torch.float64), dim=2)

    ours = SwAVPluginLoss(plugin_cfg(num_crops, K, D, local_queue=qlen)).double()
    ours.queues[0].embeddings.copy_(queue_emb)
    ours.queues[0].filled.fill_(qlen)
    ours.set_queue_active(True)
    layer = nn.Linear(D, K, bias=False).double()
    layer.weight.data.copy_(protos[0])
    ours.set_prototypes([layer])
    l_ours = ours([emb, *scores], None)

    theirs = vissl_loss(num_crops, K, D, local_queue=qlen).double()
    crit = theirs.swav_criterion
    crit.local_emb_queue.copy_(queue_emb)
    crit.local_queue0.copy_(queue_emb @ protos[0].T)  # what VISSL's queue-score hook computes
    l_theirs = theirs([emb, *scores], None)
    assert abs(l_ours.item() - l_theirs.item()) < 1e-6
    # the queue was used (the loss differs from the queue-less one) ...
    l_noq = SwAVPluginLoss(plugin_cfg(num_crops, K, D))([emb, *scores], None)
    assert abs(l_noq.item() - l_ours.item()) > 1e-4
    # ... and both implementations advance the queue identically
    assert torch.allclose(ours.queues[0].embeddings, crit.local_emb_queue, atol=0)


def test_equals_paper_two_crop_pseudocode():
    bs, D, K = 32, 10, 25
    emb, _, (scores,) = make_output(2, bs, D, [K], seed=2)
    s_t, s_s = scores[:bs].detach(), scores[bs:].detach()
    q_t, q_s = paper_sinkhorn(s_t, 0.05, 3), paper_sinkhorn(s_s, 0.05, 3)
    p_t, p_s = torch.softmax(s_t / 0.1, 1), torch.softmax(s_s / 0.1, 1)
    # appendix A.1: loss = -0.5 * mean(q_t * log(p_s) + q_s * log(p_t)), mean over the batch
    paper = -0.5 * torch.mean(torch.sum(q_t * torch.log(p_s) + q_s * torch.log(p_t), dim=1))
    ours = SwAVPluginLoss(plugin_cfg(2, K, D))([emb, scores], None)
    assert abs(ours.item() - paper.item()) < 1e-9


def test_equals_paper_multicrop_formula():
    """Sec. 3.2: sum over i in {1,2} and v != i of l(z_v, q_i), averaged over terms."""
    ncrops, bs, D, K = 6, 8, 10, 15
    emb, _, (scores,) = make_output(ncrops, bs, D, [K], seed=3)
    paper = reference_swav_loss([scores.detach()], ncrops, (0, 1), 0.1, 0.05, 3)
    ours = SwAVPluginLoss(plugin_cfg(ncrops, K, D))([emb, scores], None)
    assert abs(ours.item() - paper.item()) < 1e-9


def test_codes_only_from_global_crops():
    """Changing a small crop's scores changes the loss only through its predictions,
    never through the codes: codes come from crops_for_assign only."""
    ncrops, bs, D, K = 4, 8, 10, 15
    emb, _, (scores,) = make_output(ncrops, bs, D, [K], seed=4)
    loss = SwAVPluginLoss(plugin_cfg(ncrops, K, D))
    codes_before = [loss.codes_for(scores, 0, j, bs) for j in range(2)]
    s2 = scores.detach().clone()
    s2[2 * bs:] = torch.randn_like(s2[2 * bs:])
    codes_after = [loss.codes_for(s2, 0, j, bs) for j in range(2)]
    for a, b in zip(codes_before, codes_after):
        assert torch.equal(a, b)


def test_fp32_and_bf16_scores_train_finite():
    ncrops, bs, D, K = 4, 8, 10, 15
    emb, _, (scores,) = make_output(ncrops, bs, D, [K], seed=5)
    loss = SwAVPluginLoss(plugin_cfg(ncrops, K, D, double=False))
    l32 = loss([emb.float(), scores.float()], None)
    l16 = loss([emb.bfloat16(), scores.bfloat16()], None)
    assert l32.dtype == torch.float32 and torch.isfinite(l16)
    assert abs(l32.item() - l16.item()) < 0.05 * abs(l32.item())


def test_non_finite_scores_stop_with_dump(tmp_path):
    from vissl_swav_plugin.losses.swav_loss import NonFiniteLossError

    ncrops, bs, D, K = 2, 4, 6, 5
    emb, _, (scores,) = make_output(ncrops, bs, D, [K], seed=6)
    bad = scores.detach().clone()
    bad[3, 2] = float("nan")
    loss = SwAVPluginLoss(plugin_cfg(ncrops, K, D, output_dir=str(tmp_path)))
    with pytest.raises(NonFiniteLossError, match="saved to"):
        loss([emb, bad], None)
    dumps = list(tmp_path.glob("nonfinite_rank0_*.pth"))
    assert len(dumps) == 1
    saved = torch.load(dumps[0])
    assert torch.isnan(saved["scores"]).sum() == 1
