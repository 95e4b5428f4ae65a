"""DeepCluster-v2 and SeLa-v2 in VISSL: the tests that start processes (VISSL's launcher, gloo
workers, subprocesses).

End to end, 2 epochs then a resume from the epoch-0 checkpoint: DeepCluster-v2 with 2 gloo
processes through VISSL's launcher (its subject includes the memory bank of both ranks, gathered
into the checkpoint and restored per rank: the code of both methods' base class,
``memory_bank_loss``); SeLa-v2 in the test process at world size 1 (``testkit.train_in_process``),
its Sinkhorn-Knopp over a bank split between 2 processes checked against one process on the
whole bank in ``tests/integration/utils/test_clustering_integration.py``.

The in-process tests are in ``tests/unit/losses/test_deepcluster_sela_e2e.py``.
"""
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from testkit import HANG_S, compose, run_launcher, train_in_process
from vissl_swav_plugin.utils.clustering import sela_assign, spherical_kmeans
from vissl_swav_plugin.utils.memory_bank import IGNORE_INDEX
from deepcluster_sela_e2e_cases import load  # noqa: F401


N = 32  # DATA_LIMIT of the quick configs
METHODS = {
    "dc": dict(
        config="pretrain/deepcluster_v2/deepclusterv2_quick_cpu",
        loss="deepclusterv2_plugin_loss",
        # fp64 k-means: one process and two processes then agree bit for bit
        extra=["config.LOSS.deepclusterv2_plugin_loss.kmeans_dtype=float64"],
        in_process=False,  # the config's 2 processes, VISSL's launcher
    ),
    # testkit.train_in_process: world size 1
    "sela": dict(config="pretrain/sela_v2/selav2_quick_cpu", loss="selav2_plugin_loss", extra=[], in_process=True),
}


def protos(ck, h):
    return ck["classy_state_dict"]["base_model"]["model"]["heads"][f"0.prototypes{h}.weight"]


@pytest.fixture(scope="module", params=sorted(METHODS))
def runs(request, tmp_path_factory):
    m = METHODS[request.param]
    root = tmp_path_factory.mktemp(f"e2e_{request.param}")
    ck_a, ck_b = root / "a", root / "b"
    base = [f"config={m['config']}"] + m["extra"]
    cfg = compose(base)
    world = 1 if m["in_process"] else cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE

    def train(ck):
        if m["in_process"]:
            return train_in_process(base + [f"config.CHECKPOINT.DIR={ck}"], cwd=root)[1]
        return run_launcher(base + [f"config.CHECKPOINT.DIR={ck}"], cwd=root).stdout

    log_a = train(ck_a)
    # resume from the epoch-0 checkpoint alone, in a fresh folder
    ck_b.mkdir()
    shutil.copy(ck_a / "model_phase0.torch", ck_b / "model_phase0.torch")
    os.symlink("model_phase0.torch", ck_b / "checkpoint.torch")
    log_b = train(ck_b)
    return dict(
        method=request.param,
        loss=m["loss"],
        world=world,
        # the loss lines (rank 0's) of the 2 epochs
        iterations=N // (cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * world) * cfg.OPTIMIZER.num_epochs,
        log_a=log_a,
        log_b=log_b,
        a0=load(ck_a / "model_phase0.torch"),
        a1=load(ck_a / "model_final_checkpoint_phase1.torch"),
        b1=load(ck_b / "model_final_checkpoint_phase1.torch"),
    )


def test_every_rank_labels_epoch1_from_the_epoch0_bank(runs):
    name, log, world = runs["loss"], runs["log_a"], runs["world"]
    for rank in range(world):
        assert re.search(rf"{name}: rank {rank}: epoch 0: pseudo-labels from the memory bank filled in "
                         rf"the initial forward pass \({N} rows over {world} processes\)", log)
        assert re.search(rf"{name}: rank {rank}: epoch 1: pseudo-labels from the memory bank filled in "
                         rf"epoch 0 \({N} rows over {world} processes\); samples labelled per clustering: "
                         rf"\[{N}, {N}, {N}\]", log)
    assert f"{name}: rank {world}:" not in log
    losses = [float(x) for x in re.findall(r"loss: ([-\d.eE+naif]+);", log)]
    assert len(losses) == runs["iterations"] and all(torch.isfinite(torch.tensor(losses)))


