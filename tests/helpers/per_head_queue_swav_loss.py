"""The SwAV loss as it was when every prototype set kept its own queue (``swav_loss.py`` before
all sets shared one): the reference the one-queue loss must equal, and the writer of the old
checkpoint layout (``queues.<h>.*`` for every set h).

Copied verbatim -- ``SwAVQueue`` and ``SwAVPluginLoss`` renamed ``OldSwAVQueue`` and
``PerHeadQueueSwAVLoss``, the registration and the long docstrings dropped; the helpers that did
not change (``swapped_prediction_loss``, ``summarize_codes``, Sinkhorn-Knopp, the precision
utilities) are imported.
"""
import pprint
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from classy_vision.losses import ClassyLoss

from vissl_swav_plugin.losses.swav_loss import (  # the key tables are re-exported there
    DEFAULTS, LOSS_NAME, QUEUE_DEFAULTS, summarize_codes, swapped_prediction_loss,
)
from vissl_swav_plugin.utils.distributed import rank as _rank, world_size as _world
from vissl_swav_plugin.utils.nonfinite import raise_non_finite
from vissl_swav_plugin.utils.precision import autocast_disabled, compute_dtype
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp


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

    def summary(self) -> dict:
        """Active flag, fill level and checksums of the stored embeddings (debug traces)."""
        return {
            "queue_active": bool(self.active),
            "queue_filled": int(self.filled),
            "queue_sum": float(self.embeddings.double().sum()),
            "queue_abs_sum": float(self.embeddings.double().abs().sum()),
        }

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

    def queue_summary(self) -> dict:
        """The first queue's :meth:`SwAVQueue.summary` (empty without a queue)."""
        return self.queues[0].summary() if self.has_queue else {}

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

    def __repr__(self):
        return pprint.pformat(
            {
                "name": type(self).__name__,
                "registered_as": LOSS_NAME,
                "temperature": self.temperature,
                "epsilon": self.epsilon,
                "num_iters": self.num_iters,
                "num_crops": self.num_crops,
                "crops_for_assign": self.crops_for_assign,
                "num_prototypes": self.num_prototypes,
                "queue_local_length": self.queues[0].local_length if len(self.queues) else 0,
                "queue_start_epoch": self.queue_start_epoch,
                "use_double_precision": self.use_double,
            },
            indent=2,
        )
