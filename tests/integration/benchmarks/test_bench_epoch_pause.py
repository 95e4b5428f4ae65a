"""``benchmarks/bench_epoch_pause.py`` at a tiny size (2 epochs, 1 worker, 8 images), so that it
stays runnable: it measures both loaders, the plugin's keeps its workers and VISSL's does not,
its ratio is the two pauses it is made of, and the JSON names the machine, the date and the
command.  Its figures check the code path, not the speed (no timing is asserted)."""
import json

import pytest

from testkit import REPO, run_script

SCRIPT = REPO / "benchmarks" / "bench_epoch_pause.py"


def _run(*args, timeout=3000):  # a bound for a hang, not a speed requirement
    return run_script([SCRIPT, *args], cwd=REPO, timeout=timeout)


def test_tiny_run_measures_both_loaders(tmp_path):
    out = tmp_path / "pause.json"
    proc = _run("--epochs", "2", "--workers", "1", "--images", "8", "--start-method", "fork", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "RATIO pause between epochs VISSL / plugin" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["machine"]["cpu"] and doc["machine"]["cores"] >= 1 and doc["date"]
    assert doc["command"].startswith("python ") and "--workers 1" in doc["command"]
    assert (doc["workers"], doc["epochs"], doc["start_method"], doc["device"]) == (1, 2, "fork", "cpu")
    for kind in ("vissl", "plugin"):
        r = doc["results"][kind]
        assert r["batches"] == 2 and len(r["first_batch_s"]) == len(r["epoch_s"]) == 2
        assert r["pause_s"] == r["first_batch_s"][1]
    assert doc["ratio_pause_vissl_over_plugin"] == pytest.approx(
        doc["results"]["vissl"]["pause_s"] / doc["results"]["plugin"]["pause_s"])


def test_refuses_a_single_epoch():
    proc = _run("--epochs", "1", timeout=600)
    assert proc.returncode == 2 and "--epochs must be at least 2" in proc.stdout
