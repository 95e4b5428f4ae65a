"""Mixed precision of DeepCluster-v2 / SeLa-v2 (issue 11, item 1: the clustering part).

Under VISSL's CUDA AMP the bank's k-means, SeLa-v2's assignment and both losses run
inside ``torch.autocast`` (fp16 by default).  Each must compute with autocast off, in
fp32 (or the configured fp64), whatever dtype its inputs arrive in: here each runs under
CUDA-like fp16 autocast emulated on CPU (``autocast_emulator.cuda_like_autocast``: the matmul
family cast to the autocast dtype, as CUDA does), bf16 likewise, and plain CPU bf16
autocast, and must equal the fp32 computation outside autocast on the same (rounded)
inputs: same k-means assignments and centroids within 1e-5 from the same initial
centroids, same SeLa codes, losses within 1e-5.  Inputs include the degenerate bank:
every embedding near one direction and one centroid / prototype opposite to it.
"""
import pytest
import torch
import torch.nn.functional as F

from autocast_emulator import AMP_MODES
from vissl_swav_plugin.utils.clustering import sela_assign, spherical_kmeans

MODES = sorted(AMP_MODES)


def low_dtype(mode):
    """The dtype the head's outputs have under ``mode``."""
    return torch.bfloat16 if "bf16" in mode else torch.float16


def bank(kind, n=2000, D=32, K=20, seed=0):
    """(rows [n, D], initial centroids / prototypes [K, D]) of a ``planted`` bank (overlapping
    clusters: many rows near a decision boundary) or a ``degenerate`` one (all rows near
    one direction, centroid / prototype 0 opposite to it)."""
    g = torch.Generator().manual_seed(seed)
    c = F.normalize(torch.randn(K, D, generator=g), dim=1)
    if kind == "degenerate":
        x = F.normalize(c[1] + 0.05 * torch.randn(n, D, generator=g), dim=1)
        c[0] = -c[1]
        c[2:] = F.normalize(c[1] + 0.05 * torch.randn(K - 2, D, generator=g), dim=1)
    else:
        labels = torch.randint(K, (n,), generator=g)
        x = F.normalize(c[labels] + 0.6 * torch.randn(n, D, generator=g), dim=1)
        c = F.normalize(c + 0.3 * torch.randn(K, D, generator=g), dim=1)
    return x, c


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["planted", "degenerate"])
@pytest.mark.parametrize("bank_dtype", [torch.float32, torch.float16])
def test_kmeans_under_amp_equals_fp32(mode, kind, bank_dtype):
    x, init = bank(kind)
    x = x.to(bank_dtype)  # a bank stored in the head's AMP dtype
    ids = torch.arange(x.shape[0])
    ref_c, ref_a, _ = spherical_kmeans(x, ids, init.shape[0], 10, init_centroids=init)
    with AMP_MODES[mode]():
        c, a, _ = spherical_kmeans(x, ids, init.shape[0], 10, init_centroids=init)
    assert c.dtype == torch.float32 and torch.isfinite(c).all()
    assert torch.equal(a, ref_a), int((a != ref_a).sum())
    assert torch.allclose(c, ref_c, rtol=0, atol=1e-5), (c - ref_c).abs().max()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("init", ["random", "kmeans++"])
