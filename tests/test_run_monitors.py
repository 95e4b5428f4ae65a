"""Run-wide monitors (issue 13, items 5-7) on a real 2-process run through VISSL's stock
launcher: the progress line (vissl_swav_plugin.hooks.progress), TensorBoard (VISSL's
SSLTensorboardHook with our configs) and the online kNN (vissl_swav_plugin.hooks.online_knn).

One quick run (config test/swav_plugin/quick_cpu: 2 epochs x 2 iterations, 2 gloo
processes) serves the three; truths: VISSL's own loss log (stdout.json), the saved
checkpoints (features recomputed here, the kNN of tests/_reference.py) and the definitions.
"""
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from _reference import reference_knn
from conftest import compose, make_image_folder, run_launcher

HAVE_TB = importlib.util.find_spec("tensorboard") is not None
PROGRESS = re.compile(r"progress: epoch (\d+)/(\d+) \| iter (\d+)/(\d+) \| loss (\S+) \| lr (\S+) \| "
                      r"(\S+) it/s \| ETA (\S+)$")
KNN_LINE = re.compile(r"online kNN: epoch (\d+)/2 \| res5avg 5-NN top-1 (\S+)% \((\d+)/(\d+)\)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitors")
    bank = make_image_folder(root / "bank", classes=2, per_class=8, size=32, seed=1)
    query = make_image_folder(root / "query", classes=2, per_class=4, size=32, seed=2)
    out = root / "ckpt"
    proc = run_launcher(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={out}",
                         "config.HOOKS.PROGRESS.FREQUENCY=3",
                         f"config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD={HAVE_TB}",
                         "config.HOOKS.ONLINE_KNN.ENABLED=true", f"config.HOOKS.ONLINE_KNN.TRAIN_PATH={bank}",
                         f"config.HOOKS.ONLINE_KNN.TEST_PATH={query}", "config.HOOKS.ONLINE_KNN.TOPK=5"], cwd=root)
    vissl_losses = [json.loads(line) for line in (out / "stdout.json").read_text().splitlines() if line.strip()]
    return dict(out=out, log=proc.stdout, bank=bank, query=query, vissl=vissl_losses)


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


def test_progress_line_is_not_parsed_as_a_vissl_line_by_the_demo():
    from vissl_swav_plugin.demo.training import parse_log_line
    from vissl_swav_plugin.hooks.progress import progress_line

    line = "INFO 2026 progress.py: 1: " + progress_line(0, 12, 5, 468, 8.25, [0.3, 0.3], 2.0)
    assert PROGRESS.search(line) and parse_log_line(line) is None
    assert progress_line(1, 2, 3, 4, 1.0, [0.1, 5.0], 0.0).endswith("lr [0.1, 5] | 0.00 it/s | ETA ?")


def test_progress_config_defaults_validation_and_switch(tmp_path):
    from vissl_swav_plugin.config.validation import ConfigError
    from vissl_swav_plugin.hooks.progress import ProgressHook, progress_config, progress_hooks

    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_config(cfg) == {"ENABLED": True, "FREQUENCY": 1}
    assert [type(h) for h in progress_hooks(cfg)] == [ProgressHook]
    # a config without the block (VISSL's defaults lack it): the defaults
    bench = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_config(bench) == {"ENABLED": True, "FREQUENCY": 10}
    off = compose(["config=test/swav_plugin/quick_cpu", "config.HOOKS.PROGRESS.ENABLED=false",
                   f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_hooks(off) == []
    for override, key in [("config.HOOKS.PROGRESS.FREQUENCY=0", "HOOKS.PROGRESS.FREQUENCY"),
                          ("config.HOOKS.PROGRESS.ENABLED=3", "HOOKS.PROGRESS.ENABLED"),
                          ("+config.HOOKS.PROGRESS.FREQ=5", "HOOKS.PROGRESS.FREQ")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            compose(["config=test/swav_plugin/quick_cpu", override, f"config.CHECKPOINT.DIR={tmp_path}"])


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

    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
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


def test_online_knn_config_validation(tmp_path):
    from vissl_swav_plugin.config.validation import ConfigError
    from vissl_swav_plugin.hooks.online_knn import DEFAULTS, online_knn_config, online_knn_hooks

    base = ["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path}"]
    cfg = compose(base)
    assert online_knn_hooks(cfg) == [] and online_knn_config(cfg)["ENABLED"] is False
    bench = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert online_knn_config(bench) == DEFAULTS
    folder = make_image_folder(tmp_path / "f", classes=2, per_class=2)
    on = ["config.HOOKS.ONLINE_KNN.ENABLED=true", f"config.HOOKS.ONLINE_KNN.TRAIN_PATH={folder}",
          f"config.HOOKS.ONLINE_KNN.TEST_PATH={folder}"]
    assert len(online_knn_hooks(compose(base + on))) == 1
    for override, key in [("config.HOOKS.ONLINE_KNN.TOPK=0", "HOOKS.ONLINE_KNN.TOPK"),
                          ("config.HOOKS.ONLINE_KNN.TEMPERATURE=-1", "HOOKS.ONLINE_KNN.TEMPERATURE"),
                          ("config.HOOKS.ONLINE_KNN.STD=[1,0,1]", "HOOKS.ONLINE_KNN.STD"),
                          ("config.HOOKS.ONLINE_KNN.EVERY_N_EPOCHS=x", "HOOKS.ONLINE_KNN.EVERY_N_EPOCHS"),
                          ("+config.HOOKS.ONLINE_KNN.TOP_K=5", "HOOKS.ONLINE_KNN.TOP_K"),
                          (f"config.HOOKS.ONLINE_KNN.TEST_PATH={tmp_path}/missing", "HOOKS.ONLINE_KNN.TEST_PATH")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            compose(base + on + [override])
    with pytest.raises(ConfigError, match=r"HOOKS\.ONLINE_KNN\.TRAIN_PATH"):
        compose(base + ["config.HOOKS.ONLINE_KNN.ENABLED=true"])
