"""Host regression: the stock VISSL 0.1.6 components this plugin relies on, run on CPU under
our compat layer, each against an independent truth.  If a new NumPy / Pillow / Hydra /
torch release breaks VISSL (the host), these tests say where.

Covered: VISSL's built-in ``swav_loss`` (forward/backward vs. the paper's algorithm in
fp64), its ``multicrop_collator`` and ``ImgPilToMultiCrop`` transform, its SSL transforms
under Pillow 13, Hydra composition and config inference of its configs, its checkpoint
writer / resume-file logic / weights init, its linear evaluation (1 process), its
feature-extraction engine + kNN benchmark tool (script, 2 spawned processes), and its SVM
benchmark trainer."""
import math
import os

import numpy as np
import pytest
import torch

import vissl  # noqa: F401  (registers the plugin, applies compat)

import compat_helpers as H
from reference_swav import reference_swav_loss
from testkit import compose


# ------------------------------------------------------------------------------------------
# swav_loss
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_crops, crops_for_assign, double", [(2, [0, 1], True), (3, [0, 1], True), (3, [0], False)])
def test_vissl_swav_loss_forward_backward(num_crops, crops_for_assign, double):
    from classy_vision.generic.distributed_util import set_cpu_device
    from vissl.config import AttrDict
    from vissl.losses.swav_loss import SwAVLoss

    set_cpu_device()  # what VISSL's trainer does for MACHINE.DEVICE=cpu
    bs, dim, protos = 6, 8, [5, 7]
    cfg = AttrDict({"temperature": 0.1, "crops_for_assign": crops_for_assign, "num_crops": num_crops,
                    "num_iters": 3, "epsilon": 0.05, "use_double_precision": double, "num_prototypes": protos,
                    "embedding_dim": dim, "temp_hard_assignment_iters": 0, "output_dir": ".",
                    "queue": {"queue_length": 0, "start_iter": 0, "local_queue_length": 0}})
    loss_fn = SwAVLoss(cfg)
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(bs * num_crops, dim, generator=gen), dim=1)
    scores = [torch.randn(bs * num_crops, k, generator=gen, dtype=torch.float64 if double else torch.float32)
              .mul_(0.5).requires_grad_() for k in protos]
    loss = loss_fn([emb, *scores], torch.zeros(bs * num_crops))
    loss.backward()
    ref_scores = [s.detach().double().requires_grad_() for s in scores]
    ref = reference_swav_loss(ref_scores, num_crops, crops_for_assign, 0.1, 0.05, 3)
    ref.backward()
    tol = 1e-6 if double else 2e-5  # VISSL returns the codes as float32 even in double mode
    assert math.isclose(loss.item(), ref.item(), rel_tol=tol, abs_tol=tol)
    for s, r in zip(scores, ref_scores):
        assert torch.isfinite(s.grad).all()
        assert torch.allclose(s.grad.double(), r.grad, rtol=tol * 10, atol=tol)


# ------------------------------------------------------------------------------------------
# multi-crop transform + collator, SSL transforms under Pillow 13
# ------------------------------------------------------------------------------------------
def test_vissl_multicrop_transform_and_collator():
    from PIL import Image
    from vissl.data.collators import get_collator
    from vissl.data.ssl_transforms import get_transform

    transform = get_transform([
        {"name": "ImgPilToMultiCrop", "total_num_crops": 3, "size_crops": [32, 16], "num_crops": [2, 1],
         "crop_scales": [[0.5, 1.0], [0.1, 0.4]]},
        {"name": "ToTensor"},
    ])
    rng = np.random.default_rng(0)
    batch = []
    for i in range(4):
        img = Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
        out = transform({"data": [img], "label": [i % 2], "data_valid": [1], "data_idx": [10 + i]})
        crops = out["data"]
        assert [tuple(c.shape) for c in crops] == [(3, 32, 32), (3, 32, 32), (3, 16, 16)]
        assert out["label"] == [i % 2] * 3 and out["data_idx"] == [10 + i] * 3
        batch.append(out)
    collated = get_collator("multicrop_collator", {})(batch)
    data = collated["data"][0]
    assert len(data) == 3 and [tuple(d.shape) for d in data] == [(4, 3, 32, 32), (4, 3, 32, 32), (4, 3, 16, 16)]
    for pos in range(3):
        for b in range(4):
            assert torch.equal(data[pos][b], batch[b]["data"][pos])
    # labels / indices: crop-major order (all images' crop 0, then crop 1, ...)
    assert collated["label"][0].tolist() == [0, 1, 0, 1] * 3
    assert collated["data_idx"][0].tolist() == [10, 11, 12, 13] * 3
    assert collated["data_valid"][0].tolist() == [1] * 12


