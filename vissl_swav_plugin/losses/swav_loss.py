"""The SwAV swapped-prediction loss (paper Sec. 3, Eq. 1-3 and the multi-crop loss of
Sec. 3.2), registered as ``swav_plugin_loss``.

For every prototype set ``h`` and every crop ``i`` in ``crops_for_assign`` (the global
crops), codes ``q_i`` are computed by Sinkhorn-Knopp on that crop's scores (optionally
extended with the queue of earlier embeddings, scored with set ``h``'s *current*
prototypes: one queue serves every prototype set, as the official code keeps one), and
predicted from every other crop ``v != i``::

    L = mean_h mean_i  1/(V-1) sum_{v != i}  mean_b  -sum_k q_i[b,k] log softmax(s_v[b] / T)_k

Implementation: one ``log_softmax`` over all crops at once, and the sum over ``v != i``
as (sum over all crops) - (crop i), instead of one ``log_softmax`` per (i, v) pair.

Model output expected (VISSL's ``swav_head`` / our ``swav_plugin_head`` format):
``[embeddings (N x D), scores_0 (N x K_0), scores_1, ...]`` with ``N = num_crops * B``
crop-major (crop 0 of every image, then crop 1, ...), as VISSL's multicrop collator
produces.
"""
import logging
import pprint
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from classy_vision.losses import ClassyLoss, register_loss

from vissl_swav_plugin.utils.distributed import rank as _rank, world_size as _world
from vissl_swav_plugin.utils.precision import autocast_disabled, compute_dtype
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp
from vissl_swav_plugin.utils.nonfinite import NonFiniteLossError, raise_non_finite  # noqa: F401 (re-export)

from vissl_swav_plugin.losses.swav_config import (  # noqa: F401  (the loss's key tables, re-exported)
    DEFAULTS,
    LOSS_NAME,
    QUEUE_DEFAULTS,
    REQUIRED_KEYS,
    validate_swav_loss_config,
)

def swapped_prediction_loss(
    scores: torch.Tensor,
    codes: Sequence[torch.Tensor],
    crops_for_assign: Sequence[int],
    num_crops: int,
    temperature: float,
) -> torch.Tensor:
    """Mean over assigned crops i of the cross-entropy of q_i against every other crop.

    The paper's Eq. (1)-(2) with multi-crop (Sec. 3.2): ``p_v = softmax(z_v^T C / T)`` and

        L = 1/|A| sum_{i in A} 1/(V-1) sum_{v != i} mean_b  -sum_k q_i[b,k] log p_v[b,k]

    Args:
        scores: (num_crops * B) x K prototype scores ``z^T C``, crop-major.
        codes: ``codes[j]`` (B x K) are the codes of crop ``crops_for_assign[j]``.
        crops_for_assign: the crop indices ``A`` whose codes are predicted.
        num_crops: ``V``, the number of crops per image.
        temperature: ``T``.

    Returns:
        The scalar loss, in the dtype of ``codes`` (fp32 or fp64): the log-softmax runs
        with autocast off whatever dtype the scores arrive in.
    """
    n, K = scores.shape
    bs = n // num_crops
    with autocast_disabled(scores):
        logp = torch.log_softmax(scores.to(codes[0].dtype) / temperature, dim=1).view(num_crops, bs, K)
        logp_sum = logp.sum(dim=0)  # B x K: sum over all crops
        total = scores.new_zeros((), dtype=codes[0].dtype)
        for q, i in zip(codes, crops_for_assign):
            total = total - torch.sum(q * (logp_sum - logp[i])) / (bs * (num_crops - 1))
    return total / len(crops_for_assign)


@torch.no_grad()
def summarize_codes(codes: Sequence[torch.Tensor]) -> dict:
    """Mean entropy (nats) of the code rows and how many rows pick each prototype.

    Args:
        codes: B x K code matrices (one per assigned crop), rows summing to 1.

    Returns:
        ``{"mean_entropy": 0-dim tensor, "argmax_counts": K-vector (long)}``; uniform codes
        give ``mean_entropy == ln K`` (the collapse detector reads it, see ``collapse.py``).
    """
    q = torch.cat([c.detach().float() for c in codes])
    q = q / q.sum(dim=1, keepdim=True).clamp_min(1e-30)
    entropy = -(q * q.clamp_min(1e-30).log()).sum(dim=1).mean()
    return {"mean_entropy": entropy, "argmax_counts": torch.bincount(q.argmax(dim=1), minlength=q.shape[1])}


