"""``swav-plugin-to-detectron2`` (also ``python tools/convert_to_detectron2.py``): convert
the trunk of a VISSL checkpoint (plugin SwAV / DeepCluster-v2 / SeLa-v2 runs, or any VISSL
ResNet) into detectron2's ResNet backbone format, for detection fine-tuning
(paper App. A: Faster R-CNN on VOC07+12, detectron2).

Works for VISSL's ``resnet`` trunk (ResNet-50/101/152, ResNeXt, wide) and for
``resnet_small_plugin`` (ResNet-10/18/34 with BasicBlocks).  Both name their parameters like
torchvision's ResNet behind VISSL's ``_feature_blocks.`` prefix; the renaming is::

    torchvision / VISSL (without _feature_blocks.)   detectron2
    conv1.weight                                  -> stem.conv1.weight
    bn1.{weight,bias,running_mean,running_var}    -> stem.conv1.norm.*
    layer{i}.{b}.conv{k}.weight                   -> res{i+1}.{b}.conv{k}.weight
    layer{i}.{b}.bn{k}.*                          -> res{i+1}.{b}.conv{k}.norm.*
    layer{i}.{b}.downsample.0.weight              -> res{i+1}.{b}.shortcut.weight
    layer{i}.{b}.downsample.1.*                   -> res{i+1}.{b}.shortcut.norm.*
    *.num_batches_tracked, fc.*                   -> dropped

usage::

    swav-plugin-to-detectron2 CKPT OUT.pkl [--torchvision OUT_TV.pth]
        [--state-dict-key auto|classy_state_dict|model_state_dict|none] [--format pkl|pth]
        [--unsafe-load]

``OUT.pkl`` is detectron2's model-zoo pickle ``{"model": {name: numpy array}, "__author__":
"vissl_swav_plugin", "matching_heuristics": True}``; ``.pth`` (or ``--format pth``) stores
the same dict with tensors through ``torch.save``.  With ``matching_heuristics`` detectron2's
``DetectionCheckpointer`` adds the ``backbone.bottom_up.`` (FPN) or ``backbone.`` (C4)
prefix itself.  ``--torchvision`` also writes the torchvision-named trunk (loads with
``strict=True`` into ``torchvision.models.resnet50()`` after ``model.fc = nn.Identity()``).

detectron2 settings for these weights (torchvision-style ResNets: stride in the 3x3 conv,
RGB input in 0-255 normalised with ImageNet mean/std)::

    MODEL.WEIGHTS OUT.pkl   MODEL.RESNETS.STRIDE_IN_1X1 False   INPUT.FORMAT RGB
    MODEL.PIXEL_MEAN [123.675, 116.280, 103.530]   MODEL.PIXEL_STD [58.395, 57.120, 57.375]
    (ResNet-18/34: MODEL.RESNETS.DEPTH 18|34, MODEL.RESNETS.RES2_OUT_CHANNELS 64)

The paper's VOC recipe (App. A) also sets SyncBN (MODEL.RESNETS.NORM SyncBN) and the
Res5ROIHeadsExtraNorm head.  ``resnet_small_plugin``'s 3x3 stride-1 stem (and its missing
max-pool) has no detectron2 counterpart: detectron2 skips ``stem.conv1.weight`` with a
shape-mismatch warning unless the trunk was built with ``STEM: imagenet``.
"""
import argparse
import pickle
import re
import sys
from collections import OrderedDict
from pathlib import Path

AUTHOR = "vissl_swav_plugin"
# torchvision ResNet parameter names (fc excluded) and their detectron2 names
_RULES = [
    (re.compile(r"^conv1\.weight$"), lambda m: "stem.conv1.weight"),
    (re.compile(r"^bn1\.(weight|bias|running_mean|running_var)$"), lambda m: f"stem.conv1.norm.{m[1]}"),
    (re.compile(r"^layer([1-4])\.(\d+)\.conv([1-3])\.weight$"),
     lambda m: f"res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.weight"),
    (re.compile(r"^layer([1-4])\.(\d+)\.bn([1-3])\.(weight|bias|running_mean|running_var)$"),
     lambda m: f"res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm.{m[4]}"),
    (re.compile(r"^layer([1-4])\.(\d+)\.downsample\.0\.weight$"),
     lambda m: f"res{int(m[1]) + 1}.{m[2]}.shortcut.weight"),
    (re.compile(r"^layer([1-4])\.(\d+)\.downsample\.1\.(weight|bias|running_mean|running_var)$"),
     lambda m: f"res{int(m[1]) + 1}.{m[2]}.shortcut.norm.{m[3]}"),
]
_DROPPED = re.compile(r"(^|\.)num_batches_tracked$|^fc\.")
_PREFIXES = ("module.", "trunk.", "base_model.", "_feature_blocks.")


