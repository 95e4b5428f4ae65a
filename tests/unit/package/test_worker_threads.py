"""``tests/conftest.py``'s ``share_the_cores``: under pytest-xdist, a worker's torch, BLAS and
OpenMP thread pools hold its share of the cores (cores // workers), so that the workers' OpenMP
threads do not spin for each other's cores; and no test before this one left the worker with
another number (a test that changes the threads puts them back)."""
import os

import pytest


def test_an_xdist_worker_runs_torch_and_blas_on_its_share_of_the_cores():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        pytest.skip("runs under pytest-xdist with 2 or more workers (make test)")
    import torch
    from threadpoolctl import threadpool_info

    share = max(1, (os.cpu_count() or 1) // workers)
    assert torch.get_num_threads() == share
    pools = threadpool_info()  # NumPy's and SciPy's BLAS, torch's and scikit-learn's OpenMP
    assert {p["user_api"] for p in pools} == {"blas", "openmp"}
    assert all(p["num_threads"] == share for p in pools), pools
