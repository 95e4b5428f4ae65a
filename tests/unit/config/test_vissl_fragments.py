"""VISSL's composable SwAV fragments (``+config/pretrain/swav/{models,transforms,optimization,heads}=NAME``)
on our configs: each either composes with every value it sets in effect, or fails at composition with a
ConfigError naming the key that cannot compose.  What each fragment sets is read from VISSL's own files."""
from pathlib import Path

import pytest
import yaml
from testkit import compose

from vissl_swav_plugin.config.yaml_files import shipped_config_names

import vissl

FRAGMENTS = Path(vissl.__file__).resolve().parent.parent / "configs" / "config" / "pretrain" / "swav"
#: ``(group, option)`` of VISSL's SwAV config-group options (``pretrain/swav/<group>/<option>``)
CASES = sorted(tuple(n.split("/")[2:]) for n in shipped_config_names("pretrain/swav/", root=FRAGMENTS.parents[1])
               if n.count("/") == 3)
OURS = ["pretrain/swav/swav_8node_resnet", "pretrain/swav/swav_400ep_resnet"]
VISSL_SWAV_LOSS_DEFAULTS = {"queue": {"queue_length": 0, "start_iter": 0}}


def _fragment(group, name):
    return yaml.safe_load((FRAGMENTS / group / f"{name}.yaml").read_text())["config"]


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


def _cannot_compose(frag):
    """The key our composition check must name, or None (from the fragment file alone)."""
    if frag.get("LOSS", {}).get("name") == "swav_loss":
        return "LOSS.name"
    swav_loss = frag.get("LOSS", {}).get("swav_loss", {})
    for key, value in _leaves(swav_loss):
        default = _get(VISSL_SWAV_LOSS_DEFAULTS, key) if key.startswith("queue.") else None
        if value != default:
            return f"LOSS.swav_loss.{key}"
    return None


def test_fragments_are_found():
    assert {g for g, _ in CASES} >= {"models", "transforms", "optimization", "heads"}
    assert len(CASES) >= 20


@pytest.mark.parametrize("ours", OURS)
@pytest.mark.parametrize("group,name", CASES)
def test_fragment_composes_or_names_the_key(group, name, ours):
    from vissl_swav_plugin.config.checkers import ConfigError

    frag = _fragment(group, name)
    overrides = [f"config={ours}", f"+config/pretrain/swav/{group}={name}"]
    bad = _cannot_compose(frag)
    if bad is not None:
        with pytest.raises(ConfigError) as err:
            compose(overrides)
        msg = str(err.value)
        assert f"config.{bad}" in msg and "config=vissl/pretrain/swav/swav_8node_resnet" in msg or \
            f"config.{bad}" in msg and "swav_plugin_loss" in msg, msg
        return
    cfg = compose(overrides)
    assert cfg.LOSS.name == "swav_plugin_loss"
    for key, value in _leaves(frag):
        if key.endswith("local_queue_length"):
            continue
        have = _get(cfg, key)
        if key == "DATA.TRAIN.TRANSFORMS":
            assert [t["name"] for t in have] == [t["name"] for t in value]
            crops = value[0]
            assert cfg.LOSS.swav_plugin_loss.num_crops == crops["total_num_crops"] == sum(crops["num_crops"])
            continue
        assert have == value, (key, have, value)


def test_a_models_fragment_brings_vissls_head_which_our_loss_takes():
    """VISSL's swav_head under our loss is a supported mix: the fragment's head, trunk and crops are in
    effect, and the loss's inferred sizes follow the fragment's head, not our config file's stale ones."""
    frag = _fragment("models", "resnet50_w2")
    head = frag["MODEL"]["HEAD"]["PARAMS"][0]
    cfg = compose([f"config={OURS[0]}", "+config/pretrain/swav/models=resnet50_w2"])
    assert cfg.LOSS.name == "swav_plugin_loss"
    assert cfg.MODEL.HEAD.PARAMS[0][0] == head[0] == "swav_head"
    assert cfg.MODEL.HEAD.PARAMS[0][1]["dims"] == head[1]["dims"]
    assert cfg.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER == 2
    assert cfg.LOSS.swav_plugin_loss.num_crops == frag["DATA"]["TRAIN"]["TRANSFORMS"][0]["total_num_crops"]
    assert cfg.LOSS.swav_plugin_loss.embedding_dim == head[1]["dims"][-1]
    assert list(cfg.LOSS.swav_plugin_loss.num_prototypes) == list(head[1]["num_clusters"])


def test_vissls_own_config_still_takes_its_fragments():
    cfg = compose(["config=vissl/pretrain/swav/swav_8node_resnet", "+config/pretrain/swav/models=resnet50_w2"])
    assert cfg.LOSS.name == "swav_loss" and cfg.MODEL.HEAD.PARAMS[0][0] == "swav_head"
