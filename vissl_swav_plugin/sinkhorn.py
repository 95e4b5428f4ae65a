"""Sinkhorn-Knopp assignment under the equipartition constraint (SwAV paper, Sec. 3.1).

Given scores ``S`` (B x K: samples x prototypes) the paper computes

    Q   = exp(S / eps)^T ;  Q /= sum(Q)
    repeat n times:  Q *= (r / rowsum(Q))[:, None] ;  Q *= (c / colsum(Q))[None, :]
    codes = (Q / colsum(Q)).T                                    (r = 1/K, c = 1/B)

We compute exactly the same iterates in *scaling form*: ``Q = diag(u) P diag(v)`` with
``P`` fixed, so one iteration is two matrix-vector products over ``P`` (read only)
instead of four full read-modify-write passes, and the last column scaling is folded
into the final per-sample normalisation (which cancels it).

Numerics: ``P_b = exp((S_b - m_b) / eps)`` is shifted by each sample's own maximum,
so every row of ``P`` holds a 1 and no sample can underflow to an all-zero column,
whatever the dtype of the scores (fp16/bf16 scores are upcast before the division by
``eps``; a naive ``exp(S / eps)`` in fp16 overflows for S > 0.55 at eps = 0.05).  The
per-sample shift is undone exactly by the initial column scaling
``v0_b = exp((m_b - M) / eps)`` with ``M`` the global maximum, so the iterates equal the
paper's.  Denominators are clamped to the smallest normal number, so degenerate inputs
give finite codes instead of NaN.

Distributed: the per-prototype marginal (a K-vector) is all-reduced in every iteration,
the global max and the global number of samples once; each process keeps its own rows.
The codes of W processes therefore equal the codes of one process on the concatenated
batch.
"""
from typing import Optional

import torch
import torch.distributed as dist

from vissl_swav_plugin.distributed import active as _dist_active, all_reduce_
from vissl_swav_plugin.precision import autocast_disabled


@torch.no_grad()
def sinkhorn_knopp(
    scores: torch.Tensor,
    epsilon: float = 0.05,
    num_iters: int = 3,
    *,
    hard: bool = False,
    dtype: torch.dtype = torch.float32,
    distributed: Optional[bool] = None,
    group=None,
) -> torch.Tensor:
    """Soft codes for ``scores`` (B x K). Returns B x K (``dtype``), rows summing to 1.

    Args:
        scores: local scores, any floating dtype; the rows of all processes together
            form the batch that is equipartitioned over the K prototypes.
        epsilon: entropic regularisation (> 0).
        num_iters: Sinkhorn iterations (>= 1; the paper uses 3).
        hard: return one-hot codes (argmax of the soft codes) instead.
        dtype: computation dtype, float32 (default) or float64.
        distributed: all-reduce the marginals over ``group``; default: when a process
            group with more than one process is initialised.

    Precision: the whole computation runs with autocast switched off (CUDA's fp16
    autocast would otherwise run the ``torch.mv`` products in fp16, whose clamps
    underflow), in ``dtype``, whatever the dtype of ``scores`` and the caller's autocast
    state.

    Returns:
        Codes ``Q`` (B x K, ``dtype``): the paper's ``Q*`` transposed, each row a
        distribution over the K prototypes (one-hot rows with ``hard``).

    Example::

        >>> q = sinkhorn_knopp(torch.randn(256, 3000), epsilon=0.05, num_iters=3)
        >>> q.sum(1)  # ones
    """
    if scores.dim() != 2:
        raise ValueError(f"sinkhorn_knopp: scores must be 2-D (B x K), got {tuple(scores.shape)}")
    if not epsilon > 0:
        raise ValueError(f"sinkhorn_knopp: epsilon must be > 0, got {epsilon}")
    if int(num_iters) < 1:
        raise ValueError(f"sinkhorn_knopp: num_iters must be >= 1, got {num_iters}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"sinkhorn_knopp: dtype must be float32 or float64, got {dtype}")
    with autocast_disabled(scores):
        return _sinkhorn_iterates(scores, float(epsilon), int(num_iters), hard, dtype,
                                  _dist_active(distributed), group)


def _sinkhorn_iterates(scores, epsilon, num_iters, hard, dtype, use_dist, group):
    """The body of :func:`sinkhorn_knopp` (arguments checked, autocast off)."""
    B, K = scores.shape
    tiny = torch.finfo(dtype).tiny

    s = scores.detach()
    if torch.promote_types(s.dtype, dtype) != dtype:  # e.g. float64 scores, float32 compute
        s = s.to(dtype)
    inv_eps = 1.0 / float(epsilon)
    # row maxima of S / eps, taken on S (eps > 0): no B x K temporary for S / eps
    if B > 0:
        row_max = torch.amax(s, dim=1, keepdim=True).to(dtype).mul_(inv_eps)
    else:
        row_max = torch.zeros(0, 1, dtype=dtype, device=s.device)
    # global max and global sample count, reduced together in one message
    stats = torch.stack(
        [
            row_max.max() if B > 0 else row_max.new_tensor(float("-inf")),
            row_max.new_tensor(float(B)),
        ]
    )
    if use_dist:
        g_max = all_reduce_(stats[:1].clone(), dist.ReduceOp.MAX, True, group)
        g_cnt = all_reduce_(stats[1:].clone(), dist.ReduceOp.SUM, True, group)
        global_max, n_total = g_max[0], g_cnt[0]
    else:
        global_max, n_total = stats[0], stats[1]

    # P = exp(S / eps - row_max) in `dtype`: one fused pass (low-precision scores are
    # upcast inside it) writes P, one exponentiates it in place; each row's max entry is 1
    # (to an ulp: the shift is folded into the fused multiply-add)
    P = torch.add(row_max.neg(), s, alpha=inv_eps).exp_()
    v = torch.exp(row_max.squeeze(1) - global_max)  # initial column scaling, in (0, 1]
    r = 1.0 / K
    c = 1.0 / n_total
    u = None
    for it in range(int(num_iters)):
        row_sums = torch.mv(P.t(), v)  # K: prototype marginals of this process
        if use_dist:
            all_reduce_(row_sums, dist.ReduceOp.SUM, True, group)
        u = r / row_sums.clamp_min_(tiny)
        if it + 1 < num_iters:
            v = c / torch.mv(P, u).clamp_min_(tiny)
    codes = P.mul_(u.unsqueeze(0))
    codes /= codes.sum(dim=1, keepdim=True).clamp_min_(tiny)
    if hard:
        idx = codes.argmax(dim=1, keepdim=True)
        codes = torch.zeros_like(codes).scatter_(1, idx, 1.0)
    return codes
