"""Weights in and out of VISSL: ``swav-plugin-export`` and ``swav-plugin-import``.

``swav-plugin-export CKPT OUT.pth [--naming torchvision|timm]``
    The trunk of a VISSL checkpoint (VISSL's ``resnet`` trunk: ResNet-50/101/152/200,
    ResNeXt, the wide RN50w2/w4/w5) as a plain state dict with torchvision's ResNet
    parameter names (``conv1.weight``, ``bn1.*``, ``layer1.0.conv1.weight`` ...; no ``fc``).
    Width 1: it loads with ``strict=True`` into ``torchvision.models.resnet50()`` (``101``,
    ``152``, ``resnext50_32x4d`` ...) once ``model.fc = torch.nn.Identity()``, and that
    model's output equals VISSL's ``res5avg`` feature.  Wider trunks (``WIDTH_MULTIPLIER``
    2/4/5) have no torchvision constructor: torchvision's ``wide_resnet50_2`` widens only the
    3x3 convolutions, SwAV's RN50w2 every layer; the same names then load into the official
    SwAV code's ``resnet50w2`` / ``w4`` / ``w5`` (``src/resnet50.py``, also through
    ``torch.hub.load("facebookresearch/swav:main", "resnet50w2", pretrained=False)``).
    timm's ``resnet50`` / ``resnext50_32x4d`` use torchvision's parameter names (``fc`` too),
    so ``--naming timm`` writes the same keys; load it into
    ``timm.create_model("resnet50", num_classes=0)``.

``swav-plugin-import OFFICIAL.pth OUT.torch``
    A checkpoint in the official SwAV code's format -- ``main_swav.py``'s
    ``{"epoch", "state_dict", "optimizer", ("amp")}`` or the released
    ``swav_*_pretrain.pth.tar`` (the state dict alone); keys ``module.conv1.weight``,
    ``module.layer1...``, ``module.projection_head.*``, ``module.prototypes.weight`` (or
    ``module.prototypes.prototypes{i}.weight`` for several prototype sets) -- as a VISSL
    checkpoint: ``{"classy_state_dict": {"base_model": {"model": {"trunk", "heads"}}}}`` with
    VISSL's names (``_feature_blocks.conv1.weight``; ``0.projection_head.*``,
    ``0.prototypes{i}.weight``).  It is a weights file for ``MODEL.WEIGHTS_INIT.PARAMS_FILE``
    (VISSL's linear / low-shot / kNN benchmarks, ``swav-plugin-knn``) and for
    ``swav-plugin-eval --checkpoint``; not a file to resume a training from.  The tool prints
    the ``MODEL.TRUNK`` / ``MODEL.HEAD`` settings the file fits.

Both read their input with ``torch.load(weights_only=True)``: tensors, numbers, strings and
containers only.  A file that needs more (any other Python object) is refused with an error
naming it -- a checkpoint from the internet must not run code when it is read.
"""
import argparse
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

from vissl_swav_plugin.tools.to_detectron2 import ConversionError, extract_trunk, to_torchvision_names

__all__ = ["WeightsError", "safe_load", "export_trunk", "describe_trunk", "official_to_vissl",
           "import_official", "export_main", "import_main", "main"]

NAMINGS = ("torchvision", "timm")
_TV_DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152, (3, 24, 36, 3): 200}
_TRUNK_KEY = re.compile(r"^(conv1\.weight|bn1\.\w+|layer[1-4]\.\d+\.\w+\.\w+|layer[1-4]\.\d+\.downsample\.[01]\.\w+)$")


class WeightsError(ValueError):
    """A weights file cannot be read or converted; the message names the file (and key)."""


def safe_load(path):
    """``torch.load(path, weights_only=True)`` on the CPU, after the file's checksum (or, without
    one, the CRC-32 of its zip records) is checked; :class:`WeightsError` names the file."""
    import torch

    from vissl_swav_plugin.compat import checkpoint_checksums as sums

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    sums.verify_before_load(path, WeightsError)  # its .sha256, else the CRC-32 of its zip records
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            raise WeightsError(
                f"refusing to load {path}: it holds Python objects that torch.load(weights_only=True) "
                f"does not allow ({first}). Loading it would run code from the file. If you trust it, "
                "re-save its tensors in your own Python (torch.save(plain_state_dict, new_file)) and "
                "convert that file") from e
        raise WeightsError(f"cannot read {path} as a PyTorch file: {type(e).__name__}: {first}") from e


