"""One embedding queue for every prototype set.

The queue stores embeddings, and each prototype set scores them with its own current
prototypes, so the per-set copies the loss used to keep were equal.  The reference is that
loss, copied verbatim at the end of this file: with several
prototype sets the one-queue loss must give the same losses, gradients, codes and queue over
iterations that fill and then score the queue (fp32, fp64 Sinkhorn, emulated CUDA fp16 / bf16
autocast, CPU bf16 autocast); a single-set checkpoint must be byte-identical; and a loss
state written by the reference (``queues.<h>.*`` for every set) must load and go on exactly
as the reference goes on.
"""
import contextlib
import io
from typing import List, Optional, Sequence

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from classy_vision.losses import ClassyLoss

from autocast_emulator import AMP_MODES, swav_loss_config
from vissl_swav_plugin.losses.swav_loss import (  # the key tables are re-exported there
    DEFAULTS, LOSS_NAME, QUEUE_DEFAULTS, SwAVPluginLoss, merge_per_head_queue_state, summarize_codes,
    swapped_prediction_loss,
)
from vissl_swav_plugin.utils.distributed import rank as _rank, world_size as _world
from vissl_swav_plugin.utils.nonfinite import raise_non_finite
from vissl_swav_plugin.utils.precision import autocast_disabled, compute_dtype
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp

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


