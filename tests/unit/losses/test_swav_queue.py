"""One embedding queue for every prototype set.

The queue stores embeddings, and each prototype set scores them with its own current
prototypes, so the per-set copies the loss used to keep were equal.  The reference is that
loss, copied verbatim into ``tests/helpers/per_head_queue_swav_loss.py``: with several
prototype sets the one-queue loss must give the same losses, gradients, codes and queue over
iterations that fill and then score the queue (fp32, fp64 Sinkhorn, emulated CUDA fp16 / bf16
autocast, CPU bf16 autocast); a single-set checkpoint must be byte-identical; and a loss
state written by the reference (``queues.<h>.*`` for every set) must load and go on exactly
as the reference goes on.
"""
import contextlib
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autocast_emulator import AMP_MODES, swav_loss_config
from per_head_queue_swav_loss import PerHeadQueueSwAVLoss
from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss, merge_per_head_queue_state

V, B, D, KS = 4, 8, 12, [30, 20]
MODES = {"fp32": contextlib.nullcontext, "fp64-sinkhorn": contextlib.nullcontext, **AMP_MODES}


def config(tmp_path, ks=KS, queue_len=2 * B, use_before_full=False, mode="fp32"):
    cfg = swav_loss_config(num_crops=V, K=ks[0], D=D, queue_len=queue_len, output_dir=str(tmp_path),
                           num_prototypes=list(ks), use_double_precision=mode == "fp64-sinkhorn")
    cfg["queue"]["use_before_full"] = use_before_full
    return cfg


def prototype_layers(ks=KS, seed=0):
    g = torch.Generator().manual_seed(seed)
    layers = [nn.Linear(D, k, bias=False) for k in ks]
    with torch.no_grad():
        for layer in layers:
            layer.weight.copy_(F.normalize(torch.randn(layer.weight.shape, generator=g), dim=1))
    return layers


def batches(n, seed=1):
    """``n`` batches of crop-major unit embeddings (V * B x D)."""
    g = torch.Generator().manual_seed(seed)
    return [F.normalize(torch.randn(V * B, D, generator=g), dim=1) for _ in range(n)]


def step(loss, layers, emb, mode):
    """One training step's loss: the head's scores (under ``mode``), the loss, its gradients
    w.r.t. the scores, the code statistics; then a prototype update (as the optimizer's)."""
    with MODES[mode]():
        scores = [layer(emb).detach().requires_grad_(True) for layer in layers]
        value = loss([emb, *scores])
        grads = torch.autograd.grad(value, scores)
    return value.detach(), grads, loss.last_code_stats


def move_prototypes(layers, i):
    g = torch.Generator().manual_seed(100 + i)
    with torch.no_grad():
        for layer in layers:
            layer.weight.add_(0.05 * torch.randn(layer.weight.shape, generator=g))
            layer.weight.copy_(F.normalize(layer.weight, dim=1))


def run_both(old, new, layers, embs, mode, start=0):
    """Step ``old`` and ``new`` through ``embs``; returns how many steps scored the queue."""
    used = 0
    for i, emb in enumerate(embs, start):
        in_use = [new.queue_in_use(h) for h in range(len(layers))]
        assert in_use == [old.queue_in_use(h) for h in range(len(layers))]
        used += any(in_use)
        l_old, g_old, s_old = step(old, layers, emb, mode)
        l_new, g_new, s_new = step(new, layers, emb, mode)
        assert torch.equal(l_new, l_old), (i, l_new.item(), l_old.item())
        for a, b in zip(g_new, g_old):
            assert torch.equal(a, b), i
        for a, b in zip(s_new, s_old):
            assert torch.equal(a["mean_entropy"], b["mean_entropy"]) and torch.equal(a["argmax_counts"], b["argmax_counts"])
        for q in old.queues:  # every per-set copy of the reference equals the one queue
            assert torch.equal(new.queue.embeddings, q.embeddings) and int(new.queue.filled) == int(q.filled)
        move_prototypes(layers, i)
    return used


def pair(tmp_path, **kw):
    cfg = config(tmp_path, **kw)
    old, new = PerHeadQueueSwAVLoss(cfg), SwAVPluginLoss(cfg)
    layers = prototype_layers(cfg["num_prototypes"])
    for loss in (old, new):
        loss.set_prototypes(layers)
        loss.set_queue_active(True)
    return old, new, layers


