"""Baselines of tools/knn_eval.py (issue 13, item 4): --random-init / --random-inits N and
--raw-pixels, on a tiny labelled folder (5 classes: 120 memory-bank + 100 query images of
32 px; VISSL's kNN needs >= 100 queries and >= 5 classes for its top-5) and a checkpoint
of our small trunk saved as VISSL saves it.

Truths: scikit-learn's KNeighborsClassifier on pixels read here with PIL + torchvision
(raw pixels), and the weighted kNN of tests/helpers/reference_swav.py on the features VISSL extracted
(checkpoint and random initialisations).  The tool runs in the test process
(``testkit.vissl_run_state``; world size 1, no loader worker).
"""
import contextlib
import io
import json
import sys

import numpy as np
import pytest
import torch

from reference_swav import reference_knn
from testkit import REPO, SMALL_TRUNK, compose, folder_data_overrides, load_script, make_image_folder, vissl_run_state

TRUNK = ["config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.DEPTH=10", "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.WIDTH=8"]


def _tool(*args, cwd):
    """tools/knn_eval.py's main in this process: ``(exit status, its output)`` (VISSL's console
    log handler writes to the ``sys.stdout`` of when the run sets it up)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, vissl_run_state(cwd):
        code = load_script("tools/knn_eval.py").main([str(a) for a in args])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    from vissl.models import build_model

    root = tmp_path_factory.mktemp("knn_baselines")
    train = make_image_folder(root / "train", classes=5, per_class=24, size=32, seed=3)
    test = make_image_folder(root / "test", classes=5, per_class=20, size=32, seed=4)
    cfg = compose(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK,
                   f"config.CHECKPOINT.DIR={root}"])
    torch.manual_seed(7)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    ckpt = root / "model_final_checkpoint_phase0.torch"
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, ckpt)
    out = root / "knn"
    code, log = _tool("--topk", "20", "--random-inits", "2", "--raw-pixels",
                 "config=benchmark/swav_plugin/knn_fashion_mnist_cpu", *TRUNK,
                 *folder_data_overrides(train, "TRAIN", labels=True), *folder_data_overrides(test, "TEST", labels=True),
                 "config.DISTRIBUTED.NUM_PROC_PER_NODE=1", f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ckpt}",
                 f"config.CHECKPOINT.DIR={out}", cwd=root)
    assert code == 0, log[-4000:]
    return dict(out=out, train=train, test=test, log=log,
                res=json.loads((out / "knn_results.json").read_text()))


def _pixels(folder):
    """Pixels in [0, 1] of the kNN config's test transform (Resize 28, CenterCrop 28), read
    here with PIL + torchvision, flattened, in ImageFolder order."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(folder), transform=T.Compose([T.Resize(28), T.CenterCrop(28), T.ToTensor()]))
    return np.stack([ds[i][0].reshape(-1).numpy() for i in range(len(ds))]), np.array(ds.targets)


def test_raw_pixel_baseline_equals_scikit_learn(baseline_run):
    from sklearn.neighbors import KNeighborsClassifier

    raw = baseline_run["res"]["baselines"]["raw_pixels"]
    xtr, ytr = _pixels(baseline_run["train"])
    xte, yte = _pixels(baseline_run["test"])
    assert raw["feature_dim"] == xtr.shape[1] == 3 * 28 * 28
    euclid = KNeighborsClassifier(n_neighbors=5).fit(xtr, ytr)  # plain majority vote, Euclidean
    assert raw["nn5_euclid"] == pytest.approx(100.0 * np.mean(euclid.predict(xte) == yte), abs=1e-9)
    t = baseline_run["res"]["baselines"]["temperature"]
    assert t == 0.07  # the demo's default
    weighted = KNeighborsClassifier(n_neighbors=20, metric="cosine", algorithm="brute",
                                    weights=lambda d: np.exp((1.0 - d) / t)).fit(xtr, ytr)
    assert raw["knn20"] == pytest.approx(100.0 * np.mean(weighted.predict(xte) == yte), abs=1e-9)
    assert "baseline table: raw_pixels" in baseline_run["log"]


def _features(folder):
    from vissl.utils.misc import merge_features

    tr, te = merge_features(str(folder), "train", "res5avg"), merge_features(str(folder), "test", "res5avg")
    return tr["features"], tr["targets"].ravel(), te["features"], te["targets"].ravel()


def test_random_init_baseline_is_the_mean_over_initialisations(baseline_run):
    res, out = baseline_run["res"], baseline_run["out"]
    table = res["baselines"]
    rnd = table["random_init"]["res5avg"]
    assert [r["seed_value"] for r in rnd["per_init"]] == [0, 1]
    assert rnd["knn20"] == pytest.approx(np.mean([r["knn20"] for r in rnd["per_init"]]))
    assert rnd["range"]["knn20"] == [round(min(r["knn20"] for r in rnd["per_init"]), 2),
                                     round(max(r["knn20"] for r in rnd["per_init"]), 2)]
    feats = [_features(out)] + [_features(out / f"random_init_{i}") for i in range(2)]
    # three different networks on the same images, same order of labels
    assert not np.allclose(feats[0][0], feats[1][0]) and not np.allclose(feats[1][0], feats[2][0])
    for f in feats[1:]:
        assert np.array_equal(f[1], feats[0][1]) and np.array_equal(f[3], feats[0][3])
    # every row is the weighted kNN (T = 0.07) of its features
    rows = [table["checkpoint"]["res5avg"]] + rnd["per_init"]
    for row, (ftr, ytr, fte, yte) in zip(rows, feats):
        assert row["knn20"] == pytest.approx(reference_knn(ftr, ytr, fte, yte, 20, 0.07, l2_norm=True)[0], abs=1e-9)
    # VISSL's own numbers (config SIGMA) are still there
    assert res["res5avg"]["20"]["top1"] == pytest.approx(
        reference_knn(*feats[0], 20, res["sigma"], l2_norm=True)[0], abs=0.51)


def test_baseline_options_parse_and_are_documented(capsys):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import knn_eval
    finally:
        sys.path.pop(0)
    opts = knn_eval.split_args(["--random-init", "config=x"])
    assert (opts["random_inits"], opts["raw_pixels"], opts["temperature"]) == (5, False, 0.07)
    opts = knn_eval.split_args(["--random-inits=3", "--raw-pixels", "--temperature", "0.1", "config=x"])
    assert (opts["random_inits"], opts["raw_pixels"], opts["temperature"]) == (3, True, 0.1)
    assert knn_eval.split_args(["config=x"])["random_inits"] == 0
    for bad in (["--random-inits", "0", "config=x"], ["--temperature", "-1", "config=x"],
                ["--random-inits", "two", "config=x"]):
        with pytest.raises(knn_eval.KnnEvalError, match=bad[0]):
            knn_eval.split_args(bad)
    with pytest.raises(SystemExit) as exit_:
        load_script("tools/knn_eval.py").main(["--help"])
    assert exit_.value.code == 0
    helptext = capsys.readouterr().out
    for opt in ("--random-init ", "--random-inits N", "--raw-pixels", "--temperature T", "0.07"):
        assert opt in helptext, opt
