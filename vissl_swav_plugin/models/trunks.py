"""Small ResNets for CPU-scale runs, registered with VISSL's trunk registry.

VISSL's own ``resnet`` trunk only has depths 50/101/152/200 and an ImageNet stem (7x7
stride-2 conv + max-pool), which shrinks a 28-32 px image to 1 px before ``res5``.
``resnet_small_plugin`` is a ResNet-10/18/34-style network built from torchvision's
``BasicBlock`` with a *small-image stem* (3x3 stride-1 conv, no max-pool; the CIFAR
variant of He et al.) and configurable width and depth.  It follows VISSL's trunk
interface exactly like ``vissl.models.trunks.resnext.ResNeXt``:

* ``forward(x, out_feat_keys=None)`` returns a *list* of features, one per requested key
  (default: the last block, ``flatten``), through VISSL's ``get_trunk_forward_outputs``;
* the blocks live in ``self._feature_blocks`` named ``conv1, bn1, conv1_relu, maxpool,
  layer1..layer4, avgpool, flatten`` (so parameter names match VISSL's ResNe(X)t and
  torchvision's ResNet after stripping ``_feature_blocks.``), and ``feat_eval_mapping``
  gives VISSL's common names ``conv1, res1..res5, res5avg, flatten`` -- so linear
  evaluation configs (``TRUNK.*.OUT_FEAT_KEYS``, ``LINEAR_EVAL_FEAT_POOL_OPS_MAP``
  entries like ``["res5", ["AdaptiveAvgPool2d", [[1, 1]]]]``), feature extraction, kNN and
  SwAV heads work unchanged;
* VISSL's ``MultiDimensionalTensor`` inputs and activation checkpointing are supported.

Config (``MODEL.TRUNK``; every key optional, add the section with ``+`` on the command
line, e.g. ``+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.WIDTH=32``)::

    TRUNK:
      NAME: resnet_small_plugin
      RESNET_SMALL_PLUGIN:
        DEPTH: 18            # 10 | 18 | 34   (blocks per stage 1111 / 2222 / 3463)
        LAYERS: null         # or explicit blocks per stage, e.g. [1, 1, 1, 1]
        WIDTH: 64            # channels of the first stage; stages use W, 2W, 4W, 8W
        STEM: small          # small: 3x3/1 conv, no max-pool | imagenet: 7x7/2 + max-pool
        NORM: BatchNorm      # BatchNorm | GroupNorm
        GROUPNORM_GROUPS: 8
        ZERO_INIT_RESIDUAL: False
        CHANNELS_LAST: False # True: weights and activations in NHWC (channels-last) memory
                             # format; same numbers, faster convolutions on CPU (oneDNN)

The trunk's output dimension (``flatten``/``res5avg``) is ``8 * WIDTH``: use it as the
first entry of the head's ``dims`` (e.g. ``[512, 512, 128]`` for WIDTH 64).
"""
import logging
from typing import Dict, List, Sequence

import torch
import torch.nn as nn
from torchvision.models.resnet import BasicBlock
from vissl.data.collators.collator_helper import MultiDimensionalTensor
from vissl.models.model_helpers import (
    Flatten,
    get_trunk_forward_outputs,
    get_tunk_forward_interpolated_outputs,
    transform_model_input_data_type,
)
from vissl.models.trunks import register_model_trunk

from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys

TRUNK_NAME = "resnet_small_plugin"  # the ``MODEL.TRUNK.NAME`` this module registers
CONFIG_KEY = "RESNET_SMALL_PLUGIN"  # its section under ``MODEL.TRUNK``

# residual blocks per stage (layer1..layer4) for each DEPTH, as in He et al. / torchvision
DEPTH_LAYERS: Dict[int, Sequence[int]] = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}
DEFAULTS = {
    "DEPTH": 18,
    "LAYERS": None,
    "WIDTH": 64,
    "STEM": "small",
    "NORM": "BatchNorm",
    "GROUPNORM_GROUPS": 8,
    "ZERO_INIT_RESIDUAL": False,
    "CHANNELS_LAST": False,
}
# input channels per ``MODEL.INPUT_TYPE`` (VISSL's "lab" input keeps only the L channel)
_IN_CHANNELS = {"rgb": 3, "bgr": 3, "lab": 1}

# VISSL's common feature names (as in its ResNe(X)t) plus the raw block names.
FEAT_EVAL_MAPPING = {
    "conv1": "conv1_relu",
    "res1": "maxpool",
    "res2": "layer1",
    "res3": "layer2",
    "res4": "layer3",
    "res5": "layer4",
    "res5avg": "avgpool",
    "flatten": "flatten",
}


