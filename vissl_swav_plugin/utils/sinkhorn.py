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
paper's.

Range (measured, see ``tests/unit/utils/test_sinkhorn.py::test_codes_finite_for_every_epsilon``): this
fast path is exact only while ``exp`` of the scaled scores stays representable.  Before the
fallback below, unit-vector scores gave NaN codes for ``epsilon <= ~3e-9`` in fp32 and
``<= ~1e-20`` in fp64 (the rounding error of ``max(S) / eps``, up to ``|S| / eps * 2^-24``,
lands in the exponent and overflows), and columns whose mass underflowed (spread of
``S / eps`` beyond ~87 in fp32, ~708 in fp64) were clamped, i.e. silently wrong.  So the
fast path runs only while ``max|rowmax(S)| / eps * eps_mach <= 1`` and ``1 / eps`` fits in
the dtype, and checks (one K-vector minimum per iteration, one host sync per call) that no
prototype's marginal fell below ``n * tiny / eps_mach``; otherwise the same iterates are
recomputed in the log domain (:func:`_log_domain_iterates`), scaled by ``eps`` so that no
value exceeds the scores' own range: codes are finite, rows summing to 1, for *every*
``epsilon > 0`` and finite scores.

Distributed: the per-prototype marginal (a K-vector) is all-reduced in every iteration,
the global max and the global number of samples once; each process keeps its own rows.
The codes of W processes therefore equal the codes of one process on the concatenated
batch.
"""
import math
from typing import Optional

import torch
import torch.distributed as dist

from vissl_swav_plugin.utils.distributed import active as _dist_active, all_reduce_
from vissl_swav_plugin.utils.precision import autocast_disabled


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
    """The body of :func:`sinkhorn_knopp` (arguments checked, autocast off): the scaling
    form while it is exact, else :func:`_log_domain_iterates` (see the module docstring)."""
    B, K = scores.shape
    finfo = torch.finfo(dtype)
    tiny = finfo.tiny

    s = scores.detach()
    if torch.promote_types(s.dtype, dtype) != dtype:  # e.g. float64 scores, float32 compute
        s = s.to(dtype)
    inv_eps = 1.0 / float(epsilon)
    # row maxima of S / eps, taken on S (eps > 0): no B x K temporary for S / eps
    if B > 0:
        row_max = torch.amax(s, dim=1, keepdim=True).to(dtype).mul_(inv_eps)
    else:
        row_max = torch.zeros(0, 1, dtype=dtype, device=s.device)
    # global max, global max |row max| and global sample count, in two messages
    stats = torch.stack(
        [
            row_max.max() if B > 0 else row_max.new_tensor(float("-inf")),
            row_max.abs().max() if B > 0 else row_max.new_tensor(0.0),
            row_max.new_tensor(float(B)),
        ]
    )
    if use_dist:
        g_max = all_reduce_(stats[:2].clone(), dist.ReduceOp.MAX, True, group)
        g_cnt = all_reduce_(stats[2:].clone(), dist.ReduceOp.SUM, True, group)
        global_max, abs_max, n_total = g_max[0], g_max[1], g_cnt[0]
    else:
        global_max, abs_max, n_total = stats[0], stats[1], stats[2]
    if not inv_eps <= finfo.max or not float(abs_max) * finfo.eps <= 1.0:
        # 1 / eps or the rounding error of S / eps overflows: the scaling form cannot work
        return _finish(_log_domain_iterates(s, epsilon, num_iters, use_dist, group, n_total), hard, dtype)

    # P = exp(S / eps - row_max) in `dtype`: one fused pass (low-precision scores are
    # upcast inside it) writes P, one exponentiates it in place; each row's max entry is 1
    # (to an ulp: the shift is folded into the fused multiply-add)
    P = torch.add(row_max.neg(), s, alpha=inv_eps).exp_()
    v = torch.exp(row_max.squeeze(1) - global_max)  # initial column scaling, in (0, 1]
    r = 1.0 / K
    c = 1.0 / n_total
    u = None
    lowest = None  # smallest prototype marginal of any iteration (before clamping)
    for it in range(int(num_iters)):
        row_sums = torch.mv(P.t(), v)  # K: prototype marginals of this process
        if use_dist:
            all_reduce_(row_sums, dist.ReduceOp.SUM, True, group)
        low = row_sums.min() if K > 0 else row_sums.new_tensor(float("inf"))
        lowest = low if lowest is None else torch.minimum(lowest, low)
        u = r / row_sums.clamp_min_(tiny)
        if it + 1 < num_iters:
            v = c / torch.mv(P, u).clamp_min_(tiny)
    # a marginal this small lost mass to underflow (the clamp changed the iterates): redo
    # in the log domain.  row_sums are all-reduced, so every process takes the same branch.
    if not float(lowest) >= float(n_total) * tiny / finfo.eps:
        del P
        return _finish(_log_domain_iterates(s, epsilon, num_iters, use_dist, group, n_total), hard, dtype)
    codes = P.mul_(u.unsqueeze(0))
    codes /= codes.sum(dim=1, keepdim=True).clamp_min_(tiny)
    return _finish(codes, hard, dtype)


def _finish(codes, hard, dtype):
    """``codes`` in ``dtype``, or their row-wise argmax as one-hot rows with ``hard``."""
    codes = codes.to(dtype)
    if hard:
        idx = codes.argmax(dim=1, keepdim=True)
        codes = torch.zeros_like(codes).scatter_(1, idx, 1.0)
    return codes


def _smooth_max(x, dim, epsilon, use_dist=False, group=None):
    """``eps * log(sum(exp(x / eps)))`` along ``dim``, computed as ``max(x) + eps * log(sum(
    exp((x - max(x)) / eps)))`` so that nothing overflows for any ``eps > 0`` (the sum is
    >= 1); with ``use_dist`` the max and the sum run over the rows of all processes."""
    if x.shape[dim] > 0:
        top = torch.amax(x, dim=dim, keepdim=True)
    else:
        top = x.new_full([1 if d == dim else n for d, n in enumerate(x.shape)], float("-inf"))
    if use_dist:
        all_reduce_(top, dist.ReduceOp.MAX, True, group)
    total = torch.exp((x - top) / epsilon).sum(dim=dim, keepdim=True)
    if use_dist:
        all_reduce_(total, dist.ReduceOp.SUM, True, group)
    return (top + epsilon * torch.log(total)).squeeze(dim)


def _log_domain_iterates(s, epsilon, num_iters, use_dist, group, n_total):
    """The iterates of :func:`sinkhorn_knopp` in the log domain, in float64.

    With ``f = eps log u`` (K) and ``g = eps log v`` (B), one iteration is

        f_k = -eps log K - smax_b(S_bk + g_b) ;   g_b = -eps log n - smax_k(S_bk + f_k)

    with ``smax = eps * logsumexp(. / eps)`` (:func:`_smooth_max`), and the codes are
    ``softmax_k((S_bk + f_k) / eps)``: every intermediate is of the order of the scores,
    so the codes are finite, rows summing to 1, for every ``eps > 0`` (as ``eps -> 0`` they
    tend to the max-plus limit of the iterates).  Costs one ``exp`` pass over B x K per
    half-iteration, hence used only outside the scaling form's range.

    Returns:
        B x K float64 codes.
    """
    x = s.to(torch.float64)
    eps = float(epsilon)
    B, K = x.shape
    f_shift = -eps * math.log(K)
    g_shift = -eps * math.log(float(n_total))
    g = x.new_zeros(B)
    f = x.new_zeros(K)
    for it in range(int(num_iters)):
        f = f_shift - _smooth_max(x + g.unsqueeze(1), 0, eps, use_dist, group)
        if it + 1 < num_iters:
            g = g_shift - _smooth_max(x + f.unsqueeze(0), 1, eps)
    y = x + f.unsqueeze(0)
    top = torch.amax(y, dim=1, keepdim=True) if K > 0 else y[:, :0]
    codes = torch.exp((y - top) / eps)
    return codes / codes.sum(dim=1, keepdim=True)
