"""The training processes of a CPU run share the node's cores (compat ``shim_cpu_rank_threads``),
seen in real processes: a 2-process gloo run through ``swav-plugin-train``'s launcher, in a new
interpreter whose ranks are spawned as a user's are (each imports torch afresh, with a thread
per core by default).

Each rank's torch thread count is read in the rank itself, independently of the plugin: the
launcher script of the test registers an exit function at its top level, which every spawned
rank runs too (``spawn`` re-imports the parent's main script as ``__mp_main__``), and it writes
``torch.get_num_threads()`` to a file when the rank exits.  The expected count is computed here
from the cores the test process may use (``os.sched_getaffinity``) and the run's 2 processes.

The in-process parts (the count for any device, processes and cores; GPU runs left alone):
``tests/unit/compat/test_cpu_threads.py``.
"""
import json
import os

import pytest

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_launcher

PROCS = 2

LAUNCHER = '''\
import atexit
import json
import multiprocessing
import os
import sys

OUT = os.environ["THREADS_TEST_OUT"]


def _record():  # in every spawned rank (this file is their __mp_main__), when it exits
    if multiprocessing.current_process().name == "MainProcess":
        return
    import torch

    with open(os.path.join(OUT, f"rank_{os.getpid()}.json"), "w") as f:
        json.dump({"rank": os.environ.get("RANK"), "threads": torch.get_num_threads()}, f)


atexit.register(_record)

if __name__ == "__main__":
    from vissl_swav_plugin.tools.launch import main

    sys.exit(main(sys.argv[1:]))
'''


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _run(tmp_path, omp):
    """A 2-process CPU run (1 epoch of 16 images); returns ``(launcher output, [threads of each rank])``."""
    images = make_image_folder(tmp_path / "images")
    out = tmp_path / "threads"
    out.mkdir()
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    overrides = ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, *folder_data_overrides(images),
                 f"config.DISTRIBUTED.NUM_PROC_PER_NODE={PROCS}", "config.OPTIMIZER.num_epochs=1",
                 f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}"]
    proc = run_launcher(overrides, tmp_path, launcher=script,
                        env={"THREADS_TEST_OUT": str(out), "OMP_NUM_THREADS": omp, "MKL_NUM_THREADS": None})
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank_*.json"))]
    assert sorted(r["rank"] for r in ranks) == [str(r) for r in range(PROCS)], (ranks, proc.stdout[-3000:])
    return proc.stdout, [r["threads"] for r in ranks]


one_core = pytest.mark.skipif(_cores() < PROCS, reason="one core: a rank's default count (1) is already its share")


@one_core
def test_each_cpu_rank_gets_its_share_of_the_cores(tmp_path):
    """OMP_NUM_THREADS unset: each of the 2 ranks runs max(1, cores // 2) torch threads (torch's
    default, which VISSL leaves, is one per core: twice the share on any machine of 2 cores or
    more), and the launcher says so in one line."""
    stdout, threads = _run(tmp_path, omp=None)
    share = max(1, _cores() // PROCS)
    assert threads == [share] * PROCS, stdout[-3000:]
    said = [line for line in stdout.splitlines() if "torch thread" in line]
    assert len(said) == 1 and f"{PROCS} training process(es)" in said[0] and f": {share} torch thread(s) each" in said[0]


@one_core
def test_omp_num_threads_is_left_to_torch(tmp_path):
    """OMP_NUM_THREADS set: the ranks keep torch's reading of it (here one thread per core, unlike
    the cores' share, so an override would show; torch reads a larger value as the cores), and
    the launcher says nothing about threads."""
    wanted = _cores()
    stdout, threads = _run(tmp_path, omp=str(wanted))
    assert threads == [wanted] * PROCS, stdout[-3000:]
    assert "torch thread" not in stdout
