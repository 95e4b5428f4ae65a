"""The evaluation suite (issue 3, item 5) on a checkpoint of ours, end to end on CPU, through
VISSL's own tools and our configs in configs/config/benchmark/swav_plugin/.  The runs are in the
test process at world size 1 (``testkit.train_in_process``; VISSL's ``train_svm_low_shot.py``,
``tools/knn_eval.py`` and ``tools/convert_to_detectron2.py`` by their ``main`` in
``testkit.vissl_run_state``), except the kNN run of 2 processes, whose subject includes rank 1's
features (VISSL's launcher through ``tools/knn_eval.py``) and the suite's fixture (shared with the
unit part, ``eval_suite_cases.suite``).

The in-process tests are in ``tests/unit/tools/test_eval_suite.py``.
"""
import contextlib
import importlib
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from reference_swav import reference_knn
from testkit import REPO, SITE, catalog_env, compose, load_script, run_script, train_in_process, vissl_run_state
from eval_suite_cases import (FMNIST, PER_CLASS, TRUNK, _trunk_of, suite,)  # noqa: F401  (fixtures and cases shared with the unit part)

HEAD10 = ["config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,10]}]]"]  # 8 x WIDTH -> 10 classes

needs_fmnist = pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").is_file() and not (FMNIST / "train-images-idx3-ubyte").is_file(),
    reason="Fashion-MNIST not installed (Debian package dataset-fashion-mnist; make venv installs it)",
)


def _strip(state):
    return {k.split("base_model.", 1)[-1]: v for k, v in state.items()}


def _features_in_process(trunk_state, folder, indices):
    """res5avg features of our trunk (loaded from the checkpoint here) for ImageFolder items."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from vissl.config import AttrDict
    from vissl_swav_plugin.models.trunks import ResNetSmallPlugin

    trunk = ResNetSmallPlugin(AttrDict({"TRUNK": {"NAME": "resnet_small_plugin",
                                                  "RESNET_SMALL_PLUGIN": {"DEPTH": 10, "WIDTH": 8}}}))
    trunk.load_state_dict(trunk_state, strict=True)
    trunk.eval()
    ds = ImageFolder(str(folder))
    # the test-split transforms of our kNN config, rebuilt with torchvision
    cfg = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", "config.CHECKPOINT.DIR=."])
    steps = {t["name"]: t for t in cfg.DATA.TEST.TRANSFORMS}
    assert list(steps) == ["Resize", "CenterCrop", "ToTensor", "Normalize"], list(steps)
    tf = T.Compose([T.Resize(steps["Resize"]["size"]), T.CenterCrop(steps["CenterCrop"]["size"]), T.ToTensor(),
                    T.Normalize(list(steps["Normalize"]["mean"]), list(steps["Normalize"]["std"]))])
    x = torch.stack([tf(ds[int(i)][0]) for i in indices])
    with torch.no_grad():
        return trunk(x, ["res5avg"])[0].flatten(1).numpy(), [ds[int(i)][1] for i in indices]


def _metrics(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _train(suite, overrides, cwd):
    """``testkit.train_in_process`` on the suite's datasets: ``(run folder, log.txt)``."""
    with catalog_env(suite["env"]):
        return train_in_process(overrides, cwd=cwd)


