"""Every official SwAV / DeepCluster-v2 recipe (github:facebookresearch/swav scripts/*.sh) has a config here,
and that config, composed and inferred as the launcher does, equals the script flag by flag.

The recipes as data (:data:`SCRIPTS`, :data:`MAIN_DEFAULTS`) are written by hand from
github:facebookresearch/swav (commit 06b1b7cbaf6ba2a792300d79c7299db98b93b7f9): ``scripts/*.sh`` (the
``#SBATCH --nodes`` / ``--ntasks-per-node`` lines and the flags passed to ``main_swav.py`` /
``main_deepclusterv2.py``) and the argparse defaults of those two files, which a script that does not
pass a flag gets.  Nothing here is read from our configs: :func:`compare`, with the translation rules of
:func:`expected`, is the independent check, one message per disagreement naming the script, the flag
and the VISSL key.
"""
import copy
import math

import pytest
from testkit import REPO, compose

IMAGENET_TRAIN = 1281167  # images in ImageNet-1k train: iterations per epoch = this // global batch

# argparse defaults (main_*.py): a flag a script does not pass takes these.
MAIN_DEFAULTS = {
    "main_swav.py": {
        "nmb_crops": [2], "size_crops": [224], "min_scale_crops": [0.14], "max_scale_crops": [1.0],
        "crops_for_assign": [0, 1], "temperature": 0.1, "epsilon": 0.05, "sinkhorn_iterations": 3,
        "feat_dim": 128, "nmb_prototypes": 3000, "queue_length": 0, "epoch_queue_starts": 15,
        "epochs": 100, "batch_size": 64, "base_lr": 4.8, "final_lr": 0.0, "freeze_prototypes_niters": 313,
        "wd": 1e-6, "warmup_epochs": 10, "start_warmup": 0.0, "arch": "resnet50", "hidden_mlp": 2048,
        "use_fp16": True, "sync_bn": "pytorch",
    },
    "main_deepclusterv2.py": {
        "nmb_crops": [2], "size_crops": [224], "min_scale_crops": [0.14], "max_scale_crops": [1.0],
        "crops_for_assign": [0, 1], "temperature": 0.1, "feat_dim": 128,
        "nmb_prototypes": [3000, 3000, 3000], "epochs": 100, "batch_size": 64, "base_lr": 4.8,
        "final_lr": 0.0, "freeze_prototypes_niters": int(1e10), "wd": 1e-6, "warmup_epochs": 10,
        "start_warmup": 0.0, "arch": "resnet50", "hidden_mlp": 2048, "sync_bn": "pytorch",
        # main_deepclusterv2.py has no --use_fp16 flag and no apex.amp: it trains in fp32.
        "use_fp16": False,
    },
}

_SWAV_MC = dict(nmb_crops=[2, 6], size_crops=[224, 96], min_scale_crops=[0.14, 0.05], max_scale_crops=[1.0, 0.14],
                crops_for_assign=[0, 1], temperature=0.1, feat_dim=128)
_SWAV = dict(_SWAV_MC, epsilon=0.05, sinkhorn_iterations=3, nmb_prototypes=3000, queue_length=0, batch_size=64,
             base_lr=4.8, final_lr=0.0048, freeze_prototypes_niters=313, wd=1e-6, warmup_epochs=10, start_warmup=0.3,
             arch="resnet50", use_fp16=True, sync_bn="apex")
_BS256 = dict(_SWAV_MC, epsilon=0.05, sinkhorn_iterations=3, nmb_prototypes=3000, queue_length=3840,
              epoch_queue_starts=15, batch_size=64, base_lr=0.6, final_lr=0.0006, freeze_prototypes_niters=5005,
              wd=1e-6, warmup_epochs=0, arch="resnet50", use_fp16=True, sync_bn="pytorch")
