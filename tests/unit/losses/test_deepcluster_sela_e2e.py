"""DeepCluster-v2 and SeLa-v2 in VISSL.

* Losses and config checks in one process: the loss against the paper's formula
  ``-sum_k q_k log p_k`` (``p = softmax(z.c / tau)``), bad values naming their key.
* End to end: 2 gloo processes through VISSL's stock launcher, 2 epochs on synthetic
  images with the plugin's quick CPU configs, then AUTO_RESUME from the epoch-0
  checkpoint in a fresh folder.  Independent truths: the pseudo-labels of epoch 1 are
  recomputed here, in one process, from the memory bank saved at the end of epoch 0
  (k-means with the loss's seed / Sinkhorn-Knopp with the prototypes saved at the end of
  epoch 0); the resumed run must reproduce the uninterrupted run's epoch-1 labels."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from testkit import compose
from vissl_swav_plugin.utils.memory_bank import IGNORE_INDEX
from deepcluster_sela_e2e_cases import load  # noqa: F401

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
    from vissl_swav_plugin.config.checkers import ConfigError

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

    from vissl_swav_plugin.config.checkers import ConfigError

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


