"""DeepCluster-v2 and SeLa-v2 in VISSL.

* Losses and config checks in one process: the loss against the paper's formula
  ``-sum_k q_k log p_k`` (``p = softmax(z.c / tau)``), bad values naming their key.
* End to end: 2 gloo processes through VISSL's stock launcher, 2 epochs on synthetic
  images with the plugin's quick CPU configs, then AUTO_RESUME from the epoch-0
  checkpoint in a fresh folder.  Independent truths: the pseudo-labels of epoch 1 are
  recomputed here, in one process, from the memory bank saved at the end of epoch 0
  (k-means with the loss's seed / Sinkhorn-Knopp with the prototypes saved at the end of
  epoch 0); the resumed run must reproduce the uninterrupted run's epoch-1 labels."""
import os
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from conftest import HANG_S, compose, run_launcher
from vissl_swav_plugin.utils.clustering import sela_assign, spherical_kmeans
from vissl_swav_plugin.utils.memory_bank import IGNORE_INDEX

DC_CFG, SL_CFG = "config=pretrain/deepcluster_v2/deepclusterv2_quick_cpu", "config=pretrain/sela_v2/selav2_quick_cpu"
LD, LS = "config.LOSS.deepclusterv2_plugin_loss", "config.LOSS.selav2_plugin_loss"


# ------------------------------------------------------------------ config checks
@pytest.mark.parametrize("base,override,key", [
    (DC_CFG, "config.MODEL.HEAD.PARAMS=[[deepclusterv2_plugin_head,{dims:[64,16],num_clusters:[0,8]}]]",
     "num_clusters"),
    (DC_CFG, f"{LD}.crops_for_mb=[0,4]", "crops_for_mb"),       # 4 crops: indices 0..3
    (DC_CFG, f"{LD}.crops_for_mb=[1,1]", "crops_for_mb"),
    (DC_CFG, f"{LD}.temperature=0", "temperature"),
    (DC_CFG, f"{LD}.kmeans_iters=-1", "kmeans_iters"),
    (DC_CFG, f"{LD}.kmeans_init=farthest", "kmeans_init"),
    (DC_CFG, f"{LD}.reseed_empty_clusters=sometimes", "reseed_empty_clusters"),
    (DC_CFG, f"{LD}.init_bank_forward=together", "init_bank_forward"),
    (DC_CFG, f"{LD}.kmeans_dtype=float16", "kmeans_dtype"),
    (SL_CFG, f"{LS}.init_bank_forward=together", "init_bank_forward"),
    (SL_CFG, f"{LS}.freeze_prototypes_epochs=-1", "freeze_prototypes_epochs"),
    # trainable prototypes cannot be DeepCluster-v2's frozen centroid head
    (DC_CFG, "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,16],num_clusters:[8]}]]",
     "MODEL.HEAD.PARAMS"),
    (DC_CFG, "config.DATA.TRAIN.COLLATE_FUNCTION=default_collate", "COLLATE_FUNCTION"),
    (SL_CFG, f"{LS}.sinkhorn_epsilon=0", "sinkhorn_epsilon"),
    (SL_CFG, f"{LS}.sinkhorn_iterations=0", "sinkhorn_iterations"),
    (SL_CFG, f"{LS}.crops_for_mb=[-1]", "crops_for_mb"),
    (SL_CFG, "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,16]}]]", "MODEL.HEAD.PARAMS"),  # nothing to learn
])
def test_bad_config_value_names_the_key(base, override, key):
    from vissl_swav_plugin.config.validation import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([base, override])


def test_configs_infer_from_the_head():
    cfg = compose([DC_CFG, "config.MODEL.HEAD.PARAMS=[[deepclusterv2_plugin_head,{dims:[64,32],num_clusters:[5,6]}]]"])
    lc = cfg.LOSS.deepclusterv2_plugin_loss
    assert lc.num_clusters == [5, 6] and lc.embedding_dim == 32
    # DeepCluster-v2 also runs with a head without prototypes (the loss holds the centroids)
    cfg = compose([DC_CFG, "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,24]}]]", f"{LD}.num_clusters=[4]"])
    assert cfg.LOSS.deepclusterv2_plugin_loss.embedding_dim == 24
    for name in ("pretrain/deepcluster_v2/deepclusterv2_8node_resnet", "pretrain/sela_v2/selav2_8node_resnet"):
        cfg = compose([f"config={name}"])
        lc = cfg.LOSS[cfg.LOSS.name]
        assert lc.num_clusters == [3000, 3000, 3000] and lc.temperature == 0.1 and lc.embedding_dim == 128
        assert cfg.OPTIMIZER.weight_decay == 1e-6 and cfg.OPTIMIZER.use_larc
        assert cfg.OPTIMIZER.param_schedulers.lr.schedulers[0]["end_value"] == 4.8


