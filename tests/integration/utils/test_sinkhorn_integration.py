"""Sinkhorn-Knopp: against the paper's pseudo-code, VISSL's implementation, the
equipartition constraint, 2 processes vs 1, and low-precision inputs: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/utils/test_sinkhorn.py``.
"""

import torch

from testkit import run_gloo_workers
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp
from sinkhorn_cases import EPSILONS, cosine_scores  # noqa: F401


def _worker(rank, parts):
    return sinkhorn_knopp(parts[rank], 0.05, 3, dtype=torch.float64)


def test_two_processes_equal_one_process_on_concatenated_batch():
    s = cosine_scores(40, 25, seed=5)
    parts = [s[:24].clone(), s[24:].clone()]  # unequal local batch sizes
    two = torch.cat(run_gloo_workers(_worker, (parts,)))
    one = sinkhorn_knopp(s, 0.05, 3, dtype=torch.float64)
    assert torch.allclose(two, one, atol=1e-12)
    # and it is not what each process would get on its own
    alone = torch.cat([sinkhorn_knopp(p, 0.05, 3, dtype=torch.float64) for p in parts])
    assert not torch.allclose(alone, one, atol=1e-6)


EPSILONS += [5e-324]  # the smallest positive double


def _tiny_eps_worker(rank, parts):
    return sinkhorn_knopp(parts[rank], 1e-30, 3, dtype=torch.float64)


def test_two_processes_equal_one_process_in_the_log_domain():
    s = cosine_scores(40, 25, seed=6, D=3)
    parts = [s[:24].clone(), s[24:].clone()]
    two = torch.cat(run_gloo_workers(_tiny_eps_worker, (parts,)))
    one = sinkhorn_knopp(s, 1e-30, 3, dtype=torch.float64)
    assert torch.isfinite(two).all() and torch.allclose(two, one, atol=1e-12)
