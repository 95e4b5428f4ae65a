"""DeepCluster-v2 (SwAV paper, appendix "Details on Clustering-Based methods") for VISSL.

Registered components
---------------------
* loss ``deepclusterv2_plugin_loss`` (:class:`DeepClusterV2PluginLoss`)
* head ``deepclusterv2_plugin_head``: the plugin's ``swav_plugin_head`` (projection MLP,
  L2-normalised embedding, one linear prototype layer per clustering) whose prototype
  weights are created with ``requires_grad=False``, so DDP and the optimizer never touch
  them.  At the start of every epoch the hook copies the k-means centroids into them
  (found by parameter name ``...prototypes<h>.weight``, whatever DDP prefix): the
  centroids *are* the frozen classification head, as in the paper.  A head without
  prototypes (e.g. ``mlp``) also works: the loss then scores against its own centroids.
* hook :class:`MemoryClusteringHook` (for this loss and ``selav2_plugin_loss``), attached
  through :func:`vissl_swav_plugin.hooks.register_loss_hooks`; config inference and
  checks through :func:`vissl_swav_plugin.config_validation.register_config_inference`.

Sample indices come from VISSL's ``data_idx`` of each batch (handed to the loss by the
hook's ``on_forward``), so labelled datasets work too; the multicrop collator orders
rows crop-major, which the loss checks on the first batch.

Pipeline (one epoch ``e``)
--------------------------
``on_phase_start``: spherical k-means (one per clustering ``h``, on memory bank
``h % len(crops_for_mb)``) of the features stored during epoch ``e-1`` (or during the
initial forward pass for ``e = 0``) -> centroids (frozen head) and the pseudo-label of
every dataset sample.  ``forward``: cross-entropy between ``softmax(z^T c / tau)`` and
the pseudo-labels over all crops, averaged over clusterings; the normalised embeddings
of ``crops_for_mb`` are written to the memory bank (no extra forward pass).
``on_phase_end``: the bank rows of all processes are gathered on the primary process so
the loss' ``state_dict`` (checkpointed by VISSL, which saves on the primary process only)
holds the full bank, the pseudo-label table and the centroids; a resumed run re-shards
the bank over its processes (any world size) and clusters it at the next epoch start.
A mid-epoch (iteration) checkpoint restores the running epoch's pseudo-labels as they
were; the bank it carries is the previous epoch's and is overwritten as the resumed
epoch proceeds, so the next clustering sees some one-epoch-older features, and samples
seen only before the interruption may stay unlabelled (ignored) for one epoch.

The shared machinery (memory bank, hooks, checkpoint state, config validation) lives in
:class:`MemoryBankClusteringLoss`; SeLa-v2 (``sela_v2.py``) only changes the
assignment step.
"""
import logging
import math
import re
from collections import OrderedDict
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from classy_vision.losses import ClassyLoss, register_loss
from vissl.models.heads import register_model_head

from vissl_swav_plugin import clustering as C
from vissl_swav_plugin.config_validation import (
    ConfigError,
    register_config_inference,
    require_int,
    require_int_list,
    require_positive_number,
    total_num_crops,
)
from vissl_swav_plugin.heads import SwAVPluginHead
from vissl_swav_plugin.hooks import NoOpHook, register_loss_hooks


STATE_FORMAT = 1
_PROTO_RE = re.compile(r"(?:^|\.)prototypes(\d+)\.weight$")