# ---------------------------------------------------------------------------------------------
# The reference: the SwAV loss as it was when every prototype set kept its own queue
# (``swav_loss.py`` before all sets shared one), and the writer of the old checkpoint layout
# (``queues.<h>.*`` for every set h).  Copied verbatim -- ``SwAVQueue`` and ``SwAVPluginLoss``
# renamed ``OldSwAVQueue`` and ``PerHeadQueueSwAVLoss``; the registration, the debug summaries,
# ``__repr__`` and the long docstrings dropped; the helpers that did not change
# (``swapped_prediction_loss``, ``summarize_codes``, Sinkhorn-Knopp, the precision utilities)
# imported.
# ---------------------------------------------------------------------------------------------
class OldSwAVQueue(nn.Module):
    """Per-rank FIFO of past embeddings of the assigned crops (paper: "Working with small
    batches").  Rows ``[0, filled)`` are valid, newest first.  The queue stores embeddings,
    not scores: scores are recomputed with the current prototypes at every step.

    Checkpointing: VISSL writes ``loss.state_dict()`` from rank 0 only, so before a
    checkpoint the hook calls :meth:`gather_for_checkpoint`, which collects every rank's
    queue into rank 0's state; on load each rank takes back its own slice.
    """

    def __init__(self, num_assign_crops: int, local_length: int, dim: int):
        super().__init__()
        self.local_length = int(local_length)
        self.register_buffer("embeddings", torch.zeros(num_assign_crops, self.local_length, dim))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self.register_buffer("active", torch.zeros((), dtype=torch.bool))
        # every rank's queue, collected right before a checkpoint is written (rank 0 saves)
        self._gathered = None

    def valid(self, j: int) -> torch.Tensor:
        """The valid rows (newest first) of assigned crop slot ``j``'s queue."""
        return self.embeddings[j, : int(self.filled)]

    @property
    def full(self) -> bool:
        """Whether every row holds an embedding (the official code's condition for use)."""
        return int(self.filled) >= self.local_length

    @torch.no_grad()
    def push(self, new: Sequence[torch.Tensor]) -> None:
        """Insert the newest embeddings (one B x D tensor per assigned crop) at the front."""
        bs = new[0].shape[0]
        if bs > self.local_length:
            raise ValueError(
                f"{LOSS_NAME}: queue.local_queue_length ({self.local_length}) is shorter than the "
                f"batch per replica ({bs}); increase LOSS.{LOSS_NAME}.queue.queue_length"
            )
        emb = self.embeddings
        emb[:, bs:] = emb[:, :-bs].clone()
        for j, e in enumerate(new):
            emb[j, :bs] = e.detach().to(emb.dtype)
        self.filled.fill_(min(int(self.filled) + bs, self.local_length))

    @torch.no_grad()
    def gather_for_checkpoint(self) -> None:
        """Collective: every rank must call it.  Rank 0's next state_dict holds all queues."""
        world = _world()
        if world == 1:
            self._gathered = (self.embeddings.unsqueeze(0).clone(), self.filled.view(1).clone())
            return
        embs = [torch.empty_like(self.embeddings) for _ in range(world)]
        fills = [torch.empty_like(self.filled.view(1)) for _ in range(world)]
        dist.all_gather(embs, self.embeddings.contiguous())
        dist.all_gather(fills, self.filled.view(1).contiguous())
        self._gathered = (torch.stack(embs), torch.cat(fills))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._gathered is not None:
            destination[prefix + "all_ranks_embeddings"] = self._gathered[0]
            destination[prefix + "all_ranks_filled"] = self._gathered[1]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        all_emb = state_dict.pop(prefix + "all_ranks_embeddings", None)
        all_fill = state_dict.pop(prefix + "all_ranks_filled", None)
        if all_emb is not None:
            world, rank = _world(), _rank()
            if all_emb.shape[0] != world:
                raise ValueError(
                    f"{LOSS_NAME}: the checkpoint holds the queues of {all_emb.shape[0]} processes but "
                    f"this run has {world}; resume with the same world size or set "
                    f"LOSS.{LOSS_NAME}.queue.queue_length=0"
                )
            state_dict[prefix + "embeddings"] = all_emb[rank].clone()
            state_dict[prefix + "filled"] = all_fill[rank].clone().view(())
            self._gathered = (all_emb.clone(), all_fill.clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class PerHeadQueueSwAVLoss(ClassyLoss):
    """The old ``swav_plugin_loss``: one ``OldSwAVQueue`` per prototype set, each fed the same embeddings."""

    def __init__(self, loss_config):
        super().__init__()
        cfg = loss_config
        self.loss_config = cfg
        self.temperature = float(cfg["temperature"])
        self.epsilon = float(cfg["epsilon"])
        self.num_iters = int(cfg["num_iters"])
        self.crops_for_assign = [int(c) for c in cfg["crops_for_assign"]]
        self.num_crops = int(cfg["num_crops"])
        self.num_prototypes = [int(k) for k in cfg["num_prototypes"]]
        self.embedding_dim = int(cfg["embedding_dim"])
        opt = {k: cfg.get(k, d) for k, d in DEFAULTS.items()}
        self.use_double = bool(opt["use_double_precision"])
        self.hard_assignment = bool(opt["hard_assignment"])
        self.temp_hard_assignment_iters = int(opt["temp_hard_assignment_iters"])
        self.distributed_sinkhorn = bool(opt["distributed_sinkhorn"])
        self.output_dir = str(opt["output_dir"])
        queue_cfg = cfg.get("queue", {}) or {}
        queue_opt = {k: queue_cfg.get(k, d) for k, d in QUEUE_DEFAULTS.items()}
        self.queue_start_epoch = int(queue_opt["start_epoch"])
        self.queue_use_before_full = bool(queue_opt["use_before_full"])
        local_len = int(queue_opt["local_queue_length"] or 0)
        self.queues = nn.ModuleList(
            OldSwAVQueue(len(self.crops_for_assign), local_len, self.embedding_dim)
            for _ in self.num_prototypes
        ) if local_len > 0 else nn.ModuleList()
        self.register_buffer("num_iteration", torch.zeros((), dtype=torch.long))
        # set by SwAVAssignmentHook at every forward: the live prototype layers
        self._prototypes: Optional[List[nn.Module]] = None
        #: read-only: :func:`summarize_codes` of the last forward's codes, one per prototype
        #: set (None before the first forward); the collapse detector logs it
        self.last_code_stats: Optional[List[dict]] = None

    # -- public interface used by the hooks ----------------------------------------------
    @property
    def has_queue(self) -> bool:
        """Whether this loss keeps a queue (``queue.queue_length > 0``)."""
        return len(self.queues) > 0

    @property
    def queue_active(self) -> bool:
        """Whether the queue is being filled (from epoch ``queue.start_epoch`` on)."""
        return self.has_queue and bool(self.queues[0].active)

    def set_queue_active(self, active: bool) -> None:
        """Switch the queue on or off (the assignment hook does it at each epoch start)."""
        for q in self.queues:
            q.active.fill_(bool(active))

    def set_prototypes(self, layers: Optional[List[nn.Module]]) -> None:
        """Attach the live prototype layers (one per prototype set); the queue's stored
        embeddings are scored with them at every step."""
        self._prototypes = layers

    def gather_queues_for_checkpoint(self) -> None:
        """Collective: collect every rank's queue into rank 0's next ``state_dict``."""
        for q in self.queues:
            q.gather_for_checkpoint()

    def queue_in_use(self, head_id: int) -> bool:
        """Whether this step's codes include the queue of prototype set ``head_id``: the
        queue is active and full (official code), or has any row with ``use_before_full``."""
        if not self.queue_active:
            return False
        q = self.queues[head_id]
        return q.full or (self.queue_use_before_full and int(q.filled) > 0)

    # -- forward ------------------------------------------------------------------------
    def codes_for(self, scores: torch.Tensor, head_id: int, crop_slot: int, bs: int) -> torch.Tensor:
        """Codes ``q`` (B x K) of crop ``crops_for_assign[crop_slot]`` for prototype set
        ``head_id``: Sinkhorn-Knopp (paper Eq. 3) on that crop's scores, extended with the
        queue's embeddings scored by the current prototypes when :meth:`queue_in_use`.
        Computed in fp32 (fp64 with ``use_double_precision``) with autocast off."""
        crop = self.crops_for_assign[crop_slot]
        dtype = compute_dtype(self.use_double)
        with torch.no_grad(), autocast_disabled(scores):
            s = scores[bs * crop : bs * (crop + 1)].detach()
            if self.queue_in_use(head_id):
                queue = self.queues[head_id].valid(crop_slot)
                if self._prototypes is None:
                    raise RuntimeError(
                        f"{LOSS_NAME}: the queue is active but no prototypes were attached; "
                        "the SwAV assignment hook must run (use VISSL's default hook generator)"
                    )
                w = self._prototypes[head_id].weight.detach()
                s = torch.cat([s.to(dtype), queue.to(dtype) @ w.to(dtype).t()])
            hard = self.hard_assignment or int(self.num_iteration) < self.temp_hard_assignment_iters
            q = sinkhorn_knopp(
                s,
                self.epsilon,
                self.num_iters,
                hard=hard,
                dtype=dtype,
                distributed=None if self.distributed_sinkhorn else False,
            )
        return q[:bs]

    def forward(self, output, target=None):
        """The SwAV loss of the head output ``[embeddings, scores_0, scores_1, ...]``,
        averaged over prototype sets; pushes the assigned crops' embeddings into the queue
        when it is active (after the codes are computed, as the official code)."""
        if not isinstance(output, (list, tuple)) or len(output) < 2:
            raise ValueError(
                f"{LOSS_NAME} expects the head output [embeddings, scores_0, ...]; got "
                f"{type(output).__name__} of length {len(output) if isinstance(output, (list, tuple)) else '-'}"
            )
        emb, all_scores = output[0], list(output[1:])
        if len(all_scores) != len(self.num_prototypes):
            raise ValueError(
                f"{LOSS_NAME}: the head returned {len(all_scores)} score tensors but "
                f"num_prototypes is {self.num_prototypes}"
            )
        n = all_scores[0].shape[0]
        if n % self.num_crops:
            raise ValueError(
                f"{LOSS_NAME}: {n} rows of scores are not a multiple of num_crops={self.num_crops}"
            )
        bs = n // self.num_crops
        loss = 0.0
        code_stats = []
        for h, scores in enumerate(all_scores):
            codes = [self.codes_for(scores, h, j, bs) for j in range(len(self.crops_for_assign))]
            code_stats.append(summarize_codes(codes))
            head_loss = swapped_prediction_loss(
                scores, codes, self.crops_for_assign, self.num_crops, self.temperature
            )
            self._check_finite(head_loss, scores, codes, h)
            loss = loss + head_loss
        loss = loss / len(all_scores)
        self.last_code_stats = code_stats
        if self.queue_active:
            for q in self.queues:
                q.push([emb[bs * c : bs * (c + 1)] for c in self.crops_for_assign])
        self.num_iteration += 1
        return loss

    def _check_finite(self, loss, scores, codes, head_id):
        if torch.isfinite(loss) and all(torch.isfinite(q).all() for q in codes):
            return
        it = int(self.num_iteration)
        raise_non_finite(
            self.output_dir, it, f"head{head_id}",
            {"scores": scores, "codes": list(codes), "loss": loss, "iteration": it},
            f"{LOSS_NAME}: non-finite loss ({loss.item()}) or codes at iteration {it}, head {head_id}",
            "scores and codes",
        )
