"""DeepCluster-v2 (SwAV paper, appendix "Details on Clustering-Based methods") for VISSL.

DeepCluster-v2 is the memory-bank clustering of :mod:`vissl_swav_plugin.losses.memory_bank_loss` with
*k-means* as the assignment step and the *centroids as a frozen classifier*:

* assignment (start of epoch ``e``): spherical k-means (cosine similarity on unit
  vectors) of the features the memory bank holds from epoch ``e-1`` -- one k-means per
  clustering ``h``, with ``num_clusters[h]`` centroids, on the bank of crop
  ``crops_for_mb[h % len(crops_for_mb)]``; a sample's pseudo-label is its cluster;
* training: ``l(z, C_h, q_h)`` with the centroids ``C_h`` as the classification weights:
  they are not learned, only replaced at the next clustering.

Defaults follow the official ``main_deepclusterv2.py`` (facebookresearch/swav): k-means
starts from K random rows of the bank, an empty cluster keeps its previous centroid, and
the first bank is filled with one forward pass per crop of ``crops_for_mb``.  Options:
``kmeans_init: kmeans++``, ``reseed_empty_clusters: true`` (split the largest cluster),
``init_bank_forward: joint`` (one forward pass on all those crops).

Registered components
---------------------
* loss ``deepclusterv2_plugin_loss`` (:class:`DeepClusterV2PluginLoss`);
* head ``deepclusterv2_plugin_head``
  (:class:`~vissl_swav_plugin.models.heads.DeepClusterV2PluginHead`, with the other heads in
  :mod:`vissl_swav_plugin.models.heads`): the plugin's
  ``swav_plugin_head`` (projection MLP, L2-normalised embedding, one linear prototype
  layer per clustering) whose prototype weights are created with ``requires_grad=False``,
  so DDP and the optimizer never touch them.  At the start of every epoch the loss copies
  the k-means centroids into them (layers found by name, whatever wrapper prefix): the
  centroids *are* the frozen classification head, as in the paper.  A head without
  prototypes (e.g. ``mlp``) also works: the loss then scores against its own centroids;
* its hook (:class:`~vissl_swav_plugin.losses.memory_bank_hooks.MemoryClusteringHook`) and config
  inference (:func:`~vissl_swav_plugin.losses.clustering_config.infer_clustering_loss_config`).

Example config: ``configs/config/pretrain/deepcluster_v2/deepclusterv2_8node_resnet.yaml``
(3 clusterings of 3000 centroids, temperature 0.1, 800 epochs: the paper's 75.2% setting).
"""
from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from classy_vision.losses import register_loss

from vissl_swav_plugin.utils.clustering import KMEANS_INITS, spherical_kmeans
from vissl_swav_plugin.losses.clustering_config import DTYPES, require_choice
from vissl_swav_plugin.config.checkers import ConfigError, require_bool, require_int
from vissl_swav_plugin.config.registries import register_config_inference
from vissl_swav_plugin.utils.distributed import broadcast_
from vissl_swav_plugin.losses.memory_bank_loss import MemoryBankClusteringLoss, infer_clustering_loss_config

#: heads whose prototype layers are frozen, so they can hold the centroids
PROTOTYPE_HEADS_FROZEN = ("deepclusterv2_plugin_head",)


