"""The collapse detector (``vissl_swav_plugin/hooks/collapse.py``): the all-reduce over 2 gloo
processes, and end-to-end VISSL runs in the test process (world size 1, ``testkit.train_in_process``;
a VISSL run starts ``lscpu``).

The in-process tests are in ``tests/unit/hooks/test_collapse.py``.
"""
import math

import pytest
import torch

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_gloo_workers, train_in_process
from vissl_swav_plugin.hooks.collapse import CollapseError
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


# -- end to end: a VISSL run in the test process (world size 1) ------------------------------
IMAGES, BATCH = 8, 4  # DATA_LIMIT of the 16 images, BATCHSIZE_PER_REPLICA of quick_cpu
ITERS = IMAGES // BATCH  # iterations per epoch at world size 1: the streak of 3 spans the 2 epochs
SMALL = ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, f"config.DATA.TRAIN.DATA_LIMIT={IMAGES}",
         f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={BATCH}", "config.OPTIMIZER.num_epochs=2"]
FORCED = ["config.LOSS.swav_plugin_loss.epsilon=1000.0", "config.LOSS.swav_plugin_loss.temperature=100.0",
          "config.HOOKS.COLLAPSE_DETECTOR.PATIENCE_ITERS=3"]


def _run(tmp_path, extra):
    """The run's log.txt (the hook logs on rank 0: tests/unit/hooks/test_collapse.py fakes rank 1)."""
    data = folder_data_overrides(make_image_folder(tmp_path / "images"))
    return train_in_process(SMALL + data + extra + [f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}"], cwd=tmp_path)[1]


def test_e2e_forced_collapse_warns_and_finishes(tmp_path):
    out = _run(tmp_path, FORCED + [f"{D}.ON_COLLAPSE=warn"])
    assert out.count("COLLAPSE DETECTED") == 1  # once for the episode
    assert ("COLLAPSE DETECTED (swav_plugin_loss): 3 consecutive iterations in the collapsed state "
            "\"uniform predictions, loss at ln K\"") in out
    assert "loss = 1.000 ln K" in out and "LOSS.swav_plugin_loss.epsilon [1000.0]" in out
    assert "Collapse detector, epoch 0 (swav_plugin_loss)" in out and "Collapse detector, epoch 1" in out
    assert (tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch").is_file()


def test_e2e_forced_collapse_stop_raises(tmp_path):
    with pytest.raises(CollapseError, match=r"COLLAPSE DETECTED \(swav_plugin_loss\): 3 consecutive iterations(.|\n)*"
                       r"The run stops \(HOOKS\.COLLAPSE_DETECTOR\.ON_COLLAPSE=stop\)"):
        _run(tmp_path, FORCED + [f"{D}.ON_COLLAPSE=stop"])
    assert "Collapse detector, epoch 0 (swav_plugin_loss)" in (tmp_path / "ckpt" / "log.txt").read_text()
    assert (tmp_path / "ckpt" / "model_phase0.torch").is_file()  # the run got past epoch 0 ...
    assert not (tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch").exists()  # ... not to the end


def test_e2e_healthy_run_stays_quiet(tmp_path):
    out = _run(tmp_path, [f"{D}.ON_COLLAPSE=stop", f"{D}.PATIENCE_ITERS=1"])
    assert "COLLAPSE DETECTED" not in out and "CollapseError" not in out
    assert "Collapse detector, epoch 0 (swav_plugin_loss)" in out and "Collapse detector, epoch 1" in out
    assert f"collapsed iterations 0/{ITERS}" in out