def test_checkpoint_holds_the_whole_bank_of_every_rank(runs):
    for ck, epoch in ((runs["a0"], 0), (runs["a1"], 1)):
        st = ck["loss"]
        assert int(st["memory_epoch"]) == epoch and int(st["assign_epoch"]) == epoch
        # every sample once: the rows of every process (N / world each), gathered at the epoch end
        assert torch.equal(st["memory_ids"], torch.arange(N))
        emb = st["memory_embeddings"]
        assert emb.shape == (2, N, 16)  # crops_for_mb [0, 1], embedding_dim 16
        assert torch.allclose(emb.norm(dim=2), torch.ones(2, N), atol=1e-5)
        assert (st["assignments"] != IGNORE_INDEX).all()
    # epoch 1 refilled the bank with new features
    assert not torch.allclose(runs["a0"]["loss"]["memory_embeddings"], runs["a1"]["loss"]["memory_embeddings"])


def test_epoch1_labels_are_recomputed_from_the_epoch0_bank(runs):
    a0, a1 = runs["a0"]["loss"], runs["a1"]["loss"]
    bank_ids, bank = a0["memory_ids"], a0["memory_embeddings"]
    for h in range(3):
        x = bank[h % 2]
        if runs["method"] == "dc":
            c, a, _ = spherical_kmeans(x, bank_ids, 8, 10, id_space=N, seed=0 + 1000003 * 1 + h,
                                       dtype=torch.float64)
            assert torch.allclose(a1[f"centroids{h}"], c.float(), atol=1e-6)
        else:
            # the prototypes at the start of epoch 1 are those saved at the end of epoch 0
            a = sela_assign(x, protos(runs["a0"], h), epsilon=0.01, num_iters=200, dtype=torch.float64)
            counts = torch.bincount(a, minlength=8)
            assert counts.min() >= 2 and counts.max() <= 6, counts  # ~ equipartition (N/K = 4)
        expect = torch.full((N,), IGNORE_INDEX, dtype=torch.long)
        expect[bank_ids] = a
        assert torch.equal(a1["assignments"][h], expect), h


def test_resume_keeps_bank_and_pseudo_labels(runs):
    log_b, name, world = runs["log_b"], runs["loss"], runs["world"]
    for rank in range(world):  # each rank restores its share of the rows
        assert re.search(rf"{name}: rank {rank}: memory bank restored \({N // world} of {N} rows, filled in epoch 0\)",
                         log_b)
        assert re.search(rf"{name}: rank {rank}: epoch 1: pseudo-labels from the memory bank filled in epoch 0", log_b)
    assert "filling the memory bank with a forward pass" not in log_b  # no new initial pass
    a1, b1 = runs["a1"]["loss"], runs["b1"]["loss"]
    assert torch.equal(b1["assignments"], a1["assignments"])
    if runs["method"] == "dc":
        for h in range(3):
            assert torch.allclose(b1[f"centroids{h}"], a1[f"centroids{h}"], atol=1e-6)


def test_prototype_heads(runs):
    a0, a1 = runs["a0"], runs["a1"]
    for h in range(3):
        p0, p1 = protos(a0, h), protos(a1, h)
        assert torch.allclose(p1.norm(dim=1), torch.ones(8), atol=1e-5)
        if runs["method"] == "dc":
            # frozen head = the centroids of the epoch, untouched by a whole epoch of SGD
            # (lr 0.1, momentum, weight decay)
            assert torch.equal(p0, a0["loss"][f"centroids{h}"])
            assert torch.equal(p1, a1["loss"][f"centroids{h}"])
            assert torch.equal(protos(runs["b1"], h), runs["b1"]["loss"][f"centroids{h}"])
        else:
            assert not torch.allclose(p0, p1), "SeLa-v2 prototypes are learned"