def _main(main, *args, cwd):
    """A tool's ``main(argv)`` in this process (``testkit.vissl_run_state``): ``(exit status,
    what it printed, stdout and stderr together)``."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(out), vissl_run_state(cwd):
        code = main([str(a) for a in args])
    return code, out.getvalue()


# ------------------------------------------------------------------------------------------
# linear classification on frozen features
# ------------------------------------------------------------------------------------------
@needs_fmnist
def test_linear_eval_trains_head_on_our_frozen_trunk(suite, tmp_path):
    out = tmp_path / "linear"
    _train(suite, ["config=benchmark/swav_plugin/linear_fashion_mnist_cpu", *TRUNK,
                   "config.MODEL.HEAD.PARAMS=[[eval_mlp,{in_channels:64,dims:[64,10]}]]",
                   f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={suite['ckpt']}", "config.OPTIMIZER.num_epochs=2",
                   # world size 1: 32 per replica keeps the global batch (and steps per epoch) of the
                   # config's 2 processes x 16
                   "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
                   f"config.CHECKPOINT.DIR={out}"], cwd=tmp_path)
    ck = torch.load(out / "model_final_checkpoint_phase1.torch", map_location="cpu", weights_only=False)
    model = ck["classy_state_dict"]["base_model"]["model"]
    post = _strip(model["trunk"])
    for k, v in suite["trunk"].items():  # the frozen trunk is our checkpoint's, every tensor
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(post[k], v), k
    head = model["heads"]
    assert head["0.clf.clf.0.weight"].shape == (10, 64)
    tests = [m["test_accuracy_list_meter"] for m in _metrics(out / "metrics.json") if "test_accuracy_list_meter" in m]
    assert len(tests) == 2  # one test pass per epoch over the 500 val images
    top1 = tests[-1]["top_1"]["res5avg"]
    assert 20.0 < top1 <= 100.0, f"linear top-1 {top1} not above chance (10%)"


# ------------------------------------------------------------------------------------------
# kNN
# ------------------------------------------------------------------------------------------
def _knn_top1(train_f, train_y, test_f, test_y, k, sigma=0.1):
    """Top-1 (%) of the weighted kNN (NPID) reference: cosine similarities, top-k vote
    weighted by exp(sim / sigma)."""
    return reference_knn(train_f, train_y, test_f, test_y, k, sigma, l2_norm=True)[0]


@needs_fmnist
def test_knn_20_and_200_2proc_from_our_checkpoint(suite, tmp_path):
    """A real launch of 2 processes: rank 1's features are part of what is checked."""
    from vissl.utils.misc import merge_features

    out = tmp_path / "knn"
    proc = run_script(
        [REPO / "tools" / "knn_eval.py", "--topk", "20,200",
         "config=benchmark/swav_plugin/knn_fashion_mnist_cpu", *TRUNK,
         f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={suite['ckpt']}", f"config.CHECKPOINT.DIR={out}"],
        cwd=tmp_path, env=suite["env"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    res = json.loads((out / "knn_results.json").read_text())
    assert res["num_train"] == res["num_test"] == 10 * PER_CLASS
    assert sorted(Path(out).glob("rank1_*test_res5avg_features.npy")), "rank 1 extracted no features"
    train, test = merge_features(str(out), "train", "res5avg"), merge_features(str(out), "test", "res5avg")
    # the features VISSL extracted are our trunk's: recompute some here from the checkpoint
    pick = test["inds"][:: len(test["inds"]) // 8][:8]
    mine, labels = _features_in_process(suite["trunk"], suite["data"] / "val", pick)
    row = {int(i): n for n, i in enumerate(test["inds"])}
    np.testing.assert_allclose(test["features"][[row[int(i)] for i in pick]], mine, rtol=1e-4, atol=1e-4)
    assert labels == test["targets"][[row[int(i)] for i in pick]].ravel().tolist()
    ty, sy = train["targets"].ravel(), test["targets"].ravel()
    for k in (20, 200):
        reported = res["res5avg"][str(k)]["top1"]
        assert reported == pytest.approx(_knn_top1(train["features"], ty, test["features"], sy, k), abs=0.21)
    assert res["res5avg"]["20"]["top1"] > 30.0, res  # chance is 10%
    assert "20-NN Top1" in proc.stdout and "200-NN Top1" in proc.stdout


def test_knn_tool_rejects_bad_arguments(tmp_path):
    code, out = _main(load_script("tools/knn_eval.py").main, "--topk", "0", cwd=tmp_path)
    assert code == 2 and "--topk" in out


# ------------------------------------------------------------------------------------------
# low-shot SVM
# ------------------------------------------------------------------------------------------
def _interpolated_ap(labels, scores):
    """Area under the precision-recall curve with precision made monotone (VOC style)."""
    order = np.argsort(-scores, kind="stable")
    hits = labels[order] > 0
    tp, fp = np.cumsum(hits), np.cumsum(~hits)
    recall = np.concatenate([[0.0], tp / hits.sum(), [1.0]])
    prec = np.concatenate([[0.0], tp / (tp + fp), [0.0]])
    prec = np.maximum.accumulate(prec[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1]) + 1
    return float(np.sum((recall[steps] - recall[steps - 1]) * prec[steps]))


@needs_fmnist
def test_low_shot_svm_from_our_checkpoint(suite, tmp_path):
    """VISSL's tools/train_svm_low_shot.py (its ``hydra_main``) in this process, world size 1:
    no count below depends on it (the features of every rank are merged).  The tool trains its
    SVMs in a process (multiprocessing, the config's forkserver), which imports the tool by name:
    VISSL's top-level ``tools`` package."""
    import multiprocessing.forkserver

    from vissl.utils.misc import merge_features

    out, k = tmp_path / "svm", 5
    costs = [0.1, 1.0, 10.0]
    tool = importlib.import_module("tools.train_svm_low_shot")
    assert Path(tool.__file__) == SITE / "tools" / "train_svm_low_shot.py"
    # as testkit.train_in_process: a forkserver started by the run would be stopped with the run
    multiprocessing.forkserver.ensure_running()
    with catalog_env(suite["env"]):
        _, log = _main(tool.hydra_main, "config=benchmark/swav_plugin/low_shot_svm_fashion_mnist_cpu", *TRUNK,
                       f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={suite['ckpt']}", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
                       "config.SVM.low_shot.sample_inds=[1]", f"config.SVM.low_shot.k_values=[{k}]",
                       f"config.SVM.costs.costs_list=[{','.join(map(str, costs))}]", f"config.CHECKPOINT.DIR={out}",
                       cwd=tmp_path)
    assert "Results:" in log
    # VISSL's sample: exactly k training images per class
    labels = np.load(out / f"train_labels_sample1_k{k}.npy")
    assert np.bincount(labels).tolist() == [k] * 10
    # its per-cost mean AP equals ours, recomputed from its SVMs and the extracted test features
    layer = out / "res5avg"
    ap_vissl = np.load(layer / f"test_ap_sample1_k{k}.npy").reshape(-1)
    test = merge_features(str(out / f"sample1_k{k}"), "test", "res5avg")
    feats = test["features"] / (np.linalg.norm(test["features"], axis=1) + 1e-5)[:, None]
    y = test["targets"].ravel()
    assert len(y) == 10 * PER_CLASS
    for ci, cost in enumerate(costs):
        aps = []
        for c in range(10):
            with open(layer / f"cls{c}_cost{float(cost)}_sample1_k{k}.pickle", "rb") as f:
                svm = pickle.load(f)
            aps.append(_interpolated_ap((y == c).astype(int), svm.decision_function(feats)))
        assert np.mean(aps) == pytest.approx(ap_vissl[ci], abs=1e-6), cost
    assert ap_vissl.max() > 0.25, ap_vissl  # chance AP (10% positives) is ~0.1
    assert (layer / "test_ap_mean.npy").is_file()


# ------------------------------------------------------------------------------------------
# semi-supervised fine-tuning
# ------------------------------------------------------------------------------------------
def _random_init_trunk():
    from vissl.config import AttrDict
    from vissl_swav_plugin.models.trunks import ResNetSmallPlugin

    torch.manual_seed(123)
    return ResNetSmallPlugin(AttrDict({"TRUNK": {"NAME": "resnet_small_plugin",
                                                 "RESNET_SMALL_PLUGIN": {"DEPTH": 10, "WIDTH": 8}}})).state_dict()


def _check_fine_tuned_from(ours, tuned):
    fresh = _random_init_trunk()
    moved = 0
    for k, v in ours.items():
        if not k.endswith(".weight") or v.dim() != 4:
            continue  # conv weights (BN statistics legitimately move in training)
        d_ours = (tuned[k] - v).norm() / v.norm()
        d_fresh = (tuned[k] - fresh[k]).norm() / fresh[k].norm()
        assert d_ours < 0.5 * d_fresh, f"{k}: fine-tuned trunk not started from our checkpoint"
        moved += int(not torch.equal(tuned[k], v))
    assert moved > 0, "the trunk was not fine-tuned"


def _check_lr_schedule(out, trunk_lr, head_lr):
    """The optimizer state VISSL saved after each epoch: trunk and head learning rates of the
    config, decayed x0.2 at each milestone (moved to epochs 1 and 2 by the tests), no weight
    decay, and the head lr on the new linear layer (weight, bias) only.  Returns the last
    checkpoint."""
    for epoch, name in enumerate(["model_phase0", "model_phase1", "model_final_checkpoint_phase2"]):
        ck = torch.load(out / f"{name}.torch", map_location="cpu", weights_only=False)
        groups = ck["classy_state_dict"]["optimizer"]["optim"]["param_groups"]
        want_trunk, want_head = trunk_lr * 0.2 ** epoch, head_lr * 0.2 ** epoch
        for g in groups:
            assert g["weight_decay"] == 0
            assert g["lr"] == pytest.approx(want_trunk) or g["lr"] == pytest.approx(want_head), (epoch, g["lr"])
        n_head = sum(len(g["params"]) for g in groups if g["lr"] == pytest.approx(want_head))
        assert n_head == 2, (epoch, [(g["lr"], len(g["params"])) for g in groups])
    return ck


@needs_fmnist
def test_semi_sup_1pct_fine_tunes_from_our_checkpoint_with_two_lrs(suite, tmp_path):
    out = tmp_path / "semi1"
    _train(suite, ["config=benchmark/swav_plugin/semi_sup_1pct_fashion_mnist_cpu", *TRUNK, *HEAD10,
                   f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={suite['ckpt']}", "config.OPTIMIZER.num_epochs=3",
                   # the paper's decays at epochs 12 and 16, moved to 1 and 2 for a 3-epoch run
                   "config.OPTIMIZER.param_schedulers.lr.milestones=[1,2]",
                   "config.OPTIMIZER.param_schedulers.lr_head.milestones=[1,2]",
                   # world size 1: 8 per replica keeps the global batch of the config's 2 processes x 4
                   "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", f"config.CHECKPOINT.DIR={out}"], cwd=tmp_path)
    ck = _check_lr_schedule(out, trunk_lr=0.02, head_lr=5.0)
    model = ck["classy_state_dict"]["base_model"]["model"]
    _check_fine_tuned_from(suite["trunk"], model["trunk"])
    tests = [m for m in _metrics(out / "metrics.json") if "test_accuracy_list_meter" in m]
    assert len(tests) == 3
    # 1%: one image per class
    assert np.bincount(np.load(suite["data"] / "subsets" / "fashion_mnist_per01_labels.npy")).tolist() == [1] * 10


@needs_fmnist
def test_semi_sup_10pct_fine_tunes_from_our_checkpoint(suite, tmp_path):
    out = tmp_path / "semi10"
    _, log = _train(suite, ["config=benchmark/swav_plugin/semi_sup_10pct_fashion_mnist_cpu", *TRUNK, *HEAD10,
                            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={suite['ckpt']}", "config.OPTIMIZER.num_epochs=3",
                            "config.OPTIMIZER.param_schedulers.lr.milestones=[1,2]",
                            "config.OPTIMIZER.param_schedulers.lr_head.milestones=[1,2]",
                            "config.DISTRIBUTED.NUM_PROC_PER_NODE=1", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=25",
                            f"config.CHECKPOINT.DIR={out}"], cwd=tmp_path)
    assert "lr: [0.01, 0.2]" in log  # VISSL's log of the first iteration: [trunk, head]
    ck = _check_lr_schedule(out, trunk_lr=0.01, head_lr=0.2)
    _check_fine_tuned_from(suite["trunk"], ck["classy_state_dict"]["base_model"]["model"]["trunk"])
    labels = np.load(suite["data"] / "subsets" / "fashion_mnist_per10_labels.npy")
    assert np.bincount(labels).tolist() == [PER_CLASS // 10] * 10
    assert any("test_accuracy_list_meter" in m for m in _metrics(out / "metrics.json"))


# ------------------------------------------------------------------------------------------
# detectron2 / torchvision conversion
# ------------------------------------------------------------------------------------------
D2_NAME = re.compile(
    r"^(stem\.conv1\.(weight|norm\.(weight|bias|running_mean|running_var))"
    r"|res[2-5]\.\d+\.(conv[1-3]|shortcut)\.(weight|norm\.(weight|bias|running_mean|running_var)))$")


def _d2_to_torchvision(d2):
    """detectron2 ResNet names -> torchvision's (written independently of the tool)."""
    out = {}
    for k, v in d2.items():
        if k.startswith("stem."):
            t = "conv1.weight" if k == "stem.conv1.weight" else "bn1." + k.rsplit(".", 1)[1]
        else:
            stage, block, rest = k.split(".", 2)
            layer = f"layer{int(stage[3:]) - 1}.{block}."
            if rest.startswith("shortcut.norm."):
                t = layer + "downsample.1." + rest.rsplit(".", 1)[1]
            elif rest.startswith("shortcut."):
                t = layer + "downsample.0.weight"
            elif ".norm." in rest:
                t = layer + "bn" + rest[4] + "." + rest.rsplit(".", 1)[1]
            else:
                t = layer + rest
        out[t] = torch.as_tensor(v)
    return out


def _vissl_checkpoint(overrides, path, tmp_path):
    """A VISSL model built by VISSL's builder from a config of ours, saved as VISSL saves it."""
    from vissl.models import build_model

    cfg = compose(["config=test/swav_plugin/quick_cpu", *overrides, f"config.CHECKPOINT.DIR={tmp_path}"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    # non-trivial BN statistics, so that a BN mix-up cannot go unnoticed
    for m in model.trunk.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, path)
    return model.trunk.eval()


def _convert(src, tmp_path, suffix):
    d2_path, tv_path = tmp_path / f"d2.{suffix}", tmp_path / "tv.pth"
    code, out = _main(load_script("tools/convert_to_detectron2.py").main, src, d2_path, "--torchvision", tv_path,
                      cwd=tmp_path)
    assert code == 0, out[-4000:]
    if suffix == "pkl":
        with open(d2_path, "rb") as f:
            d2 = pickle.load(f)
    else:
        d2 = torch.load(d2_path, map_location="cpu", weights_only=True)
    assert d2["matching_heuristics"] is True and d2["__author__"]
    return d2["model"], torch.load(tv_path, map_location="cpu", weights_only=True), out


def test_resnet50_trunk_converts_to_detectron2_and_loads_strict_in_torchvision(tmp_path):
    import torchvision

    vissl_trunk = _vissl_checkpoint([], tmp_path / "r50.torch", tmp_path)  # VISSL's resnet, depth 50
    d2, tv_direct, log = _convert(tmp_path / "r50.torch", tmp_path, "pkl")
    assert all(isinstance(v, np.ndarray) for v in d2.values())
    assert all(D2_NAME.match(k) for k in d2), [k for k in d2 if not D2_NAME.match(k)]
    assert "res5.2.conv3.norm.running_var" in d2 and "res2.0.shortcut.norm.weight" in d2
    assert "MODEL.RESNETS.DEPTH 50" in log
    tv = torchvision.models.resnet50()
    tv.fc = torch.nn.Identity()
    tv.load_state_dict(_d2_to_torchvision(d2), strict=True)
    tv.eval()
    tv2 = torchvision.models.resnet50()
    tv2.fc = torch.nn.Identity()
    tv2.load_state_dict(tv_direct, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = vissl_trunk(x, ["res5avg"])[0].flatten(1)
        assert torch.allclose(tv(x), ref, atol=1e-5, rtol=1e-4)
        assert torch.allclose(tv2.eval()(x), ref, atol=1e-5, rtol=1e-4)


def test_small_trunk_converts_and_matches_torchvision_resnet18_with_small_stem(tmp_path):
    import torchvision

    trunk = _vissl_checkpoint(["config.MODEL.TRUNK.NAME=resnet_small_plugin",
                               "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:64,DEPTH:18}",
                               "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[512,64,16],num_clusters:[20]}]]"],
                              tmp_path / "r18.torch", tmp_path)
    d2, _, log = _convert(tmp_path / "r18.torch", tmp_path, "pth")
    assert all(D2_NAME.match(k) for k in d2)
    assert "3x3 stem" in log and "MODEL.RESNETS.DEPTH 18" in log
    tv = torchvision.models.resnet18()
    tv.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # the small-image stem
    tv.maxpool, tv.fc = torch.nn.Identity(), torch.nn.Identity()
    tv.load_state_dict(_d2_to_torchvision(d2), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(tv.eval()(x), trunk(x, ["res5avg"])[0].flatten(1), atol=1e-5, rtol=1e-4)


@needs_fmnist
def test_our_trained_checkpoint_converts_tensor_for_tensor(suite, tmp_path):
    d2, tv, _ = _convert(suite["ckpt"], tmp_path, "pkl")
    ours = {k[len("_feature_blocks."):]: v for k, v in suite["trunk"].items()
            if not k.endswith("num_batches_tracked")}
    back = _d2_to_torchvision(d2)
    assert set(back) == set(ours) == set(tv)
    for k, v in ours.items():
        assert torch.equal(back[k], v) and torch.equal(tv[k], v), k


def test_converter_names_a_non_resnet_key(tmp_path):
    torch.save({"model_state_dict": {"conv1.weight": torch.zeros(1), "blocks.0.attn.qkv.weight": torch.zeros(1)}},
               tmp_path / "vit.torch")
    code, out = _main(load_script("tools/convert_to_detectron2.py").main, tmp_path / "vit.torch", tmp_path / "o.pkl",
                      cwd=tmp_path)
    assert code == 2 and "blocks.0.attn.qkv.weight" in out