def test_kmeans_initialisation_under_amp_equals_fp32(mode, init):
    """The seeded initialisations (k-means++ scores rows with matmuls) as well."""
    x, _ = bank("planted", n=1500, K=12, seed=3)
    ids = torch.arange(x.shape[0])
    ref_c, ref_a, _ = spherical_kmeans(x, ids, 12, 5, seed=7, init=init)
    with AMP_MODES[mode]():
        c, a, _ = spherical_kmeans(x, ids, 12, 5, seed=7, init=init)
    assert torch.equal(a, ref_a) and torch.allclose(c, ref_c, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["planted", "degenerate"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sela_assign_under_amp_equals_fp32(mode, kind, dtype):
    x, protos = bank(kind, n=3000, K=30, seed=1)
    ref = sela_assign(x, protos, epsilon=0.05, num_iters=3, hard=False, dtype=dtype)
    with AMP_MODES[mode]():
        got = sela_assign(x, protos, epsilon=0.05, num_iters=3, hard=False, dtype=dtype)
        labels = sela_assign(x, protos, epsilon=0.05, num_iters=3, hard=True, dtype=dtype)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.allclose(got, ref, rtol=0, atol=1e-5), (got - ref).abs().max()
    assert torch.equal(labels, ref.argmax(1))


# ------------------------------------------------------------------ the losses' forward
N_TRAIN = 4096  # samples of the dataset (pseudo-label table rows)


def make_loss(kind, K, D, **over):
    from vissl.config import AttrDict

    from vissl_swav_plugin.losses.deepcluster_v2 import DeepClusterV2PluginLoss
    from vissl_swav_plugin.losses.sela_v2 import SeLaV2PluginLoss

    cfg = dict(name=f"{kind}_plugin_loss", num_train_samples=N_TRAIN, temperature=0.1, num_clusters=[K, K],
               embedding_dim=D, crops_for_mb=[0], init_memory_pass=True)
    cfg.update(over)
    cls = DeepClusterV2PluginLoss if kind == "deepclusterv2" else SeLaV2PluginLoss
    return cls.from_config(AttrDict(cfg))


def loss_inputs(K=3000, D=32, B=64, V=2):
    """Degenerate batch: embeddings near prototype 1, prototype 0 opposite; pseudo-labels
    that include the dead prototype (a large -log p)."""
    g = torch.Generator().manual_seed(5)
    c = F.normalize(torch.randn(K, D, generator=g), dim=1)
    c[0] = -c[1]
    emb = F.normalize(c[1] + 0.05 * torch.randn(V * B, D, generator=g), dim=1)
    labels = torch.randint(K, (N_TRAIN,), generator=g)
    labels[:8] = 0
    return c, emb, labels, torch.arange(B).repeat(V), V


def run_loss(kind, c, emb, labels, ids, V, scores, tmp_path, **over):
    K, D = c.shape
    loss = make_loss(kind, K, D, output_dir=str(tmp_path), **over)
    loss.assignments.copy_(labels.expand(2, -1))
    if kind == "deepclusterv2":
        loss.centroids(0).copy_(c)
        loss.centroids(1).copy_(c)
    if not getattr(loss, "hard_labels", True):
        q = torch.softmax(torch.randn(N_TRAIN, K, generator=torch.Generator().manual_seed(2)) * 3, dim=1)
        loss.soft_codes(0).copy_(q)
        loss.soft_codes(1).copy_(q)
    loss.set_batch(ids, V, True)
    return loss(emb if scores is None else [emb] + scores, ids)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind,over,head_scores", [
    ("deepclusterv2", {}, True),     # centroids in the frozen prototype head
    ("deepclusterv2", {}, False),    # head without prototypes: the loss scores the embedding
    ("selav2", {}, True),
    ("selav2", {"hard_labels": False}, True),
])
def test_loss_under_amp_equals_fp32(mode, kind, over, head_scores, tmp_path):
    """Under AMP the head gives fp16 / bf16 embeddings and scores: the loss of those under
    autocast equals the fp32 loss outside autocast of the same rounded values."""
    c, emb, labels, ids, V = loss_inputs()
    low = low_dtype(mode)
    emb_low = emb.to(low)
    scores_low = [(emb @ c.t()).to(low)] * 2 if head_scores else None
    expected = run_loss(kind, c, emb_low.float(), labels, ids, V,
                        None if scores_low is None else [s.float() for s in scores_low], tmp_path, **over)
    with AMP_MODES[mode]():
        got = run_loss(kind, c, emb_low, labels, ids, V, scores_low, tmp_path, **over)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), (got.item(), expected.item())