# ------------------------------------------------------------------ real images (opt-in)
SLOW = os.environ.get("VISSL_SWAV_PLUGIN_SLOW_TESTS") == "1"
KNN_SEED = int(os.environ.get("VISSL_SWAV_PLUGIN_KNN_SEED", "0"))  # to measure the margin over seeds
# Margins (20-NN top-1, fraction) over the mean of 3 random inits, from runs with
# VISSL_SWAV_PLUGIN_KNN_SEED=0 / 1 on the 2-core machine (2026-11-22, ~1.5 min per run):
#   DC-v2:   71.0 vs 66.2 (+4.8), 71.3 vs 66.6 (+4.7)  -> asserted +2 points, in `make test`
#            with the reference defaults (random k-means init, empty clusters kept, per-crop
#            first bank; 2026-11-23): 71.7 vs 66.2 (+5.5), 72.7 vs 66.6 (+6.1)
#   SeLa-v2: 70.0 vs 66.2 (+3.8), 68.4 vs 66.6 (+1.8)  -> asserted +1 point, opt-in
#            (VISSL_SWAV_PLUGIN_SLOW_TESTS=1): its gain varies too much at this size for CI
#            (not re-measured since the first-epoch prototype freeze became the default)
# Those were 20 epochs of 2x32 + 2x16 crops.  The test now trains 12 epochs of 2x24 + 2x12 crops
# (KNN_EPOCHS, KNN_CROPS: 55 s of training instead of 131 s alone on the 2-core Intel Xeon,
# 2026-11-27), with DC-v2 gains, seeds 0 / 1 / 2: 70.4 vs 66.2 (+4.2), 68.9 vs 65.3 (+3.6),
# 71.5 vs 66.0 (+5.5); the same day, 20 epochs of 32/16 crops gave +6.6 (seed 0), 12 epochs of
# 32/16 crops +3.5 / +4.2 / +4.2, 20 epochs of 24/12 crops +5.1 / +2.0.
KNN_EPOCHS = 12
KNN_CROPS = (24, 12)
KNN_MIN_GAIN = {"dc": 0.02, "sela": 0.01}
KNN_OPT_IN = {"sela"}
KNN_METHODS = {
    "dc": ("pretrain/deepcluster_v2/deepclusterv2_quick_cpu", "deepclusterv2_plugin_head"),
    "sela": ("pretrain/sela_v2/selav2_quick_cpu", "swav_plugin_head"),
}


# kNN evaluation of a trunk (random init or from a checkpoint) on an image folder: the trunk's
# flattened, L2-normalised features of the un-augmented images (ToTensor + the multi-crop
# transform's ImageNet normalisation); the plugin's shared kNN
# (vissl_swav_plugin.utils.knn.weighted_knn_accuracy: 20 nearest training images by cosine, votes
# exp(sim / 0.07), Wu et al. 2018 as VISSL's kNN benchmark); top-1.
def load_folder(root):
    """Images (N x 3 x H x W float, normalised) and labels of an ImageFolder tree."""
    xs, ys = [], []
    for label, d in enumerate(sorted(p for p in Path(root).iterdir() if p.is_dir())):
        for f in sorted(d.iterdir()):
            xs.append(torch.from_numpy(np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1))
            ys.append(label)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return (torch.stack(xs) - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1), torch.tensor(ys)