def _strip_ddp(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def find_prototype_params(model: torch.nn.Module) -> Dict[int, tuple]:
    """``{h: (name, parameter)}`` for every ``...prototypes<h>.weight`` parameter of the
    model (names compared without DDP's ``module.`` prefix)."""
    found: Dict[int, tuple] = {}
    for name, p in model.named_parameters():
        n = _strip_ddp(name)
        m = _PROTO_RE.search(n)
        if m is None:
            if re.search(r"(?:^|\.)prototypes\d+\.", n):
                raise ValueError(
                    f"parameter {n}: only plain linear prototype layers are supported "
                    "(weight-normalised prototypes are not)"
                )
            continue
        h = int(m.group(1))
        if h in found:
            raise ValueError(
                f"model has two prototype layers with index {h} ({found[h][0]} and {n}); "
                "use a single prototypes head"
            )
        found[h] = (n, p)
    return found


def _embedding_of(model_output) -> torch.Tensor:
    o = model_output
    while isinstance(o, (list, tuple)):
        if len(o) == 0:
            raise ValueError("model returned an empty output list")
        o = o[0]
    return o


class MemoryBankClusteringLoss(ClassyLoss):
    """Base of the offline clustering losses (memory bank + pseudo-label table).

    Config (``LOSS.<name>``)::

        num_train_samples: -1      # filled in by VISSL from the training dataset
        temperature: 0.1           # tau of the classification softmax
        num_clusters: [3000, 3000, 3000]   # one clustering / prototype set each
        embedding_dim: 128         # last entry of the head's dims
        crops_for_mb: [0, 1]       # crops whose features fill the memory bank(s)
        init_memory_pass: true     # forward pass over the data before epoch 0 (as the
                                   # reference code); false: epoch 0 only fills the bank
    """

    LOSS_NAME = "memory_bank_clustering"
    # subclasses: whether prototypes in the model must be frozen (DC-v2) / learned (SeLa-v2)
    PROTOTYPES_TRAINABLE: Optional[bool] = None
    REQUIRES_HEAD_PROTOTYPES = False

    def __init__(self, loss_config):
        super().__init__()
        self.loss_config = loss_config
        self.name = loss_config.get("name", self.LOSS_NAME)
        get = self._get
        self.num_train_samples = int(get("num_train_samples", -1))
        if self.num_train_samples <= 0:
            self._bad(
                "num_train_samples",
                f"must be > 0 (got {self.num_train_samples}); VISSL fills it in from the training "
                "dataset when the key is present in the loss config",
            )
        self.temperature = float(get("temperature", 0.1))
        if not self.temperature > 0:
            self._bad("temperature", f"must be > 0, got {self.temperature}")
        nc = get("num_clusters", [3000, 3000, 3000])
        if isinstance(nc, int):
            nc = [nc]
        self.num_clusters = [int(k) for k in nc]
        if len(self.num_clusters) == 0 or any(k <= 0 for k in self.num_clusters):
            self._bad("num_clusters", f"must be a non-empty list of positive integers, got {list(nc)}")
        if max(self.num_clusters) > self.num_train_samples:
            self._bad(
                "num_clusters",
                f"{max(self.num_clusters)} clusters for {self.num_train_samples} training samples",
            )
        self.embedding_dim = int(get("embedding_dim", 128))
        if self.embedding_dim <= 0:
            self._bad("embedding_dim", f"must be > 0, got {self.embedding_dim}")
        cfm = get("crops_for_mb", [0])
        if isinstance(cfm, int):
            cfm = [cfm]
        self.crops_for_mb = [int(c) for c in cfm]
        if len(self.crops_for_mb) == 0 or any(c < 0 for c in self.crops_for_mb):
            self._bad("crops_for_mb", f"must be a non-empty list of crop indices >= 0, got {list(cfm)}")
        if len(set(self.crops_for_mb)) != len(self.crops_for_mb):
            self._bad("crops_for_mb", f"has duplicates: {self.crops_for_mb}")
        self.init_memory_pass = bool(get("init_memory_pass", True))

        self.world_size, self.rank = C.world_size_and_rank()
        capacity = int(math.ceil(self.num_train_samples / self.world_size))
        self.memory = C.MemoryBank(len(self.crops_for_mb), capacity, self.embedding_dim)
        self.register_buffer(
            "assignments",
            torch.full((len(self.num_clusters), self.num_train_samples), C.IGNORE_INDEX, dtype=torch.long),
        )
        self.assign_epoch = -1  # epoch whose pseudo-labels are in `assignments`
        self.memory_epoch = None  # epoch whose features fill the bank (-1: initial pass)
        self.memory_source_epoch = None  # epoch of the features the current labels come from
        self._snapshot = None  # (ids, embeddings) of all processes, primary process only
        self._batch_ids: Optional[torch.Tensor] = None
        self._batch_num_crops: Optional[int] = None
        self._training = True
        self._checked_batch = False
        self.last_assignment_info: Dict[str, Any] = {}

    # ------------------------------------------------------------------ config helpers
    def _get(self, key, default):
        cfg = self.loss_config
        try:
            v = cfg[key] if key in cfg else default
        except TypeError:
            v = getattr(cfg, key, default)
        return default if v is None else v

    def _bad(self, key: str, msg: str):
        raise ConfigError(f"config.LOSS.{self.name}.{key} {msg}")

    @classmethod
    def from_config(cls, loss_config):
        return cls(loss_config)

    @property
    def num_heads(self) -> int:
        return len(self.num_clusters)

    def bank_of_head(self, h: int) -> int:
        return h % len(self.crops_for_mb)

    # ------------------------------------------------------------------ training step
    def set_batch(self, ids: Optional[torch.Tensor], num_crops: Optional[int], training: bool) -> None:
        """Called by the hook before every loss evaluation (``on_forward``)."""
        self._batch_ids = ids
        self._batch_num_crops = num_crops
        self._training = bool(training)

    def _split_output(self, output):
        """-> (embedding [R, D], list of H score tensors or None)."""
        if isinstance(output, torch.Tensor):
            return output, None
        if not isinstance(output, (list, tuple)) or len(output) == 0:
            raise ValueError(f"{self.name}: unexpected model output of type {type(output)}")
        if len(output) == 1 and isinstance(output[0], (list, tuple)):
            output = output[0]
        if len(output) == 1:
            return output[0], None
        if len(output) != self.num_heads + 1:
            raise ValueError(
                f"{self.name}: the head returned {len(output) - 1} prototype score tensors but "
                f"LOSS.{self.name}.num_clusters has {self.num_heads} entries"
            )
        return output[0], list(output[1:])

    def _infer_num_crops(self, ids: torch.Tensor) -> int:
        R = ids.shape[0]
        for nc in range(R, 0, -1):
            if R % nc == 0:
                v = ids.view(nc, -1)
                if bool((v == v[:1]).all()):
                    return nc
        return 1

    def forward(self, output, target: torch.Tensor):
        emb, scores = self._split_output(output)
        ids = self._batch_ids if self._batch_ids is not None else target
        self._batch_ids = None
        ids = ids.to(emb.device).long().view(-1)
        R = emb.shape[0]
        if ids.shape[0] != R:
            raise ValueError(
                f"{self.name}: {ids.shape[0]} sample indices for {R} model outputs (the loss needs the "
                "dataset index of every row: VISSL's data_idx, or DATA.TRAIN.LABEL_TYPE: sample_index)"
            )
        if emb.shape[1] != self.embedding_dim:
            self._bad("embedding_dim", f"is {self.embedding_dim} but the model's embedding has {emb.shape[1]} dims")
        num_crops = self._batch_num_crops or self._infer_num_crops(ids)
        if R % num_crops != 0:
            raise ValueError(f"{self.name}: {R} output rows are not a multiple of {num_crops} crops")
        B = R // num_crops
        if max(self.crops_for_mb) >= num_crops:
            self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {num_crops} crops of a sample")
        if not self._checked_batch:
            v = ids.view(num_crops, B)
            if not bool((v == v[:1]).all()):
                raise ValueError(
                    f"{self.name}: sample indices are not crop-major (crop 0 of all images, then crop 1, ...); "
                    "use COLLATE_FUNCTION multicrop_collator"
                )
            if int(ids.max()) >= self.num_train_samples or int(ids.min()) < 0:
                self._bad(
                    "num_train_samples",
                    f"is {self.num_train_samples} but the batch holds sample index {int(ids.max())}",
                )
            self._checked_batch = True

        emb_n = F.normalize(emb.detach().float(), dim=1)
        if self._training:
            self.memory.add(ids[:B], [emb_n[c * B : (c + 1) * B] for c in self.crops_for_mb])

        if scores is None:
            scores = self.scores_without_head_prototypes(emb)
        loss = 0.0
        for h in range(self.num_heads):
            loss = loss + self.head_loss(h, scores[h], ids)
        return loss / self.num_heads

    def scores_without_head_prototypes(self, emb: torch.Tensor) -> List[torch.Tensor]:
        raise ValueError(
            f"{self.name}: the model head must return [embedding, scores_0, ..., scores_H-1] "
            "(a swav_head-style head with one prototype layer per clustering)"
        )

    def head_loss(self, h: int, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        labels = self.assignments[h][ids]
        # mean over the rows that have a pseudo-label (none yet: loss 0, zero gradient);
        # no host sync
        n = (labels != C.IGNORE_INDEX).sum().clamp_min(1)
        return F.cross_entropy(logits, labels, ignore_index=C.IGNORE_INDEX, reduction="sum") / n

    # ------------------------------------------------------------------ hooks
    def setup(self, task) -> None:
        """``on_start``: validate against the task, fill the bank if empty."""
        if "train" in getattr(task, "datasets", {}):
            n = len(task.datasets["train"])
            if n != self.num_train_samples:
                self._bad(
                    "num_train_samples",
                    f"is {self.num_train_samples} but the training dataset has {n} samples "
                    "(memory bank / pseudo-label table size mismatch)",
                )
        total = total_num_crops(task.config)
        if total is not None and max(self.crops_for_mb) >= int(total):
            self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {total} crops of the train transforms")
        self.check_model(task.base_model)
        if self.memory.num_valid() == 0 and self.init_memory_pass and "train" in task.dataloaders:
            self.init_memory(task)
            self.memory_epoch = -1
            self._snapshot = self.memory.gather_snapshot(dst=0)

    def check_model(self, model) -> None:
        protos = find_prototype_params(model)
        if not protos:
            if self.REQUIRES_HEAD_PROTOTYPES:
                raise ValueError(
                    f"{self.name}: the model has no prototype layers (parameters named "
                    "'prototypes<i>.weight'); use MODEL.HEAD.PARAMS [[swav_plugin_head, {dims: [..., "
                    f"{self.embedding_dim}], num_clusters: {self.num_clusters}}}]]"
                )
            return
        if sorted(protos) != list(range(self.num_heads)):
            self._bad(
                "num_clusters",
                f"has {self.num_heads} entries but the model has prototype layers {sorted(protos)}",
            )
        for h, (name, p) in sorted(protos.items()):
            if tuple(p.shape) != (self.num_clusters[h], self.embedding_dim):
                self._bad(
                    "num_clusters",
                    f"={self.num_clusters} and embedding_dim={self.embedding_dim} expect {name} of shape "
                    f"{(self.num_clusters[h], self.embedding_dim)}, the model has {tuple(p.shape)}",
                )
            if self.PROTOTYPES_TRAINABLE is False and p.requires_grad:
                raise ValueError(
                    f"{self.name}: prototype parameter {name} is trainable, but DeepCluster-v2 uses the "
                    "k-means centroids as a frozen classification head; use MODEL.HEAD.PARAMS "
                    "[[deepclusterv2_plugin_head, {...}]] (prototypes created with requires_grad=False)"
                )
            if self.PROTOTYPES_TRAINABLE is True and not p.requires_grad:
                raise ValueError(f"{self.name}: prototype parameter {name} is frozen but SeLa-v2 learns them")

    @torch.no_grad()
    def init_memory(self, task) -> None:
        """One forward pass (no gradient) over the training data to fill the bank."""
        model = task.base_model
        device = task.device
        n_batches = 0
        logging.info(f"{self.name}: rank {self.rank}: filling the memory bank with a forward pass")
        self.memory.reset_pointer()
        for batch in task.dataloaders["train"]:
            data = batch["data"][0]
            crops = list(data) if isinstance(data, (list, tuple)) else [data]
            ids = batch["data_idx"][0].view(-1)
            nc = len(crops)
            if max(self.crops_for_mb) >= nc:
                self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {nc} crops of a sample")
            B = ids.shape[0] // nc
            inp = [crops[c].to(device, non_blocking=True) for c in self.crops_for_mb]
            emb = _embedding_of(model(inp if len(inp) > 1 else inp[0]))
            emb = F.normalize(emb.float(), dim=1)
            self.memory.add(ids[:B], [emb[j * B : (j + 1) * B] for j in range(len(inp))])
            n_batches += 1
        self.memory.reset_pointer()
        logging.info(f"{self.name}: rank {self.rank}: memory bank filled ({n_batches} batches)")

    def start_epoch(self, task, epoch: int) -> None:
        """``on_phase_start`` of a training phase: pseudo-labels for ``epoch``."""
        self.memory.reset_pointer()
        model = task.base_model
        if self.assign_epoch == epoch:
            logging.info(f"{self.name}: epoch {epoch}: pseudo-labels restored from the checkpoint")
            self.restore_head(model)
            return
        n = self.memory.num_valid()
        if n == 0:
            logging.info(f"{self.name}: epoch {epoch}: memory bank empty, no pseudo-labels for this epoch")
            self.assignments.fill_(C.IGNORE_INDEX)
            self.assign_epoch = epoch
            self.memory_source_epoch = None
            return
        info = self.compute_assignments(model, epoch)
        self.assign_epoch = epoch
        self.memory_source_epoch = self.memory_epoch
        assigned = (self.assignments != C.IGNORE_INDEX).sum(dim=1).tolist()
        self.last_assignment_info = dict(info, assigned=assigned, bank_rows=n)
        source = "the initial forward pass" if self.memory_epoch == -1 else f"epoch {self.memory_epoch}"
        logging.info(
            f"{self.name}: rank {self.rank}: epoch {epoch}: pseudo-labels from the memory bank "
            f"filled in {source} ({n} rows over {self.world_size} processes); samples labelled "
            f"per clustering: {assigned}; {info}"
        )

    def end_epoch(self, task, epoch: int) -> None:
        """``on_phase_end`` of a training phase (collective)."""
        self.memory_epoch = epoch
        self._snapshot = self.memory.gather_snapshot(dst=0)

    def after_update(self, task) -> None:
        pass

    def compute_assignments(self, model, epoch: int) -> Dict[str, Any]:
        raise NotImplementedError

    def restore_head(self, model) -> None:
        pass

    # ------------------------------------------------------------------ checkpoint state
    def extra_state(self) -> Dict[str, torch.Tensor]:
        return {}

    def load_extra_state(self, state: Dict[str, torch.Tensor]) -> None:
        pass

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


@register_loss("deepclusterv2_plugin_loss")
class DeepClusterV2PluginLoss(MemoryBankClusteringLoss):
    """DeepCluster-v2: spherical k-means pseudo-labels, centroids as frozen head.

    Extra config: ``kmeans_iters`` (10), ``kmeans_init`` (kmeans++ | random), ``seed`` (0;
    k-means init of epoch e, clustering h uses seed + 1000003 * e + h), ``kmeans_dtype``
    (float32 | float64).
    Works with ``deepclusterv2_plugin_head`` (centroids copied into its frozen prototype
    layers) or with a head that returns only the embedding (e.g. ``mlp``: the loss then
    scores the embedding against its own copy of the centroids).
    """

    LOSS_NAME = "deepclusterv2_plugin_loss"
    PROTOTYPES_TRAINABLE = False

    def __init__(self, loss_config):
        super().__init__(loss_config)
        self.kmeans_iters = int(self._get("kmeans_iters", 10))
        if self.kmeans_iters < 0:
            self._bad("kmeans_iters", f"must be >= 0, got {self.kmeans_iters}")
        self.seed = int(self._get("seed", 0))
        dt = str(self._get("kmeans_dtype", "float32"))
        if dt not in ("float32", "float64"):
            self._bad("kmeans_dtype", f"must be float32 or float64, got {dt}")
        self.kmeans_dtype = getattr(torch, dt)
        self.kmeans_init = str(self._get("kmeans_init", "kmeans++"))
        if self.kmeans_init not in ("kmeans++", "random"):
            self._bad("kmeans_init", f"must be kmeans++ or random, got {self.kmeans_init}")
        for h, k in enumerate(self.num_clusters):
            self.register_buffer(f"centroids{h}", torch.zeros(k, self.embedding_dim))

    def centroids(self, h: int) -> torch.Tensor:
        return getattr(self, f"centroids{h}")

    def scores_without_head_prototypes(self, emb):
        z = F.normalize(emb.float(), dim=1)
        return [z @ self.centroids(h).t() for h in range(self.num_heads)]

    def compute_assignments(self, model, epoch):
        info = {"objective": [], "reseeded": []}
        for h, K in enumerate(self.num_clusters):
            ids, x = self.memory.local_rows(self.bank_of_head(h))
            cent, assign, inf = C.spherical_kmeans(
                x,
                ids,
                K,
                self.kmeans_iters,
                id_space=self.num_train_samples,
                seed=self.seed + 1000003 * epoch + h,
                dtype=self.kmeans_dtype,
                init=self.kmeans_init,
            )
            cent = C.broadcast_(cent.float().contiguous(), 0)
            self.centroids(h).copy_(cent)
            self.assignments[h].copy_(C.gather_table(ids, assign, self.num_train_samples))
            info["objective"].append(round(inf["objective"], 4))
            info["reseeded"].append(inf["reseeded"])
        self.restore_head(model)
        return info

    @torch.no_grad()
    def restore_head(self, model):
        """Copy the centroids into the model's (frozen) prototype layers."""
        for h, (name, p) in find_prototype_params(model).items():
            p.data.copy_(self.centroids(h).to(p.device, p.dtype))

    def extra_state(self):
        return {f"centroids{h}": self.centroids(h) for h in range(self.num_heads)}

    def load_extra_state(self, sd):
        for h in range(self.num_heads):
            k = f"centroids{h}"
            if k in sd:
                self.centroids(h).copy_(sd[k].to(self.centroids(h).device))


class MemoryClusteringHook(NoOpHook):
    """Drives a :class:`MemoryBankClusteringLoss` through training (see module doc)."""

    @staticmethod
    def _loss(task) -> MemoryBankClusteringLoss:
        loss = task.base_loss
        if not isinstance(loss, MemoryBankClusteringLoss):
            raise TypeError(f"MemoryClusteringHook needs a memory-bank clustering loss, got {type(loss)}")
        return loss

    def on_start(self, task) -> None:
        self._loss(task).setup(task)

    def on_phase_start(self, task) -> None:
        if task.train:
            self._loss(task).start_epoch(task, task.train_phase_idx)

    def on_forward(self, task) -> None:
        sample = task.last_batch.sample
        ids = sample.get("data_idx")
        if isinstance(ids, (list, tuple)):
            ids = ids[0]
        inp = sample.get("input")
        num_crops = len(inp) if isinstance(inp, (list, tuple)) else 1
        self._loss(task).set_batch(ids, num_crops, task.train)

    def on_update(self, task) -> None:
        self._loss(task).after_update(task)

    def on_phase_end(self, task) -> None:
        if task.train:
            self._loss(task).end_epoch(task, task.train_phase_idx)


# ---------------------------------------------------------------------- config inference
PROTOTYPE_HEADS_FROZEN = ("deepclusterv2_plugin_head",)


def infer_clustering_loss_config(cfg, loss_name: str, deepcluster: bool):
    """Fill in / check ``LOSS.<loss_name>`` when a config is composed (every launcher).

    ``num_clusters`` and ``embedding_dim`` come from the prototype head (last entry of
    ``MODEL.HEAD.PARAMS``) when it has ``num_clusters``; DeepCluster-v2 also accepts a
    head without prototypes (e.g. ``mlp``), then they are read from the loss config.
    """
    prefix = f"LOSS.{loss_name}"
    lc = cfg.LOSS[loss_name]
    heads = cfg.MODEL.HEAD.PARAMS
    if not heads:
        raise ConfigError(f"config.MODEL.HEAD.PARAMS is empty; {prefix} needs a projection head")
    head_name, hp = heads[-1][0], heads[-1][1]
    if "num_clusters" in hp:
        if deepcluster and head_name not in PROTOTYPE_HEADS_FROZEN:
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: {prefix} uses the k-means centroids as a frozen "
                f"classification head, so its prototype head must be one of {list(PROTOTYPE_HEADS_FROZEN)} "
                f"(or a head without prototypes, e.g. mlp); got {head_name}"
            )
        require_int_list(list(hp["num_clusters"]), f"MODEL.HEAD.PARAMS.{head_name}.num_clusters", minimum=1)
        lc.num_clusters = [int(k) for k in hp["num_clusters"]]
        if "dims" not in hp:
            raise ConfigError(f"config.MODEL.HEAD.PARAMS: {head_name} needs 'dims'")
        lc.embedding_dim = int(hp["dims"][-1])
    elif not deepcluster:
        raise ConfigError(
            f"config.MODEL.HEAD.PARAMS: {prefix} learns prototypes, so the last head must have "
            f"them (swav_plugin_head / swav_head with num_clusters); got {head_name}"
        )
    elif "dims" in hp:  # the head's output is the embedding
        lc.embedding_dim = int(hp["dims"][-1])
    require_int_list(lc.get("num_clusters"), f"{prefix}.num_clusters", minimum=1)
    require_int(lc.get("embedding_dim"), f"{prefix}.embedding_dim", minimum=1)
    require_positive_number(lc.get("temperature"), f"{prefix}.temperature")
    cfm = lc.get("crops_for_mb")
    require_int_list(cfm, f"{prefix}.crops_for_mb")
    if len(set(cfm)) != len(cfm):
        raise ConfigError(f"config.{prefix}.crops_for_mb={list(cfm)} repeats a crop")
    crops = total_num_crops(cfg)  # None: unknown here, checked on the first batch
    bad = [c for c in cfm if crops is not None and c >= crops]
    if bad:
        raise ConfigError(
            f"config.{prefix}.crops_for_mb={list(cfm)} has crop indices {bad} outside [0, {crops}) "
            f"(the train transforms give {crops} crops per image)"
        )
    if crops is not None and cfg.DATA.TRAIN.COLLATE_FUNCTION not in ("multicrop_collator",):
        raise ConfigError(
            "config.DATA.TRAIN.COLLATE_FUNCTION must be multicrop_collator for a multi-crop "
            f"transform with {prefix}, got {cfg.DATA.TRAIN.COLLATE_FUNCTION!r}"
        )
    if "num_train_samples" not in lc:
        lc.num_train_samples = -1  # filled in by VISSL from the training dataset
    if deepcluster:
        require_int(lc.get("kmeans_iters", 10), f"{prefix}.kmeans_iters", minimum=0)
        require_int(lc.get("seed", 0), f"{prefix}.seed", minimum=0)
        if lc.get("kmeans_init", "kmeans++") not in ("kmeans++", "random"):
            raise ConfigError(f"config.{prefix}.kmeans_init must be kmeans++ or random, got {lc.get('kmeans_init')!r}")
        if lc.get("kmeans_dtype", "float32") not in ("float32", "float64"):
            raise ConfigError(f"config.{prefix}.kmeans_dtype must be float32 or float64, got {lc.get('kmeans_dtype')!r}")
    else:
        require_positive_number(lc.get("sinkhorn_epsilon", 0.01), f"{prefix}.sinkhorn_epsilon")
        require_int(lc.get("sinkhorn_iterations", 200), f"{prefix}.sinkhorn_iterations", minimum=1)
        if lc.get("sinkhorn_dtype", "float64") not in ("float32", "float64"):
            raise ConfigError(
                f"config.{prefix}.sinkhorn_dtype must be float32 or float64, got {lc.get('sinkhorn_dtype')!r}"
            )
    return cfg


@register_config_inference("deepclusterv2_plugin_loss")
def infer_deepclusterv2_plugin_loss(cfg):
    return infer_clustering_loss_config(cfg, "deepclusterv2_plugin_loss", deepcluster=True)


@register_loss_hooks("deepclusterv2_plugin_loss")
def deepclusterv2_hooks(cfg):
    return [MemoryClusteringHook()]


@register_model_head("deepclusterv2_plugin_head")
class DeepClusterV2PluginHead(SwAVPluginHead):
    """``swav_plugin_head`` whose prototype layers are created frozen
    (``requires_grad=False``: DDP and the optimizer never see them); the DeepCluster-v2
    hook copies the k-means centroids into them at every epoch start.  Same arguments
    and output as ``swav_plugin_head``: ``[normalised embedding, scores_0, ...]``."""

    def __init__(self, model_config, dims, num_clusters, **kwargs):
        super().__init__(model_config, dims, num_clusters, **kwargs)
        for layer in self.prototype_layers():
            layer.weight.requires_grad_(False)
