"""Run-wide monitors (issue 13, items 5-7) on a real 2-process run through VISSL's stock
launcher: the progress line (vissl_swav_plugin.hooks.progress), TensorBoard (VISSL's
SSLTensorboardHook with our configs) and the online kNN (vissl_swav_plugin.hooks.online_knn): the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/hooks/test_run_monitors.py``.
"""
import json
import re
from pathlib import Path

import pytest
import torch

from reference_swav import reference_knn
from testkit import SMALL_TRUNK, compose
from run_monitors_cases import HAVE_TB, PROGRESS, run  # noqa: F401

KNN_LINE = re.compile(r"online kNN: epoch (\d+)/2 \| res5avg 5-NN top-1 (\S+)% \((\d+)/(\d+)\)")


# ------------------------------------------------------------------------------------------
# progress line
# ------------------------------------------------------------------------------------------
def test_progress_line_every_n_iterations_and_at_epoch_end_rank0_only(run):
    lines = [m for m in (PROGRESS.search(line) for line in run["log"].splitlines()) if m]
    # 2 epochs x 2 iterations, FREQUENCY 3: iteration 3, and the ends of the epochs (2, 4)
    assert [int(m.group(3)) for m in lines] == [2, 3, 4], run["log"][-3000:]
    assert [int(m.group(1)) for m in lines] == [1, 2, 2]
    assert {(m.group(2), m.group(4)) for m in lines} == {("2", "4")}
    # loss of the iteration logged by VISSL itself (its iter is 0-based), lr of the config
    loss = {int(r["iter"]) + 1: float(r["loss"]) for r in run["vissl"]}
    for m in lines:
        assert float(m.group(5)) == pytest.approx(loss[int(m.group(3))], abs=1e-4)
        assert m.group(6) == "0.1" and float(m.group(7)) > 0
    assert lines[-1].group(8) == "0:00:00"


# ------------------------------------------------------------------------------------------
# TensorBoard
# ------------------------------------------------------------------------------------------
def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for f in sorted(Path(folder).glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


@pytest.mark.skipif(not HAVE_TB, reason="tensorboard not installed (make venv installs it)")
def test_tensorboard_event_file_has_the_loss_of_every_iteration(run):
    scalars = _scalars(run["out"] / "tb_logs")
    loss = scalars["Training/Loss"]
    assert [s for s, _ in loss] == [0, 1, 2, 3]  # every iteration of the 4 (<= 100: every 5th and LOG_FREQUENCY 1)
    for (step, value), rec in zip(loss, run["vissl"]):
        assert step == rec["iter"] and value == pytest.approx(rec["loss"], abs=1e-4)
    assert [v for _, v in scalars["Training/Learning_rate"]] == pytest.approx([0.1] * 4)
    knn = [json.loads(line) for line in (run["out"] / "online_knn.jsonl").read_text().splitlines()]
    assert scalars["Online_kNN/top1_res5avg_5NN"] == [(r["epoch"], pytest.approx(r["top1"])) for r in knn]


# ------------------------------------------------------------------------------------------
# online kNN
# ------------------------------------------------------------------------------------------
def _offline_top1(ckpt, bank, query, tmp_path):
    """The 5-NN top-1 of a saved checkpoint's trunk, features computed here (eval mode)."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from vissl.models import build_model

    cfg = compose(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, f"config.CHECKPOINT.DIR={tmp_path}"])
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["classy_state_dict"]["base_model"]["model"]
    model.trunk.load_state_dict(state["trunk"], strict=True)
    model.eval()
    tf = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def feats(folder):
        ds = ImageFolder(str(folder), transform=tf)
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        with torch.no_grad():
            return model.trunk(x, out_feat_keys=["res5avg"])[0].flatten(1).numpy(), ds.targets

    (ftr, ytr), (fte, yte) = feats(bank), feats(query)
    return reference_knn(ftr, ytr, fte, yte, k=5, sigma=0.07, l2_norm=True)[0]


def test_online_knn_logs_each_epoch_equal_to_offline_knn_of_the_checkpoint(run, tmp_path):
    lines = [m for m in (KNN_LINE.search(line) for line in run["log"].splitlines()) if m]
    assert [int(m.group(1)) for m in lines] == [1, 2], run["log"][-3000:]
    records = [json.loads(line) for line in (run["out"] / "online_knn.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    ckpts = [run["out"] / "model_phase0.torch", run["out"] / "model_final_checkpoint_phase1.torch"]
    for m, rec, ckpt in zip(lines, records, ckpts):
        top1 = float(m.group(2))
        assert 0.0 <= top1 <= 100.0 and (int(m.group(3)), int(m.group(4))) == (rec["correct"], 8)
        assert top1 == pytest.approx(rec["top1"], abs=0.005)
        assert (rec["num_train"], rec["num_test"], rec["k"], rec["layer"]) == (16, 8, 5, "res5avg")
        # eval mode on both sides: exactly the offline kNN of the checkpoint saved after that epoch
        assert rec["top1"] == pytest.approx(_offline_top1(ckpt, run["bank"], run["query"], tmp_path), abs=1e-9)
