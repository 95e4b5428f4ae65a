"""The official implementation's semantics (facebookresearch/swav ``main_swav.py``) are the
defaults: the queue is scored only once it is full, prototypes are unit-norm before every
forward pass; our loss also works with VISSL's own ``swav_head``."""
import types

import pytest
import torch
import torch.nn.functional as F

from autocast_emulator import swav_loss_config
from testkit import compose
from vissl_swav_plugin.models.heads import SwAVPluginHead, find_prototype_layers
from vissl_swav_plugin.hooks.swav_hooks import NormalizePrototypesHook, swav_hooks
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp
from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss

B, D, K, V = 8, 16, 12, 4


def official_queue_codes(steps, W, queue_len):
    """Codes of crop 0 at each step, as ``main_swav.py`` computes them: a zero-initialised
    queue is filled every step; it is scored (all of it, queue rows first) from the step
    at which its last row is non-zero, and filled after the scores are taken."""
    queue = torch.zeros(queue_len, D)
    use_the_queue = False
    codes = []
    for emb in steps:
        out = emb[:B] @ W.t()
        if use_the_queue or not torch.all(queue[-1] == 0):
            use_the_queue = True
            out = torch.cat([queue @ W.t(), out])
        queue[B:] = queue[:-B].clone()
        queue[:B] = emb[:B]
        codes.append(sinkhorn_knopp(out, 0.05, 3)[-B:])
    return codes


def partial_queue_codes(steps, W, queue_len):
    """The ``queue.use_before_full: true`` option: the valid rows of a filling queue."""
    stored, codes = [], []
    for emb in steps:
        out = emb[:B] @ W.t()
        if stored:
            out = torch.cat([torch.cat(stored)[:queue_len] @ W.t(), out])
        stored.insert(0, emb[:B])
        codes.append(sinkhorn_knopp(out, 0.05, 3)[-B:])
    return codes


@pytest.mark.parametrize("use_before_full,reference", [(False, official_queue_codes),
                                                        (True, partial_queue_codes)])
@pytest.mark.parametrize("queue_len", [2 * B, 3 * B])
def test_queue_scoring_follows_reference(use_before_full, reference, queue_len, tmp_path):
    g = torch.Generator().manual_seed(queue_len)
    protos = torch.nn.Linear(D, K, bias=False)
    with torch.no_grad():
        protos.weight.copy_(F.normalize(torch.randn(K, D, generator=g), dim=1))
    steps = [F.normalize(torch.randn(V * B, D, generator=g), dim=1) for _ in range(5)]
    cfg = swav_loss_config(num_crops=V, K=K, D=D, queue_len=queue_len, output_dir=str(tmp_path))
    cfg["queue"]["use_before_full"] = use_before_full
    loss = SwAVPluginLoss(cfg)
    loss.set_prototypes([protos])
    loss.set_queue_active(True)
    expected = reference(steps, protos.weight.detach(), queue_len)
    for t, emb in enumerate(steps):
        scores = emb @ protos.weight.detach().t()
        got = loss.codes_for(scores, 0, 0, B)
        assert torch.allclose(got, expected[t], atol=1e-6), (t, (got - expected[t]).abs().max())
        loss([emb, scores])
    # the two semantics differ while the queue fills: the test would catch a swap
    if not use_before_full:
        other = partial_queue_codes(steps, protos.weight.detach(), queue_len)
        assert not torch.allclose(other[1], expected[1], atol=1e-4)


def test_queue_default_is_the_reference():
    loss = SwAVPluginLoss(swav_loss_config(num_crops=V, K=K, D=D, queue_len=2 * B))
    assert loss.queue_use_before_full is False


def _fake_task(model, iteration=0):
    return types.SimpleNamespace(model=model, iteration=iteration)


@pytest.mark.parametrize("wrap", ["plain", "ddp_prefix"])
def test_loaded_unnormalised_prototypes_are_normalised_at_start(wrap):
    """Prototypes loaded un-normalised (another tool's checkpoint, a user's init) are
    unit-norm before the first forward, even inside the freeze window."""
    head = SwAVPluginHead(None, dims=[8, D], num_clusters=[K, 5])
    with torch.no_grad():
        for layer in head.prototype_layers():
            layer.weight.mul_(torch.rand(layer.weight.shape[0], 1) * 3 + 0.5)
    model = torch.nn.Sequential(head) if wrap == "plain" else torch.nn.ModuleDict({"module": head})
    hook = NormalizePrototypesHook(frozen_niters=100)
    hook.on_start(_fake_task(model))
    for _, layer in find_prototype_layers(model).values():
        assert torch.allclose(layer.weight.norm(dim=1), torch.ones(layer.weight.shape[0]), atol=1e-6)


def test_unit_prototypes_left_bit_exact_at_start():
    head = SwAVPluginHead(None, dims=[8, D], num_clusters=[K])
    before = head.prototypes0.weight.detach().clone()
    NormalizePrototypesHook(frozen_niters=10).on_start(_fake_task(head))
    assert torch.equal(before, head.prototypes0.weight)


def test_vissl_swav_head_prototypes_found_and_normalised():
    from vissl.models.heads.swav_prototypes_head import SwAVPrototypesHead

    head = SwAVPrototypesHead(None, dims=[8, D], use_bn=False, num_clusters=[K])
    layers = find_prototype_layers(torch.nn.ModuleDict({"heads": head}))
    assert [n for n, _ in layers.values()] == ["heads.prototypes0"]
    NormalizePrototypesHook().on_start(_fake_task(head))
    assert torch.allclose(head.prototypes0.weight.norm(dim=1), torch.ones(K), atol=1e-6)


def test_weight_norm_prototypes_are_rejected_by_name():
    from vissl.models.heads.swav_prototypes_head import SwAVPrototypesHead

    head = SwAVPrototypesHead(None, dims=[8, D], use_bn=False, num_clusters=[K],
                              use_weight_norm_prototypes=True)
    with pytest.raises(ValueError, match="prototypes0.*weight-normalised"):
        find_prototype_layers(head)


def test_swav_hooks_normalise_at_start_and_freeze():
    cfg = compose(["config=test/swav_plugin/quick_cpu"])
    names = [type(h).__name__ for h in swav_hooks(cfg)]
    assert "NormalizePrototypesHook" in names and "FreezePrototypesHook" in names