# ------------------------------------------------------------------ losses, one process
def make_loss(kind, **over):
    from vissl.config import AttrDict

    from vissl_swav_plugin.losses.deepcluster_v2 import DeepClusterV2PluginLoss
    from vissl_swav_plugin.losses.sela_v2 import SeLaV2PluginLoss

    cfg = dict(name=f"{kind}_plugin_loss", num_train_samples=10, temperature=0.1, num_clusters=[3, 4],
               embedding_dim=5, crops_for_mb=[1], init_memory_pass=True)
    cfg.update(over)
    cls = DeepClusterV2PluginLoss if kind == "deepclusterv2" else SeLaV2PluginLoss
    return cls.from_config(AttrDict(cfg))


def paper_loss(scores, labels, tau):
    """l(z, c, q) = - sum_k q^(k) log p^(k), averaged over rows with a label."""
    keep = labels != IGNORE_INDEX
    logp = torch.log_softmax(scores[keep] / tau, dim=1)
    return -logp.gather(1, labels[keep, None]).mean()


def test_loss_is_the_papers_cross_entropy_and_fills_the_bank():
    loss = make_loss("deepclusterv2")
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([7, 2, 9])
    B, nc = 3, 2
    emb = F.normalize(torch.randn(B * nc, 5, generator=g), dim=1)
    scores = [torch.randn(B * nc, 3, generator=g), torch.randn(B * nc, 4, generator=g)]
    loss.assignments[0] = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    loss.assignments[1] = torch.tensor([3, 2, IGNORE_INDEX, 0, 1, 2, 3, 0, 1, 2])
    loss.set_batch(ids.repeat(nc), nc, True)
    got = loss([emb] + scores, torch.zeros(B * nc))
    rows = ids.repeat(nc)
    want = (paper_loss(scores[0], loss.assignments[0][rows], 0.1)
            + paper_loss(scores[1], loss.assignments[1][rows], 0.1)) / 2
    assert torch.allclose(got, want, atol=1e-6)
    # crops_for_mb=[1]: the second crop's embeddings went to the bank, tagged with the ids
    bank_ids, bank = loss.memory.local_rows(0)
    assert torch.equal(bank_ids, ids) and torch.allclose(bank, emb[B:])
    # with a head that returns only the embedding, the loss scores it against its centroids
    loss.centroids(0).copy_(F.normalize(torch.randn(3, 5, generator=g), dim=1))
    loss.centroids(1).copy_(F.normalize(torch.randn(4, 5, generator=g), dim=1))
    loss.set_batch(ids.repeat(nc), nc, False)  # not training: the bank is left alone
    got = loss(emb, torch.zeros(B * nc))
    want = sum(paper_loss(emb @ loss.centroids(h).T, loss.assignments[h][rows], 0.1) for h in (0, 1)) / 2
    assert torch.allclose(got, want, atol=1e-6)
    assert loss.memory.ptr == B


def test_sela_soft_labels_loss():
    loss = make_loss("selav2", hard_labels=False, num_clusters=[3])
    g = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(10, 3, generator=g), dim=1)
    loss.soft_codes(0).copy_(q)
    loss.assignments[0] = q.argmax(1)
    ids = torch.tensor([4, 0])
    emb = F.normalize(torch.randn(4, 5, generator=g), dim=1)
    s = torch.randn(4, 3, generator=g)
    loss.set_batch(ids.repeat(2), 2, True)
    got = loss([emb, s], ids.repeat(2))
    want = -(q[ids.repeat(2)] * torch.log_softmax(s / 0.1, dim=1)).sum(1).mean()
    assert torch.allclose(got, want, atol=1e-6)


def test_runtime_checks_name_the_key():
    from vissl.config import AttrDict

    from vissl_swav_plugin.config.validation import ConfigError

    with pytest.raises(ConfigError, match="num_clusters"):
        make_loss("deepclusterv2", num_clusters=[11])  # more clusters than samples
    with pytest.raises(ConfigError, match="num_train_samples"):
        make_loss("deepclusterv2", num_train_samples=-1)
    loss = make_loss("deepclusterv2")
    task = SimpleNamespace(datasets={"train": list(range(12))}, dataloaders={},
                           config=AttrDict({"DATA": {"TRAIN": {"TRANSFORMS": []}}}),
                           base_model=torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="num_train_samples"):  # bank sized for 10, data has 12
        loss.setup(task)
    other = make_loss("deepclusterv2", num_train_samples=9, num_clusters=[3, 4])
    with pytest.raises(ConfigError, match="num_train_samples"):
        loss.load_state_dict(other.state_dict())
    loss.set_batch(torch.tensor([3, 11, 3, 11]), 2, True)  # sample index 11 >= 10
    with pytest.raises(ConfigError, match="num_train_samples"):
        loss([torch.randn(4, 5), torch.randn(4, 3), torch.randn(4, 4)], torch.zeros(4))
    single = make_loss("deepclusterv2", crops_for_mb=[0, 2])
    single.set_batch(torch.tensor([1, 2, 1, 2]), 2, True)  # 2 crops: crop 2 does not exist
    with pytest.raises(ConfigError, match="crops_for_mb"):
        single([torch.randn(4, 5), torch.randn(4, 3), torch.randn(4, 4)], torch.zeros(4))