class ConversionError(ValueError):
    """The input is not a ResNet checkpoint we can convert; the message names the key/file."""


def load_checkpoint(path, unsafe=False):
    """Load a checkpoint on the CPU with ``torch.load(weights_only=True)`` (``unsafe``: full unpickling, for trusted files only); :class:`ConversionError` names the file."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"checkpoint not found: {path}")
    from vissl_swav_plugin.compat import checkpoint_checksums as sums

    sums.verify_before_load(path, ConversionError)  # its .sha256, else the CRC-32 of its zip records
    try:
        return torch.load(path, map_location="cpu", weights_only=not unsafe)
    except Exception as e:  # noqa: BLE001
        hint = "" if unsafe else " (if you trust the file, retry with --unsafe-load)"
        raise ConversionError(f"cannot load checkpoint {path}: {e}{hint}") from e


def extract_trunk(ckpt, key="auto"):
    """The trunk's state dict out of a VISSL checkpoint (or a plain state dict)."""
    if not isinstance(ckpt, dict):
        raise ConversionError(f"checkpoint is a {type(ckpt).__name__}, not a dict")
    if key == "auto":
        key = next((k for k in ("classy_state_dict", "model_state_dict", "state_dict", "model")
                    if k in ckpt), "none")
    if key != "none":
        if key not in ckpt:
            raise ConversionError(f"--state-dict-key {key!r} not in checkpoint (keys: {sorted(ckpt)})")
        ckpt = ckpt[key]
    if key == "classy_state_dict":
        try:
            ckpt = ckpt["base_model"]["model"]["trunk"]
        except (KeyError, TypeError):
            raise ConversionError("classy_state_dict has no base_model.model.trunk") from None
    elif isinstance(ckpt, dict) and "trunk" in ckpt and isinstance(ckpt["trunk"], dict):
        ckpt = ckpt["trunk"]
    return ckpt


def to_torchvision_names(trunk_state):
    """VISSL trunk keys -> torchvision ResNet keys (prefixes stripped, counters/fc dropped)."""
    out = OrderedDict()
    for k, v in trunk_state.items():
        name = k
        stripped = True
        while stripped:
            stripped = False
            for p in _PREFIXES:
                if name.startswith(p):
                    name, stripped = name[len(p):], True
        if _DROPPED.search(name):
            continue
        if not any(rule.match(name) for rule, _ in _RULES):
            raise ConversionError(
                f"trunk key {k!r} is not a torchvision-style ResNet parameter; this tool converts "
                "VISSL's 'resnet' and the plugin's 'resnet_small_plugin' trunks only")
        if name in out:
            raise ConversionError(f"two trunk keys map to {name!r}")
        out[name] = v
    if "conv1.weight" not in out or not any(n.startswith("layer4.") for n in out):
        raise ConversionError("no ResNet trunk found (conv1.weight / layer4.* missing)")
    return out


def torchvision_to_detectron2(tv_state):
    """Rename a torchvision ResNet state dict to detectron2's parameter names (an ordered copy)."""
    out = OrderedDict()
    for name, v in tv_state.items():
        for rule, rename in _RULES:
            m = rule.match(name)
            if m:
                out[rename(m)] = v
                break
        else:
            raise ConversionError(f"no detectron2 name for {name!r}")
    return out


def describe(tv_state):
    """Depth/block type/stem of the trunk, for the detectron2 config hints."""
    blocks = [len({n.split(".")[1] for n in tv_state if n.startswith(f"layer{i}.")}) for i in (1, 2, 3, 4)]
    bottleneck = any(".conv3." in n for n in tv_state)
    stem = tuple(tv_state["conv1.weight"].shape[-2:])
    depth = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}.get(tuple(blocks)) if bottleneck \
        else {(2, 2, 2, 2): 18, (3, 4, 6, 3): 34}.get(tuple(blocks))
    return {"blocks": blocks, "bottleneck": bottleneck, "stem_kernel": stem, "depth": depth,
            "res2_out_channels": int(tv_state[f"layer1.0.conv{3 if bottleneck else 2}.weight"].shape[0])}


