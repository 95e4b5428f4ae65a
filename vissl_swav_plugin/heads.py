"""Projection head + prototypes for SwAV (paper Sec. 3.1, appendix A.1), registered as
``swav_plugin_head``.

Output format matches VISSL's ``swav_head`` -- ``[z, z @ C_0^T, z @ C_1^T, ...]`` with ``z``
the L2-normalised projection -- so VISSL's tooling (feature extraction, linear eval) and
our loss both consume it.  Differences from VISSL's head: prototypes are unit-norm from
initialisation (so freezing and re-normalising commute), the prototype layers are found
by type (:func:`find_prototype_heads`) instead of by parameter-name prefix, which is what
makes our freeze / normalisation / queue hooks independent of DDP/FSDP wrappers, and the
constructor validates its arguments.
"""
from typing import List, Sequence

import torch
import torch.nn as nn
from vissl.models.heads import register_model_head


def _check_dims(dims, num_clusters):
    if not isinstance(dims, (list, tuple)) or len(dims) < 2 or any(int(d) <= 0 for d in dims):
        raise ValueError(
            f"swav_plugin_head: 'dims' must list >= 2 positive sizes, e.g. [2048, 2048, 128]; got {dims!r}"
        )
    if not isinstance(num_clusters, (list, tuple)) or any(int(k) <= 0 for k in num_clusters):
        raise ValueError(
            f"swav_plugin_head: 'num_clusters' must be a list of positive prototype counts, e.g. [3000]; "
            f"got {num_clusters!r}"
        )


@register_model_head("swav_plugin_head")
class SwAVPluginHead(nn.Module):
    """MLP projection (Linear [-> BN] -> ReLU ... -> Linear), L2 norm, K prototypes per set.

    Args (``MODEL.HEAD.PARAMS`` entry ``["swav_plugin_head", {...}]``):
        dims: layer sizes, e.g. ``[2048, 2048, 128]`` (the paper's 2-layer MLP to 128-D).
        num_clusters: prototype counts, one entry per prototype set, e.g. ``[3000]``.
        use_bn: BatchNorm after hidden linear layers.
        use_bias: bias in the projection layers (prototypes never have one).
        return_embeddings: put the normalised embedding first in the output (the loss
            needs it for the queue).
        normalize_feats: L2-normalise the projection (the paper's ``z``).
    """

    def __init__(
        self,
        model_config,
        dims: Sequence[int],
        num_clusters: Sequence[int],
        use_bn: bool = True,
        use_bias: bool = True,
        return_embeddings: bool = True,
        normalize_feats: bool = True,
    ):
        super().__init__()
        _check_dims(dims, num_clusters)
        dims = [int(d) for d in dims]
        eps = getattr(getattr(model_config, "HEAD", None), "BATCHNORM_EPS", 1e-5) if model_config else 1e-5
        mom = getattr(getattr(model_config, "HEAD", None), "BATCHNORM_MOMENTUM", 0.1) if model_config else 0.1
        layers: List[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(d_in, d_out, bias=use_bias))
            if i < len(dims) - 2:  # hidden layer
                if use_bn:
                    layers.append(nn.BatchNorm1d(d_out, eps=eps, momentum=mom))
                layers.append(nn.ReLU(inplace=True))
        self.projection_head = nn.Sequential(*layers)
        self.normalize_feats = normalize_feats
        self.return_embeddings = return_embeddings
        self.num_clusters = [int(k) for k in num_clusters]
        self.nmb_heads = len(self.num_clusters)
        for i, k in enumerate(self.num_clusters):
            proto = nn.Linear(dims[-1], k, bias=False)
            with torch.no_grad():
                proto.weight.copy_(nn.functional.normalize(proto.weight, dim=1, p=2))
            self.add_module(f"prototypes{i}", proto)

    def prototype_layers(self) -> List[nn.Linear]:
        return [getattr(self, f"prototypes{i}") for i in range(self.nmb_heads)]

    @torch.no_grad()
    def normalize_prototypes(self) -> None:
        for layer in self.prototype_layers():
            w = layer.weight
            w.copy_(nn.functional.normalize(w.float(), dim=1, p=2).to(w.dtype))

    def forward(self, batch: torch.Tensor):
        if isinstance(batch, (list, tuple)):
            if len(batch) != 1:
                raise ValueError(f"swav_plugin_head expects one input tensor, got {len(batch)}")
            batch = batch[0]
        if batch.dim() > 2:
            batch = torch.flatten(batch, start_dim=1)
        z = self.projection_head(batch)
        if self.normalize_feats:
            z = nn.functional.normalize(z, dim=1, p=2)
        out = [z] if self.return_embeddings else []
        out.extend(layer(z) for layer in self.prototype_layers())
        return out


def find_prototype_heads(model: nn.Module) -> List[SwAVPluginHead]:
    """Every :class:`SwAVPluginHead` inside ``model``, whatever wraps it (DDP, FSDP, ...)."""
    return [m for m in model.modules() if isinstance(m, SwAVPluginHead)]


def prototype_parameters(model: nn.Module) -> List[nn.Parameter]:
    return [layer.weight for head in find_prototype_heads(model) for layer in head.prototype_layers()]