class SwAVQueue(nn.Module):
    """Per-rank FIFO of past embeddings of the assigned crops (paper: "Working with small
    batches").  Rows ``[0, filled)`` are valid, newest first.  The queue stores embeddings,
    not scores: scores are recomputed with the current prototypes at every step, so one
    queue serves every prototype set (the loss keeps one, whatever the number of sets).

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


def merge_per_head_queue_state(state_dict, prefix: str = "") -> int:
    """Convert, in place, a loss state written when every prototype set kept its own copy of
    the queue (``queues.<h>.*``, h = 0 .. H-1) to the current layout: one queue, ``queues.0.*``.

    The copies were fed the same embeddings at the same steps, switched on together and
    gathered together, so they are equal; the keys of sets 1 .. H-1 are checked against set
    0's and dropped.  A single-set state (or one already converted) is left as it is.

    Args:
        state_dict: the loss's state (VISSL's checkpoint ``["loss"]``), modified in place.
        prefix: the loss's key prefix in ``state_dict`` (``""`` for a loss state).

    Returns:
        The number of per-set queues dropped (0: nothing to convert).

    Raises:
        ValueError: a dropped copy differs from set 0's queue, or set 0's key is missing
            (then the state was not written by this loss).
    """
    head = prefix + "queues."
    dropped = set()
    for key in [k for k in state_dict if k.startswith(head)]:
        index, _, name = key[len(head):].partition(".")
        if not index.isdigit() or int(index) == 0 or not name:
            continue
        ref, val = state_dict.get(head + "0." + name), state_dict.pop(key)
        same = (ref is not None and ref.shape == val.shape and ref.dtype == val.dtype
                and bool(((ref == val) | (ref != ref) & (val != val)).all()))  # NaN == NaN here
        if not same:
            raise ValueError(
                f"{LOSS_NAME}: the loss state's queue of prototype set {index} ({key}) differs from "
                f"set 0's ({head}0.{name}); {LOSS_NAME} keeps one queue for every prototype set and "
                "can only merge equal per-set copies (as it wrote them); resume without the queue "
                f"state (LOSS.{LOSS_NAME}.queue.queue_length=0) or from another checkpoint"
            )
        dropped.add(index)
    if dropped:
        logging.info(
            f"{LOSS_NAME}: the loss state holds {len(dropped) + 1} equal per-prototype-set queues; "
            "loaded as one queue for every set"
        )
    return len(dropped)


@register_loss(LOSS_NAME)
class SwAVPluginLoss(ClassyLoss):
    """SwAV's swapped-prediction loss (paper Sec. 3, Eq. 1-3, multi-crop Eq. 4), registered as
    ``swav_plugin_loss``.  The codes come from Sinkhorn-Knopp
    (:func:`~vissl_swav_plugin.utils.sinkhorn.sinkhorn_knopp`) over the scores of the
    ``crops_for_assign`` crops (and the queue, when active) against the live prototypes,
    which :class:`~vissl_swav_plugin.hooks.swav_hooks.SwAVAssignmentHook` hands over at every
    forward pass.  Keys are validated when the config is composed
    (:func:`~vissl_swav_plugin.losses.swav_config.validate_swav_loss_config`): an unknown key
    is an error naming the closest known key.  The defaults are
    :data:`~vissl_swav_plugin.losses.swav_config.DEFAULTS` and ``QUEUE_DEFAULTS``.

    Config params (``LOSS.swav_plugin_loss``):
        temperature (float, required): softmax temperature tau of the predictions (paper: 0.1).
        epsilon (float, required): entropic regularisation of Sinkhorn-Knopp (paper: 0.05).
        num_iters (int, required): Sinkhorn-Knopp iterations (paper: 3).
        crops_for_assign (list of int, required): the crops whose codes are computed and
            predicted from every other crop (paper: the two global crops, ``[0, 1]``).
        num_crops (int, inferred): crops per image, from the ``multicrop_plugin`` transform.
        num_prototypes (list of int, inferred): prototypes per prototype set, from the head's
            ``num_clusters``.
        embedding_dim (int, inferred): size of the embedding, the last entry of the head's ``dims``.
        use_double_precision (bool, default False): Sinkhorn-Knopp in float64 instead of float32.
        hard_assignment (bool, default False): one-hot codes (argmax of the soft codes).
        temp_hard_assignment_iters (int, default 0): hard codes for the first N iterations.
        distributed_sinkhorn (bool, default True): equipartition over the batch of all
            processes (the marginals are all-reduced), as the official code.
        normalize_prototypes (bool, default True): keep the prototypes L2-normalised
            (:class:`~vissl_swav_plugin.hooks.swav_hooks.NormalizePrototypesHook`).
        freeze_prototypes_niters (int, default 0): the prototypes get no update during the
            first N iterations (paper: one epoch).
        output_dir (str, default "."): where the non-finite guard saves its tensors (inferred:
            the checkpoint folder).
        queue.queue_length (int, default 0): length of the feature queue over all processes
            (0: no queue; the official code: 3840 for small batches).
        queue.start_epoch (int, default 0): the epoch from which the queue is used.
        queue.local_queue_length (int, default 0): per-process length (inferred:
            ``queue_length`` / world size).
        queue.use_before_full (bool, default False): score the valid part of a queue that is
            still filling (the official code waits until it is full).
    """

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
        # one queue of embeddings for every prototype set (each scores it with its own
        # prototypes); a list of one, so that the state keys stay ``queues.0.*``
        self.queues = nn.ModuleList(
            [SwAVQueue(len(self.crops_for_assign), local_len, self.embedding_dim)] if local_len > 0 else []
        )
        self.register_buffer("num_iteration", torch.zeros((), dtype=torch.long))
        # set by SwAVAssignmentHook at every forward: the live prototype layers
        self._prototypes: Optional[List[nn.Module]] = None
        #: read-only: :func:`summarize_codes` of the last forward's codes, one per prototype
        #: set (None before the first forward); the collapse detector logs it
        self.last_code_stats: Optional[List[dict]] = None

    @classmethod
    def from_config(cls, loss_config):
        """Classy Vision's constructor: validate ``loss_config`` (an error names the key), then build."""
        validate_swav_loss_config(loss_config, prefix=f"LOSS.{LOSS_NAME}")
        return cls(loss_config)

    # -- public interface used by the hooks ----------------------------------------------
    @property
    def has_queue(self) -> bool:
        """Whether this loss keeps a queue (``queue.queue_length > 0``)."""
        return len(self.queues) > 0

    @property
    def queue(self) -> Optional[SwAVQueue]:
        """The queue of embeddings every prototype set scores (None without a queue)."""
        return self.queues[0] if self.has_queue else None

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
        if self.has_queue:
            self.queue.gather_for_checkpoint()

    def queue_summary(self) -> dict:
        """The queue's :meth:`SwAVQueue.summary` (empty without a queue)."""
        return self.queue.summary() if self.has_queue else {}

    def queue_in_use(self, head_id: int) -> bool:
        """Whether this step's codes of prototype set ``head_id`` include the queue: the
        queue is active and full (official code), or has any row with ``use_before_full``.
        The one queue serves every set, so the answer is the same for all of them."""
        if not self.queue_active:
            return False
        q = self.queue
        return q.full or (self.queue_use_before_full and int(q.filled) > 0)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a state written when every prototype set kept its own queue: merged into one
        merge_per_head_queue_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
                queue = self.queue.valid(crop_slot)
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
        when it is active (after the codes are computed, as the official code; one push
        into the queue that every prototype set scores)."""
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
            self.queue.push([emb[bs * c : bs * (c + 1)] for c in self.crops_for_assign])
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