# ----------------------------------------------------------------------------------------
# export: VISSL trunk -> torchvision / timm state dict
# ----------------------------------------------------------------------------------------
def describe_trunk(tv_state):
    """Depth, width multiplier, groups and the constructor the torchvision-named trunk loads into."""
    blocks = tuple(len({n.split(".")[1] for n in tv_state if n.startswith(f"layer{i}.")}) for i in (1, 2, 3, 4))
    bottleneck = any(".conv3." in n for n in tv_state)
    stem = tuple(tv_state["conv1.weight"].shape)
    width = stem[0] // 64 if stem[0] % 64 == 0 else None
    inner, per_group = tv_state["layer1.0.conv2.weight"].shape[:2]
    groups = int(inner // per_group)
    depth = _TV_DEPTHS.get(blocks) if bottleneck else None
    if not bottleneck or stem[-2:] != (7, 7) or stem[1] != 3 or depth is None or width is None:
        raise WeightsError(
            f"trunk (blocks {list(blocks)}, {'bottleneck' if bottleneck else 'basic'} blocks, stem conv "
            f"{stem[-2]}x{stem[-1]} with {stem[1]} input and {stem[0]} output channels) is not a "
            "torchvision-layout ResNet: export takes VISSL's 'resnet' trunk (DEPTH 50/101/152/200, RGB "
            "input); for other trunks use swav-plugin-to-detectron2 --torchvision")
    width_per_group = int(inner // (width * groups))  # bottleneck width = 64 * W * (wpg / 64) * groups
    if width == 1:
        named = {(50, 1, 64): "resnet50", (101, 1, 64): "resnet101", (152, 1, 64): "resnet152",
                 (50, 32, 4): "resnext50_32x4d", (101, 32, 8): "resnext101_32x8d",
                 (101, 64, 4): "resnext101_64x4d", (50, 1, 128): "wide_resnet50_2",
                 (101, 1, 128): "wide_resnet101_2"}.get((depth, groups, width_per_group))
        target = (f"torchvision.models.{named}()" if named else
                  f"torchvision.models.resnet.ResNet(Bottleneck, {list(blocks)}, groups={groups}, "
                  f"width_per_group={width_per_group})")
    elif depth == 50 and groups == 1 and width_per_group == 64:
        target = f"the official SwAV code's resnet50w{width}() (src/resnet50.py; not in torchvision)"
    else:
        target = None
    return {"depth": depth, "width": width, "groups": groups, "width_per_group": width_per_group,
            "blocks": list(blocks), "target": target}


def export_trunk(input_path, output_path, naming="torchvision", state_dict_key="auto"):
    """Write the trunk of VISSL checkpoint ``input_path`` as a torchvision (or timm) state dict."""
    import torch

    if naming not in NAMINGS:
        raise WeightsError(f"--naming must be one of {NAMINGS}, got {naming!r}")
    ckpt = safe_load(input_path)
    try:
        tv = to_torchvision_names(extract_trunk(ckpt, state_dict_key))
        info = describe_trunk(tv)
    except (ConversionError, WeightsError) as e:
        raise WeightsError(f"{input_path}: {e}") from e
    # timm's ResNet (resnet50, resnext50_32x4d, ...) names every trunk parameter as torchvision does
    out = OrderedDict((k, v.detach().cpu().clone().contiguous()) for k, v in tv.items())
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, output_path)
    return {"keys": list(out), "info": info}


def export_main(argv=None):
    """``swav-plugin-export --help``; returns the exit code (2: bad input)."""
    ap = argparse.ArgumentParser(
        prog="swav-plugin-export",
        description="VISSL 'resnet' trunk -> torchvision (or timm) ResNet state dict (no fc)")
    ap.add_argument("input", help="VISSL checkpoint (model_final_checkpoint_phaseN.torch) or a trunk state dict")
    ap.add_argument("output", help="where to write the state dict (.pth)")
    ap.add_argument("--naming", choices=NAMINGS, default="torchvision",
                    help="parameter names: torchvision (default) or timm (the same names for ResNets)")
    ap.add_argument("--state-dict-key", default="auto",
                    help="auto (default) | classy_state_dict | model_state_dict | none")
    args = ap.parse_args(argv)
    try:
        res = export_trunk(args.input, args.output, args.naming, args.state_dict_key)
    except WeightsError as e:
        print(f"swav-plugin-export: error: {e}", file=sys.stderr)
        return 2
    info = res["info"]
    print(f"swav-plugin-export: {len(res['keys'])} tensors ({args.naming} names) -> {args.output}")
    print(f"swav-plugin-export: ResNet-{info['depth']} width x{info['width']}, groups {info['groups']}")
    if info["target"]:
        how = ("timm.create_model(..., num_classes=0)" if args.naming == "timm" and info["width"] == 1
               else info["target"])
        print(f"swav-plugin-export: load it with {how}; set model.fc = torch.nn.Identity() first "
              "(the file has no fc), then load_state_dict(state, strict=True)")
    return 0


# ----------------------------------------------------------------------------------------
# import: official SwAV checkpoint -> VISSL checkpoint
# ----------------------------------------------------------------------------------------
_PROTO_SINGLE = re.compile(r"^prototypes\.weight$")
_PROTO_MULTI = re.compile(r"^prototypes\.prototypes(\d+)\.weight$")
_PROJ = re.compile(r"^projection_head\.(?:(\d+)\.)?(\w+)$")


def _official_state(ckpt, path):
    if not isinstance(ckpt, dict):
        raise WeightsError(f"{path} holds a {type(ckpt).__name__}, not a state dict or a checkpoint dict")
    if "state_dict" in ckpt and isinstance(ckpt["state_dict"], dict):
        return ckpt["state_dict"]
    if "classy_state_dict" in ckpt:
        raise WeightsError(f"{path} is already a VISSL checkpoint (classy_state_dict): no import needed")
    return ckpt


def official_to_vissl(state, path="<state dict>"):
    """``(trunk, heads, dropped)`` VISSL state dicts out of an official SwAV state dict."""
    trunk, heads, dropped = OrderedDict(), OrderedDict(), []
    for key, value in state.items():
        name = key[len("module."):] if key.startswith("module.") else key
        if not hasattr(value, "shape"):
            raise WeightsError(f"{path}: {key!r} is a {type(value).__name__}, not a tensor")
        if _TRUNK_KEY.match(name):
            trunk[f"_feature_blocks.{name}"] = value
        elif name.startswith("fc."):
            dropped.append(key)  # a torchvision classifier: not part of the SwAV model
        elif _PROTO_SINGLE.match(name):
            heads["0.prototypes0.weight"] = value
        elif _PROTO_MULTI.match(name):
            heads[f"0.prototypes{_PROTO_MULTI.match(name)[1]}.weight"] = value
        elif _PROJ.match(name):
            m = _PROJ.match(name)
            heads[f"0.projection_head.{m[1] or 0}.{m[2]}"] = value
        else:
            raise WeightsError(
                f"{path}: key {key!r} is not part of the official SwAV ResNet (conv1, bn1, layer1-4, "
                "projection_head, prototypes)")
    if "_feature_blocks.conv1.weight" not in trunk or not any(k.startswith("_feature_blocks.layer4.") for k in trunk):
        raise WeightsError(f"{path}: no ResNet trunk (module.conv1.weight / module.layer4.* missing)")
    return trunk, heads, dropped


def _head_settings(heads):
    """The ``MODEL.HEAD.PARAMS`` entry that builds a head with exactly these parameters."""
    if not heads:
        return None
    linear = sorted(int(k.split(".")[2]) for k in heads if k.startswith("0.projection_head.") and k.endswith(".weight")
                    and heads[k].dim() == 2)
    dims = [int(heads[f"0.projection_head.{linear[0]}.weight"].shape[1])] if linear else []
    dims += [int(heads[f"0.projection_head.{i}.weight"].shape[0]) for i in linear]
    use_bn = any(heads[k].dim() == 1 and k.endswith(".running_mean") for k in heads)
    protos = sorted((int(re.match(r"0\.prototypes(\d+)\.weight", k)[1]), int(v.shape[0]))
                    for k, v in heads.items() if k.startswith("0.prototypes"))
    return {"dims": dims, "use_bn": use_bn, "num_clusters": [k for _, k in protos]}


def import_official(input_path, output_path):
    """Write the official SwAV checkpoint ``input_path`` as a VISSL weights file ``output_path``."""
    from vissl_swav_plugin.compat import checkpoint_checksums as sums
    from vissl_swav_plugin.compat.checkpoint_files import atomic_torch_save

    trunk, heads, dropped = official_to_vissl(_official_state(safe_load(input_path), input_path), input_path)
    tv = OrderedDict((k[len("_feature_blocks."):], v) for k, v in trunk.items())
    try:
        info = describe_trunk(tv)
    except WeightsError as e:
        raise WeightsError(f"{input_path}: {e}") from e
    trunk = OrderedDict((k, v.detach().cpu().clone()) for k, v in trunk.items())
    heads = OrderedDict((k, v.detach().cpu().clone()) for k, v in heads.items())
    ckpt = {"classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": heads}, "meta": {}}},
            "converted_from": str(input_path)}
    output_path = str(output_path)
    atomic_torch_save(ckpt, output_path)
    if sums.enabled():
        sums.write_checksum(output_path)
    return {"trunk": list(trunk), "heads": list(heads), "dropped": dropped, "info": info,
            "head": _head_settings(heads)}


