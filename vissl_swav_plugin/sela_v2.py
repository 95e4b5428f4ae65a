"""SeLa-v2 (SwAV paper, appendix "Details on Clustering-Based methods") for VISSL.

Registered loss ``selav2_plugin_loss`` (:class:`SeLaV2PluginLoss`).  No public
implementation exists; this follows the paper:

* training phase: ``min_{z, c} l(z, c, q)`` -- the cross-entropy between the pseudo-labels
  ``q`` and ``softmax(z^T c / tau)``, over all crops, averaged over the clusterings; the
  prototypes ``c`` are ordinary head parameters learned by SGD (use VISSL's
  ``swav_head``), L2-normalised after every update like SwAV's;
* assignment phase (start of every epoch): ``min_q l(z, c, q)`` under the equipartition
  constraint over the *whole dataset*, solved by Sinkhorn-Knopp on the scores of the
  memory bank (features of the previous epoch, no extra forward pass) against the
  current prototypes.  The bank rows are split over the processes and
  ``sinkhorn_knopp`` all-reduces its marginals, so the labels equal those of a single
  process holding the whole bank.  Pseudo-labels are hard (argmax of the transport
  plan, as in SeLa) or, with ``hard_labels: false``, the soft codes themselves (a
  dataset x K table per clustering: small datasets only).

Extra config: ``sinkhorn_epsilon`` (0.01, entropic regularisation of the scores
``z^T c``; SeLa's lambda corresponds to ``tau / epsilon``; smaller values make the hard
labels closer to an exact equipartition but need more iterations),
``sinkhorn_iterations`` (200),
``sinkhorn_dtype`` (float64 | float32), ``hard_labels`` (true),
``normalize_prototypes`` (true).
"""
import logging

import torch
import torch.nn.functional as F
from classy_vision.losses import register_loss

from vissl_swav_plugin import clustering as C
from vissl_swav_plugin.config_validation import register_config_inference
from vissl_swav_plugin.deepcluster_v2 import (
    MemoryBankClusteringLoss,
    MemoryClusteringHook,
    find_prototype_params,
    infer_clustering_loss_config,
)
from vissl_swav_plugin.hooks import register_loss_hooks



@register_loss("selav2_plugin_loss")
class SeLaV2PluginLoss(MemoryBankClusteringLoss):
    LOSS_NAME = "selav2_plugin_loss"
    PROTOTYPES_TRAINABLE = True
    REQUIRES_HEAD_PROTOTYPES = True

    def __init__(self, loss_config):
        super().__init__(loss_config)
        self.epsilon = float(self._get("sinkhorn_epsilon", 0.01))
        if not self.epsilon > 0:
            self._bad("sinkhorn_epsilon", f"must be > 0, got {self.epsilon}")
        self.sinkhorn_iterations = int(self._get("sinkhorn_iterations", 200))
        if self.sinkhorn_iterations < 1:
            self._bad("sinkhorn_iterations", f"must be >= 1, got {self.sinkhorn_iterations}")
        dt = str(self._get("sinkhorn_dtype", "float64"))
        if dt not in ("float32", "float64"):
            self._bad("sinkhorn_dtype", f"must be float32 or float64, got {dt}")
        self.sinkhorn_dtype = getattr(torch, dt)
        self.hard_labels = bool(self._get("hard_labels", True))
        self.normalize_prototypes = bool(self._get("normalize_prototypes", True))
        if not self.hard_labels:
            for h, k in enumerate(self.num_clusters):
                self.register_buffer(f"soft_codes{h}", torch.zeros(self.num_train_samples, k))
        self._prototypes = None

    def soft_codes(self, h: int) -> torch.Tensor:
        return getattr(self, f"soft_codes{h}")

    def check_model(self, model):
        super().check_model(model)
        self._prototypes = {h: p for h, (n, p) in find_prototype_params(model).items()}

    def prototypes(self, model):
        if self._prototypes is None:
            self._prototypes = {h: p for h, (n, p) in find_prototype_params(model).items()}
        return self._prototypes

    def compute_assignments(self, model, epoch):
        protos = self.prototypes(model)
        counts_min, counts_max = [], []
        for h, K in enumerate(self.num_clusters):
            ids, x = self.memory.local_rows(self.bank_of_head(h))
            codes = C.sela_assign(
                x,
                protos[h].detach(),
                epsilon=self.epsilon,
                num_iters=self.sinkhorn_iterations,
                hard=False,
                dtype=self.sinkhorn_dtype,
            )
            labels = codes.argmax(dim=1)
            self.assignments[h].copy_(C.gather_table(ids, labels, self.num_train_samples))
            if not self.hard_labels:
                self.soft_codes(h).copy_(
                    C.gather_table(ids, codes.float(), self.num_train_samples, fill=0.0)
                )
            a = self.assignments[h]
            cnt = torch.bincount(a[a >= 0], minlength=K)
            counts_min.append(int(cnt.min()))
            counts_max.append(int(cnt.max()))
        return {"cluster_size_min": counts_min, "cluster_size_max": counts_max}

    def head_loss(self, h, scores, ids):
        if self.hard_labels:
            return super().head_loss(h, scores, ids)
        logp = F.log_softmax(scores.float() / self.temperature, dim=1)
        q = self.soft_codes(h)[ids]
        valid = (self.assignments[h][ids] != C.IGNORE_INDEX).to(logp.dtype)
        return -((q * logp).sum(dim=1) * valid).sum() / valid.sum().clamp_min(1)

    @torch.no_grad()
    def after_update(self, task):
        if not self.normalize_prototypes:
            return
        for p in self.prototypes(task.base_model).values():
            p.data.copy_(F.normalize(p.data, dim=1))

    def extra_state(self):
        if self.hard_labels:
            return {}
        return {f"soft_codes{h}": self.soft_codes(h) for h in range(self.num_heads)}

    def load_extra_state(self, sd):
        if self.hard_labels:
            return
        for h in range(self.num_heads):
            k = f"soft_codes{h}"
            if k in sd:
                self.soft_codes(h).copy_(sd[k].to(self.soft_codes(h).device))


@register_config_inference("selav2_plugin_loss")
def infer_selav2_plugin_loss(cfg):
    return infer_clustering_loss_config(cfg, "selav2_plugin_loss", deepcluster=False)


@register_loss_hooks("selav2_plugin_loss")
def selav2_hooks(cfg):
    return [MemoryClusteringHook()]
