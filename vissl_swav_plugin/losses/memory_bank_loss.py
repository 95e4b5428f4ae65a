"""The memory-bank base of DeepCluster-v2 and SeLa-v2 (SwAV paper, appendix "Details on
Clustering-Based methods"): what the two methods share.

Both alternate, once per epoch, an *assignment* step and a *training* step on the loss

    l(z, c, q) = - sum_k q^(k) log p^(k),   p = softmax(z^T c / tau),

with ``z`` the L2-normalised embedding of a crop, ``c`` the prototypes (one set per
clustering ``h``) and ``q`` the pseudo-label of the crop's image:

* assignment (``on_phase_start`` of epoch ``e``): the features of the whole dataset
  stored in a memory bank during epoch ``e-1`` (or during an initial forward pass before
  epoch 0) are clustered -- k-means for DeepCluster-v2, Sinkhorn-Knopp under the
  equipartition constraint for SeLa-v2 (:mod:`vissl_swav_plugin.utils.clustering`) -- which
  gives the pseudo-label of every sample; clustering ``h`` uses the bank of crop
  ``crops_for_mb[h % len(crops_for_mb)]``;
* training (every iteration): the cross-entropy above over all crops, averaged over the
  clusterings, while the normalised embeddings of the ``crops_for_mb`` crops overwrite
  the bank (no extra forward pass).

Here is the shared machinery: :class:`MemoryBankClusteringLoss` (bank filling and
updates, pseudo-label table, checkpoint state, non-finite guard) and
:class:`~vissl_swav_plugin.hooks.memory_bank_hooks.MemoryClusteringHook`, which drives it from
VISSL's training loop (the hooks layer, which registers it for both loss names); a method
implements the assignment step and its head handling (``deepcluster_v2.py``,
``sela_v2.py``).  Storage: :class:`~vissl_swav_plugin.utils.memory_bank.MemoryBank`; config
inference: :func:`~vissl_swav_plugin.losses.clustering_config.infer_clustering_loss_config`
(both importable from here).

Checkpoints: at every epoch end the bank rows of all processes are gathered on the
primary process, so the loss' ``state_dict`` (VISSL saves on the primary process only)
holds the full bank, the pseudo-label table and the method's extra state; a resumed run
re-shards the bank over its processes (any world size) and clusters it at the next epoch
start.  A mid-epoch checkpoint restores the running epoch's pseudo-labels; the bank it
carries is the previous epoch's and is overwritten as the resumed epoch proceeds, so the
next clustering sees some one-epoch-older features, and samples seen only before the
interruption may stay unlabelled (ignored) for one epoch.
"""
import logging
import math
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from classy_vision.losses import ClassyLoss

from vissl_swav_plugin.losses.clustering_config import ClusteringChecksMixin, infer_clustering_loss_config
from vissl_swav_plugin.transforms.device_step import train_batches
from vissl_swav_plugin.utils.distributed import world_size_and_rank
from vissl_swav_plugin.utils.memory_bank import IGNORE_INDEX, MemoryBank, bank_embeddings, batch_crops, gather_table
from vissl_swav_plugin.utils.nonfinite import all_finite, raise_non_finite
from vissl_swav_plugin.utils.precision import autocast_disabled

__all__ = ["IGNORE_INDEX", "MemoryBank", "MemoryBankClusteringLoss", "gather_table", "infer_clustering_loss_config"]

#: version of the layout of :meth:`MemoryBankClusteringLoss.state_dict`
STATE_FORMAT = 1


