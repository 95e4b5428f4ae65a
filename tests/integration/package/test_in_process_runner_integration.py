"""``testkit.train_in_process``: a VISSL run in the test process (world size 1), as VISSL's own
tests run one.  Two runs in a row: the second is unaffected by the first, and the test
process is left as it was.  Integration: the runs' loader worker is a process (started by
a forkserver, quick_cpu's start method)."""
import ctypes
import json
import logging
import multiprocessing
import os

import torch
import torch.distributed as dist

from testkit import SMALL_TRUNK, train_in_process


def _state():
    subreaper = ctypes.c_int()
    ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(subreaper), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    # torch's inductor notes its cache folder in the environment once per process (not the run's doing)
    environ = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    return dict(process_group=dist.is_initialized(), environ=environ, cwd=os.getcwd(),
                root=logging.getLogger() is logging.Logger.root, handlers=list(logging.Logger.root.handlers),
                start_method=multiprocessing.get_start_method(allow_none=True), threads=torch.get_num_threads(),
                subreaper=subreaper.value)


def test_two_runs_in_a_row_leave_the_test_process_as_it_was(tmp_path, caplog):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as under make test (conftest.share_the_cores): not the cores' count
    try:
        _two_runs(tmp_path, caplog)
    finally:
        torch.set_num_threads(threads)


def _two_runs(tmp_path, caplog):
    before = _state()
    losses = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        folder, log = train_in_process(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK,
                                        "config.DATA.NUM_DATALOADER_WORKERS=1", "config.OPTIMIZER.num_epochs=1",
                                        "config.CHECKPOINT.DIR=ckpt"], cwd=tmp_path / name)
        assert folder == tmp_path / name / "ckpt"
        assert "world_size: 1" in log or "WORLD_SIZE" in log, log[-2000:]
        losses.append([json.loads(line)["loss"] for line in (folder / "stdout.json").read_text().splitlines()])
        assert _state() == before
    assert len(losses[0]) == 16 // 4 and losses[1] == losses[0]
    logging.getLogger("vissl_swav_plugin.test").warning("after the runs")  # pytest's logging still sees records
    assert "after the runs" in caplog.text
