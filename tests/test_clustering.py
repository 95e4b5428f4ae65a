"""Offline clustering of DeepCluster-v2 / SeLa-v2 (vissl_swav_plugin.utils.clustering, .memory_store):
spherical k-means against planted clusters and a dense fp64 reference, SeLa assignment
against a dense Sinkhorn written from the paper's pseudo-code, the equipartition
constraint, the memory bank / dataset-wide tables, and 2 processes vs 1."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.metrics import adjusted_rand_score

from _reference import paper_sinkhorn
from conftest import run_gloo_workers
from vissl_swav_plugin.utils.clustering import sela_assign, spherical_kmeans
from vissl_swav_plugin.utils.memory_bank import IGNORE_INDEX, MemoryBank, gather_table


def planted(K=10, D=32, n=100, noise=0.15, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    centers = F.normalize(torch.randn(K, D, generator=g, dtype=dtype), dim=1)
    labels = torch.arange(K).repeat_interleave(n)
    x = F.normalize(centers[labels] + noise * torch.randn(K * n, D, generator=g, dtype=dtype), dim=1)
    perm = torch.randperm(K * n, generator=g)
    return x[perm], labels[perm], centers


def dense_spherical_lloyd(x, init, iters):
    """Textbook spherical k-means (fp64, one process): assign to the most similar
    centroid, centroid = normalised mean of its rows (kept when empty)."""
    c = init.clone()
    for _ in range(iters):
        a = (x @ c.T).argmax(1)
        for k in range(c.shape[0]):
            m = a == k
            if m.any():
                c[k] = F.normalize(x[m].mean(0), dim=0)
    return c, (x @ c.T).argmax(1)


# ------------------------------------------------------------------------ k-means
def test_kmeans_plus_plus_recovers_planted_clusters():
    x, labels, centers = planted()
    ids = torch.arange(x.shape[0])
    runs = [spherical_kmeans(x, ids, 10, 10, seed=s, dtype=torch.float64, init="kmeans++") for s in range(5)]
    aris = [adjusted_rand_score(labels.numpy(), a.numpy()) for _, a, _ in runs]
    # k-means++ seeding is randomised: most seeds find the planted partition ...
    assert sum(ari > 0.99 for ari in aris) >= 4, aris
    # ... and the run with the best objective (what restarts would keep) always does
    best = max(range(5), key=lambda i: runs[i][2]["objective"])
    assert aris[best] == pytest.approx(1.0)
    cent = runs[best][0]
    # every planted centre has a centroid within a small angle
    assert (centers @ cent.T).max(dim=1).values.min() > 0.98


def test_kmeans_equals_dense_reference_from_same_init():
    x, _, _ = planted(K=6, D=8, n=40, noise=0.6, seed=1)  # overlapping clusters: Lloyd moves
    ids = torch.arange(x.shape[0])
    g = torch.Generator().manual_seed(3)
    init = x[torch.randperm(x.shape[0], generator=g)[:6]]
    c, a, info = spherical_kmeans(x, ids, 6, 7, init_centroids=init, dtype=torch.float64)
    c_ref, a_ref = dense_spherical_lloyd(x, F.normalize(init, dim=1), 7)
    assert info["reseeded"] == 0
    assert torch.equal(a, a_ref)
    assert torch.allclose(c, c_ref, atol=1e-12)
    assert not torch.equal(a, (x @ F.normalize(init, dim=1).T).argmax(1)), "premise: iterations change labels"


def test_kmeans_reseeds_empty_clusters_option():
    x, labels, _ = planted(K=4, D=16, n=50, noise=0.05, seed=2)
    ids = torch.arange(x.shape[0])
    # two identical initial centroids: one of them gets no row in the first E step
    init = torch.stack([x[0], x[0], x[labels == labels[0]][0] * -1, x[1]])
    c, a, info = spherical_kmeans(x, ids, 4, 15, init_centroids=init, dtype=torch.float64, reseed_empty=True)
    assert info["reseeded"] >= 1
    assert torch.bincount(a, minlength=4).min() > 0
    assert torch.isfinite(c).all() and torch.allclose(c.norm(dim=1), torch.ones(4, dtype=c.dtype))


def test_kmeans_bad_arguments():
    x = F.normalize(torch.randn(5, 3), dim=1)
    ids = torch.tensor([0, 1, 1, 2, 2])  # 3 distinct samples
    with pytest.raises(ValueError, match="num_clusters"):
        spherical_kmeans(x, ids, 4)
    with pytest.raises(ValueError, match="num_clusters"):
        spherical_kmeans(x, ids, 0)
    with pytest.raises(ValueError, match="init"):
        spherical_kmeans(x, ids, 2, init="nope")


# ------------------------------------------------------------------------ SeLa
def random_bank(N, K, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
    c = F.normalize(torch.randn(K, D, generator=g, dtype=torch.float64), dim=1)
    return z, c


def test_sela_assignment_equals_dense_paper_sinkhorn():
    z, c = random_bank(90, 7, seed=4)
    codes = sela_assign(z, c, epsilon=0.05, num_iters=25, hard=False, dtype=torch.float64)
    ref = paper_sinkhorn(z @ c.T, 0.05, 25)
    assert torch.allclose(codes, ref, atol=1e-12, rtol=0)
    labels = sela_assign(z, c, epsilon=0.05, num_iters=25, hard=True, dtype=torch.float64)
    assert torch.equal(labels, ref.argmax(1))


def test_sela_labels_equipartition_the_bank():
    N, K = 3000, 30
    z, c = random_bank(N, K, seed=5)
    z = F.normalize(z + 0.8 * c[0], dim=1)  # a bank leaning towards prototype 0
    # premise: plain argmax of the scores is far from balanced
    naive = torch.bincount((z @ c.T).argmax(1), minlength=K)
    assert naive.max() > 3 * N / K and naive.min() < 0.5 * N / K
    codes = sela_assign(z, c, epsilon=0.01, num_iters=200, hard=False, dtype=torch.float64)
    assert torch.allclose(codes.sum(1), torch.ones(N, dtype=codes.dtype), atol=1e-12)
    assert torch.allclose(codes.sum(0), torch.full((K,), N / K, dtype=codes.dtype), rtol=1e-4)
    counts = torch.bincount(codes.argmax(1), minlength=K)
    assert counts.sum() == N
    assert (counts - N / K).abs().max() <= 0.1 * N / K, counts


# ------------------------------------------------------------------------ bank / tables
def test_memory_bank_and_gather_table_single_process():
    bank = MemoryBank(num_banks=2, capacity=6, dim=3)
    ids = torch.tensor([4, 0, 2])
    e0, e1 = torch.randn(3, 3), torch.randn(3, 3)
    bank.add(ids, [e0, e1])
    assert bank.num_valid() == 3
    got_ids, got0 = bank.local_rows(0)
    assert torch.equal(got_ids, ids) and torch.equal(got0, e0)
    with pytest.raises(RuntimeError, match="overflow"):
        bank.add(torch.arange(4), [torch.zeros(4, 3)] * 2)
    snap_ids, snap_emb = bank.gather_snapshot()
    assert torch.equal(snap_ids, torch.tensor([0, 2, 4]))
    assert torch.equal(snap_emb[1], e1[[1, 2, 0]])
    table = gather_table(torch.tensor([3, 1, 3]), torch.tensor([7, 8, 9]), 5)
    assert table.tolist() == [IGNORE_INDEX, 8, IGNORE_INDEX, 9, IGNORE_INDEX]  # last row wins


# ------------------------------------------------------------------------ 2 processes
def _worker(rank, data):
    x, ids, split = data["x"], data["ids"], data["split"]
    mine = split == rank
    c, a, info = spherical_kmeans(x[mine], ids[mine], 10, 10, id_space=x.shape[0], seed=1, dtype=torch.float64)
    z, protos = data["z"], data["protos"]
    zm = data["zsplit"] == rank
    codes = sela_assign(z[zm], protos, epsilon=0.05, num_iters=30, hard=False, dtype=torch.float64)
    table = gather_table(ids[mine], a, x.shape[0])
    bank = MemoryBank(1, x.shape[0], x.shape[1], dtype=torch.float64)
    bank.add(ids[mine], [x[mine]])
    snap = bank.gather_snapshot(dst=0)
    # re-shard the rank-0 snapshot over the processes
    bank2 = MemoryBank(1, x.shape[0], x.shape[1], dtype=torch.float64)
    obj = [snap]
    dist.broadcast_object_list(obj, 0)
    kept = bank2.load_snapshot(*obj[0])
    return dict(c=c, a=a, info=info, codes=codes, table=table, snap=snap, kept=kept,
                shard=bank2.local_rows(0))


def test_two_processes_equal_one_process():
    x, labels, _ = planted(K=10, D=32, n=30, noise=0.3, seed=7)
    N = x.shape[0]
    ids = torch.arange(N)
    g = torch.Generator().manual_seed(0)
    split = (torch.rand(N, generator=g) < 0.35).long()  # unequal, interleaved split
    z, protos = random_bank(200, 9, seed=8)
    zsplit = (torch.rand(200, generator=g) < 0.5).long()
    data = dict(x=x, ids=ids, split=split, z=z, protos=protos, zsplit=zsplit)
    r0, r1 = run_gloo_workers(_worker, (data,))

    # k-means: same centroids on both ranks, equal to one process on all the rows
    c1, a1, info1 = spherical_kmeans(x, ids, 10, 10, id_space=N, seed=1, dtype=torch.float64)
    assert torch.equal(r0["c"], r1["c"])
    assert torch.allclose(r0["c"], c1, atol=1e-12)
    two = torch.empty(N, dtype=torch.long)
    two[split == 0], two[split == 1] = r0["a"], r1["a"]
    assert torch.equal(two, a1)
    assert r0["info"]["objective"] == pytest.approx(info1["objective"], abs=1e-12)
    # the dataset-wide table assembled from both ranks is the one-process assignment
    assert torch.equal(r0["table"], a1) and torch.equal(r1["table"], a1)

    # SeLa: Sinkhorn over the whole (split) bank equals one process on the whole bank
    one = sela_assign(z, protos, epsilon=0.05, num_iters=30, hard=False, dtype=torch.float64)
    two_codes = torch.empty_like(one)
    two_codes[zsplit == 0], two_codes[zsplit == 1] = r0["codes"], r1["codes"]
    assert torch.allclose(two_codes, one, atol=1e-12)
    alone = sela_assign(z[zsplit == 0], protos, epsilon=0.05, num_iters=30, hard=False, dtype=torch.float64)
    assert not torch.allclose(alone, one[zsplit == 0], atol=1e-4), "premise: marginals are global"

    # memory-bank snapshot: all rows on rank 0 sorted by index; re-sharding loses nothing
    assert r1["snap"] is None
    snap_ids, snap_emb = r0["snap"]
    assert torch.equal(snap_ids, ids) and torch.equal(snap_emb[0], x)
    assert r0["kept"] + r1["kept"] == N
    sh_ids = torch.cat([r0["shard"][0], r1["shard"][0]])
    sh_x = torch.cat([r0["shard"][1], r1["shard"][1]])
    order = torch.argsort(sh_ids)
    assert torch.equal(sh_ids[order], ids) and torch.equal(sh_x[order], x)
