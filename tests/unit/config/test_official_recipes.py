"""Every official SwAV / DeepCluster-v2 recipe (github:facebookresearch/swav scripts/*.sh) has a config here,
and that config, composed and inferred as the launcher does, equals the script flag by flag
(the table and the translation rules: tests/helpers/official_recipes.py)."""
import copy

import pytest
from testkit import REPO, compose

import official_recipes as R

SCRIPTS = sorted(R.SCRIPTS)


def test_the_table_covers_the_twelve_official_scripts():
    assert len(SCRIPTS) == 12
    assert {s.split("_")[0] for s in SCRIPTS} == {"swav", "deepclusterv2"}
    # one row per (script, flag); every script's rows name the flags its main file parses
    rows = R.rows()
    assert len({(s, f) for s, f, _, _ in rows}) == len(rows)
    for s in SCRIPTS:
        main = R.SCRIPTS[s][0]
        assert set(R.MAIN_DEFAULTS[main]) <= {f for s2, f, _, _ in rows if s2 == s}


@pytest.fixture(scope="module")
def composed():
    return {s: compose([f"config={R.CONFIG_FOR_SCRIPT[s]}"]) for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS)
def test_config_equals_the_official_script(script, composed):
    assert (REPO / "configs" / "config" / (R.CONFIG_FOR_SCRIPT[script] + ".yaml")).is_file()
    assert R.compare(script, composed[script]) == []


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
    msgs = R.compare(script, cfg)
    assert msgs, f"{key}={value!r} not reported"
    assert any(script in m and f"--{flag}" in m and key in m for m in msgs), msgs


def test_a_missing_key_is_reported(composed):
    cfg = copy.deepcopy(dict(composed["swav_800ep_pretrain.sh"]))
    del cfg["LOSS"]["swav_plugin_loss"]["epsilon"]
    assert any("missing" in m and "--epsilon" in m for m in R.compare("swav_800ep_pretrain.sh", cfg))
