"""Process-group helpers shared by every module of the plugin.

All of them are no-ops (or return the single-process answer) when no ``torch.distributed``
process group is initialised, so the same code runs in one process, under VISSL's launcher
with several gloo/NCCL processes, and in unit tests.

``distributed`` arguments follow one convention everywhere: ``None`` means "when a process
group with more than one process is initialised", ``True`` / ``False`` force it.

Example::

    >>> from vissl_swav_plugin.utils import distributed as D
    >>> D.rank(), D.world_size()          # outside a process group
    (0, 1)
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist

__all__ = [
    "active",
    "rank",
    "world_size",
    "world_size_and_rank",
    "all_reduce_",
    "all_gather_rows",
    "broadcast_",
]


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def active(distributed: Optional[bool] = None) -> bool:
    """Whether collectives should run: ``distributed`` if given, else whether a process
    group with more than one process is initialised."""
    if distributed is None:
        return _initialised() and dist.get_world_size() > 1
    return bool(distributed)


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if _initialised() else 0


def world_size() -> int:
    """Number of processes in the default group (1 without a process group)."""
    return dist.get_world_size() if _initialised() else 1


def world_size_and_rank(distributed: Optional[bool] = None) -> Tuple[int, int]:
    """``(world_size, rank)`` when collectives are active (see :func:`active`), else ``(1, 0)``."""
    if active(distributed):
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def all_reduce_(t: torch.Tensor, op=None, distributed: Optional[bool] = None, group=None) -> torch.Tensor:
    """In-place all-reduce (default: sum) of ``t`` over ``group``; returns ``t``."""
    if active(distributed):
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return t


def all_gather_rows(x: torch.Tensor, distributed: Optional[bool] = None) -> torch.Tensor:
    """Concatenate along dim 0, in rank order, tensors whose first dimension may differ per
    process (padded to the largest, then trimmed).  Every process receives the result."""
    if not active(distributed):
        return x
    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s.item()) for s in sizes]
    padded = x.new_zeros((max(sizes),) + tuple(x.shape[1:]))
    padded[: x.shape[0]] = x
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded.contiguous())
    return torch.cat([o[:s] for o, s in zip(out, sizes)], dim=0)


def broadcast_(t: torch.Tensor, src: int = 0, distributed: Optional[bool] = None) -> torch.Tensor:
    """In-place broadcast of ``t`` from rank ``src``; returns ``t``."""
    if active(distributed):
        dist.broadcast(t, src)
    return t