def test_vissl_ssl_transforms_under_pillow():
    from PIL import Image
    from vissl.data.ssl_transforms import get_transform

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8))
    pipelines = {
        "RandAugment": [{"name": "RandAugment", "magnitude": 10, "magnitude_std": 0.5, "increasing_severity": True}],
        "RandAugmentPlain": [{"name": "RandAugment", "magnitude": 0, "magnitude_std": 0.0}],
        "VisslAutoAugment": [{"name": "VisslAutoAugment", "policy_name": "original"}],
        "ImgPilRandomPhotometric": [{"name": "ImgPilRandomPhotometric", "p": 1.0}],
        "ImgPilColorDistortion": [{"name": "ImgPilColorDistortion", "strength": 1.0}],
        "ImgPilGaussianBlur": [{"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 0.1, "radius_max": 2.0}],
        "ImgPilRandomSolarize": [{"name": "ImgPilRandomSolarize", "prob": 1.0}],
        "imagenet_autoaugment": [{"name": "imagenet_autoaugment"}],
    }
    for name, spec in pipelines.items():
        t = get_transform([{**s} for s in spec])
        for _ in range(25):
            out = t({"data": [img], "label": [0], "data_valid": [1], "data_idx": [0]})["data"][0]
            assert isinstance(out, Image.Image) and out.size == (48, 48) and out.mode == "RGB", name


# ------------------------------------------------------------------------------------------
# Hydra composition + VISSL's config inference
# ------------------------------------------------------------------------------------------
def test_vissl_config_composition_and_inference():
    from vissl_swav_plugin.config.registries import register_plugin_config_keys

    register_plugin_config_keys("MY_PLUGIN_TEST_KEY")  # a key a plugin adds (else: an unknown key)
    config = compose([
        "config=test/integration_test/quick_swav",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,128],use_bn:False,num_clusters:[30,40]}]]",
        "+config.MY_PLUGIN_TEST_KEY=7",
    ])
    loss = config.LOSS.swav_loss
    assert loss.epsilon == 0.05 and loss.temperature == 0.1 and list(loss.crops_for_assign) == [0, 1]
    # inferred by VISSL from the transforms / head / batch
    assert loss.num_crops == 6 and list(loss.num_prototypes) == [30, 40] and loss.embedding_dim == 128
    assert config.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 8 and config.MY_PLUGIN_TEST_KEY == 7
    assert config.OPTIMIZER.use_larc is True and config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE == "pytorch"


# ------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------
def test_vissl_checkpoint_write_resume_and_weights_init(tmp_path):
    from classy_vision.generic.util import load_checkpoint
    from vissl.models import build_model
    from vissl.utils.checkpoint import (CheckpointWriter, get_checkpoint_resume_files, get_resume_checkpoint,
                                        has_checkpoint, init_model_from_consolidated_weights)

    config = compose(["config=test/integration_test/quick_swav", f"config.CHECKPOINT.DIR={tmp_path}",
                      "config.CHECKPOINT.AUTO_RESUME=True"])
    model = H.build_pretrain_model(seed=1)
    folder = str(tmp_path)
    for phase in (0, 1):
        writer = CheckpointWriter(folder, is_final_train_phase=False, mode="phase", mode_num=phase, backend="disk")
        writer.save_consolidated_checkpoint({"phase_idx": phase, "iteration": 10 * phase,
                                             "classy_state_dict": {"base_model": model.get_classy_state()}})
    assert has_checkpoint(folder) and get_checkpoint_resume_files(folder, config) == "model_phase1.torch"
    assert get_resume_checkpoint(config, folder) == f"{folder}/model_phase1.torch"
    assert os.path.realpath(tmp_path / "checkpoint.torch") == str(tmp_path / "model_phase1.torch")
    # torch's default (weights_only=True) loads VISSL checkpoints
    ckpt = load_checkpoint(f"{folder}/model_phase1.torch", device=torch.device("cpu"))
    assert ckpt["iteration"] == 10 and ckpt["type"] == "consolidated"
    fresh_config = compose(["config=test/integration_test/quick_swav",
                            "config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,32],use_bn:False,num_clusters:[10]}]]"])
    torch.manual_seed(99)
    fresh = build_model(fresh_config.MODEL, fresh_config.OPTIMIZER)
    init_model_from_consolidated_weights(fresh_config, fresh, ckpt, state_dict_key_name="classy_state_dict",
                                         skip_layers=[])
    want = model.state_dict()
    got = fresh.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(want[k], got[k]), k


# ------------------------------------------------------------------------------------------
# SVM benchmark trainer
# ------------------------------------------------------------------------------------------
def test_vissl_svm_tool_on_synthetic_features(tmp_path, monkeypatch):
    import pickle

    import tools.train_svm as svm_tool

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_ID"):  # train_svm sets them
        monkeypatch.setenv(key, os.environ.get(key, ""))
    rng = np.random.default_rng(0)
    classes, dim = 3, 12
    centers = rng.normal(size=(classes, dim)) * 2.5
    data = {}
    for split, n in (("train", 48), ("test", 36)):
        y = rng.integers(0, classes, size=n)
        x = centers[y] + rng.normal(size=(n, dim))
        targets = np.zeros((n, classes), dtype=np.int64)
        targets[np.arange(n), y] = 1
        if split == "test":
            targets[::7, 0] = -1  # VOC "difficult": ignored by the evaluation
        data[split] = (x, targets)
        np.save(tmp_path / f"rank0_chunk0_{split}_res5_features.npy", x.astype(np.float32))
        np.save(tmp_path / f"rank0_chunk0_{split}_res5_targets.npy", targets)
        np.save(tmp_path / f"rank0_chunk0_{split}_res5_inds.npy", np.arange(n))
    config = compose(["config=test/integration_test/quick_swav", "config.SVM.costs.costs_list=[0.01,1.0]",
                      "config.SVM.cross_val_folds=2"])
    svm_tool.train_svm(config, str(tmp_path), "res5")
    out = tmp_path / "res5"
    test_ap = np.load(out / "test_ap.npy").reshape(-1)
    chosen = np.load(out / "chosen_cost.npy").reshape(-1)
    x, targets = data["test"]
    x = x.astype(np.float32).astype(np.float64)
    x = x / (np.linalg.norm(x, axis=1) + 1e-5)[:, None]
    for c in range(classes):
        with open(out / f"cls{c}_cost{float(chosen[c])}.pickle", "rb") as f:
            clf = pickle.load(f)
        keep = targets[:, c] != -1
        expected = H.voc_ap(targets[keep, c], clf.decision_function(x)[keep])
        assert math.isclose(test_ap[c], expected, abs_tol=1e-9), (c, test_ap[c], expected)
    assert test_ap.mean() > 0.8  # well separated classes