@pytest.mark.parametrize("use_before_full", [False, True], ids=["official", "use_before_full"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_several_prototype_sets_give_the_per_set_queue_losses(tmp_path, mode, use_before_full):
    old, new, layers = pair(tmp_path, use_before_full=use_before_full, mode=mode)
    used = run_both(old, new, layers, batches(6), mode)
    assert used == (5 if use_before_full else 4)  # the queue (2 batches long) was scored
    # ... and it mattered: a queue-less loss differs on the next batch
    emb = batches(1, seed=9)[0]
    plain = SwAVPluginLoss(config(tmp_path, queue_len=0, mode=mode))
    assert not torch.equal(step(plain, layers, emb, mode)[0], step(new, layers, emb, mode)[0])


def test_one_queue_whatever_the_number_of_prototype_sets(tmp_path):
    def queue_bytes(loss):
        return sum(b.numel() * b.element_size() for q in loss.queues for b in q.buffers())

    for ks in ([30], [30, 20], [30, 20, 10]):
        cfg = config(tmp_path, ks=ks, queue_len=64)
        old, new = PerHeadQueueSwAVLoss(cfg), SwAVPluginLoss(cfg)
        assert len(new.queues) == 1 and new.queue is new.queues[0]
        assert new.queue.embeddings.shape == (2, 64, D)
        assert queue_bytes(old) == len(ks) * queue_bytes(new)
    assert SwAVPluginLoss(config(tmp_path, queue_len=0)).queue is None


def saved_bytes(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def reloaded(state):
    return torch.load(io.BytesIO(saved_bytes(state)))


@pytest.mark.parametrize("gathered", [False, True], ids=["plain", "gathered"])
def test_single_set_checkpoint_is_byte_identical(tmp_path, gathered):
    old, new, layers = pair(tmp_path, ks=[30])
    run_both(old, new, layers, batches(3), "fp32")
    if gathered:
        old.gather_queues_for_checkpoint()
        new.gather_queues_for_checkpoint()
    assert list(new.state_dict()) == list(old.state_dict())
    assert ("queues.0.all_ranks_embeddings" in new.state_dict()) == gathered
    assert saved_bytes(new.state_dict()) == saved_bytes(old.state_dict())


def test_several_sets_checkpoint_holds_one_queue(tmp_path):
    old, new, layers = pair(tmp_path)
    run_both(old, new, layers, batches(3), "fp32")
    old.gather_queues_for_checkpoint()
    new.gather_queues_for_checkpoint()
    s_old, s_new = old.state_dict(), new.state_dict()
    assert any(k.startswith("queues.1.") for k in s_old)
    assert list(s_new) == [k for k in s_old if not k.startswith("queues.1.")]
    for k in s_new:
        assert torch.equal(s_new[k], s_old[k]), k


@pytest.mark.parametrize("gathered", [False, True], ids=["plain", "gathered"])
def test_checkpoint_round_trip_goes_on_identically(tmp_path, gathered):
    old, new, layers = pair(tmp_path)
    run_both(old, new, layers, batches(3), "fp32")
    if gathered:
        new.gather_queues_for_checkpoint()
    resumed = SwAVPluginLoss(config(tmp_path))
    resumed.load_state_dict(reloaded(new.state_dict()))  # strict, as VISSL's resume
    resumed.set_prototypes(layers)
    assert saved_bytes(resumed.state_dict()) == saved_bytes(new.state_dict())
    for i, emb in enumerate(batches(4, seed=5)):
        l_a, g_a, _ = step(new, layers, emb, "fp32")
        l_b, g_b, _ = step(resumed, layers, emb, "fp32")
        assert torch.equal(l_a, l_b) and all(torch.equal(a, b) for a, b in zip(g_a, g_b)), i
        move_prototypes(layers, 10 + i)


@pytest.mark.parametrize("ks", [[30, 20], [30, 20, 10]], ids=["2sets", "3sets"])
@pytest.mark.parametrize("gathered", [False, True], ids=["plain", "gathered"])
def test_a_per_set_queue_state_loads_and_goes_on_as_the_reference(tmp_path, ks, gathered):
    """A checkpoint written by the per-set-queue loss: the one-queue loss loads it (strict)
    and its next steps equal the reference's own next steps."""
    old, new, layers = pair(tmp_path, ks=ks)
    run_both(old, new, layers, batches(3), "fp32")
    if gathered:
        old.gather_queues_for_checkpoint()
    state = reloaded(old.state_dict())
    assert sum(k.startswith(f"queues.{len(ks) - 1}.") for k in state) == (5 if gathered else 3)
    resumed = SwAVPluginLoss(config(tmp_path, ks=ks))
    resumed.load_state_dict(state)
    resumed.set_prototypes(layers)
    assert int(resumed.num_iteration) == 3 and resumed.queue_active
    assert run_both(old, resumed, layers, batches(4, seed=5), "fp32", start=10) == 4
    # the conversion on its own: in place, the number of copies dropped
    state = reloaded(old.state_dict())
    assert merge_per_head_queue_state(state) == len(ks) - 1
    assert not any(k.startswith("queues.1.") for k in state)
    assert merge_per_head_queue_state(state) == 0  # already one queue
    prefixed = {"loss." + k: v for k, v in reloaded(old.state_dict()).items()}
    assert merge_per_head_queue_state(prefixed, "loss.") == len(ks) - 1


def test_differing_per_set_queues_are_refused(tmp_path):
    old, new, layers = pair(tmp_path)
    run_both(old, new, layers, batches(2), "fp32")
    state = reloaded(old.state_dict())
    state["queues.1.embeddings"][0, 0, 0] += 1.0
    with pytest.raises(ValueError, match=r"queue of prototype set 1 \(queues.1.embeddings\) differs"):
        SwAVPluginLoss(config(tmp_path)).load_state_dict(state)
    nan_state = reloaded(old.state_dict())  # equal copies holding NaN still merge
    for h in (0, 1):
        nan_state[f"queues.{h}.embeddings"][0, 0, 0] = float("nan")
    assert merge_per_head_queue_state(nan_state) == 1
