"""The assignment steps of DeepCluster-v2 and SeLa-v2 (SwAV paper, appendix "Details on
Clustering-Based methods"): how the features of the memory bank become pseudo-labels.
Pure ``torch`` + ``torch.distributed``; nothing here knows about VISSL.  The bank itself
and the dataset-wide pseudo-label tables are in :mod:`vissl_swav_plugin.utils.memory_bank`.

Contents
--------
* :func:`spherical_kmeans` -- DeepCluster-v2: k-means with cosine similarity on
  L2-normalised rows, distributed: the assignment (E) step is local, the per-centroid sums
  and counts are all-reduced, so W processes compute the k-means of the concatenation of
  their rows.  Initialisation (default, as the reference implementation): the rows of K
  random samples, picked by *dataset index* with a seeded generator so the result does
  not depend on how the rows are split over processes; option: k-means++.  Empty
  clusters keep their previous centroid (as the reference implementation); option:
  re-seed them by splitting the largest cluster (faiss' strategy).  Autocast is off
  inside (fp32 / fp64 whatever the caller's AMP).
* :func:`sela_assign` -- SeLa-v2: Sinkhorn-Knopp of bank scores against the current
  prototypes under equipartition over the *whole* bank, via
  :func:`vissl_swav_plugin.utils.sinkhorn.sinkhorn_knopp` (its marginals are all-reduced).

Why k-means in torch rather than faiss: faiss' ``Kmeans`` is single-process, so it would
need the whole bank on one process (or every process) plus a broadcast; in torch the
distributed version is one ``all_reduce`` of a K x (D+1) tensor per iteration, runs
on the GPU that already holds the bank, and needs no extra dependency.
"""
import math
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vissl_swav_plugin.utils.distributed import active, all_reduce_, broadcast_
from vissl_swav_plugin.utils.precision import autocast_disabled
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp

#: initialisations of :func:`spherical_kmeans` (the first is the default)
KMEANS_INITS = ("random", "kmeans++")


# --------------------------------------------------------------------------------------
# spherical k-means
# --------------------------------------------------------------------------------------
def _mean_rows_of_ids(x, ids, chosen, id_space, distributed):
    """Normalised mean of the rows (over all processes) carrying each id of ``chosen``."""
    m, D = chosen.numel(), x.shape[1]
    slot = torch.full((id_space,), -1, dtype=torch.long, device=x.device)
    slot[chosen] = torch.arange(m, device=x.device)
    row_slot = slot[ids] if ids.numel() else ids
    sel = row_slot >= 0
    acc = torch.zeros(m, D + 1, dtype=x.dtype, device=x.device)
    acc[:, :D].index_add_(0, row_slot[sel], x[sel])
    acc[:, D].index_add_(0, row_slot[sel], torch.ones(int(sel.sum()), dtype=x.dtype, device=x.device))
    all_reduce_(acc, distributed=distributed)
    return F.normalize(acc[:, :D], dim=1)