@torch.no_grad()
def knn_accuracy(config, train_dir, val_dir, checkpoint=None, seed=None):
    """Top-1 (a fraction) of VISSL's trunk for ``config`` (torch seed ``seed``, default
    SEED_VALUE), its weights from ``checkpoint`` if given."""
    from vissl.models import build_model
    from vissl_swav_plugin.utils.knn import weighted_knn_accuracy

    torch.manual_seed(config.SEED_VALUE if seed is None else seed)
    trunk = build_model(config.MODEL, config.OPTIMIZER).trunk
    if checkpoint is not None:
        trunk.load_state_dict(load(checkpoint)["classy_state_dict"]["base_model"]["model"]["trunk"], strict=True)
    trunk.eval()

    def features(x):
        out = [trunk(x[i:i + 256]) for i in range(0, x.shape[0], 256)]
        return F.normalize(torch.cat([f[0] if isinstance(f, (list, tuple)) else f for f in out]).flatten(1), dim=1)

    (xtr, ytr), (xte, yte) = load_folder(train_dir), load_folder(val_dir)
    return weighted_knn_accuracy(features(xtr), ytr, features(xte), yte, k=20) / 100.0


@pytest.mark.parametrize("method", [
    pytest.param(m, marks=pytest.mark.skipif(
        m in KNN_OPT_IN and not SLOW,
        reason="opt-in (VISSL_SWAV_PLUGIN_SLOW_TESTS=1): SeLa-v2's kNN gain at this size varies too much "
               "across seeds (+1.8 to +3.8 points) for a CI assertion"))
    for m in sorted(KNN_METHODS)
])
def test_knn_beats_random_init_on_fashion_mnist(method, tmp_path):
    """1000 Fashion-MNIST training images (100 per class, 32 px), 12 epochs, 2 processes;
    20-NN top-1 on 1000 test images of the trunk's features vs the same trunk at random
    init (mean of 3 initialisations); margins measured over two seeds (see KNN_MIN_GAIN)."""
    from testkit import REPO, run_script

    data = tmp_path / "fm"
    prep = run_script([REPO / "tools" / "prepare_fashion_mnist.py", "--out", data,
                       "--limit-per-class", "100", "--size", "32", "--rgb", "--format", "folder"], cwd=tmp_path)
    assert prep.returncode == 0, prep.stdout[-3000:]
    cfg_name, head = KNN_METHODS[method]
    over = [
        f"config={cfg_name}",
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]",
        f"config.DATA.TRAIN.DATA_PATHS=[{data / 'train'}]", f"config.DATA.TRAIN.LABEL_PATHS=[{data / 'train'}]",
        "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
        "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.WIDTH=16",
        f"config.MODEL.HEAD.PARAMS=[[{head},{{dims:[128,128,32],use_bn:True,num_clusters:[10,10,10]}}]]",
        f"config.DATA.TRAIN.TRANSFORMS.0.size_crops=[{KNN_CROPS[0]},{KNN_CROPS[1]}]",
        f"config.OPTIMIZER.num_epochs={KNN_EPOCHS}", "config.OPTIMIZER.use_larc=True",
        "+config.OPTIMIZER.larc_config={clip:False,trust_coefficient:0.001,eps:1e-8}",
        "config.OPTIMIZER.param_schedulers.lr={name:cosine,start_value:1.2,end_value:0.0012,update_interval:step}",
        "config.LOG_FREQUENCY=50",
    ]
    over.append(f"config.SEED_VALUE={KNN_SEED}")
    ckdir = tmp_path / "ck"
    run_launcher(over + [f"config.CHECKPOINT.DIR={ckdir}"], cwd=tmp_path, timeout=HANG_S)
    cfg = compose(over)
    # baseline: mean over 3 random inits, the first the training's own start (VISSL seeds
    # rank 0 with SEED_VALUE * num_epochs); one init alone is a noisy baseline
    inits = [KNN_SEED * KNN_EPOCHS + 1000 * j for j in range(3)]
    per_init = [knn_accuracy(cfg, data / "train", data / "val", seed=s) for s in inits]
    random_init = sum(per_init) / len(per_init)
    trained = knn_accuracy(cfg, data / "train", data / "val", ckdir / f"model_final_checkpoint_phase{KNN_EPOCHS - 1}.torch")
    print(f"{method} seed {KNN_SEED}: kNN top-1 trained {trained:.4f} vs random init {random_init:.4f} "
          f"(inits {[round(a, 4) for a in per_init]})")
    assert trained >= random_init + KNN_MIN_GAIN[method]
