"""Offline clustering of DeepCluster-v2 / SeLa-v2 (vissl_swav_plugin.utils.clustering, .memory_store):
spherical k-means against planted clusters and a dense fp64 reference, SeLa assignment
against a dense Sinkhorn written from the paper's pseudo-code, the equipartition
constraint, the memory bank / dataset-wide tables, and 2 processes vs 1: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/utils/test_clustering.py``.
"""

import pytest
import torch
import torch.distributed as dist

from testkit import run_gloo_workers
from vissl_swav_plugin.utils.clustering import sela_assign, spherical_kmeans
from vissl_swav_plugin.utils.memory_bank import MemoryBank, gather_table
from clustering_cases import planted, random_bank  # noqa: F401


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