@pytest.mark.parametrize("kind", ["deepclusterv2", "selav2"])
def test_non_finite_scores_stop_with_dump(kind, tmp_path):
    from vissl_swav_plugin.utils.nonfinite import NonFiniteLossError
    from vissl_swav_plugin.losses.swav_loss import NonFiniteLossError as SwAVError

    assert NonFiniteLossError is SwAVError  # one error class for every loss
    loss = make_loss(kind, output_dir=str(tmp_path))
    g = torch.Generator().manual_seed(2)
    ids = torch.tensor([1, 5, 8]).repeat(2)
    emb = F.normalize(torch.randn(6, 5, generator=g), dim=1)
    scores = [torch.randn(6, 3, generator=g), torch.randn(6, 4, generator=g)]
    loss.assignments.copy_(torch.randint(0, 3, (2, 10), generator=g))
    loss.set_batch(ids, 2, True, 7)
    assert torch.isfinite(loss([emb] + scores, ids))  # finite input: no guard, no dump
    assert not list(tmp_path.iterdir())
    scores[1][4, 2] = float("nan")
    loss.set_batch(ids, 2, True, 8)
    with pytest.raises(NonFiniteLossError, match="saved to") as err:
        loss([emb] + scores, ids)
    dumps = list(tmp_path.glob("nonfinite_rank0_*.pth"))
    assert [d.name for d in dumps] == ["nonfinite_rank0_iter8_head1.pth"]
    assert str(dumps[0]) in str(err.value) and "head 1" in str(err.value)
    saved = torch.load(dumps[0])
    assert torch.isnan(saved["scores"]).sum() == 1 and saved["iteration"] == 8


@pytest.mark.parametrize("kind", ["deepclusterv2", "selav2"])
def test_non_finite_memory_bank_stops_the_clustering(kind, tmp_path):
    from vissl_swav_plugin.utils.nonfinite import NonFiniteLossError

    loss = make_loss(kind, output_dir=str(tmp_path), num_clusters=[2])
    x = F.normalize(torch.randn(4, 5), dim=1)
    x[2, 0] = float("inf")
    loss.memory.add(torch.tensor([0, 3, 6, 9]), [x])
    task = SimpleNamespace(base_model=torch.nn.Linear(2, 2), iteration=12)
    with pytest.raises(NonFiniteLossError, match="memory bank rows"):
        loss.start_epoch(task, 1)
    saved = torch.load(tmp_path / "nonfinite_rank0_iter12_head0.pth")
    assert torch.equal(saved["ids"], torch.tensor([0, 3, 6, 9])) and torch.isinf(saved["bank_rows"]).sum() == 1


N = 32  # DATA_LIMIT of the quick configs
METHODS = {
    "dc": dict(
        config="pretrain/deepcluster_v2/deepclusterv2_quick_cpu",
        loss="deepclusterv2_plugin_loss",
        # fp64 k-means: one process and two processes then agree bit for bit
        extra=["config.LOSS.deepclusterv2_plugin_loss.kmeans_dtype=float64"],
    ),
    "sela": dict(config="pretrain/sela_v2/selav2_quick_cpu", loss="selav2_plugin_loss", extra=[]),
}


# ------------------------------------------------------------------ end to end
def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def protos(ck, h):
    return ck["classy_state_dict"]["base_model"]["model"]["heads"][f"0.prototypes{h}.weight"]


@pytest.fixture(scope="module", params=sorted(METHODS))
def runs(request, tmp_path_factory):
    m = METHODS[request.param]
    root = tmp_path_factory.mktemp(f"e2e_{request.param}")
    ck_a, ck_b = root / "a", root / "b"
    base = [f"config={m['config']}"] + m["extra"]
    a = run_launcher(base + [f"config.CHECKPOINT.DIR={ck_a}"], cwd=root)
    # resume from the epoch-0 checkpoint alone, in a fresh folder
    ck_b.mkdir()
    shutil.copy(ck_a / "model_phase0.torch", ck_b / "model_phase0.torch")
    os.symlink("model_phase0.torch", ck_b / "checkpoint.torch")
    b = run_launcher(base + [f"config.CHECKPOINT.DIR={ck_b}"], cwd=root)
    return dict(
        method=request.param,
        loss=m["loss"],
        log_a=a.stdout,
        log_b=b.stdout,
        a0=load(ck_a / "model_phase0.torch"),
        a1=load(ck_a / "model_final_checkpoint_phase1.torch"),
        b1=load(ck_b / "model_final_checkpoint_phase1.torch"),
    )


