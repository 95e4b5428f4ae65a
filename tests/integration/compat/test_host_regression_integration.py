"""Host regression: the stock VISSL 0.1.6 components this plugin relies on, run on CPU under
our compat layer, each against an independent truth.  If a new NumPy / Pillow / Hydra /
torch release breaks VISSL (the host), these tests say where: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/compat/test_host_regression.py``.
"""
import json
import math
import re
import sysconfig
from pathlib import Path

import numpy as np
import torch

import vissl  # noqa: F401  (registers the plugin, applies compat)

import compat_helpers as H
from testkit import make_image_folder, run_launcher, train_in_process

SITE_TOOLS = Path(sysconfig.get_paths()["purelib"]) / "tools"


# ------------------------------------------------------------------------------------------
# Linear evaluation (VISSL engine, 1 process: in the test process) from a weights file
# ------------------------------------------------------------------------------------------
def test_vissl_linear_eval_from_weights_file(tmp_path):
    root = H.write_configs(tmp_path)
    train = make_image_folder(root / "train", classes=2, per_class=8, seed=1)
    test = make_image_folder(root / "test", classes=2, per_class=4, seed=2)
    model = H.build_pretrain_model(seed=0)
    weights = H.save_weights_file(model, root / "weights.torch")
    ckpt = root / "ckpt"
    train_in_process(["config=compat_test/tiny_linear", f"config.CHECKPOINT.DIR={ckpt}",
                      f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}", *H.data_overrides(train, test)], cwd=root)
    metrics = [json.loads(line) for line in (ckpt / "metrics.json").read_text().splitlines()]
    names = {k for m in metrics for k in m}
    assert {"train_accuracy_list_meter", "test_accuracy_list_meter"} <= names
    for m in metrics:
        for meter in m.values():
            if isinstance(meter, dict) and "top_1" in meter:
                assert 0 <= meter["top_1"]["res5avg"] <= 100
    losses = [float(x) for x in re.findall(r"loss: ([-+\w.]+);", (ckpt / "log.txt").read_text())]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    first = torch.load(ckpt / "model_phase0.torch", map_location="cpu")["classy_state_dict"]["base_model"]["model"]
    final = torch.load(ckpt / "model_final_checkpoint_phase1.torch", map_location="cpu")["classy_state_dict"]["base_model"]["model"]
    src = model.get_classy_state()["model"]["trunk"]
    for k, v in final["trunk"].items():  # frozen trunk = the weights file, every entry
        name = k.split("base_model.", 1)[-1]
        if not name.endswith("num_batches_tracked"):
            assert torch.equal(v, src[name]), k
    assert any(not torch.equal(first["heads"][k], final["heads"][k]) for k in final["heads"]), "head did not train"


# ------------------------------------------------------------------------------------------
# Feature extraction engine + kNN tool (script), 2 spawned processes
# ------------------------------------------------------------------------------------------
def test_vissl_knn_tool_script_two_spawned_processes(tmp_path):
    from vissl.utils.misc import merge_features

    root = H.write_configs(tmp_path)
    train = make_image_folder(root / "train", classes=5, per_class=8, seed=3)
    test = make_image_folder(root / "test", classes=5, per_class=20, seed=4)  # VISSL's tool needs >= 100
    model = H.build_pretrain_model(seed=0)
    weights = H.save_weights_file(model, root / "weights.torch")
    ckpt = root / "ckpt"
    proc = run_launcher(["config=compat_test/tiny_extract", f"config.CHECKPOINT.DIR={ckpt}",
                         f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}", *H.data_overrides(train, test)],
                        cwd=root, launcher=SITE_TOOLS / "nearest_neighbor_test.py")
    # both ranks wrote their share of the features
    files = sorted(p.name for p in ckpt.glob("rank*_features.npy"))
    assert {f[:5] for f in files} == {"rank0", "rank1"}, files
    model.eval()
    feats = {}
    for split, folder in (("train", train), ("test", test)):
        x, y = H.load_images(folder)
        with torch.no_grad():
            ref = model.trunk(x, ["res5avg"])[0].reshape(len(x), -1)
        out = merge_features(str(ckpt), split, "res5avg")
        assert np.array_equal(out["inds"], np.arange(len(x)))
        assert np.array_equal(out["targets"].reshape(-1), y.numpy())
        np.testing.assert_allclose(out["features"], ref.numpy(), rtol=1e-4, atol=1e-5)
        feats[split] = (out["features"], y.numpy())
    m = re.search(r"layer: res5avg Top1: ([\d.]+), Top5: ([\d.]+)", proc.stdout)
    assert m, proc.stdout[-3000:]
    top1, top5 = float(m.group(1)), float(m.group(2))
    ref1, ref5 = H.reference_knn(*feats["train"], *feats["test"], k=5, sigma=0.1, l2_norm=True)
    # float32 (VISSL) vs float64 (reference) may break a near-tie for at most one image
    assert abs(top1 - ref1) <= 1.0 and abs(top5 - ref5) <= 1.0, (top1, ref1, top5, ref5)