#: A 1x1 convolution with a stride > 1 and fewer input channels than this subsamples its input
#: and runs at stride 1 inside a channels-last trunk (:class:`_SubsampledShortcutConv`): oneDNN's
#: CPU kernel for the strided case's weight gradient (``jit_1x1``, NHWC source, stride > 1,
#: fewer input channels than its channel block of 8 with AVX2 or 16 with AVX-512) writes past its
#: workspace (oneDNN issue 6035, open; oneDNN 3.12 in torch 2.14.1): on an AVX2 CPU, measured, one
#: thread corrupted the heap (an abort or a segfault) and two threads returned wrong weight
#: gradients or spun forever.
NHWC_SAFE_MIN_CHANNELS = 16


class _SubsampledShortcutConv(nn.Conv2d):
    """A 1x1 ``nn.Conv2d`` (no padding) with a stride, computed as the stride-1 convolution of
    the subsampled input ``x[..., ::sh, ::sw]``: the same outputs, gradients and state dict,
    without oneDNN's strided 1x1 path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh, sw = self.stride
        return nn.functional.conv2d(x[..., ::sh, ::sw], self.weight, self.bias, 1, 0, self.dilation, self.groups)


class TrunkConfigError(ConfigError):
    """A ``MODEL.TRUNK.RESNET_SMALL_PLUGIN`` value is wrong; the message names the key (a
    :class:`~vissl_swav_plugin.config.checkers.ConfigError`, hence a ``ValueError``)."""


def _key(name):
    """The full config path of one of our keys, for error messages."""
    return f"config.MODEL.TRUNK.{CONFIG_KEY}.{name}"


def _is_int(v):
    """An ``int`` that is not a ``bool``."""
    return isinstance(v, int) and not isinstance(v, bool)


def resolve_params(model_config) -> dict:
    """Defaults merged with ``MODEL.TRUNK.RESNET_SMALL_PLUGIN``, validated.

    Args:
        model_config: VISSL's ``config.MODEL`` (an ``AttrDict`` or a plain dict with a
            ``TRUNK`` entry), or None for all defaults.

    Returns:
        A dict with every key of :data:`DEFAULTS`; ``LAYERS`` is always the tuple of 4
        block counts (from ``LAYERS`` if given, else from ``DEPTH``).

    Raises:
        TrunkConfigError: an unknown key or a wrong value; the message names the key,
            e.g. ``config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.DEPTH must be one of [10, 18, 34]``.

    Example::

        resolve_params({"TRUNK": {"RESNET_SMALL_PLUGIN": {"DEPTH": 10, "WIDTH": 32}}})
        # -> {..., "DEPTH": 10, "LAYERS": (1, 1, 1, 1), "WIDTH": 32, ...}
    """
    trunk = model_config["TRUNK"] if model_config is not None else {}
    user = trunk.get(CONFIG_KEY, None) or {}
    check_known_keys(user, DEFAULTS, f"config.MODEL.TRUNK.{CONFIG_KEY}", TrunkConfigError)
    p = dict(DEFAULTS)
    p.update(dict(user))
    if p["LAYERS"] is not None:
        layers = p["LAYERS"]
        if (
            not isinstance(layers, (list, tuple))
            or len(layers) != 4
            or not all(_is_int(v) and v >= 1 for v in layers)
        ):
            raise TrunkConfigError(
                f"{_key('LAYERS')} must list 4 block counts >= 1 (one per stage), got {layers!r}"
            )
        p["LAYERS"] = tuple(int(v) for v in layers)
    else:
        if p["DEPTH"] not in DEPTH_LAYERS:
            raise TrunkConfigError(
                f"{_key('DEPTH')} must be one of {sorted(DEPTH_LAYERS)} (or give LAYERS), got {p['DEPTH']!r}"
            )
        p["LAYERS"] = tuple(DEPTH_LAYERS[p["DEPTH"]])
    if not _is_int(p["WIDTH"]) or p["WIDTH"] < 1:
        raise TrunkConfigError(f"{_key('WIDTH')} must be an integer >= 1, got {p['WIDTH']!r}")
    if p["STEM"] not in ("small", "imagenet"):
        raise TrunkConfigError(f"{_key('STEM')} must be 'small' or 'imagenet', got {p['STEM']!r}")
    if p["NORM"] not in ("BatchNorm", "GroupNorm"):
        raise TrunkConfigError(f"{_key('NORM')} must be 'BatchNorm' or 'GroupNorm', got {p['NORM']!r}")
    if p["NORM"] == "GroupNorm":
        g = p["GROUPNORM_GROUPS"]
        if not _is_int(g) or g < 1 or p["WIDTH"] % g:
            raise TrunkConfigError(
                f"{_key('GROUPNORM_GROUPS')} must be an integer >= 1 dividing WIDTH={p['WIDTH']}, got {g!r}"
            )
    for name in ("ZERO_INIT_RESIDUAL", "CHANNELS_LAST"):
        if not isinstance(p[name], bool):
            raise TrunkConfigError(f"{_key(name)} must be true or false, got {p[name]!r}")
    return p


def output_dim(model_config) -> int:
    """Channels of ``res5`` / ``res5avg`` / ``flatten`` for this config: ``8 * WIDTH``.

    Args:
        model_config: VISSL's ``config.MODEL`` (see :func:`resolve_params`).

    Returns:
        The trunk's output dimension, the first entry of the head's ``dims``.
    """
    return 8 * resolve_params(model_config)["WIDTH"]


@register_model_trunk(TRUNK_NAME)
class ResNetSmallPlugin(nn.Module):
    """ResNet-10/18/34-style trunk with a small-image stem, VISSL's trunk interface.

    Built from torchvision's ``BasicBlock``: stem (``conv1``, ``bn1``, ``conv1_relu``,
    ``maxpool``), four stages of widths ``W, 2W, 4W, 8W`` (stride 1, 2, 2, 2), global
    average pool and flatten, all in ``self._feature_blocks`` (see the module docstring
    for the config keys and the feature names).

    Args:
        model_config: VISSL's ``config.MODEL``; reads ``TRUNK.RESNET_SMALL_PLUGIN`` (see
            :func:`resolve_params`), ``INPUT_TYPE`` (``rgb`` | ``bgr`` | ``lab``) and
            ``ACTIVATION_CHECKPOINTING``.
        model_name: the registered name (VISSL passes it; unused).

    Raises:
        TrunkConfigError: a wrong ``TRUNK.RESNET_SMALL_PLUGIN`` value or ``INPUT_TYPE``.

    Example::

        trunk = ResNetSmallPlugin(cfg.MODEL)  # or VISSL's build_model(cfg.MODEL, ...)
        (res5avg,) = trunk(images, ["res5avg"])  # [N, 8 * WIDTH, 1, 1]
    """

    def __init__(self, model_config, model_name: str = TRUNK_NAME):
        super().__init__()
        self.model_config = model_config
        p = resolve_params(model_config)
        self.params = p
        self.input_type = model_config.get("INPUT_TYPE", "rgb")
        if self.input_type not in _IN_CHANNELS:
            raise TrunkConfigError(
                f"config.MODEL.INPUT_TYPE must be one of {sorted(_IN_CHANNELS)}, got {self.input_type!r}"
            )
        ckpt = model_config.get("ACTIVATION_CHECKPOINTING", {}) or {}
        self.use_checkpointing = bool(ckpt.get("USE_ACTIVATION_CHECKPOINTING", False))
        self.num_checkpointing_splits = int(ckpt.get("NUM_ACTIVATION_CHECKPOINTING_SPLITS", 2))

        width = p["WIDTH"]
        if p["NORM"] == "BatchNorm":
            norm = nn.BatchNorm2d
        else:
            groups = p["GROUPNORM_GROUPS"]

            def norm(c):
                return nn.GroupNorm(groups, c)

        self._norm = norm
        self.channels_last = p["CHANNELS_LAST"]
        in_ch = _IN_CHANNELS[self.input_type]
        if p["STEM"] == "small":
            conv1 = nn.Conv2d(in_ch, width, kernel_size=3, stride=1, padding=1, bias=False)
            pool = nn.Identity()
        else:
            conv1 = nn.Conv2d(in_ch, width, kernel_size=7, stride=2, padding=3, bias=False)
            pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self._inplanes = width
        stages = [
            self._make_stage(width * (2 ** i), n, stride=1 if i == 0 else 2)
            for i, n in enumerate(p["LAYERS"])
        ]
        self._feature_blocks = nn.ModuleDict(
            [
                ("conv1", conv1),
                ("bn1", norm(width)),
                ("conv1_relu", nn.ReLU(inplace=True)),
                ("maxpool", pool),
                ("layer1", stages[0]),
                ("layer2", stages[1]),
                ("layer3", stages[2]),
                ("layer4", stages[3]),
                ("avgpool", nn.AdaptiveAvgPool2d((1, 1))),
                ("flatten", Flatten(1)),
            ]
        )
        self.feat_eval_mapping = dict(FEAT_EVAL_MAPPING)
        for name in self._feature_blocks.keys():  # raw block names work too
            self.feat_eval_mapping.setdefault(name, name)
        self.out_dim = 8 * width
        self._init_weights(p["ZERO_INIT_RESIDUAL"])
        if self.channels_last:
            # the 4-D conv weights in NHWC; ``Module.to(device)``, DDP's broadcast, the
            # optimizer's state and ``load_state_dict`` keep (or copy into) this format
            self.to(memory_format=torch.channels_last)
        logging.info(
            f"{TRUNK_NAME}: layers={list(p['LAYERS'])} width={width} stem={p['STEM']} "
            f"norm={p['NORM']} out_dim={self.out_dim} channels_last={self.channels_last}"
        )

    def _make_stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        """One ResNet stage: ``blocks`` BasicBlocks of ``planes`` channels, the first with
        ``stride`` and a 1x1 conv + norm shortcut where the shape changes."""
        downsample = None
        if stride != 1 or self._inplanes != planes:
            unsafe_nhwc = self.channels_last and stride > 1 and self._inplanes < NHWC_SAFE_MIN_CHANNELS
            conv = _SubsampledShortcutConv if unsafe_nhwc else nn.Conv2d
            downsample = nn.Sequential(
                conv(self._inplanes, planes, kernel_size=1, stride=stride, bias=False),
                self._norm(planes),
            )
        layers = [BasicBlock(self._inplanes, planes, stride, downsample, norm_layer=self._norm)]
        self._inplanes = planes
        for _ in range(1, blocks):
            layers.append(BasicBlock(planes, planes, norm_layer=self._norm))
        return nn.Sequential(*layers)

    def _init_weights(self, zero_init_residual: bool):
        """He (fan-out) init of the convs, norms at weight 1 / bias 0, as torchvision's
        ResNet; ``zero_init_residual`` zeroes each block's last norm (Goyal et al. 2017)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def forward(self, x: torch.Tensor, out_feat_keys: List[str] = None) -> List[torch.Tensor]:
        """Features of a batch of images.

        Args:
            x: ``[N, C, H, W]`` images (or VISSL's ``MultiDimensionalTensor``).
            out_feat_keys: feature names (``conv1``, ``res1``..``res5``, ``res5avg``,
                ``flatten`` or raw block names); None or empty: the last block
                (``flatten``), VISSL's default.

        Returns:
            One tensor per requested key, in the order asked for.

        Raises:
            ValueError: an unknown feature key (the message lists the available ones).
        """
        out_feat_keys = list(out_feat_keys or [])
        if out_feat_keys:
            bad = [k for k in out_feat_keys if k not in self.feat_eval_mapping]
            if bad:
                raise ValueError(
                    f"{TRUNK_NAME}: unknown feature key(s) {bad}; available: {sorted(self.feat_eval_mapping)}"
                )
        if isinstance(x, MultiDimensionalTensor):
            return get_tunk_forward_interpolated_outputs(
                input_type=self.input_type,
                interpolate_out_feat_key_name="res5",
                remove_padding_before_feat_key_name="avgpool",
                feat=x,
                feature_blocks=self._feature_blocks,
                feature_mapping=self.feat_eval_mapping,
                use_checkpointing=self.use_checkpointing,
                checkpointing_splits=self.num_checkpointing_splits,
            )
        x = transform_model_input_data_type(x, self.input_type)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        feats = get_trunk_forward_outputs(
            feat=x,
            out_feat_keys=out_feat_keys,
            feature_blocks=self._feature_blocks,
            feature_mapping=self.feat_eval_mapping,
            use_checkpointing=self.use_checkpointing,
            checkpointing_splits=self.num_checkpointing_splits,
        )
        return self._in_requested_order(out_feat_keys, feats)

    def _in_requested_order(self, keys: List[str], feats: List[torch.Tensor]) -> List[torch.Tensor]:
        """VISSL's helper returns distinct features in *block* order; return them in the
        order asked for (what LINEAR_EVAL_FEAT_POOL_OPS_MAP / OUT_FEAT_KEYS pair them by)."""
        mapped = [self.feat_eval_mapping[k] for k in keys]
        if len(set(mapped)) != len(mapped) or len(feats) != len(mapped):
            return feats  # duplicates: VISSL's helper already returns them per key
        names = list(self._feature_blocks.keys())
        by_block = dict(zip(sorted(mapped, key=names.index), feats))
        return [by_block[m] for m in mapped]