@register_loss("deepclusterv2_plugin_loss")
class DeepClusterV2PluginLoss(MemoryBankClusteringLoss):
    """DeepCluster-v2: spherical k-means pseudo-labels, centroids as frozen head.

    Config params (``LOSS.deepclusterv2_plugin_loss``): the keys of
    :class:`~vissl_swav_plugin.losses.memory_bank_loss.MemoryBankClusteringLoss`, and
        kmeans_iters (int, default 10): Lloyd iterations per clustering.
        kmeans_init (str, default "random"): K random samples (the reference code); or ``kmeans++``.
        kmeans_dtype (str, default "float32"): or ``float64``.
        seed (int, default 0): the k-means of epoch e, clustering h, uses seed ``seed + 1000003 * e + h``.
        reseed_empty_clusters (bool, default False): empty clusters keep their centroid (the
            reference code); True: split the largest cluster.

    The k-means and the loss run with autocast off (fp32 / ``kmeans_dtype``) under AMP.

    Works with ``deepclusterv2_plugin_head`` (centroids copied into its frozen prototype
    layers) or with a head that returns only the embedding (e.g. ``mlp``: the loss then
    scores the embedding against its own copy of the centroids, buffers ``centroids<h>``).
    """

    LOSS_NAME = "deepclusterv2_plugin_loss"
    #: the method's own keys and their defaults (the reference's: random k-means init, empty
    #: clusters left empty), read by both ``__init__`` and ``validate_method_config``
    DEFAULTS = dict(kmeans_iters=10, kmeans_init=KMEANS_INITS[0], kmeans_dtype="float32", seed=0,
                    reseed_empty_clusters=False)
    METHOD_CONFIG_KEYS = tuple(DEFAULTS)
    STATE_BUFFERS = ("centroids",)  # checkpointed with the loss

    def __init__(self, loss_config):
        super().__init__(loss_config)
        d = self.DEFAULTS
        self.kmeans_iters = self._at_least("kmeans_iters", d["kmeans_iters"], minimum=0)
        self.seed = int(self._get("seed", d["seed"]))
        self.kmeans_dtype = getattr(torch, self._choice("kmeans_dtype", d["kmeans_dtype"], DTYPES))
        self.kmeans_init = self._choice("kmeans_init", d["kmeans_init"], KMEANS_INITS)
        self.reseed_empty_clusters = self._flag("reseed_empty_clusters", d["reseed_empty_clusters"])
        for h, k in enumerate(self.num_clusters):
            self.register_buffer(f"centroids{h}", torch.zeros(k, self.embedding_dim))

    # ------------------------------------------------------------------ config
    @classmethod
    def check_head_config(cls, head_name, has_prototypes, prefix):
        """A head with prototypes must be one whose prototypes are frozen."""
        if has_prototypes and head_name not in PROTOTYPE_HEADS_FROZEN:
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: {prefix} uses the k-means centroids as a frozen "
                f"classification head, so its prototype head must be one of {list(PROTOTYPE_HEADS_FROZEN)} "
                f"(or a head without prototypes, e.g. mlp); got {head_name}"
            )

    @classmethod
    def validate_method_config(cls, lc, prefix):
        """``kmeans_iters``, ``seed``, ``kmeans_init``, ``reseed_empty_clusters``, ``kmeans_dtype``."""
        d = cls.DEFAULTS
        require_int(lc.get("kmeans_iters", d["kmeans_iters"]), f"{prefix}.kmeans_iters", minimum=0)
        require_int(lc.get("seed", d["seed"]), f"{prefix}.seed", minimum=0)
        require_choice(lc, "kmeans_init", KMEANS_INITS, prefix)
        require_bool(lc.get("reseed_empty_clusters", d["reseed_empty_clusters"]), f"{prefix}.reseed_empty_clusters")
        require_choice(lc, "kmeans_dtype", DTYPES, prefix)

    def check_model(self, model):
        """Prototype layers, if any, must be frozen: they hold the centroids."""
        protos = super().check_model(model)
        for name, layer in protos.values():
            if layer.weight.requires_grad:
                raise ValueError(
                    f"{self.name}: prototype parameter {name}.weight is trainable, but DeepCluster-v2 uses the "
                    "k-means centroids as a frozen classification head; use MODEL.HEAD.PARAMS "
                    "[[deepclusterv2_plugin_head, {...}]] (prototypes created with requires_grad=False)"
                )
        return protos

    # ------------------------------------------------------------------ the method
    def centroids(self, h: int) -> torch.Tensor:
        """The centroids ``C_h`` [K_h, D] of clustering ``h`` (unit rows once clustered)."""
        return getattr(self, f"centroids{h}")

    def scores_without_head_prototypes(self, emb: torch.Tensor) -> List[torch.Tensor]:
        """``normalize(z) C_h^T`` for every clustering (a head without prototypes)."""
        z = F.normalize(emb.float(), dim=1)
        return [z @ self.centroids(h).t() for h in range(self.num_heads)]

    def compute_assignments(self, model, epoch: int) -> Dict[str, Any]:
        """k-means of the bank for every clustering ``h`` (distributed: the rows of all
        processes): centroids (identical on every process, copied into the model's frozen
        head) and the pseudo-label table.  Returns the k-means objective and the number
        of re-seeded empty clusters per clustering."""
        info = {"objective": [], "reseeded": []}
        for h, K in enumerate(self.num_clusters):
            ids, x = self.bank_rows(h, epoch)
            cent, assign, inf = spherical_kmeans(
                x,
                ids,
                K,
                self.kmeans_iters,
                id_space=self.num_train_samples,
                seed=self.seed + 1000003 * epoch + h,
                dtype=self.kmeans_dtype,
                init=self.kmeans_init,
                reseed_empty=self.reseed_empty_clusters,
            )
            cent = broadcast_(cent.float().contiguous(), 0)
            self.centroids(h).copy_(cent)
            self.set_pseudo_labels(h, ids, assign)
            info["objective"].append(round(inf["objective"], 4))
            info["reseeded"].append(inf["reseeded"])
        self.restore_head(model)
        return info

    @torch.no_grad()
    def restore_head(self, model) -> None:
        """Copy the centroids into the model's (frozen) prototype layers."""
        for h, (_name, layer) in self.prototype_layers(model).items():
            layer.weight.data.copy_(self.centroids(h).to(layer.weight.device, layer.weight.dtype))



@register_config_inference("deepclusterv2_plugin_loss")
def infer_deepclusterv2_plugin_loss(cfg):
    """Config inference / checks of ``LOSS.deepclusterv2_plugin_loss`` (any launcher)."""
    return infer_clustering_loss_config(cfg, DeepClusterV2PluginLoss)
