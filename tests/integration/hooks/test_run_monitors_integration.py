"""Run-wide monitors (issue 13, items 5-7) on a quick VISSL run in the test process (world size 1,
``testkit.train_in_process``; a VISSL run starts ``lscpu``): the progress line
(vissl_swav_plugin.hooks.progress), TensorBoard (VISSL's SSLTensorboardHook with our configs) and
the online kNN (vissl_swav_plugin.hooks.online_knn); the online kNN's features gathered over 2 gloo
processes, with rank 0's BatchNorm statistics.

The in-process tests are in ``tests/unit/hooks/test_run_monitors.py`` (there, a faked rank 1
checks that only rank 0 logs and writes).
"""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reference_swav import reference_knn
from testkit import SMALL_TRUNK, compose, make_image_folder, run_gloo_workers
from run_monitors_cases import EPOCHS, HAVE_TB, ITERS, PROGRESS, run  # noqa: F401

KNN_LINE = re.compile(rf"online kNN: epoch (\d+)/{EPOCHS} \| res5avg 5-NN top-1 (\S+)% \((\d+)/(\d+)\)")


# ------------------------------------------------------------------------------------------
# progress line
# ------------------------------------------------------------------------------------------
def test_progress_line_every_n_iterations_and_at_epoch_end(run):
    lines = [m for m in (PROGRESS.search(line) for line in run["log"].splitlines()) if m]
    # 2 epochs x 4 iterations (16 images, 4 per replica, world size 1), FREQUENCY 3:
    # iterations 3 and 6, and the ends of the epochs (4, 8), each once
    assert (EPOCHS, ITERS) == (2, 4)
    assert [int(m.group(3)) for m in lines] == [3, 4, 6, 8], run["log"][-3000:]
    assert [int(m.group(1)) for m in lines] == [1, 1, 2, 2]
    assert {(m.group(2), m.group(4)) for m in lines} == {("2", "8")}
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
    # every iteration of the run (<= 100 iterations: every 5th, and LOG_FREQUENCY 1)
    assert [s for s, _ in loss] == list(range(EPOCHS * ITERS))
    for (step, value), rec in zip(loss, run["vissl"]):
        assert step == rec["iter"] and value == pytest.approx(rec["loss"], abs=1e-4)
    assert [v for _, v in scalars["Training/Learning_rate"]] == pytest.approx([0.1] * (EPOCHS * ITERS))
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
    assert [int(m.group(1)) for m in lines] == list(range(1, EPOCHS + 1)), run["log"][-3000:]
    records = [json.loads(line) for line in (run["out"] / "online_knn.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(EPOCHS))
    ckpts = [run["out"] / "model_phase0.torch", run["out"] / "model_final_checkpoint_phase1.torch"]
    for m, rec, ckpt in zip(lines, records, ckpts):
        top1 = float(m.group(2))
        assert 0.0 <= top1 <= 100.0 and (int(m.group(3)), int(m.group(4))) == (rec["correct"], 8)
        assert top1 == pytest.approx(rec["top1"], abs=0.005)
        assert (rec["num_train"], rec["num_test"], rec["k"], rec["layer"]) == (16, 8, 5, "res5avg")
        # eval mode on both sides: exactly the offline kNN of the checkpoint saved after that epoch
        assert rec["top1"] == pytest.approx(_offline_top1(ckpt, run["bank"], run["query"], tmp_path), abs=1e-9)


# -- the online kNN over 2 gloo processes: features split and gathered, rank 0's statistics --
class _TinyTrunk(torch.nn.Module):
    """Conv, BatchNorm, ReLU, average pool, called as VISSL calls a trunk (``out_feat_keys``);
    the same weights in every process, BatchNorm statistics of the process's own (VISSL's
    BatchNorm layers are not synchronised)."""

    def __init__(self, stats_seed):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        g = torch.Generator().manual_seed(stats_seed)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(8, generator=g))
            self.bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)

    def forward(self, x, out_feat_keys=None):
        return [torch.relu(self.bn(self.conv(x))).mean((2, 3))]


def _knn_rank(rank, bank, query, folder):
    import vissl_swav_plugin.utils.knn as knn
    from vissl_swav_plugin.hooks.online_knn import DEFAULTS, OnlineKnnHook

    seen, predict = {}, knn.weighted_knn_predict

    def recorder(train_x, train_y, test_x, *args, **kwargs):  # the features the kNN gets
        seen.update(bank=train_x.clone(), query=test_x.clone())
        return predict(train_x, train_y, test_x, *args, **kwargs)

    knn.weighted_knn_predict = recorder
    hook = OnlineKnnHook({**DEFAULTS, "ENABLED": True, "TRAIN_PATH": bank, "TEST_PATH": query, "TOPK": 3,
                          "RESIZE": 32, "CROP_SIZE": 32, "BATCH_SIZE": 2}, num_epochs=1)
    trunk = _TinyTrunk(stats_seed=100 + rank)
    task = SimpleNamespace(train=True, train_phase_idx=0, iteration=3, checkpoint_folder=folder, hooks=[],
                           base_model=SimpleNamespace(trunk=trunk))
    hook.on_start(task)
    hook.on_phase_end(task)
    return dict(seen, training=trunk.training, mean=trunk.bn.running_mean.clone(), var=trunk.bn.running_var.clone())


def _features(trunk, folder):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    tf = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = ImageFolder(str(folder), transform=tf)
    with torch.no_grad():
        return trunk.eval()(torch.stack([ds[i][0] for i in range(len(ds))]))[0], ds.targets


def test_online_knn_over_two_processes_gathers_every_feature_with_rank_0_statistics(tmp_path):
    """9 bank and 3 query images, split 5/4 and 2/1 over the ranks: every rank's kNN gets all
    the features in folder order, computed in eval mode with rank 0's BatchNorm statistics;
    each rank's own statistics and train mode come back; rank 0 alone writes the record."""
    bank = make_image_folder(tmp_path / "bank", classes=3, per_class=3, seed=3)
    query = make_image_folder(tmp_path / "query", classes=3, per_class=1, seed=4)
    results = run_gloo_workers(_knn_rank, args=(str(bank), str(query), str(tmp_path)))
    (fb, yb), (fq, yq) = _features(_TinyTrunk(100), bank), _features(_TinyTrunk(100), query)
    assert not torch.allclose(_features(_TinyTrunk(101), bank)[0], fb, atol=1e-3)  # premise: the ranks differ
    for rank, r in enumerate(results):
        assert torch.allclose(r["bank"], fb, atol=1e-5) and torch.allclose(r["query"], fq, atol=1e-5), rank
        own = _TinyTrunk(100 + rank).bn
        assert r["training"] and torch.equal(r["mean"], own.running_mean) and torch.equal(r["var"], own.running_var)
    records = [json.loads(line) for line in (tmp_path / "online_knn.jsonl").read_text().splitlines()]
    assert len(records) == 1 and (records[0]["num_train"], records[0]["num_test"]) == (9, 3)
    assert records[0]["top1"] == pytest.approx(reference_knn(fb, yb, fq, yq, k=3, sigma=0.07, l2_norm=True)[0],
                                               abs=1e-9)
