"""Wrong config values raise an error naming the key, before anything is started."""
import re

import pytest

from testkit import compose

QUICK = "config=test/swav_plugin/quick_cpu"
L = "config.LOSS.swav_plugin_loss"


@pytest.mark.parametrize("override,key", [
    (f"{L}.crops_for_assign=[0,7]", "crops_for_assign"),
    (f"{L}.crops_for_assign=[1,1]", "crops_for_assign"),
    (f"{L}.epsilon=0.0", "epsilon"),
    (f"{L}.epsilon=-0.05", "epsilon"),
    (f"{L}.temperature=0", "temperature"),
    (f"{L}.num_iters=0", "num_iters"),
    (f"{L}.queue.queue_length=6", "queue.queue_length"),          # 3 per process < batch 4
    (f"{L}.queue.queue_length=15", "queue.queue_length"),         # not divisible by 2 processes
    (f"{L}.queue.start_epoch=-1", "queue.start_epoch"),
    (f"{L}.freeze_prototypes_niters=-3", "freeze_prototypes_niters"),
    ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[2048,16]}]]", "MODEL.HEAD.PARAMS"),
    ("config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,16],num_clusters:[20],use_weight_norm_prototypes:True}]]",
     "use_weight_norm_prototypes"),
    ("config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,16],num_clusters:[20],return_embeddings:False}]]",
     "return_embeddings"),
    (f"{L}.queue.use_before_full=1", "queue.use_before_full"),
    ("config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[2048,16],num_clusters:[0]}]]", "num_prototypes"),
    ("config.DATA.TRAIN.COLLATE_FUNCTION=default_collate", "COLLATE_FUNCTION"),
])
def test_bad_value_names_the_key(override, key):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([QUICK, override])


def test_good_config_passes():
    cfg = compose([QUICK])
    assert cfg.LOSS.swav_plugin_loss.queue.local_queue_length == 8


# --------------------------------------------------------------------------------------
# issue 12: unknown keys in every section of ours, with the closest known key
# --------------------------------------------------------------------------------------
DC = "config=pretrain/deepcluster_v2/deepclusterv2_quick_cpu"
SELA = "config=pretrain/sela_v2/selav2_quick_cpu"
SMALL = [QUICK, "config.MODEL.TRUNK.NAME=resnet_small_plugin", "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
         "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],num_clusters:[20]}]]"]
MC = "{name:multicrop_plugin,num_crops:[2,2],size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]"


@pytest.mark.parametrize("base,override,path,near", [
    ([QUICK], f"+{L}.use_double_precison=true", f"{L}.use_double_precison", "use_double_precision"),
    ([QUICK], f"+{L}.hard_assigment=true", f"{L}.hard_assigment", "hard_assignment"),
    ([QUICK], f"+{L}.temprature=0.5", f"{L}.temprature", "temperature"),
    ([QUICK], f"+{L}.freeze_prototypes_iters=5", f"{L}.freeze_prototypes_iters", "freeze_prototypes_niters"),
    ([QUICK], f"+{L}.queue.queue_lenght=32", f"{L}.queue.queue_lenght", "queue_length"),
    ([QUICK], "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[2048,16],num_clusters:[20],normalise_feats:True}]]",
     r"config.MODEL.HEAD.PARAMS[0] (swav_plugin_head).normalise_feats", "normalize_feats"),
    ([QUICK], "config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,16],use_bn:False,num_clusters:[20],use_biass:True}]]",
     r"config.MODEL.HEAD.PARAMS[0] (swav_head).use_biass", "use_bias"),
    ([QUICK], "+config.HOOKS.PROGRESS.FREQENCY=3", "config.HOOKS.PROGRESS.FREQENCY", "FREQUENCY"),
    ([QUICK], "+config.HOOKS.COLLAPSE_DETECTOR.patience_iters=3", "config.HOOKS.COLLAPSE_DETECTOR.patience_iters",
     "PATIENCE_ITERS"),
    ([QUICK], "+config.HOOKS.ONLINE_KNN.TOP_K=3", "config.HOOKS.ONLINE_KNN.TOP_K", "TOPK"),
    ([QUICK], f"config.DATA.TRAIN.TRANSFORMS=[{MC},flip_prob:0.5}}]", "config.DATA.TRAIN.TRANSFORMS[0].flip_prob",
     "flip_p"),
    (SMALL[:2], "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPHT:10}",
     "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.DEPHT", "DEPTH"),
    (["config=pretrain/swav/swav_fashion_mnist_cpu"], "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.CHANNEL_LAST=True",
     "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.CHANNEL_LAST", "CHANNELS_LAST"),
    ([DC], "config.MODEL.HEAD.PARAMS=[[deepclusterv2_plugin_head,{dims:[64,32,16],use_bnn:True,num_clusters:[8]}]]",
     r"config.MODEL.HEAD.PARAMS[0] (deepclusterv2_plugin_head).use_bnn", "use_bn"),
    ([DC], "+config.LOSS.deepclusterv2_plugin_loss.kmeans_iter=5", "config.LOSS.deepclusterv2_plugin_loss.kmeans_iter",
     "kmeans_iters"),
    ([SELA], "+config.LOSS.selav2_plugin_loss.sinkhorn_epsilom=0.1", "config.LOSS.selav2_plugin_loss.sinkhorn_epsilom",
     "sinkhorn_epsilon"),
])
def test_unknown_key_is_named_with_the_closest_known_key(base, override, path, near):
    import re

    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=re.escape(path) + f".*did you mean '{near}'"):
        compose(base + [override])