def _kmeans_plus_plus(s: torch.Tensor, K: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; ``2 + log K`` candidates per
    step, the one lowering the potential most is kept, as in scikit-learn) of unit rows
    ``s`` [m, D] with the squared chordal distance ``2 - 2 cos``; randomness from ``gen``."""
    m = s.shape[0]
    trials = 2 + int(math.log(K))
    us = torch.rand(K, trials, generator=gen, dtype=torch.float64).to(s.device)
    first = int(torch.randint(m, (1,), generator=gen))
    chosen = [first]
    best = (2 - 2 * (s @ s[first])).clamp_min_(0)
    for k in range(1, K):
        cs = torch.cumsum(best.double(), 0)
        total = cs[-1]
        if float(total) <= 0:  # every remaining row duplicates a chosen one
            i = int(torch.randint(m, (1,), generator=gen))
            chosen.append(i)
            continue
        cand = torch.searchsorted(cs, us[k] * total).clamp_(max=m - 1)  # [trials]
        d = (2 - 2 * (s[cand] @ s.t())).clamp_min_(0)  # [trials, m]
        pot = torch.minimum(d, best.unsqueeze(0)).double().sum(dim=1)
        j = int(torch.argmin(pot))
        i = int(cand[j])
        chosen.append(i)
        best = torch.minimum(best, d[j])
    return s[torch.tensor(chosen, device=s.device)].clone()


def _argmax_scores(x: torch.Tensor, centroids: torch.Tensor, chunk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    best = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    best_s = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        v, i = torch.mm(x[s : s + chunk], centroids.t()).max(dim=1)
        best[s : s + chunk] = i
        best_s[s : s + chunk] = v
    return best, best_s


def _initial_centroids(x, ids, K, id_space, present, gen, init, oversample, distributed):
    """K initial unit centroids from K (``random``) or ``oversample * K`` (``kmeans++``)
    distinct sample ids drawn with the seeded permutation ``gen``: the same on every
    process, whatever the split of the rows over the processes."""
    perm = torch.randperm(id_space, generator=gen).to(x.device)
    candidates = perm[present[perm] > 0]
    if candidates.numel() < K:
        raise ValueError(
            f"spherical_kmeans: num_clusters ({K}) is larger than the number of distinct samples in "
            f"the memory bank ({candidates.numel()}); reduce num_clusters"
        )
    if init == "random":
        return _mean_rows_of_ids(x, ids, candidates[:K], id_space, distributed)
    m = min(candidates.numel(), max(K, int(oversample) * K))
    sample = _mean_rows_of_ids(x, ids, candidates[:m], id_space, distributed)
    return _kmeans_plus_plus(sample, K, gen)


def _split_largest_(centroids, counts, k, gen):
    """Re-seed the empty cluster ``k`` by splitting the largest cluster ``j`` in two along
    a seeded random direction orthogonal to its centroid (faiss' strategy; in place)."""
    D = centroids.shape[1]
    j = int(torch.argmax(counts))
    r = torch.randn(D, generator=gen, dtype=torch.float64).to(device=centroids.device, dtype=centroids.dtype)
    c = centroids[j]
    r = r - (r @ c) * c
    r = F.normalize(r, dim=0) * (1.0 / 1024)
    centroids[k] = F.normalize(c + r, dim=0)
    centroids[j] = F.normalize(c - r, dim=0)
    counts[k] = counts[j] / 2
    counts[j] = counts[j] / 2


def _lloyd(x, centroids, num_iters, chunk_size, reseed_empty, gen, distributed):
    """``num_iters`` (E, M) iterations from ``centroids`` plus a final E step; the M step
    sums and counts are all-reduced.  Returns (centroids, assignments, best scores,
    number of re-seeded clusters)."""
    K, D = centroids.shape
    reseeded = 0
    for it in range(int(num_iters) + 1):
        assign, best = _argmax_scores(x, centroids, chunk_size)  # E step
        if it == int(num_iters):
            break
        acc = torch.zeros(K, D + 1, dtype=x.dtype, device=x.device)  # M step
        acc[:, :D].index_add_(0, assign, x)
        acc[:, D] = torch.bincount(assign, minlength=K).to(x.dtype)
        all_reduce_(acc, distributed=distributed)
        counts = acc[:, D].clone()
        nonempty = counts > 0
        # an empty cluster keeps its previous centroid (the reference implementation) ...
        centroids = torch.where(nonempty.unsqueeze(1), F.normalize(acc[:, :D], dim=1), centroids)
        if reseed_empty:  # ... or is re-seeded (deterministic, identical on every process)
            for k in torch.nonzero(~nonempty).flatten().tolist():
                _split_largest_(centroids, counts, k, gen)
                reseeded += 1
    return centroids, assign, best, reseeded


@torch.no_grad()
def spherical_kmeans(
    x: torch.Tensor,
    ids: torch.Tensor,
    num_clusters: int,
    num_iters: int = 10,
    *,
    id_space: Optional[int] = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    chunk_size: int = 8192,
    init: str = "random",
    kmeanspp_oversample: int = 32,
    init_centroids: Optional[torch.Tensor] = None,
    reseed_empty: bool = False,
    distributed: Optional[bool] = None,
):
    """Distributed spherical k-means (SwAV paper appendix, Eq. "kmeans"): E step
    ``a_i = argmax_k <x_i, c_k>``, M step ``c_k = normalize(sum_{a_i = k} x_i)``.

    Precision: runs with autocast switched off, in ``dtype``, whatever the dtype of ``x``
    and the caller's autocast state (CUDA's fp16 autocast would run the score matmuls in
    fp16 and change the assignments).

    Args:
        x: this process' rows [n, D] (normalised here).
        ids: their sample indices [n] in ``[0, id_space)``; only used to choose the
            initial centroids independently of how rows are split over processes.
        num_clusters: K (<= number of distinct ids over all processes).
        num_iters: number of (E, M) iterations; a final E step gives the assignments.
        id_space: upper bound of ``ids`` (default: global max + 1).
        seed: initialisation / re-seeding seed (same on every process).
        dtype: computation dtype (float32 or float64).
        init: ``"random"`` (default, the reference implementation's choice): the rows of
            K distinct samples, the first K present ids of ``torch.randperm(id_space)``
            seeded with ``seed`` (one process holding the bank in id order: the rows
            ``x[torch.randperm(n)[:K]]``); ``"kmeans++"``: greedy k-means++ seeding on the
            rows of ``kmeanspp_oversample * K`` samples drawn the same way.
        init_centroids: explicit [K, D] initial centroids (overrides ``init``).
        reseed_empty: ``False`` (default, the reference implementation): an empty
            cluster keeps its previous centroid; ``True``: it is re-seeded by splitting
            the largest cluster in two (faiss' strategy).

    Returns:
        (centroids [K, D] normalised, identical on all processes,
         assignments [n] (long) of this process' rows,
         info dict: ``objective`` (mean cosine to assigned centroid), ``reseeded`` (count)).

    Example::

        >>> c, a, info = spherical_kmeans(torch.randn(100, 8), torch.arange(100), 5, seed=1)
    """
    if x.dim() != 2 or ids.dim() != 1 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"spherical_kmeans: x must be [n, D] and ids [n]; got {tuple(x.shape)}, {tuple(ids.shape)}")
    K = int(num_clusters)
    if K < 1:
        raise ValueError(f"spherical_kmeans: num_clusters must be >= 1, got {num_clusters}")
    if int(num_iters) < 0:
        raise ValueError(f"spherical_kmeans: num_iters must be >= 0, got {num_iters}")
    if init not in KMEANS_INITS:
        raise ValueError(f"spherical_kmeans: init must be 'random' or 'kmeans++', got {init!r}")
    with autocast_disabled(x):
        return _spherical_kmeans(x, ids, K, num_iters, id_space, seed, dtype, chunk_size, init,
                                 kmeanspp_oversample, init_centroids, reseed_empty, distributed)


