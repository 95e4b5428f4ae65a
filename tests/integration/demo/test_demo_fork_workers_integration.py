"""The demo on a GPU starts its loader workers with fork instead of VISSL's default forkserver
(a forkserver worker imports torch and VISSL afresh at every epoch: about 70 s per epoch on
the lent H100 machine, docs/gpu.md).  Fork-started workers must deliver the same batches: the
demo trained with fork workers has, iteration for iteration, the losses of the same run with
forkserver workers (VISSL seeds each worker from the loader, not from the start method).  Run
on the CPU with the GPU branch's loader settings (2 gloo processes, one worker each, 2 epochs,
so the workers are started twice)."""
import json

from multicrop_helpers import make_fake_fashion
from testkit import REPO, run_script

TINY = ["--quick", "--device", "cpu", "--procs", "2", "--train-per-class", "8", "--test-per-class", "4",
        "--epochs", "2", "--batch", "8", "--prototypes", "10", "--freeze", "1", "--random-inits", "1",
        "--probes", "off", "--precise-bn", "off", "--amp", "off", "--threads", "1",
        "--override", "config.DATA.NUM_DATALOADER_WORKERS=1"]


def _losses(tmp_path, source, method):
    out = tmp_path / method
    cmd = [REPO / "tools" / "demo.py", *TINY,
           "--override", f"config.MULTI_PROCESSING_METHOD={method}",
           "--source", str(source), "--out", str(out), "--data-dir", str(tmp_path / f"data_{method}")]
    proc = run_script(cmd, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    log = (out / "run" / "train_log.txt").read_text()
    assert f"Set start method of multiprocessing to {method}" in log
    report = json.loads((out / "swav_demo_report.json").read_text())
    return [(p["iter"], p["loss"]) for p in report["loss_curve"]]


def test_fork_started_workers_give_the_losses_of_forkserver_started_ones(tmp_path):
    source = tmp_path / "fm"
    make_fake_fashion(source, n_train=80, n_val=40)
    fork, forkserver = _losses(tmp_path, source, "fork"), _losses(tmp_path, source, "forkserver")
    assert len(fork) == 10 and [i for i, _ in fork] == list(range(10))  # 2 epochs x 40 images / (2 x 8)
    assert fork == forkserver