def test_demo_trunk_channels_last_bad_value_fails_at_compose():
    """The demo config's trunk block is checked in the launching process: a CHANNELS_LAST that
    is not a boolean is an error naming the key, before any worker starts."""
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=r"config\.MODEL\.TRUNK\.RESNET_SMALL_PLUGIN\.CHANNELS_LAST must be true or false"):
        compose(["config=pretrain/swav/swav_fashion_mnist_cpu", "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.CHANNELS_LAST=yes"])


@pytest.mark.parametrize("base, head", [
    ([QUICK], "swav_plugin_head,{dims:[2048,64,16],num_clusters:[20]"),
    ([DC], "deepclusterv2_plugin_head,{dims:[64,32,16],num_clusters:[8]")])
@pytest.mark.parametrize("key", ["use_bn", "fp32_head", "output_bn", "normalize_feats"])
@pytest.mark.parametrize("value", ["'false'", "'True'", "1", "0", "null"])
def test_a_head_switch_that_is_not_a_bool_fails_at_compose(base, head, key, value):
    """Our heads' on/off parameters are checked in the launching process: a quoted "false"
    (truthy) or a number is an error naming the key, before any worker builds the head."""
    from vissl_swav_plugin.config.checkers import ConfigError

    name = head.split(",")[0]
    with pytest.raises(ConfigError, match=re.escape(f"config.MODEL.HEAD.PARAMS[0] ({name}).{key} must be True or "
                                                    "False, got ")):
        compose(base + [f"config.MODEL.HEAD.PARAMS=[[{head},{key}:{value}}}]]"])
    compose(base + [f"config.MODEL.HEAD.PARAMS=[[{head},{key}:False}}]]"])  # a bool passes


def test_the_documented_head_switch_message_is_the_real_one():
    from testkit import REPO
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError) as err:
        compose([QUICK, "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[2048,64,16],num_clusters:[20],"
                        "fp32_head:'false'}]]"])
    assert f"`ConfigError: {err.value}`" in (REPO / "docs" / "reliability.md").read_text()


def test_constructor_keys_follow_kwargs_to_the_base_head():
    """A head whose ``__init__`` passes ``**kwargs`` up accepts exactly its base's keys;
    ``**kwargs`` that end at ``nn.Module`` accept anything (None: not checkable)."""
    import torch.nn as nn

    from vissl_swav_plugin.checks.run_wide import constructor_keys
    from vissl_swav_plugin.models.heads import DeepClusterV2PluginHead, SwAVPluginHead

    base = constructor_keys(SwAVPluginHead)
    assert {"dims", "num_clusters", "use_bn", "output_bn"} <= base
    assert constructor_keys(DeepClusterV2PluginHead) == base

    class Extra(SwAVPluginHead):
        def __init__(self, model_config, dims, num_clusters, extra_key=1, **kwargs):
            super().__init__(model_config, dims, num_clusters, **kwargs)

    class NoInit(Extra):
        pass

    class Open(nn.Module):
        def __init__(self, model_config, dims, **kwargs):
            super().__init__()

    assert constructor_keys(Extra) == base | {"extra_key"}
    assert constructor_keys(NoInit) == base | {"extra_key"}
    assert constructor_keys(Open) is None