_DC = dict(crops_for_assign=[0, 1], temperature=0.1, feat_dim=128, nmb_prototypes=[3000, 3000, 3000],
           batch_size=64, base_lr=4.8, final_lr=0.0048, freeze_prototypes_niters=300000, wd=1e-6,
           warmup_epochs=10, start_warmup=0.3, arch="resnet50", sync_bn="apex")
_2X224 = dict(nmb_crops=[2], size_crops=[224], min_scale_crops=[0.08], max_scale_crops=[1.0])

# script -> (main file, #SBATCH --nodes, --ntasks-per-node, flags passed in the script)
SCRIPTS = {
    "swav_100ep_pretrain.sh": ("main_swav.py", 8, 8, dict(_SWAV, epochs=100)),
    "swav_200ep_pretrain.sh": ("main_swav.py", 8, 8, dict(_SWAV, epochs=200)),
    "swav_400ep_pretrain.sh": ("main_swav.py", 8, 8, dict(_SWAV, epochs=400)),
    "swav_800ep_pretrain.sh": ("main_swav.py", 8, 8, dict(_SWAV, epochs=800)),
    "swav_200ep_bs256_pretrain.sh": ("main_swav.py", 1, 4, dict(_BS256, epochs=200)),
    "swav_400ep_bs256_pretrain.sh": ("main_swav.py", 1, 4, dict(_BS256, epochs=400)),
    "swav_400ep_2x224_pretrain.sh": ("main_swav.py", 8, 8, dict(_SWAV, epochs=400, **_2X224)),
    "swav_RN50w2_400ep_pretrain.sh": ("main_swav.py", 16, 8, dict(
        _SWAV, nmb_crops=[2, 4], epochs=400, batch_size=32, arch="resnet50w2", hidden_mlp=8192)),
    "swav_RN50w4_400ep_pretrain.sh": ("main_swav.py", 8, 8, dict(
        _SWAV, nmb_crops=[2, 4], min_scale_crops=[0.08, 0.08], queue_length=2560, epoch_queue_starts=0,
        epochs=400, batch_size=40, arch="resnet50w4", hidden_mlp=8192)),
    "deepclusterv2_400ep_pretrain.sh": ("main_deepclusterv2.py", 8, 8, dict(
        _DC, nmb_crops=[2, 4], size_crops=[160, 96], min_scale_crops=[0.08, 0.05], max_scale_crops=[1.0, 0.14],
        epochs=400)),
    "deepclusterv2_400ep_2x224_pretrain.sh": ("main_deepclusterv2.py", 8, 8, dict(_DC, epochs=400, **_2X224)),
    "deepclusterv2_800ep_pretrain.sh": ("main_deepclusterv2.py", 8, 8, dict(_DC, **_SWAV_MC, epochs=800)),
}

# our config for each official script
CONFIG_FOR_SCRIPT = {
    "swav_100ep_pretrain.sh": "pretrain/swav/swav_100ep_resnet",
    "swav_200ep_pretrain.sh": "pretrain/swav/swav_200ep_resnet",
    "swav_400ep_pretrain.sh": "pretrain/swav/swav_400ep_resnet",
    "swav_800ep_pretrain.sh": "pretrain/swav/swav_8node_resnet",
    "swav_200ep_bs256_pretrain.sh": "pretrain/swav/swav_200ep_bs256_resnet",
    "swav_400ep_bs256_pretrain.sh": "pretrain/swav/swav_400ep_bs256_resnet",
    "swav_400ep_2x224_pretrain.sh": "pretrain/swav/swav_400ep_2x224_resnet",
    "swav_RN50w2_400ep_pretrain.sh": "pretrain/swav/swav_400ep_resnet50_w2",
    "swav_RN50w4_400ep_pretrain.sh": "pretrain/swav/swav_400ep_resnet50_w4",
    "deepclusterv2_400ep_pretrain.sh": "pretrain/deepcluster_v2/deepclusterv2_400ep_resnet",
    "deepclusterv2_400ep_2x224_pretrain.sh": "pretrain/deepcluster_v2/deepclusterv2_400ep_2x224_resnet",
    "deepclusterv2_800ep_pretrain.sh": "pretrain/deepcluster_v2/deepclusterv2_8node_resnet",
}


