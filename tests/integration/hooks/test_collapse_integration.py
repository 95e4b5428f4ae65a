"""The collapse detector (``vissl_swav_plugin/hooks/collapse.py``): the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/hooks/test_collapse.py``.
"""
import math

import pytest
import torch

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_gloo_workers, run_launcher
from collapse_cases import (D, FakeLoss, T, drive, fake_task, figures, healthy_scores, make_hook, uniform_scores,)  # noqa: F401  (fixtures and cases shared with the unit part)


def _allreduce_worker(rank):
    hook = make_hook()
    scores = uniform_scores(8, 10) if rank == 0 else healthy_scores(10)
    drive(hook, [(scores, math.log(10))], end_epoch=False)
    return hook.last


def test_figures_and_decision_are_all_reduced_over_processes():
    r0, r1 = run_gloo_workers(_allreduce_worker, world=2)
    joined = figures(torch.cat([uniform_scores(8, 10), healthy_scores(10)]))
    for r in (r0, r1):
        assert r["kind"] is None  # rank 0 alone would be "uniform": the decision is global
        for key in ("rows", "sample_entropy", "mean_entropy", "used"):
            assert r["heads"][0][key] == pytest.approx(joined[key], rel=1e-12)


# -- end to end: VISSL's stock launcher, 2 gloo processes --------------------------------------
SMALL = ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK,
         "config.OPTIMIZER.num_epochs=2"]  # 16 images / (4 x 2 processes): 2 iterations per epoch
FORCED = ["config.LOSS.swav_plugin_loss.epsilon=1000.0", "config.LOSS.swav_plugin_loss.temperature=100.0",
          "config.HOOKS.COLLAPSE_DETECTOR.PATIENCE_ITERS=3"]


def _run(tmp_path, extra, check):
    data = folder_data_overrides(make_image_folder(tmp_path / "images"))
    return run_launcher(SMALL + data + extra + [f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}"], cwd=tmp_path,
                        check=check)


def test_e2e_forced_collapse_warns_and_finishes(tmp_path):
    out = _run(tmp_path, FORCED + [f"{D}.ON_COLLAPSE=warn"], check=True).stdout
    assert out.count("COLLAPSE DETECTED") == 1  # rank 0 logs it, once for the episode
    assert ("COLLAPSE DETECTED (swav_plugin_loss): 3 consecutive iterations in the collapsed state "
            "\"uniform predictions, loss at ln K\"") in out
    assert "loss = 1.000 ln K" in out and "LOSS.swav_plugin_loss.epsilon [1000.0]" in out
    assert "Collapse detector, epoch 0 (swav_plugin_loss)" in out and "Collapse detector, epoch 1" in out
    assert (tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch").is_file()


def test_e2e_forced_collapse_stop_exits_non_zero(tmp_path):
    proc = _run(tmp_path, FORCED + [f"{D}.ON_COLLAPSE=stop"], check=False)
    tail = f"rc {proc.returncode}; end of the output:\n{proc.stdout[-6000:]}"  # every failure shows the run
    assert proc.returncode != 0, tail
    assert "CollapseError: COLLAPSE DETECTED (swav_plugin_loss): 3 consecutive iterations" in proc.stdout, tail
    assert "The run stops (HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE=stop)" in proc.stdout, tail
    assert not (tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch").exists(), tail


def test_e2e_healthy_run_stays_quiet(tmp_path):
    out = _run(tmp_path, [f"{D}.ON_COLLAPSE=stop", f"{D}.PATIENCE_ITERS=1"], check=True).stdout
    assert "COLLAPSE DETECTED" not in out and "CollapseError" not in out
    assert "Collapse detector, epoch 0 (swav_plugin_loss)" in out and "Collapse detector, epoch 1" in out
    assert "collapsed iterations 0/2" in out