def test_unknown_key_without_a_near_key_lists_the_known_ones():
    from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys

    with pytest.raises(ConfigError, match=r"config\.X\.zzz: unknown key 'zzz'; known keys: \['alpha', 'beta'\]"):
        check_known_keys({"alpha": 1, "zzz": 2}, ["alpha", "beta"], "config.X")


class _Recorder(dict):
    """A loss config that records every key the loss reads."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, d=None):
        self.read.add(k)
        return super().get(k, d)

    def __contains__(self, k):
        self.read.add(k)
        return super().__contains__(k)


@pytest.mark.parametrize("config,name", [(QUICK, "swav_plugin_loss"), (DC, "deepclusterv2_plugin_loss"),
                                         (SELA, "selav2_plugin_loss")])
def test_the_run_time_reads_only_known_keys(config, name):
    """Validation's known-keys table covers every key the loss reads at run time (a key
    read but unknown would be rejected; a key known but unread would be ignored)."""
    from classy_vision.losses import LOSS_REGISTRY

    cfg = compose([config])
    lc = _Recorder({k: v for k, v in cfg.LOSS[name].items()})
    if dict.__contains__(lc, "num_train_samples"):
        dict.__setitem__(lc, "num_train_samples", 64)
    cls = LOSS_REGISTRY[name]
    cls(lc)
    if name == "swav_plugin_loss":
        from vissl_swav_plugin.losses.swav_config import swav_loss_known_keys

        known = swav_loss_known_keys()[0]
    else:
        known = cls.known_config_keys()
    assert lc.read <= known, lc.read - known
    assert set(cfg.LOSS[name]) <= known


def test_validation_and_run_time_share_the_defaults(monkeypatch):
    """The SwAV loss' optional keys have one defaults table, read by validation, the loss
    and its hooks: a default changed there changes all three."""
    from vissl_swav_plugin.hooks import swav_hooks as hooks
    from vissl_swav_plugin.losses import swav_loss
    from vissl_swav_plugin.config.checkers import ConfigError

    without = [QUICK, f"~{L}.freeze_prototypes_niters"]
    monkeypatch.setitem(swav_loss.DEFAULTS, "freeze_prototypes_niters", -1)
    with pytest.raises(ConfigError, match="freeze_prototypes_niters"):
        compose(without)
    monkeypatch.setitem(swav_loss.DEFAULTS, "freeze_prototypes_niters", 3)
    cfg = compose(without)
    freeze = [h for h in hooks.swav_hooks(cfg) if type(h).__name__ == "FreezePrototypesHook"]
    assert len(freeze) == 1 and freeze[0].niters == 3
    import inspect

    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
    from vissl_swav_plugin.transforms.multicrop_config import KNOWN_KEYS

    assert set(inspect.signature(MultiCropPlugin).parameters) == KNOWN_KEYS


# --------------------------------------------------------------------------------------
# settings that never act, late or misleading errors: key-level ones when the config is
# composed, run-wide ones when the run is launched (run_launch_checks, in the launcher)
# --------------------------------------------------------------------------------------
def launch(overrides):
    """Compose as the launchers do, then run the launch checks (as launch_distributed does)."""
    from vissl_swav_plugin.config.registries import run_launch_checks

    cfg = compose(overrides)
    run_launch_checks(cfg)
    return cfg


def _warnings(caplog, overrides):
    caplog.clear()
    with caplog.at_level("WARNING"):
        launch(overrides)
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_queue_that_never_starts_warns(caplog):
    assert not [w for w in _warnings(caplog, [QUICK]) if "never" in w]
    msgs = _warnings(caplog, [QUICK, f"{L}.queue.start_epoch=2"])
    assert any("queue.start_epoch=2 >= config.OPTIMIZER.num_epochs=2" in m and "never used" in m for m in msgs), msgs


def test_prototypes_frozen_for_the_whole_run_warns(caplog):
    # 16 samples, 2 processes x batch 4: 2 iterations per epoch, 2 epochs = 4 iterations
    assert not [w for w in _warnings(caplog, [QUICK, f"{L}.freeze_prototypes_niters=3"]) if "never" in w]
    msgs = _warnings(caplog, [QUICK, f"{L}.freeze_prototypes_niters=4"])
    assert any("freeze_prototypes_niters=4 >= the 4 iterations" in m and "never trained" in m for m in msgs), msgs


@pytest.mark.parametrize("config,name", [(DC, "deepclusterv2_plugin_loss"), (SELA, "selav2_plugin_loss")])
def test_more_clusters_than_samples_fails(config, name):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"LOSS\.{name}\.num_clusters=\[8, 8, 8\] has 8 clusters but the training "
                                          r"set has 6 samples"):
        launch([config, "config.DATA.TRAIN.DATA_LIMIT=6", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2"])


@pytest.mark.parametrize("bs", [0, -4])
def test_batch_size_below_one_fails(bs):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"config\.DATA\.TRAIN\.BATCHSIZE_PER_REPLICA must be an integer >= 1, got {bs}"):
        compose([QUICK, f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={bs}", f"{L}.queue.queue_length=0"])


def test_dataset_smaller_than_a_batch_per_process_fails(tmp_path):
    from testkit import folder_data_overrides, make_image_folder
    from vissl_swav_plugin.config.checkers import ConfigError

    root = make_image_folder(tmp_path / "imgs", classes=2, per_class=3)  # 6 images: 3 per process < 4
    with pytest.raises(ConfigError, match=r"BATCHSIZE_PER_REPLICA=4 is larger than the 6 training samples split over "
                                          r"2 processes \(3 each, DROP_LAST=True\)"):
        launch([QUICK, "config.DATA.TRAIN.DATA_LIMIT=-1"] + folder_data_overrides(root))
    with pytest.raises(ConfigError, match=r"larger than the 2 training samples"):
        launch([QUICK, "config.DATA.TRAIN.DATA_LIMIT=2"])


@pytest.mark.parametrize("base,head,match", [
    ([QUICK], "[[swav_plugin_head,{dims:[512,64,16],num_clusters:[20]}]]",
     r"PARAMS\[0\] \(swav_plugin_head\) dims\[0\]=512 but the trunk MODEL.TRUNK.NAME=resnet outputs 2048 features"),
    (SMALL[:3], "[[swav_plugin_head,{dims:[128,32,16],num_clusters:[20]}]]",
     r"dims\[0\]=128 but the trunk MODEL\.TRUNK\.NAME=resnet_small_plugin outputs 64 features "
     r"\(8 x RESNET_SMALL_PLUGIN\.WIDTH\)"),
])
def test_head_input_must_match_the_trunk_output(base, head, match):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=match):
        launch(base + [f"config.MODEL.HEAD.PARAMS={head}"])
    with pytest.raises(ConfigError, match=r"outputs 4096 features \(2048 x RESNETS\.WIDTH_MULTIPLIER=2\)"):
        launch([QUICK, "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=2"])
    compose(base + [f"config.MODEL.HEAD.PARAMS={head}"])  # a composition alone is not a run
    launch(SMALL)  # 8 x 8 = 64 = dims[0]


@pytest.mark.parametrize("extra,match", [
    (",size_crops:[32]", r"TRANSFORMS\[0\]: multicrop_plugin: 'size_crops' has 1 entries but num_crops has 2"),
    (",crop_scales:[[0.14,1.5],[0.05,0.14]]", r"'crop_scales\[0\]' must lie in \(0\.0, 1\.0\], got \[0\.14, 1\.5\]"),
    (",flip_p:2", r"'flip_p' must be a probability in \[0, 1\], got 2"),
    (",total_num_crops:5", r"'total_num_crops' is 5 but sum\(num_crops\) = 4"),
])
def test_bad_multicrop_parameters_fail_when_composing(extra, match):
    from vissl_swav_plugin.config.checkers import ConfigError

    mc = MC.replace(",size_crops:[32,16]", "") if "size_crops" in extra else MC
    mc = mc.replace(",crop_scales:[[0.14,1],[0.05,0.14]]", "") if "crop_scales" in extra else mc
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.TRANSFORMS\[0\].*" + match.split(": ", 1)[-1]):
        compose([QUICK, f"config.DATA.TRAIN.TRANSFORMS=[{mc}{extra}}}]"])
