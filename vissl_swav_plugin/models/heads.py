"""Projection head + prototypes for SwAV (paper Sec. 3.1, appendix A.1), registered as
``swav_plugin_head``, and its DeepCluster-v2 variant with frozen prototypes that hold the
k-means centroids, ``deepclusterv2_plugin_head`` (:class:`DeepClusterV2PluginHead`).

Output format matches VISSL's ``swav_head`` -- ``[z, z @ C_0^T, z @ C_1^T, ...]`` with ``z``
the L2-normalised projection -- so VISSL's tooling (feature extraction, linear eval) and
our loss both consume it.  Differences from VISSL's head: prototypes are unit-norm from
initialisation (so freezing and re-normalising commute), the prototype layers are found
by name wherever they sit (:func:`find_prototype_layers`) instead of by parameter-name prefix, which is what
makes our freeze / normalisation / queue hooks independent of DDP/FSDP wrappers, and the
constructor validates its arguments.
"""
import re
from typing import Dict, List, Sequence, Tuple

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
        output_bn: BatchNorm without affine parameters on the projection's output, before
            the L2 normalisation (not in the paper or the reference: off by default).  It
            centres the embeddings over the batch, so that no input-independent part of
            ``z`` can dominate every sample's prototype scores (docs/experiments/collapse.md).
        fp32_head: under autocast (AMP), run this head -- projection, normalisation and
            prototype scores -- in fp32 on an fp32 copy of the trunk's features; the trunk
            keeps the autocast dtype.  Off by default: the reference runs the head under AMP
            like the rest of the model.  bf16 rounds a cosine score to about 2^-8, which the
            temperature (0.1) turns into about 0.04 in the logits; the head costs little next
            to the trunk (docs/demo.md, "bf16 autocast on CPU").  No effect without autocast.
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
        output_bn: bool = False,
        fp32_head: bool = False,
    ):
        super().__init__()
        _check_dims(dims, num_clusters)
        switches = dict(use_bn=use_bn, use_bias=use_bias, return_embeddings=return_embeddings,
                        normalize_feats=normalize_feats, output_bn=output_bn, fp32_head=fp32_head)
        for name, value in switches.items():  # a quoted "false" would otherwise switch it on
            if not isinstance(value, bool):
                raise ValueError(f"swav_plugin_head: {name!r} must be True or False, got {value!r}")
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
        if output_bn:
            layers.append(nn.BatchNorm1d(dims[-1], eps=eps, momentum=mom, affine=False))
        self.projection_head = nn.Sequential(*layers)
        self.normalize_feats = normalize_feats
        self.fp32_head = fp32_head
        self.return_embeddings = return_embeddings
        self.num_clusters = [int(k) for k in num_clusters]
        self.nmb_heads = len(self.num_clusters)
        for i, k in enumerate(self.num_clusters):
            proto = nn.Linear(dims[-1], k, bias=False)
            with torch.no_grad():
                proto.weight.copy_(nn.functional.normalize(proto.weight, dim=1, p=2))
            self.add_module(f"prototypes{i}", proto)

    def prototype_layers(self) -> List[nn.Linear]:
        """The prototype layers (one ``nn.Linear`` per prototype set, no bias)."""
        return [getattr(self, f"prototypes{i}") for i in range(self.nmb_heads)]

    def normalize_prototypes(self) -> None:
        """L2-normalise every prototype of this head in place."""
        normalize_prototypes_(self.prototype_layers())

    def forward(self, batch: torch.Tensor):
        """``[embedding, scores of each prototype set]``: the projection MLP's L2-normalised output and its scores against every prototype set."""
        if isinstance(batch, (list, tuple)):
            if len(batch) != 1:
                raise ValueError(f"swav_plugin_head expects one input tensor, got {len(batch)}")
            batch = batch[0]
        device_type = batch.device.type
        if self.fp32_head and torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type, enabled=False):
                return self._scores(batch.float())
        return self._scores(batch)

    def _scores(self, batch: torch.Tensor):
        if batch.dim() > 2:
            batch = torch.flatten(batch, start_dim=1)
        z = self.projection_head(batch)
        if self.normalize_feats:
            z = nn.functional.normalize(z, dim=1, p=2)
        out = [z] if self.return_embeddings else []
        out.extend(layer(z) for layer in self.prototype_layers())
        return out


_PROTOTYPE_NAME = re.compile(r"prototypes(\d+)$")
#: name prefixes that wrappers (DDP, FSDP, activation checkpointing) put before a module's name
WRAPPER_PREFIXES = ("module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_fpw_module.")


def strip_wrapper_prefixes(name: str) -> str:
    """``name`` without the path components that DDP / FSDP / checkpoint wrappers insert."""
    parts = [p for p in name.split(".") if p + "." not in WRAPPER_PREFIXES]
    return ".".join(parts)


def find_prototype_layers(model: nn.Module) -> Dict[int, Tuple[str, nn.Linear]]:
    """The prototype layers ``C_h`` of ``model``: ``{h: (name, layer)}``, sorted by ``h``.

    A prototype layer is any sub-module called ``prototypes<h>`` -- the naming of our
    :class:`SwAVPluginHead` (and DeepCluster-v2's head built on it) and of VISSL's own
    ``swav_head`` -- found wherever it sits: in a plain model, under DDP's ``module.``,
    FSDP's or checkpoint wrappers (their prefixes are removed from ``name``).

    Raises:
        ValueError: a ``prototypes<h>`` module is not a plain bias-free ``nn.Linear``
            (weight-normalised prototypes are not supported), or two layers share ``h``.
    """
    found: Dict[int, Tuple[str, nn.Linear]] = {}
    for raw_name, module in model.named_modules():
        match = _PROTOTYPE_NAME.match(raw_name.rsplit(".", 1)[-1])
        if match is None:
            continue
        name = strip_wrapper_prefixes(raw_name)
        if not isinstance(module, nn.Linear) or "weight" not in module._parameters:
            raise ValueError(
                f"module {name}: only plain linear prototype layers are supported "
                "(weight-normalised prototypes are not)"
            )
        h = int(match.group(1))
        if h in found:
            raise ValueError(
                f"model has two prototype layers with index {h} ({found[h][0]} and {name}); "
                "use a single prototypes head"
            )
        found[h] = (name, module)
    return dict(sorted(found.items()))


def prototype_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The weight matrices (K_h x D) of every prototype layer of ``model``, in order of ``h``."""
    return [layer.weight for _, layer in find_prototype_layers(model).values()]


@torch.no_grad()
def normalize_prototypes_(layers: Sequence[nn.Linear]) -> None:
    """L2-normalise each prototype (each row of every layer's weight) in place, computing
    in fp32 whatever the parameter dtype (the paper: ``C`` has unit-norm columns)."""
    for layer in layers:
        w = layer.weight
        w.copy_(nn.functional.normalize(w.float(), dim=1, p=2).to(w.dtype))


@register_model_head("deepclusterv2_plugin_head")
class DeepClusterV2PluginHead(SwAVPluginHead):
    """``swav_plugin_head`` whose prototype layers are created frozen
    (``requires_grad=False``: DDP and the optimizer never see them); the DeepCluster-v2
    loss copies the k-means centroids into them at every epoch start.  Same arguments
    and output as ``swav_plugin_head``: ``[normalised embedding, scores_0, ...]``."""

    def __init__(self, model_config, dims, num_clusters, **kwargs):
        super().__init__(model_config, dims, num_clusters, **kwargs)
        for layer in self.prototype_layers():
            layer.weight.requires_grad_(False)