class MemoryBankClusteringLoss(ClusteringChecksMixin, ClassyLoss):
    """Base of the offline clustering losses: memory bank + dataset-wide pseudo-labels.

    Config params (``LOSS.<name>``, shared by every memory-bank clustering loss):
        num_train_samples (int, default -1): size of the training set (-1: VISSL fills it in
            from the training dataset).
        temperature (float, required): tau of the classification softmax (paper: 0.1).
        num_clusters (list of int, inferred): one clustering / prototype set each (paper:
            ``[3000, 3000, 3000]``), from the head's ``num_clusters``.
        embedding_dim (int, inferred): the last entry of the head's ``dims``.
        crops_for_mb (list of int, default [0]): crops whose features fill the memory bank(s).
        init_memory_pass (bool, default True): a forward pass over the data before epoch 0
            (as the reference code); False: epoch 0 only fills the bank.
        init_bank_forward (str, default "per_crop"): that pass calls the model once per crop
            (the reference code); ``joint``: once on all ``crops_for_mb`` crops.
        output_dir (str, default None): where the non-finite guard saves its tensors
            (inferred: the checkpoint folder).

    Subclasses implement :meth:`compute_assignments` and may override
    :meth:`restore_head`, :meth:`after_update`, :meth:`head_loss`, the config / model
    checks of :class:`~vissl_swav_plugin.losses.clustering_config.ClusteringChecksMixin`, and
    list their checkpointed buffers in ``STATE_BUFFERS``.
    """

    LOSS_NAME = "memory_bank_clustering"
    #: prefixes of the method's per-clustering buffers checkpointed with the loss
    STATE_BUFFERS: Tuple[str, ...] = ()

    def __init__(self, loss_config):
        super().__init__()
        self.loss_config = loss_config
        self.name = loss_config.get("name", self.LOSS_NAME)
        self.read_base_config()
        self.output_dir: Optional[str] = self._get("output_dir", None)
        self.world_size, self.rank = world_size_and_rank()
        capacity = int(math.ceil(self.num_train_samples / self.world_size))
        self.memory = MemoryBank(len(self.crops_for_mb), capacity, self.embedding_dim)
        self.register_buffer(
            "assignments",
            torch.full((len(self.num_clusters), self.num_train_samples), IGNORE_INDEX, dtype=torch.long),
        )
        self.assign_epoch = -1  # epoch whose pseudo-labels are in `assignments`
        self.memory_epoch = None  # epoch whose features fill the bank (-1: initial pass)
        self.memory_source_epoch = None  # epoch of the features the current labels come from
        self._snapshot = None  # (ids, embeddings) of all processes, primary process only
        self._batch_ids: Optional[torch.Tensor] = None
        self._batch_num_crops: Optional[int] = None
        self._training = True
        self._checked_batch = False
        self.iteration = 0  # training iteration (from the hook), names the non-finite dumps
        self.last_assignment_info: Dict[str, Any] = {}

    @classmethod
    def from_config(cls, loss_config):
        """Build the loss from ``LOSS.<name>`` (Classy Vision's registry entry point)."""
        return cls(loss_config)

    @property
    def num_heads(self) -> int:
        """Number of clusterings ``H`` (= prototype sets = entries of ``num_clusters``)."""
        return len(self.num_clusters)

    def bank_of_head(self, h: int) -> int:
        """Memory bank clustered for clustering ``h``: ``h % len(crops_for_mb)``."""
        return h % len(self.crops_for_mb)

    # ------------------------------------------------------------------ training step
    def set_batch(
        self, ids: Optional[torch.Tensor], num_crops: Optional[int], training: bool, iteration: Optional[int] = None
    ) -> None:
        """Called by the hook before every loss evaluation (``on_forward``): the dataset
        indices of the batch rows, its number of crops, train / eval, the iteration."""
        self._batch_ids = ids
        self._batch_num_crops = num_crops
        self._training = bool(training)
        if iteration is not None:
            self.iteration = int(iteration)

    def forward(self, output, target: torch.Tensor):
        """Mean over clusterings ``h`` of the cross-entropy between ``softmax(scores_h / tau)``
        and the pseudo-labels, over all crops; stores the ``crops_for_mb`` embeddings in
        the bank when training.  Runs with autocast off, in fp32, whatever the dtype of
        the scores (fp16 / bf16 under AMP).  ``output``: ``[embedding, scores_0, ..., scores_H-1]``
        (crop-major rows) or the embedding alone (scored by
        :meth:`scores_without_head_prototypes`); ``target``: the sample indices when the
        hook gave none."""
        ids = self._batch_ids if self._batch_ids is not None else target
        self._batch_ids = None
        emb, scores, ids, B = self.unpack_batch(output, ids, self._batch_num_crops)
        emb_n = F.normalize(emb.detach().float(), dim=1)
        if self._training:
            self.memory.add(ids[:B], [emb_n[c * B : (c + 1) * B] for c in self.crops_for_mb])

        with autocast_disabled(emb, *(scores or ())):  # fp32 scores / log-softmax under AMP
            if scores is None:
                scores = self.scores_without_head_prototypes(emb)
            losses = [self.head_loss(h, scores[h], ids) for h in range(self.num_heads)]
        if not all_finite(*losses, *scores):  # one host sync for all clusterings
            for h in range(self.num_heads):
                self.guard_finite(
                    h,
                    {"scores": scores[h], "loss": losses[h], "pseudo_labels": self.assignments[h][ids], "ids": ids},
                    f"non-finite loss ({losses[h].item()}) or scores",
                )
        loss = 0.0
        for head_loss in losses:
            loss = loss + head_loss
        return loss / self.num_heads

    def scores_without_head_prototypes(self, emb: torch.Tensor) -> List[torch.Tensor]:
        """Scores ``[R, K_h]`` per clustering when the head returns only the embedding
        (the base class requires prototype scores from the head)."""
        raise ValueError(
            f"{self.name}: the model head must return [embedding, scores_0, ..., scores_H-1] "
            "(a swav_head-style head with one prototype layer per clustering)"
        )

    def head_loss(self, h: int, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``l(z, c_h, q_h)`` (hard pseudo-labels): cross-entropy of ``softmax(scores / tau)``
        against ``assignments[h][ids]``, mean over the rows that have a pseudo-label (none
        yet: loss 0, zero gradient).  No host sync."""
        logits = scores.float() / self.temperature
        labels = self.assignments[h][ids]
        n = (labels != IGNORE_INDEX).sum().clamp_min(1)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum") / n

    def guard_finite(self, h: int, tensors: Dict[str, torch.Tensor], problem: str) -> None:
        """The non-finite guard: if a tensor of ``tensors`` (name -> tensor of clustering
        ``h``) holds a NaN/inf, save them all to ``<output_dir>/nonfinite_rank<r>_iter<n>_head<h>.pth``
        and raise :class:`~vissl_swav_plugin.utils.nonfinite.NonFiniteLossError`, message
        ``"<loss>: <problem> at iteration <n>, head <h>; <names> saved to <path>"``."""
        if all_finite(*tensors.values()):
            return
        it = self.iteration
        raise_non_finite(
            self.output_dir or ".", it, f"head{h}", dict(tensors, iteration=it),
            f"{self.name}: {problem} at iteration {it}, head {h}", ", ".join(tensors),
        )

    # ------------------------------------------------------------------ hooks
    def setup(self, task) -> None:
        """``on_start``: validate against the task, fill the bank if empty."""
        self.check_task(task)
        if self.output_dir is None:
            self.output_dir = getattr(task, "checkpoint_folder", None)
        self.check_model(task.base_model)
        if self.memory.num_valid() == 0 and self.init_memory_pass and "train" in task.dataloaders:
            self.init_memory(task)
            self.memory_epoch = -1
            self._snapshot = self.memory.gather_snapshot(dst=0)

    @torch.no_grad()
    def init_memory(self, task) -> None:
        """One forward pass (no gradient) over the training data to fill the bank; with
        ``init_bank_forward: per_crop`` (default, the reference implementation) one model
        call per crop of ``crops_for_mb`` (BatchNorm statistics of that crop alone), with
        ``joint`` one call on all of them (statistics over all crops, as in training)."""
        model = task.base_model
        device = task.device
        n_batches = 0
        logging.info(f"{self.name}: rank {self.rank}: filling the memory bank with a forward pass")
        self.memory.reset_pointer()
        for batch in train_batches(task):  # as the train step sees them (DATA.TRAIN.DEVICE_AUGMENT)
            crops = batch_crops(batch)
            ids = batch["data_idx"][0].view(-1)
            nc = len(crops)
            if max(self.crops_for_mb) >= nc:
                self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {nc} crops of a sample")
            B = ids.shape[0] // nc
            inp = [crops[c].to(device, non_blocking=True) for c in self.crops_for_mb]
            emb = bank_embeddings(model, inp, per_crop=self.init_bank_forward == "per_crop")
            self.memory.add(ids[:B], emb)
            n_batches += 1
        self.memory.reset_pointer()
        logging.info(f"{self.name}: rank {self.rank}: memory bank filled ({n_batches} batches)")

    def start_epoch(self, task, epoch: int) -> None:
        """``on_phase_start`` of a training phase: pseudo-labels for ``epoch`` (collective)."""
        self.memory.reset_pointer()
        self.iteration = int(getattr(task, "iteration", self.iteration))
        model = task.base_model
        if self.assign_epoch == epoch:
            logging.info(f"{self.name}: epoch {epoch}: pseudo-labels restored from the checkpoint")
            self.restore_head(model)
            return
        n = self.memory.num_valid()
        if n == 0:
            logging.info(f"{self.name}: epoch {epoch}: memory bank empty, no pseudo-labels for this epoch")
            self.assignments.fill_(IGNORE_INDEX)
            self.assign_epoch = epoch
            self.memory_source_epoch = None
            return
        info = self.compute_assignments(model, epoch)
        self.assign_epoch = epoch
        self.memory_source_epoch = self.memory_epoch
        assigned = (self.assignments != IGNORE_INDEX).sum(dim=1).tolist()
        self.last_assignment_info = dict(info, assigned=assigned, bank_rows=n)
        source = "the initial forward pass" if self.memory_epoch == -1 else f"epoch {self.memory_epoch}"
        logging.info(
            f"{self.name}: rank {self.rank}: epoch {epoch}: pseudo-labels from the memory bank "
            f"filled in {source} ({n} rows over {self.world_size} processes); samples labelled "
            f"per clustering: {assigned}; {info}"
        )

    def end_epoch(self, task, epoch: int) -> None:
        """``on_phase_end`` of a training phase (collective): the bank of all processes is
        gathered on the primary process for the checkpoint written next."""
        self.memory_epoch = epoch
        self._snapshot = self.memory.gather_snapshot(dst=0)

    def bank_rows(self, h: int, epoch: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(ids [n], features [n, D])``: this process' bank rows clustered for clustering
        ``h``, checked by the non-finite guard (a diverged previous epoch)."""
        ids, x = self.memory.local_rows(self.bank_of_head(h))
        self.guard_finite(h, {"bank_rows": x, "ids": ids}, f"non-finite memory bank rows for the clustering of epoch {epoch}")
        return ids, x

    def set_pseudo_labels(self, h: int, ids: torch.Tensor, labels: torch.Tensor) -> None:
        """``assignments[h]`` = the dataset-wide table of the labels of every process' rows
        (collective); samples no process holds get :data:`IGNORE_INDEX`."""
        self.assignments[h].copy_(gather_table(ids, labels, self.num_train_samples))

    def compute_assignments(self, model, epoch: int) -> Dict[str, Any]:
        """The method's assignment step (collective): fill ``assignments`` from the bank
        (:meth:`bank_rows`, :meth:`set_pseudo_labels`); returns a dict for the log."""
        raise NotImplementedError

    def after_backward(self, task) -> None:
        """``on_backward`` (before the optimizer step): nothing by default."""

    def after_update(self, task) -> None:
        """``on_update`` (after every optimizer step): nothing by default."""

    def restore_head(self, model) -> None:
        """Put the method's state into the model after a resume (nothing by default)."""

    # ------------------------------------------------------------------ checkpoint state
    def _state_buffer_names(self) -> List[str]:
        names = (f"{prefix}{h}" for prefix in self.STATE_BUFFERS for h in range(self.num_heads))
        return [n for n in names if hasattr(self, n)]

    def extra_state(self) -> Dict[str, torch.Tensor]:
        """The method's per-clustering buffers ``<prefix><h>`` (``STATE_BUFFERS``) that exist."""
        return {n: getattr(self, n) for n in self._state_buffer_names()}

    def load_extra_state(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore :meth:`extra_state` from a loss ``state_dict`` (entries it lacks are kept)."""
        for n in self._state_buffer_names():
            if n in state:
                buf = getattr(self, n)
                buf.copy_(state[n].to(buf.device))

    def state_dict(self, *args, **kwargs):
        """Everything needed to resume: the memory bank of all processes (gathered on the
        primary process at the last epoch end), the pseudo-label table and its epoch."""
        sd = OrderedDict()
        sd["format"] = torch.tensor(STATE_FORMAT)
        sd["num_train_samples"] = torch.tensor(self.num_train_samples)
        sd["embedding_dim"] = torch.tensor(self.embedding_dim)
        sd["num_clusters"] = torch.tensor(self.num_clusters)
        sd["assignments"] = self.assignments.detach().cpu().clone()
        sd["assign_epoch"] = torch.tensor(self.assign_epoch)
        sd["memory_epoch"] = torch.tensor(-2 if self.memory_epoch is None else self.memory_epoch)
        if self._snapshot is not None:
            ids, emb = self._snapshot
            sd["memory_ids"] = ids
            sd["memory_embeddings"] = emb
        for k, v in self.extra_state().items():
            sd[k] = v.detach().cpu().clone()
        return sd

    def load_state_dict(self, state_dict, strict: bool = True):
        """Restore :meth:`state_dict`; this process takes its share of the bank."""
        sd = state_dict
        if "format" not in sd or "assignments" not in sd:
            raise ValueError(f"{self.name}: checkpoint loss state is not from {self.name} (keys {list(sd)[:8]})")
        if int(sd["num_train_samples"]) != self.num_train_samples:
            self._bad(
                "num_train_samples",
                f"is {self.num_train_samples} but the checkpoint was trained on {int(sd['num_train_samples'])} samples",
            )
        if int(sd["embedding_dim"]) != self.embedding_dim:
            self._bad("embedding_dim", f"is {self.embedding_dim}, checkpoint has {int(sd['embedding_dim'])}")
        if sd["num_clusters"].tolist() != self.num_clusters:
            self._bad("num_clusters", f"is {self.num_clusters}, checkpoint has {sd['num_clusters'].tolist()}")
        self.assignments.copy_(sd["assignments"].to(self.assignments.device))
        self.assign_epoch = int(sd["assign_epoch"])
        me = int(sd["memory_epoch"])
        self.memory_epoch = None if me == -2 else me
        if "memory_ids" in sd:
            ids, emb = sd["memory_ids"], sd["memory_embeddings"]
            kept = self.memory.load_snapshot(ids, emb)
            self._snapshot = (ids.clone(), emb.clone()) if self.rank == 0 else None
            logging.info(
                f"{self.name}: rank {self.rank}: memory bank restored ({kept} of {ids.shape[0]} rows, "
                f"filled in epoch {self.memory_epoch}); pseudo-labels of epoch {self.assign_epoch}"
            )
        self.load_extra_state(sd)
        return torch.nn.modules.module._IncompatibleKeys([], [])

    def __repr__(self):
        return (
            f"{type(self).__name__}(num_train_samples={self.num_train_samples}, num_clusters={self.num_clusters}, "
            f"embedding_dim={self.embedding_dim}, crops_for_mb={self.crops_for_mb}, temperature={self.temperature}, "
            f"world_size={self.world_size}, bank_capacity={self.memory.capacity})"
        )