def _spherical_kmeans(x, ids, K, num_iters, id_space, seed, dtype, chunk_size, init, oversample,
                      init_centroids, reseed_empty, distributed):
    """The body of :func:`spherical_kmeans` (arguments checked, autocast off)."""
    device = x.device
    D = x.shape[1]
    x = F.normalize(x.to(dtype), dim=1)
    ids = ids.to(device=device, dtype=torch.long)
    use_dist = active(distributed)

    # ---- id space and global presence of ids
    if id_space is None:
        mx = torch.tensor([int(ids.max()) + 1 if ids.numel() else 0], device=device, dtype=torch.long)
        id_space = int(all_reduce_(mx, dist.ReduceOp.MAX if use_dist else None, distributed).item())
    present = torch.zeros(id_space, dtype=torch.int32, device=device)
    if ids.numel():
        if int(ids.min()) < 0 or int(ids.max()) >= id_space:
            raise ValueError(f"spherical_kmeans: ids must lie in [0, {id_space})")
        present[ids] = 1
    all_reduce_(present, dist.ReduceOp.MAX if use_dist else None, distributed)

    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    if init_centroids is not None:
        if tuple(init_centroids.shape) != (K, D):
            raise ValueError(f"spherical_kmeans: init_centroids must be {(K, D)}, got {tuple(init_centroids.shape)}")
        centroids = F.normalize(init_centroids.to(device=device, dtype=dtype), dim=1)
    else:
        centroids = _initial_centroids(x, ids, K, id_space, present, gen, init, oversample, distributed)
    centroids = broadcast_(centroids.contiguous(), 0, distributed)

    centroids, assign, best, reseeded = _lloyd(x, centroids, num_iters, chunk_size, reseed_empty, gen, distributed)
    # objective: mean cosine of rows to their centroid, over all processes
    stats = torch.stack([best.sum() if best.numel() else best.new_zeros(()), best.new_tensor(float(best.numel()))])
    all_reduce_(stats, distributed=distributed)
    objective = float(stats[0] / stats[1].clamp_min(1))
    return centroids, assign, {"objective": objective, "reseeded": reseeded}


# --------------------------------------------------------------------------------------
# SeLa-v2 assignment
# --------------------------------------------------------------------------------------
@torch.no_grad()
def sela_assign(
    x: torch.Tensor,
    prototypes: torch.Tensor,
    *,
    epsilon: float = 0.05,
    num_iters: int = 50,
    hard: bool = True,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    distributed: Optional[bool] = None,
) -> torch.Tensor:
    """Pseudo-labels of the bank rows ``x`` [n, D] (this process' share) against the
    prototypes [K, D] under the equipartition constraint over the rows of *all*
    processes (Sinkhorn-Knopp on scores ``x c^T``, entropic regularisation ``epsilon``).
    The scores and the iterations run with autocast switched off, in ``dtype``, whatever
    the dtype of ``x`` / ``prototypes`` and the caller's autocast state.

    Returns the labels [n] (long) if ``hard`` else the soft codes [n, K] (rows sum to 1).
    """
    if x.dim() != 2 or prototypes.dim() != 2 or x.shape[1] != prototypes.shape[1]:
        raise ValueError(
            f"sela_assign: x [n, D] and prototypes [K, D] expected, got {tuple(x.shape)} and {tuple(prototypes.shape)}"
        )
    with autocast_disabled(x, prototypes):
        x = x.to(dtype)
        c = prototypes.detach().to(device=x.device, dtype=dtype)
        if normalize:
            x = F.normalize(x, dim=1)
            c = F.normalize(c, dim=1)
        scores = torch.mm(x, c.t())
        codes = sinkhorn_knopp(scores, epsilon, num_iters, hard=False, dtype=dtype, distributed=distributed)
    if hard:
        return codes.argmax(dim=1)
    return codes


__all__: List[str] = ["sela_assign", "spherical_kmeans"]