def test_both_ranks_label_epoch1_from_the_epoch0_bank(runs):
    name, log = runs["loss"], runs["log_a"]
    for rank in (0, 1):
        assert re.search(rf"{name}: rank {rank}: epoch 0: pseudo-labels from the memory bank filled in "
                         rf"the initial forward pass \({N} rows over 2 processes\)", log)
        assert re.search(rf"{name}: rank {rank}: epoch 1: pseudo-labels from the memory bank filled in "
                         rf"epoch 0 \({N} rows over 2 processes\); samples labelled per clustering: "
                         rf"\[{N}, {N}, {N}\]", log)
    losses = [float(x) for x in re.findall(r"loss: ([-\d.eE+naif]+);", log)]
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))


def test_checkpoint_holds_the_whole_bank_of_both_ranks(runs):
    for ck, epoch in ((runs["a0"], 0), (runs["a1"], 1)):
        st = ck["loss"]
        assert int(st["memory_epoch"]) == epoch and int(st["assign_epoch"]) == epoch
        # every sample once: the two processes' rows (16 each), gathered at the epoch end
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
    log_b = runs["log_b"]
    name = runs["loss"]
    for rank in (0, 1):
        assert re.search(rf"{name}: rank {rank}: memory bank restored \(16 of {N} rows, filled in epoch 0\)", log_b)
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
KNN_MIN_GAIN = {"dc": 0.02, "sela": 0.01}
KNN_OPT_IN = {"sela"}
KNN_METHODS = {
    "dc": ("pretrain/deepcluster_v2/deepclusterv2_quick_cpu", "deepclusterv2_plugin_head"),
    "sela": ("pretrain/sela_v2/selav2_quick_cpu", "swav_plugin_head"),
}


@pytest.mark.parametrize("method", [
    pytest.param(m, marks=pytest.mark.skipif(
        m in KNN_OPT_IN and not SLOW,
        reason="opt-in (VISSL_SWAV_PLUGIN_SLOW_TESTS=1): SeLa-v2's kNN gain at this size varies too much "
               "across seeds (+1.8 to +3.8 points) for a CI assertion"))
    for m in sorted(KNN_METHODS)
])
def test_knn_beats_random_init_on_fashion_mnist(method, tmp_path):
    """1000 Fashion-MNIST training images (100 per class, 32 px), 20 epochs, 2 processes;
    20-NN top-1 on 1000 test images of the trunk's features vs the same trunk at random
    init (mean of 3 initialisations); margins measured over two seeds (see KNN_MIN_GAIN)."""
    import subprocess
    import sys

    from _helpers_clustering import knn_accuracy
    from conftest import REPO

    data = tmp_path / "fm"
    subprocess.run([sys.executable, str(REPO / "tools" / "prepare_fashion_mnist.py"), "--out", str(data),
                    "--limit-per-class", "100", "--size", "32", "--rgb", "--format", "folder"], check=True)
    cfg_name, head = KNN_METHODS[method]
    over = [
        f"config={cfg_name}",
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]",
        f"config.DATA.TRAIN.DATA_PATHS=[{data / 'train'}]", f"config.DATA.TRAIN.LABEL_PATHS=[{data / 'train'}]",
        "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
        "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.WIDTH=16",
        f"config.MODEL.HEAD.PARAMS=[[{head},{{dims:[128,128,32],use_bn:True,num_clusters:[10,10,10]}}]]",
        "config.OPTIMIZER.num_epochs=20", "config.OPTIMIZER.use_larc=True",
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
    inits = [KNN_SEED * 20 + 1000 * j for j in range(3)]
    per_init = [knn_accuracy(cfg, data / "train", data / "val", seed=s) for s in inits]
    random_init = sum(per_init) / len(per_init)
    trained = knn_accuracy(cfg, data / "train", data / "val", ckdir / "model_final_checkpoint_phase19.torch")
    print(f"{method} seed {KNN_SEED}: kNN top-1 trained {trained:.4f} vs random init {random_init:.4f} "
          f"(inits {[round(a, 4) for a in per_init]})")
    assert trained >= random_init + KNN_MIN_GAIN[method]
