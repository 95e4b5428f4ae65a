"""``benchmarks/bench_epoch_pause.py`` at a tiny size (2 epochs, 1 worker, 8 images), so that it
stays runnable: it measures both loaders, the plugin's keeps its workers and VISSL's does not,
its ratio is the two pauses it is made of, and the JSON names the machine, the date and the
command.  Its figures check the code path, not the speed (no timing is asserted).

Its ``main`` runs in the test process (in ``vissl_run_state``, which ends the benchmark's
one-process group); the loader workers it measures are processes (forked), hence
``tests/integration``."""
import json
import logging
import os

import pytest

from testkit import REPO, load_script, vissl_run_state


@pytest.fixture
def bench():
    return load_script("benchmarks/bench_epoch_pause.py")


def test_tiny_run_measures_both_loaders(bench, tmp_path, capsys):
    out = tmp_path / "pause.json"
    before = logging.getLogger().level, os.environ.get("LOCAL_WORLD_SIZE")
    with vissl_run_state(REPO):
        bench.main(["--epochs", "2", "--workers", "1", "--images", "8", "--start-method", "fork", "--json", str(out)])
    assert (logging.getLogger().level, os.environ.get("LOCAL_WORLD_SIZE")) == before  # put back for later tests
    assert "RATIO pause between epochs VISSL / plugin" in capsys.readouterr().out
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


def test_refuses_a_single_epoch(bench, capsys):
    with pytest.raises(SystemExit) as exit_, vissl_run_state(REPO):
        bench.main(["--epochs", "1"])
    assert exit_.value.code == 2 and "--epochs must be at least 2" in capsys.readouterr().err