def convert(input_path, output_path, torchvision_path=None, state_dict_key="auto", fmt=None, unsafe=False):
    """Convert a VISSL checkpoint's trunk to a detectron2 checkpoint at ``output_path`` (pickle for
    ``.pkl``, else a torch file; ``fmt`` overrides) and, with ``torchvision_path``, a torchvision
    ResNet state dict."""
    import torch

    trunk = extract_trunk(load_checkpoint(input_path, unsafe), state_dict_key)
    tv = OrderedDict((k, v.detach().cpu().clone()) for k, v in to_torchvision_names(trunk).items())
    d2 = torchvision_to_detectron2(tv)
    output_path = Path(output_path)
    fmt = fmt or ("pkl" if output_path.suffix == ".pkl" else "pth")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pkl":
        model = OrderedDict((k, v.numpy()) for k, v in d2.items())
        with open(output_path, "wb") as f:
            pickle.dump({"model": model, "__author__": AUTHOR, "matching_heuristics": True}, f)
    elif fmt == "pth":
        torch.save({"model": d2, "__author__": AUTHOR, "matching_heuristics": True}, output_path)
    else:
        raise ConversionError(f"--format must be pkl or pth, got {fmt!r}")
    if torchvision_path:
        Path(torchvision_path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(tv, torchvision_path)
    return {"detectron2": list(d2), "torchvision": list(tv), "info": describe(tv)}


def main(argv=None):
    """Command line (``swav-plugin-to-detectron2 --help``); returns the exit code (2: bad input)."""
    ap = argparse.ArgumentParser(description="VISSL ResNet trunk -> detectron2 (and torchvision) weights")
    ap.add_argument("input", help="VISSL checkpoint (model_final_checkpoint_phaseN.torch) or state dict")
    ap.add_argument("output", help="detectron2 weights: .pkl (model-zoo pickle) or .pth")
    ap.add_argument("--torchvision", help="also write the torchvision-named trunk state dict here")
    ap.add_argument("--state-dict-key", default="auto",
                    help="auto (default) | classy_state_dict | model_state_dict | none")
    ap.add_argument("--format", choices=("pkl", "pth"), help="default: from the output suffix")
    ap.add_argument("--unsafe-load", action="store_true",
                    help="torch.load with weights_only=False (only for files you trust)")
    args = ap.parse_args(argv)
    try:
        res = convert(args.input, args.output, args.torchvision, args.state_dict_key, args.format,
                      args.unsafe_load)
    except ConversionError as e:
        print(f"convert_to_detectron2: error: {e}", file=sys.stderr)
        return 2
    info = res["info"]
    print(f"convert_to_detectron2: {len(res['detectron2'])} tensors -> {args.output}"
          + (f" (+ torchvision names -> {args.torchvision})" if args.torchvision else ""))
    print(f"convert_to_detectron2: trunk blocks {info['blocks']}, "
          f"{'bottleneck' if info['bottleneck'] else 'basic'} blocks, stem {info['stem_kernel']}")
    hints = ["MODEL.RESNETS.STRIDE_IN_1X1 False", "INPUT.FORMAT RGB",
             "MODEL.PIXEL_MEAN [123.675,116.280,103.530]", "MODEL.PIXEL_STD [58.395,57.120,57.375]"]
    if info["depth"]:
        hints.insert(0, f"MODEL.RESNETS.DEPTH {info['depth']}")
    if not info["bottleneck"]:
        hints.append(f"MODEL.RESNETS.RES2_OUT_CHANNELS {info['res2_out_channels']}")
    print("convert_to_detectron2: detectron2 config: MODEL.WEIGHTS " + str(args.output) + " " + " ".join(hints)
          + "  (PIXEL_MEAN/STD: the ImageNet normalisation of the paper's configs, x255; use the mean/std "
          "your pretraining used)")
    if not info["bottleneck"] and info["res2_out_channels"] != 64:
        print(f"convert_to_detectron2: note: detectron2 builds R18/R34 with RES2_OUT_CHANNELS 64 only; "
              f"this trunk has {info['res2_out_channels']} (WIDTH) channels in res2")
    if info["stem_kernel"] != (7, 7):
        print(f"convert_to_detectron2: note: {info['stem_kernel'][0]}x{info['stem_kernel'][1]} stem conv "
              "(small-image stem): detectron2's 7x7 stem will not load stem.conv1.weight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
