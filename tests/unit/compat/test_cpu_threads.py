"""compat ``shim_cpu_rank_threads``: the torch threads each training process of a CPU run gets,
for any device, number of processes per node, cores and ``OMP_NUM_THREADS`` (the count itself,
seen in real spawned ranks: ``tests/integration/compat/test_cpu_threads_integration.py``)."""
import pytest

import vissl  # noqa: F401  (registers the plugin: every patch applied)
from vissl_swav_plugin import compat
from vissl_swav_plugin.compat.cpu_threads import NAME, available_cores, rank_threads, threads_line


def _cfg(device="cpu", per_node=2, nodes=1):
    return {"MACHINE": {"DEVICE": device}, "DISTRIBUTED": {"NUM_PROC_PER_NODE": per_node, "NUM_NODES": nodes}}


@pytest.mark.parametrize("per_node,cores,expected", [
    (2, 2, 1), (1, 2, 2), (3, 2, 1), (4, 16, 4), (3, 16, 5), (8, 4, 1), (1, 1, 1), (2, 3, 1),
])
def test_a_cpu_rank_gets_the_node_cores_divided_by_its_processes(per_node, cores, expected):
    # cores // processes per node, at least one: written out by hand above, not computed
    assert rank_threads(_cfg(per_node=per_node), environ={}, cores=cores) == expected


def test_the_nodes_do_not_divide_a_node_s_cores():
    assert rank_threads(_cfg(per_node=2, nodes=8), environ={}, cores=16) == 8


@pytest.mark.parametrize("value", ["1", "4", " 2 "])
def test_omp_num_threads_leaves_the_threads_to_torch(value):
    assert rank_threads(_cfg(), environ={"OMP_NUM_THREADS": value}, cores=16) is None


def test_an_empty_omp_num_threads_counts_as_unset():
    assert rank_threads(_cfg(), environ={"OMP_NUM_THREADS": ""}, cores=16) == 8


def test_a_gpu_run_is_left_as_it_is():
    assert rank_threads(_cfg(device="gpu"), environ={}, cores=16) is None


def test_the_cores_are_this_process_s_and_the_line_names_them():
    import os

    assert available_cores() == len(os.sched_getaffinity(0))
    line = threads_line(_cfg(per_node=2), 4, cores=8)
    assert line.startswith("CPU run: 2 training process(es) on this node's 8 core(s): 4 torch thread(s) each")
    assert "OMP_NUM_THREADS" in line


def test_the_patch_wraps_vissl_s_rank_entry_and_launcher_picklably():
    """Spawned ranks get ``dl._distributed_worker`` by reference (pickle): the replacement is
    reachable under VISSL's name, and VISSL's function is under it."""
    import pickle

    from vissl.utils import distributed_launcher as dl

    assert NAME in compat.applied()
    worker = dl._distributed_worker
    assert compat.patched_by(worker) == NAME
    assert pickle.loads(pickle.dumps(worker)) is worker
    with compat.disabled(NAME):
        assert dl._distributed_worker is not worker and compat.patched_by(dl._distributed_worker) != NAME
    assert dl._distributed_worker is worker


@pytest.mark.parametrize("before,procs", [(None, 2), ("", 2), (None, 1)])
def test_the_launcher_hands_the_count_to_the_processes_it_starts_and_restores_its_environment(
        monkeypatch, before, procs):
    """``launch_distributed`` starts its processes with ``OMP_NUM_THREADS`` set to the count (what
    torch, NumPy's BLAS and the loader workers read at their start), says so where it starts
    several, and leaves its own environment as it found it."""
    import os

    import torch.multiprocessing
    from vissl.utils import distributed_launcher as dl

    from testkit import compose

    if before is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", before)
    seen = []
    monkeypatch.setattr(dl, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: seen.append(os.environ.get("OMP_NUM_THREADS")))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: seen.append(os.environ.get("OMP_NUM_THREADS")))
    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.DISTRIBUTED.NUM_PROC_PER_NODE={procs}",
                   "config.CHECKPOINT.DIR=/nonexistent/i57"])
    monkeypatch.setattr("vissl_swav_plugin.compat.cpu_threads.available_cores", lambda: 4)  # 4 // 2 processes
    monkeypatch.setattr(dl, "get_checkpoint_folder", lambda cfg: "/nonexistent/i57")
    monkeypatch.setattr(dl, "is_training_finished", lambda *a, **k: False)
    monkeypatch.setattr(dl, "get_resume_checkpoint", lambda *a, **k: None)
    monkeypatch.setattr(dl, "_copy_to_local", lambda cfg: None)
    monkeypatch.setattr(dl, "_cleanup_local_dir", lambda cfg: None)
    said = []
    monkeypatch.setattr("vissl_swav_plugin.compat.cpu_threads._say", said.append)  # whatever the logging state
    dl.launch_distributed(cfg=cfg, node_id=0, engine_name="train", hook_generator=lambda cfg: [])
    assert seen == [str(4 // procs)]
    assert os.environ.get("OMP_NUM_THREADS") == before
    assert said == ([] if procs == 1 else
                    ["CPU run: 2 training process(es) on this node's 4 core(s): 2 torch thread(s) each "
                     "(OMP_NUM_THREADS is not set; set it to choose another number)"])