def import_main(argv=None):
    """``swav-plugin-import --help``; returns the exit code (2: bad input)."""
    ap = argparse.ArgumentParser(
        prog="swav-plugin-import",
        description="official SwAV checkpoint (main_swav.py / released .pth.tar) -> VISSL weights file")
    ap.add_argument("input", help="official SwAV checkpoint: {'state_dict': ...} or the state dict itself")
    ap.add_argument("output", help="VISSL checkpoint to write (.torch), for MODEL.WEIGHTS_INIT.PARAMS_FILE")
    args = ap.parse_args(argv)
    try:
        res = import_official(args.input, args.output)
    except WeightsError as e:
        print(f"swav-plugin-import: error: {e}", file=sys.stderr)
        return 2
    info, head = res["info"], res["head"]
    print(f"swav-plugin-import: {len(res['trunk'])} trunk + {len(res['heads'])} head tensors -> {args.output}")
    if res["dropped"]:
        print(f"swav-plugin-import: left out {res['dropped']} (a classifier, not part of the SwAV model)")
    trunk = (f"config.MODEL.TRUNK.NAME=resnet config.MODEL.TRUNK.RESNETS.DEPTH={info['depth']} "
             f"config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER={info['width']}")
    if info["groups"] > 1:
        trunk += (f" config.MODEL.TRUNK.RESNETS.GROUPS={info['groups']} "
                  f"config.MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP={info['width_per_group']}")
    print(f"swav-plugin-import: trunk settings: {trunk}")
    if not head:
        print("swav-plugin-import: note: no projection head or prototypes in the file: the trunk only "
              "(enough for the benchmarks; a SwAV head stays as initialised)")
    else:
        print("swav-plugin-import: head settings (to load the heads too): MODEL.HEAD.PARAMS "
              + json.dumps([["swav_plugin_head", head]]))
    print(f"swav-plugin-import: use it as config.MODEL.WEIGHTS_INIT.PARAMS_FILE={args.output}")
    return 0


def main(argv=None):
    """``python -m vissl_swav_plugin.tools.weights export|import ...`` (the two console scripts)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("export", "import"):
        print("usage: python -m vissl_swav_plugin.tools.weights export|import ... (swav-plugin-export / "
              "swav-plugin-import)", file=sys.stderr)
        return 2
    return (export_main if argv[0] == "export" else import_main)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