def flags(script):
    """Every flag the recipe runs with: the script's, then main_*.py's default for each flag it does not pass."""
    main, nodes, tasks, passed = SCRIPTS[script]
    full = dict(MAIN_DEFAULTS[main])
    full.update(passed)
    full["nodes"], full["ntasks_per_node"] = nodes, tasks
    return full


def rows():
    """(script, flag, value, where the value comes from) for every script and flag."""
    out = []
    for script, (main, _, _, passed) in SCRIPTS.items():
        for flag, value in flags(script).items():
            src = "#SBATCH" if flag in ("nodes", "ntasks_per_node") else ("script" if flag in passed else main)
            out.append((script, flag, value, src))
    return out


# ---- translation rules: official flag(s) -> {VISSL key: expected value} -------------------------------

_WIDTH = {"resnet50": 1, "resnet50w2": 2, "resnet50w4": 4, "resnet50w5": 5}


def _loss(f):
    return "swav_plugin_loss" if "epsilon" in f else "deepclusterv2_plugin_loss"


def expected(script):
    """[(flag, VISSL key, expected value)] for one official script."""
    f = flags(script)
    loss = _loss(f)
    world = f["nodes"] * f["ntasks_per_node"]
    E, w = f["epochs"], f["warmup_epochs"]
    T = "DATA.TRAIN.TRANSFORMS.0."
    out = [
        ("nodes", "DISTRIBUTED.NUM_NODES", f["nodes"]),
        ("ntasks_per_node", "DISTRIBUTED.NUM_PROC_PER_NODE", f["ntasks_per_node"]),
        ("batch_size", "DATA.TRAIN.BATCHSIZE_PER_REPLICA", f["batch_size"]),
        ("nmb_crops", T + "num_crops", f["nmb_crops"]),
        ("nmb_crops", T + "total_num_crops", sum(f["nmb_crops"])),
        ("size_crops", T + "size_crops", f["size_crops"]),
        # VISSL spells RandomResizedCrop's scale per crop type as [min, max]
        ("min_scale_crops/max_scale_crops", T + "crop_scales",
         [[lo, hi] for lo, hi in zip(f["min_scale_crops"], f["max_scale_crops"])]),
        # resnet50wK = VISSL's resnet with WIDTH_MULTIPLIER K; the head's input is 2048 * K
        ("arch", "MODEL.TRUNK.NAME", "resnet"),
        ("arch", "MODEL.TRUNK.RESNETS.DEPTH", 50),
        ("arch", "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER", _WIDTH[f["arch"]]),
        ("arch/hidden_mlp/feat_dim", "MODEL.HEAD.PARAMS.0.1.dims",
         [2048 * _WIDTH[f["arch"]], f["hidden_mlp"], f["feat_dim"]]),
        ("nmb_prototypes", "MODEL.HEAD.PARAMS.0.1.num_clusters",
         f["nmb_prototypes"] if isinstance(f["nmb_prototypes"], list) else [f["nmb_prototypes"]]),
        ("temperature", f"LOSS.{loss}.temperature", f["temperature"]),
        ("crops_for_assign", f"LOSS.{loss}." + ("crops_for_assign" if loss == "swav_plugin_loss" else "crops_for_mb"),
         f["crops_for_assign"]),
        ("wd", "OPTIMIZER.weight_decay", f["wd"]),
        # apex LARC(trust_coefficient=0.001, clip=False) wraps SGD(momentum 0.9) in both main files
        ("(LARC in main_*.py)", "OPTIMIZER.use_larc", True),
        ("(LARC in main_*.py)", "OPTIMIZER.larc_config.clip", False),
        ("(LARC in main_*.py)", "OPTIMIZER.larc_config.trust_coefficient", 0.001),
        ("(SGD in main_*.py)", "OPTIMIZER.momentum", 0.9),
        ("epochs", "OPTIMIZER.num_epochs", E),
        # the official lr is absolute (not rescaled with the batch)
        ("base_lr", "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale", False),
        # --use_fp16 true = apex O1 mixed precision; ours is native AMP. DeepCluster-v2 has no fp16 at all.
        ("use_fp16", "MODEL.AMP_PARAMS.USE_AMP", f["use_fp16"]),
        # --sync_bn apex and --sync_bn pytorch both synchronise BN over all processes; ours is PyTorch's
        ("sync_bn", "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN", f["sync_bn"] in ("apex", "pytorch")),
        ("sync_bn", "MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE", "pytorch"),
    ]
    L = "OPTIMIZER.param_schedulers.lr."
    if w > 0:
        # warm-up linear start_warmup -> base_lr over w epochs, then cosine base_lr -> final_lr (per iteration)
        out += [("warmup_epochs", L + "name", "composite"),
                ("start_warmup", L + "schedulers.0.start_value", f["start_warmup"]),
                ("base_lr", L + "schedulers.0.end_value", f["base_lr"]),
                ("base_lr", L + "schedulers.1.start_value", f["base_lr"]),
                ("final_lr", L + "schedulers.1.end_value", f["final_lr"]),
                ("warmup_epochs/epochs", L + "lengths", [w / E, 1 - w / E]),
                ("warmup_epochs", L + "update_interval", "step")]
    else:
        out += [("warmup_epochs", L + "name", "cosine"),
                ("base_lr", L + "start_value", f["base_lr"]),
                ("final_lr", L + "end_value", f["final_lr"]),
                ("warmup_epochs", L + "update_interval", "step")]
    if loss == "swav_plugin_loss":
        # the official queue holds queue_length // world_size per process, rounded down to whole batches
        ql = f["queue_length"] - f["queue_length"] % (f["batch_size"] * world)
        out += [("epsilon", f"LOSS.{loss}.epsilon", f["epsilon"]),
                ("sinkhorn_iterations", f"LOSS.{loss}.num_iters", f["sinkhorn_iterations"]),
                ("freeze_prototypes_niters", f"LOSS.{loss}.freeze_prototypes_niters", f["freeze_prototypes_niters"]),
                ("queue_length", f"LOSS.{loss}.queue.queue_length", ql),
                ("feat_dim", f"LOSS.{loss}.embedding_dim", f["feat_dim"])]
        if ql > 0:
            out.append(("epoch_queue_starts", f"LOSS.{loss}.queue.start_epoch", f["epoch_queue_starts"]))
    else:
        # DeepCluster-v2: prototypes are the k-means centroids; frozen for freeze_prototypes_niters iterations.
        # Every official script freezes them for at least the whole run = our frozen deepclusterv2_plugin_head.
        iters = E * (IMAGENET_TRAIN // (f["batch_size"] * world))
        out.append(("freeze_prototypes_niters", "MODEL.HEAD.PARAMS.0.0",
                    "deepclusterv2_plugin_head" if f["freeze_prototypes_niters"] >= iters else "(not frozen all run)"))
    return out


_MISSING = object()


def get(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, (list, tuple)):
            i = int(part)
            node = node[i] if i < len(node) else _MISSING
        elif isinstance(node, dict):
            node = node.get(part, _MISSING)
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _same(a, b):
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def compare(script, cfg):
    """Messages for every official value our config (a dict: the file's ``config`` node) does not equal."""
    msgs = []
    for flag, key, want in expected(script):
        have = get(cfg, key)
        if key == "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER" and have is _MISSING:
            have = 1  # VISSL's default
        if key.endswith("total_num_crops") and have is _MISSING:
            continue  # optional in multicrop_plugin (it is sum(num_crops))
        if have is _MISSING or not _same(have, want):
            shown = "missing" if have is _MISSING else repr(have)
            msgs.append(f"{script} --{flag}: {key} should be {want!r}, {CONFIG_FOR_SCRIPT[script]} has {shown}")
    return msgs


NAMES = sorted(SCRIPTS)


def test_the_table_covers_the_twelve_official_scripts():
    assert len(SCRIPTS) == 12
    assert {s.split("_")[0] for s in NAMES} == {"swav", "deepclusterv2"}
    # one row per (script, flag); every script's rows name the flags its main file parses
    table = rows()
    assert len({(s, f) for s, f, _, _ in table}) == len(table)
    for s in NAMES:
        main = SCRIPTS[s][0]
        assert set(MAIN_DEFAULTS[main]) <= {f for s2, f, _, _ in table if s2 == s}


@pytest.fixture(scope="module")
def composed():
    return {s: compose([f"config={CONFIG_FOR_SCRIPT[s]}"]) for s in NAMES}


@pytest.mark.parametrize("script", NAMES)
def test_config_equals_the_official_script(script, composed):
    assert (REPO / "configs" / "config" / (CONFIG_FOR_SCRIPT[script] + ".yaml")).is_file()
    assert compare(script, composed[script]) == []


# a planted wrong value in each kind of row must be reported, naming the script, the flag and the key
PLANTS = [
    ("swav_800ep_pretrain.sh", "OPTIMIZER.param_schedulers.lr.schedulers.0.start_value", 0.0, "start_warmup"),
    ("deepclusterv2_800ep_pretrain.sh", "OPTIMIZER.param_schedulers.lr.schedulers.0.start_value", 0.0,
     "start_warmup"),
    ("deepclusterv2_800ep_pretrain.sh", "MODEL.AMP_PARAMS.USE_AMP", True, "use_fp16"),
    ("swav_200ep_bs256_pretrain.sh", "LOSS.swav_plugin_loss.queue.queue_length", 3584, "queue_length"),
    ("swav_200ep_bs256_pretrain.sh", "DISTRIBUTED.NUM_PROC_PER_NODE", 8, "ntasks_per_node"),
    ("swav_RN50w4_400ep_pretrain.sh", "LOSS.swav_plugin_loss.queue.start_epoch", 15, "epoch_queue_starts"),
    ("swav_RN50w2_400ep_pretrain.sh", "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER", 1, "arch"),
    ("swav_400ep_2x224_pretrain.sh", "DATA.TRAIN.TRANSFORMS.0.crop_scales", [[0.14, 1.0]], "min_scale_crops"),
    ("swav_100ep_pretrain.sh", "OPTIMIZER.param_schedulers.lr.lengths", [0.0125, 0.9875], "warmup_epochs/epochs"),
    ("swav_400ep_pretrain.sh", "LOSS.swav_plugin_loss.epsilon", 0.03, "epsilon"),
    ("swav_400ep_bs256_pretrain.sh", "OPTIMIZER.param_schedulers.lr.end_value", 0.0, "final_lr"),
    ("deepclusterv2_400ep_pretrain.sh", "DATA.TRAIN.TRANSFORMS.0.size_crops", [224, 96], "size_crops"),
]


def _set(cfg, dotted, value):
    *path, last = dotted.split(".")
    node = cfg
    for p in path:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize("script,key,value,flag", PLANTS)
def test_a_planted_wrong_value_is_reported(script, key, value, flag, composed):
    cfg = copy.deepcopy(dict(composed[script]))
    _set(cfg, key, value)
    msgs = compare(script, cfg)
    assert msgs, f"{key}={value!r} not reported"
    assert any(script in m and f"--{flag}" in m and key in m for m in msgs), msgs


def test_a_missing_key_is_reported(composed):
    cfg = copy.deepcopy(dict(composed["swav_800ep_pretrain.sh"]))
    del cfg["LOSS"]["swav_plugin_loss"]["epsilon"]
    assert any("missing" in m and "--epsilon" in m for m in compare("swav_800ep_pretrain.sh", cfg))
