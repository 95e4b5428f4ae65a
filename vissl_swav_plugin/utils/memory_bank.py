"""Storage of the memory bank of DeepCluster-v2 and SeLa-v2 (SwAV paper, appendix
"Details on Clustering-Based methods"), and the dataset-wide tables built from it.
Pure ``torch`` + ``torch.distributed``; nothing here knows about VISSL.

The paper clusters "the features of the whole dataset from the previous epoch": every
process stores the normalised embeddings it computes during an epoch, one bank per crop
of ``crops_for_mb``, each row tagged with its dataset sample index.  The rows of all
processes together form the bank of the whole dataset; each process keeps only its own
rows (the samples its data sampler gave it), so memory per process is
``len(crops_for_mb) x ceil(N / world_size) x D``.

* :class:`MemoryBank` -- the per-process rows; :meth:`MemoryBank.gather_snapshot`
  collects all rows on one process (for checkpoints, which VISSL writes from the primary
  process only), :meth:`MemoryBank.load_snapshot` re-shards a snapshot over the current
  processes (any world size).
* :func:`bank_embeddings` -- the normalised embeddings of a batch's crops, for the
  initial forward pass that fills the bank (one model call per crop, or one joint call).
* :func:`gather_table` -- the dataset-wide table ``sample index -> value`` (pseudo-label,
  soft code) from the rows of all processes; :data:`IGNORE_INDEX` marks samples without
  a pseudo-label (ignored by the cross-entropy).

Example::

    >>> import torch
    >>> bank = MemoryBank(num_banks=1, capacity=4, dim=2)
    >>> bank.add(torch.tensor([3, 0]), [torch.eye(2)])
    >>> bank.local_rows(0)[0].tolist()
    [3, 0]
    >>> gather_table(torch.tensor([3, 0]), torch.tensor([1, 0]), 4).tolist()
    [0, -100, -100, 1]
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from vissl_swav_plugin.utils.distributed import all_gather_rows, all_reduce_, world_size_and_rank

__all__ = ["IGNORE_INDEX", "MemoryBank", "bank_embeddings", "gather_table"]

#: pseudo-label of a sample no process holds a feature of: ignored by the cross-entropy
IGNORE_INDEX = -100


def gather_table(
    ids: torch.Tensor,
    values: torch.Tensor,
    size: int,
    fill=IGNORE_INDEX,
    distributed: Optional[bool] = None,
) -> torch.Tensor:
    """Dataset-wide table ``T[size, *values.shape[1:]]`` with ``T[ids[i]] = values[i]``
    over the rows of all processes (collective); every process receives the full table.

    Args:
        ids: sample indices [n] of this process' rows, in ``[0, size)``.
        values: their values [n, ...] (pseudo-labels, soft codes).
        size: number of samples of the dataset.
        fill: value of the entries no process holds (default :data:`IGNORE_INDEX`).
        distributed: see :mod:`vissl_swav_plugin.utils.distributed`.

    Returns:
        The table; an index held by several rows takes the value of the last one in
        rank-then-row order (deterministic).
    """
    if ids.shape[0] != values.shape[0]:
        raise ValueError(f"gather_table: {ids.shape[0]} ids for {values.shape[0]} values")
    all_ids = all_gather_rows(ids.to(torch.long), distributed)
    all_vals = all_gather_rows(values, distributed)
    table = torch.full((size,) + tuple(values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    if all_ids.numel() == 0:
        return table
    if int(all_ids.min()) < 0 or int(all_ids.max()) >= size:
        raise ValueError(
            f"gather_table: sample index out of range [0, {size}): "
            f"min {int(all_ids.min())}, max {int(all_ids.max())}"
        )
    pos = torch.arange(all_ids.shape[0], device=all_ids.device)
    last = torch.full((size,), -1, dtype=torch.long, device=all_ids.device)
    last.scatter_reduce_(0, all_ids, pos, reduce="amax", include_self=True)
    have = last >= 0
    table[have] = all_vals[last[have]]
    return table


def _embedding_of(output) -> torch.Tensor:
    """The embedding of a model output: ``[[embedding, scores...]]`` -> ``embedding``."""
    while isinstance(output, (list, tuple)):
        if len(output) == 0:
            raise ValueError("model returned an empty output list")
        output = output[0]
    return output


def batch_crops(batch) -> list:
    """The crop tensors of a ``multicrop_collator`` batch: ``batch["data"][0]`` is one tensor
    per crop (a list) or a single tensor; a bare tensor / list is taken as that entry."""
    data = batch["data"][0] if isinstance(batch, dict) else batch
    return list(data) if isinstance(data, (list, tuple)) else [data]


def bank_embeddings(model, crops: Sequence[torch.Tensor], per_crop: bool = True):
    """L2-normalised fp32 embeddings ``[B, D]`` of each crop tensor of ``crops`` (``[B, ...]``
    each), as the first memory bank stores them.

    Args:
        model: returns the embedding, or a (nested) list whose first entry is it.
        crops: the batch's crops whose features fill the banks (``crops_for_mb``).
        per_crop: ``True``: one ``model(crop)`` call per crop, as the reference
            DeepCluster-v2 code fills its first bank (BatchNorm in train mode then uses
            the statistics of that crop alone); ``False``: one call on the list of all
            crops (a VISSL multi-crop forward: statistics over all of them).

    Returns:
        A list of ``len(crops)`` tensors ``[B, D]``.
    """
    if per_crop or len(crops) == 1:
        return [F.normalize(_embedding_of(model(c)).float(), dim=1) for c in crops]
    emb = F.normalize(_embedding_of(model(list(crops))).float(), dim=1)
    B = crops[0].shape[0]
    return [emb[j * B : (j + 1) * B] for j in range(len(crops))]


class MemoryBank(torch.nn.Module):
    """Embeddings of the previous epoch, ``num_banks`` x ``capacity`` x ``dim`` per process.

    Rows are written in arrival order (:meth:`add`); ``indices[i]`` is the dataset sample
    index of row ``i`` (-1: empty).  Rows are *not* cleared between epochs: an epoch
    overwrites the rows it reaches, a row it does not reach keeps the older feature.

    Args:
        num_banks: one bank per crop of ``crops_for_mb``; all share ``indices``.
        capacity: rows per bank on this process, ``ceil(num_train_samples / world_size)``.
        dim: embedding dimension.
        dtype: storage dtype (float32 by default).
    """

    def __init__(self, num_banks: int, capacity: int, dim: int, dtype=torch.float32):
        super().__init__()
        if num_banks < 1 or capacity < 1 or dim < 1:
            raise ValueError(
                f"MemoryBank: num_banks ({num_banks}), capacity ({capacity}) and dim ({dim}) must be >= 1"
            )
        self.register_buffer("embeddings", torch.zeros(num_banks, capacity, dim, dtype=dtype))
        self.register_buffer("indices", torch.full((capacity,), -1, dtype=torch.long))
        self.ptr = 0

    @property
    def num_banks(self) -> int:
        """Number of banks (``len(crops_for_mb)``: one per crop whose features are stored)."""
        return self.embeddings.shape[0]

    @property
    def capacity(self) -> int:
        """Rows per bank on this process (``ceil(num_train_samples / world_size)``)."""
        return self.embeddings.shape[1]

    @property
    def dim(self) -> int:
        """Embedding dimension ``D``."""
        return self.embeddings.shape[2]

    def reset_pointer(self) -> None:
        """Start writing at row 0 again (every epoch start: the epoch overwrites the bank)."""
        self.ptr = 0

    @torch.no_grad()
    def add(self, ids: torch.Tensor, embeddings: Sequence[torch.Tensor]) -> None:
        """Write ``len(ids)`` rows; ``embeddings[j]`` ([n, dim]) goes to bank ``j``."""
        n = int(ids.shape[0])
        if len(embeddings) != self.num_banks:
            raise ValueError(f"MemoryBank.add: {len(embeddings)} embeddings for {self.num_banks} banks")
        if self.ptr + n > self.capacity:
            raise RuntimeError(
                f"MemoryBank overflow: {self.ptr} + {n} rows > capacity {self.capacity} per process. "
                "The bank is sized ceil(num_train_samples / world_size); the data loader gave this "
                "process more samples in one epoch than that (num_train_samples does not match the "
                "training dataset, or the per-epoch pointer was not reset)."
            )
        s = slice(self.ptr, self.ptr + n)
        self.indices[s] = ids.to(self.indices.device, torch.long)
        for j, e in enumerate(embeddings):
            if e.shape != (n, self.dim):
                raise ValueError(f"MemoryBank.add: embedding {j} has shape {tuple(e.shape)}, expected {(n, self.dim)}")
            self.embeddings[j, s] = e.detach().to(self.embeddings.dtype)
        self.ptr += n

    def valid_mask(self) -> torch.Tensor:
        """``[capacity]`` bool: which rows hold a feature."""
        return self.indices >= 0

    def num_valid(self, distributed: Optional[bool] = None) -> int:
        """Number of filled rows over all processes."""
        n = self.valid_mask().sum().reshape(1)
        return int(all_reduce_(n, distributed=distributed).item())

    def local_rows(self, bank: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ids [n], embeddings [n, dim]) of this process' filled rows of ``bank``."""
        m = self.valid_mask()
        return self.indices[m], self.embeddings[bank][m]

    @torch.no_grad()
    def gather_snapshot(self, dst: int = 0, distributed: Optional[bool] = None):
        """All processes' filled rows, sorted by sample index (stable), on process ``dst``
        (CPU tensors ``ids [M]`` and ``embeddings [num_banks, M, dim]``); ``None`` elsewhere.
        Collective: every process must call it."""
        m = self.valid_mask()
        ids = self.indices[m]
        emb = self.embeddings[:, m].transpose(0, 1).contiguous()  # [n, banks, dim]
        all_ids = all_gather_rows(ids, distributed)
        all_emb = all_gather_rows(emb, distributed)
        _, rank = world_size_and_rank(distributed)
        if rank != dst:
            return None
        order = torch.sort(all_ids, stable=True).indices
        return all_ids[order].cpu(), all_emb[order].transpose(0, 1).contiguous().cpu()

    @torch.no_grad()
    def load_snapshot(self, ids: torch.Tensor, embeddings: torch.Tensor, distributed: Optional[bool] = None) -> int:
        """Take this process' share (rows ``rank::world``) of a snapshot; returns rows kept."""
        if embeddings.dim() != 3 or embeddings.shape[0] != self.num_banks or embeddings.shape[2] != self.dim:
            raise ValueError(
                f"memory bank snapshot has shape {tuple(embeddings.shape)}, expected "
                f"[{self.num_banks} (len(crops_for_mb)), M, {self.dim} (embedding_dim)]"
            )
        if ids.shape[0] != embeddings.shape[1]:
            raise ValueError(f"memory bank snapshot: {ids.shape[0]} indices for {embeddings.shape[1]} rows")
        world, rank = world_size_and_rank(distributed)
        mine = torch.arange(rank, ids.shape[0], world)
        if mine.numel() > self.capacity:
            raise ValueError(
                f"memory bank snapshot holds {ids.shape[0]} rows, more than {world} processes x "
                f"capacity {self.capacity} (num_train_samples smaller than in the checkpointed run?)"
            )
        n = mine.numel()
        self.indices.fill_(-1)
        self.embeddings.zero_()
        self.indices[:n] = ids[mine].to(self.indices.device)
        self.embeddings[:, :n] = embeddings[:, mine].to(self.embeddings.device, self.embeddings.dtype)
        self.ptr = 0
        return n
