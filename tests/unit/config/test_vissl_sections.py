"""Bad input in VISSL's own config sections, and checks VISSL runs late, fail when the
config is composed -- in the launcher process, before any worker starts:

* unknown keys of VISSL's sections (``defaults.yaml`` is the schema), with the closest key;
* a value the user set that the inference replaces (an error for the plugin's losses, a
  warning where it does not change training or the loss is VISSL's);
* out-of-range optimizer values;
* an unsupported AMP dtype, VISSL's SwAV-type losses with a head they cannot use, a
  bare AssertionError of VISSL's inference, a misspelt ``config=`` name.
"""
import copy
import difflib
import logging
from pathlib import Path

import pytest
import yaml

from testkit import compose, write_user_config

from vissl_swav_plugin.config.search_path import vissl_configs_dir
from vissl_swav_plugin.config.yaml_files import shipped_config_names

QUICK = "config=test/swav_plugin/quick_cpu"
L = "config.LOSS.swav_plugin_loss"


def _defaults():
    import vissl

    with open(Path(vissl.__file__).parent / "config" / "defaults.yaml") as f:
        return yaml.safe_load(f)["config"]


def _leaf_paths(node, path=()):
    """Every key path of ``defaults.yaml`` (mappings and leaves), except inside the
    sections documented as open: empty mappings, parameter schedulers, AMP_ARGS."""
    for k, v in node.items():
        p = path + (str(k),)
        if p[:2] == ("OPTIMIZER", "param_schedulers") and len(p) > 2 or p[-1] == "AMP_ARGS":
            continue
        yield p
        if isinstance(v, dict) and v:
            yield from _leaf_paths(v, p)


def _mutations(key):
    """Typos of ``key``: a dropped character, two swapped characters, a doubled one."""
    out = []
    if len(key) >= 4:
        out.append(key[:-2] + key[-1])  # drop the second-last character
        i = len(key) // 2
        out.append(key[:i - 1] + key[i] + key[i - 1] + key[i + 1:])  # swap two in the middle
    out.append(key + key[-1])  # double the last character
    return [m for m in out if m != key]


DEFAULT_PATHS = list(_leaf_paths(_defaults()))


@pytest.fixture(scope="module")
def quick_raw():
    """The composed quick config *before* inference (what the key check sees)."""
    from omegaconf import OmegaConf
    from vissl.utils.hydra_config import AttrDict, compose_hydra_configuration

    import vissl_swav_plugin  # noqa: F401

    return AttrDict(OmegaConf.to_container(compose_hydra_configuration([QUICK]))["config"])


def _renamed(cfg, path, new):
    cfg = copy.deepcopy(cfg)
    node = cfg
    for p in path[:-1]:
        node = node[p]
    node[new] = node.pop(path[-1])
    return cfg


def test_every_default_key_is_checked_somewhere():
    assert len(DEFAULT_PATHS) > 400  # the property below runs over all of defaults.yaml (468 keys)


@pytest.mark.parametrize("path", DEFAULT_PATHS, ids=".".join)
def test_a_typo_in_any_key_of_defaults_yaml_is_named_with_the_closest_key(quick_raw, path):
    """Property over every key of VISSL's ``defaults.yaml``: renaming it to a typo fails
    naming the full path of the typo; the suggestion is the original key wherever it is
    the uniquely closest of the section's keys (difflib ratio, computed here)."""
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.vissl_schema import check_vissl_keys, known_schema

    node = known_schema()
    for p in path[:-1]:
        node = node[p]
    siblings = [str(k) for k in node]
    for typo in _mutations(path[-1]):
        if typo in siblings:
            continue
        cfg = _renamed(quick_raw, path, typo)
        with pytest.raises(ConfigError) as e:
            check_vissl_keys(cfg)
        where = ".".join(("config",) + path[:-1] + (typo,))
        assert f"{where}: unknown key '{typo}'" in str(e.value)
        ratios = sorted(((difflib.SequenceMatcher(None, typo.lower(), s.lower()).ratio(), s) for s in siblings),
                        reverse=True)
        runner_up = ratios[1][0] if len(ratios) > 1 else 0.0
        if ratios[0][1] == path[-1] and ratios[0][0] > runner_up and ratios[0][0] >= 0.6:
            assert f"(did you mean '{path[-1]}'?)" in str(e.value)


@pytest.mark.parametrize("override,where,near", [
    ("+config.OPTIMIZER.nam=sgd", "config.OPTIMIZER.nam", "name"),
    ("+config.OPTIMIZER.weight_decy=0.1", "config.OPTIMIZER.weight_decy", "weight_decay"),
    ("+config.DATA.TRAIN.BATCHSIZE_PER_REPLIC=8", "config.DATA.TRAIN.BATCHSIZE_PER_REPLIC", "BATCHSIZE_PER_REPLICA"),
    ("+config.CHECKPOINT.CHECKPOINT_FREQUECY=2", "config.CHECKPOINT.CHECKPOINT_FREQUECY", "CHECKPOINT_FREQUENCY"),
    ("+config.MACHINE.DEVICES=cpu", "config.MACHINE.DEVICES", "DEVICE"),
    ("+config.DISTRIBUTED.NUM_PROCS_PER_NODE=2", "config.DISTRIBUTED.NUM_PROCS_PER_NODE", "NUM_PROC_PER_NODE"),
    ("+config.SLURM.PARTITON=dev", "config.SLURM.PARTITON", "PARTITION"),
    ("+config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBORD=true", "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBORD",
     "USE_TENSORBOARD"),
    ("+config.LOSS.swav_loss.temprature=0.2", "config.LOSS.swav_loss.temprature", "temperature"),
    ("+config.SEED_VALU=1", "config.SEED_VALU", "SEED_VALUE"),
    ("+config.OPTIMIZER.param_schedulers.lr.star_value=0.1", "config.OPTIMIZER.param_schedulers.lr.star_value",
     "start_value"),
])
def test_a_typo_added_with_plus_fails_when_composing(override, where, near):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"{where.replace('.', chr(92) + '.')}: unknown key .*did you mean '{near}'"):
        compose([QUICK, override])


@pytest.mark.parametrize("override", [
    "+config.MODEL.AMP_PARAMS.AMP_ARGS.loss_scale=dynamic",        # apex's keyword arguments
    "+config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.anything=1",       # empty in defaults.yaml: open
    "+config.SLURM.ADDITIONAL_PARAMETERS.mem=1G",
    "+config.OPTIMIZER.param_schedulers.weight_decay.name=constant",  # any optimizer option
    "+config.OPTIMIZER.exclude_bias_and_norm=true",                # LARS reads it; VISSL's configs set it
])
def test_open_sections_and_keys_vissl_reads_beyond_defaults_pass(override):
    compose([QUICK, override])


def _vissl_pretrain():
    groups = ("pretrain/swav/", "pretrain/deepcluster_v2/", "pretrain/dino/", "pretrain/simclr/", "test/integration_test/")
    return [n for n in shipped_config_names(root=vissl_configs_dir()) if n.startswith(groups)]


VISSL_SAMPLE = _vissl_pretrain()


@pytest.mark.parametrize("name", VISSL_SAMPLE)
def test_shipped_configs_pass_every_check(name):
    """No false positive: VISSL's own SwAV / DeepCluster-v2 / DINO / SimCLR / integration-test
    configs, those the plugin shadows too (``config=vissl/<name>``), compose with the plugin's
    checks on.  The plugin's own configs go through the same checks in
    ``tests/unit/package/test_packaging.py`` (``test_every_shipped_config_composes_and_validates``)."""
    compose([f"config=vissl/{name}"])


# -- values the inference replaces -------------------------------------------------------------
def _quick_yaml():
    from vissl_swav_plugin.config.search_path import configs_dir

    with open(configs_dir() / "config" / "test" / "swav_plugin" / "quick_cpu.yaml") as f:
        return yaml.safe_load(f)["config"]


def _inferred_truth(key):
    """The value the quick config's head / transforms / processes give ``key`` (read from
    the YAML file, not from the inference)."""
    c = _quick_yaml()
    head = c["MODEL"]["HEAD"]["PARAMS"][-1][1]
    world = c["DISTRIBUTED"]["NUM_NODES"] * c["DISTRIBUTED"]["NUM_PROC_PER_NODE"]
    return {"num_prototypes": head["num_clusters"], "embedding_dim": head["dims"][-1],
            "num_crops": c["DATA"]["TRAIN"]["TRANSFORMS"][0]["total_num_crops"],
            "queue.local_queue_length": c["LOSS"]["swav_plugin_loss"]["queue"]["queue_length"] // world}[key]


@pytest.mark.parametrize("key,value", [
    ("num_prototypes", [30]), ("num_prototypes", [20, 20]), ("embedding_dim", 32), ("num_crops", 6),
    ("num_crops", 2), ("queue.local_queue_length", 3),
])
def test_a_user_value_the_inference_replaces_is_an_error_naming_both(key, value):
    from vissl_swav_plugin.config.checkers import ConfigError

    truth = _inferred_truth(key)
    assert truth != value
    with pytest.raises(ConfigError) as e:
        compose([QUICK, f"{L}.{key}={value}".replace(" ", "")])
    assert f"{L}.{key}={value!r} is replaced by the inferred value {truth!r}" in str(e.value)


@pytest.mark.parametrize("key", ["num_prototypes", "embedding_dim", "num_crops", "queue.local_queue_length"])
def test_a_user_value_equal_to_the_inferred_one_passes(key):
    value = _inferred_truth(key)
    cfg = compose([QUICK, f"{L}.{key}={value}".replace(" ", "")])
    node = cfg.LOSS.swav_plugin_loss
    for p in key.split("."):
        node = node[p]
    assert node == value


def test_output_dir_replaced_by_the_checkpoint_folder_warns(caplog, tmp_path):
    with caplog.at_level(logging.WARNING):
        cfg = compose([QUICK, f"{L}.output_dir=/somewhere/else", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert cfg.LOSS.swav_plugin_loss.output_dir != "/somewhere/else"
    assert f"{L}.output_dir='/somewhere/else' is replaced by the inferred value" in caplog.text


@pytest.mark.parametrize("config,loss", [("config=pretrain/deepcluster_v2/deepclusterv2_quick_cpu", "deepclusterv2_plugin_loss"),
                                         ("config=pretrain/sela_v2/selav2_quick_cpu", "selav2_plugin_loss")])
@pytest.mark.parametrize("key,value", [("num_clusters", [7]), ("embedding_dim", 3)])
def test_clustering_losses_reject_a_replaced_value(config, loss, key, value):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"config\.LOSS\.{loss}\.{key}={value!r}".replace("[", r"\[").replace("]", r"\]")
                       + " is replaced by the inferred value"):
        compose([config, f"config.LOSS.{loss}.{key}={value}"])


def test_vissl_own_loss_warns_when_its_inference_replaces_a_value(caplog):
    """VISSL's swav_loss: its inference replaces num_prototypes by design (its own configs
    carry stale values), so the replacement is a warning naming both values."""
    with caplog.at_level(logging.WARNING):
        cfg = compose(["config=vissl/test/integration_test/quick_swav", "config.LOSS.swav_loss.num_prototypes=[7]"])
    truth = cfg.MODEL.HEAD.PARAMS[0][1]["num_clusters"]
    assert cfg.LOSS.swav_loss.num_prototypes == truth != [7]
    assert f"config.LOSS.swav_loss.num_prototypes=[7] is replaced by the inferred value {truth!r}" in caplog.text


# -- ranges of the optimizer's values ------------------------------------------------------------
O = "config.OPTIMIZER"


@pytest.mark.parametrize("overrides,key", [
    ([f"{O}.param_schedulers.lr.values=[-0.1,0.01]"], r"param_schedulers\.lr\.values\[0\]"),
    ([f"{O}.param_schedulers.lr.name=constant", f"{O}.param_schedulers.lr.value=-0.1"], r"lr\.value"),
    ([f"{O}.param_schedulers.lr.name=cosine", f"{O}.param_schedulers.lr.start_value=-1"], r"lr\.start_value"),
    ([f"{O}.param_schedulers.lr.name=cosine", f"{O}.param_schedulers.lr.end_value=-0.001"], r"lr\.end_value"),
    ([f"{O}.param_schedulers.lr.auto_lr_scaling.base_value=-0.3"], r"auto_lr_scaling\.base_value"),
    ([f"{O}.param_schedulers.lr.value=.inf"], r"lr\.value"),
    ([f"{O}.param_schedulers.lr.name=composite",
      f"{O}.param_schedulers.lr.schedulers=[{{name:linear,start_value:0.0,end_value:-0.3}},{{name:constant,value:0.1}}]",
      f"{O}.param_schedulers.lr.interval_scaling=[rescaled,fixed]", f"{O}.param_schedulers.lr.lengths=[0.5,0.5]"],
     r"lr\.schedulers\[0\]\.end_value"),
    ([f"{O}.param_schedulers.lr_head.values=[0.1,-0.01]"], r"lr_head\.values\[1\]"),
    ([f"{O}.weight_decay=-1e-6"], r"OPTIMIZER\.weight_decay"),
    ([f"{O}.head_optimizer_params.weight_decay=-1"], r"head_optimizer_params\.weight_decay"),
    ([f"{O}.momentum=1.0"], r"OPTIMIZER\.momentum"),
    ([f"{O}.momentum=-0.1"], r"OPTIMIZER\.momentum"),
    ([f"{O}.momentum=1.5"], r"OPTIMIZER\.momentum"),
    ([f"{O}.nesterov=1"], r"OPTIMIZER\.nesterov"),
    ([f"{O}.use_larc=yes"], r"OPTIMIZER\.use_larc"),
    ([f"{O}.larc_config.trust_coefficient=0"], r"larc_config\.trust_coefficient"),
    ([f"{O}.larc_config.eps=-1e-8"], r"larc_config\.eps"),
    ([f"{O}.num_epochs=0"], r"OPTIMIZER\.num_epochs"),
    ([f"{O}.num_epochs=1.5"], r"OPTIMIZER\.num_epochs"),
    ([f"{O}.name=sgdd"], r"OPTIMIZER\.name='sgdd' is not a registered optimizer \(did you mean 'sgd'\?\)"),
])
def test_out_of_range_optimizer_values_name_key_and_value(overrides, key):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=key):
        compose([QUICK, *overrides])


@pytest.mark.parametrize("overrides", [
    [f"{O}.momentum=0.0", f"{O}.weight_decay=0.0"],
    [f"{O}.param_schedulers.lr.name=cosine", f"{O}.param_schedulers.lr.start_value=0.0",
     f"{O}.param_schedulers.lr.end_value=0.0"],
    [f"{O}.num_epochs=1", f"{O}.nesterov=true", f"{O}.use_larc=true"],
])
def test_boundary_values_of_the_ranges_pass(overrides):
    compose([QUICK, *overrides])


# -- checks VISSL runs late ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float8", "fp32", "int8", "bfloat"])
def test_an_unsupported_amp_dtype_fails_when_composing(dtype):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"config\.MODEL\.AMP_PARAMS\.AMP_DTYPE='{dtype}' is not supported"):
        compose([QUICK, "config.MODEL.AMP_PARAMS.USE_AMP=true", f"config.MODEL.AMP_PARAMS.AMP_DTYPE={dtype}"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "bf16"])
def test_supported_amp_dtypes_pass(dtype):
    compose([QUICK, f"config.MODEL.AMP_PARAMS.AMP_DTYPE={dtype}"])


@pytest.mark.parametrize("loss", ["swav_loss", "swav_momentum_loss", "dino_loss"])
def test_vissl_swav_type_loss_with_the_plugin_head_names_the_mismatch_and_the_fix(loss):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"config\.LOSS\.name={loss} \(VISSL's loss\) needs exactly one head, "
                                          r"swav_head.* has \['swav_plugin_head'\]"):
        compose([QUICK, f"config.LOSS.name={loss}"])


def test_swav_loss_with_the_plugin_head_suggests_the_plugin_loss():
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=r"config\.LOSS\.name=swav_plugin_loss"):
        compose([QUICK, "config.LOSS.name=swav_loss"])


def test_any_assertion_of_vissl_inference_becomes_a_config_error_with_the_condition():
    """VISSL's swav_loss asserts its collator: the bare AssertionError becomes a ConfigError
    quoting the failed condition (read from VISSL's source)."""
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=r"config\.LOSS\.name='swav_loss' rejects this config: "
                                          r"`.*COLLATE_FUNCTION in \[` is false \(hydra_config\.py:\d+\)"):
        compose(["config=vissl/test/integration_test/quick_swav", "config.DATA.TRAIN.COLLATE_FUNCTION=default_collate"])


@pytest.mark.parametrize("typo,expected", [
    ("test/swav_plugin/quick_cpux", "test/swav_plugin/quick_cpu"),
    ("pretrain/swav/swav_8node_resnett", "pretrain/swav/swav_8node_resnet"),
    ("pretrain/swav/swav_1gpu_resnt", "pretrain/swav/swav_1gpu_resnet"),
    ("pretrain/swaw/swav_8node_resnet", "pretrain/swav/swav_8node_resnet"),
    ("vissl/pretrain/swav/swav_8node_resnet_", "vissl/pretrain/swav/swav_8node_resnet"),
])
def test_a_misspelt_config_name_lists_the_closest_names(typo, expected):
    from vissl_swav_plugin.config.config_names import UnknownConfigError

    with pytest.raises(UnknownConfigError, match=rf"config={typo}: no such config") as e:
        compose([f"config={typo}"])
    names = str(e.value).split("closest names: ")[1].split(", ")
    assert names[0] == expected


# -- before any worker -------------------------------------------------------------------------------
BAD = [
    ["+config.OPTIMIZER.nam=sgd"],
    ["config.LOSS.name=CosineEmbeddingLoss", "+config.LOSS.CosineEmbeddingLoss.margn=1"],
    [f"{L}.num_prototypes=[30]"],
    [f"{O}.param_schedulers.lr.values=[-0.1,0.01]"],
    ["config.MODEL.AMP_PARAMS.USE_AMP=true", "config.MODEL.AMP_PARAMS.AMP_DTYPE=float8"],
    ["config.LOSS.name=swav_loss"],
]


@pytest.mark.parametrize("extra", BAD, ids=lambda e: e[0].split("=")[0])
def test_swav_plugin_train_fails_in_the_launcher_before_any_worker(monkeypatch, tmp_path, extra):
    """``swav-plugin-train`` (VISSL's launcher with the plugin): every class above fails in
    the launching process with no worker started (every way of starting one is recorded)."""
    import torch.multiprocessing
    from vissl.utils import distributed_launcher as dl

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.tools import launch

    started = []
    monkeypatch.setattr(dl, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: started.append("spawn"))
    monkeypatch.setattr(torch.multiprocessing, "start_processes", lambda *a, **k: started.append("start_processes"))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: started.append("_distributed_worker"))
    with pytest.raises(ConfigError):
        launch.main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}", *extra])
    assert started == []
    launch.main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}"])  # the recorder: a good config starts workers
    assert started


def test_a_head_changed_on_the_command_line_replaces_the_files_stale_value_silently():
    """The command line changes what the value is inferred from (the head), not the value:
    the config file's num_prototypes is stale, as expected, and the head's count is used."""
    head = "[[swav_plugin_head,{dims:[2048,64,16],use_bn:True,num_clusters:[30]}]]"
    cfg = compose([QUICK, f"config.MODEL.HEAD.PARAMS={head}"])
    assert cfg.LOSS.swav_plugin_loss.num_prototypes == [30]


def test_a_config_file_whose_value_contradicts_its_own_head_fails(tmp_path, monkeypatch):
    """A user's config file (working directory) with num_prototypes unlike its head's."""
    from vissl_swav_plugin.config.search_path import configs_dir
    from vissl_swav_plugin.config.checkers import ConfigError

    text = (configs_dir() / "config" / "test" / "swav_plugin" / "quick_cpu.yaml").read_text()
    assert "      num_prototypes: [20]\n" in text
    (tmp_path / "configs" / "config").mkdir(parents=True)
    (tmp_path / "configs" / "config" / "stale.yaml").write_text(
        text.replace("      num_prototypes: [20]\n", "      num_prototypes: [3000]\n"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"{L}\.num_prototypes=\[3000\] is replaced by the inferred value \[20\]"):
        compose(["config=stale"])


# -- dataset lists VISSL's workers would reject --------------------------------------------------
def _folder_cfg(tmp_path, *extra):
    from testkit import make_image_folder

    folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=4, size=8)
    return compose([QUICK, "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.DATA_LIMIT=-1",
                    f"config.DATA.TRAIN.DATA_PATHS=[{folder}]", *extra]), folder


@pytest.mark.parametrize("extra,match", [
    (["config.DATA.TRAIN.DATASET_NAMES=[mine]"],
     r"DATA\.TRAIN\.DATASET_NAMES\[0\]='mine' is not in VISSL's dataset catalog .*config\.DATA\.TRAIN\.LABEL_PATHS is empty"),
    (["config.DATA.TRAIN.DATASET_NAMES=[mine]", "config.DATA.TRAIN.DATA_PATHS=[]"],
     r"DATASET_NAMES\[0\]='mine' is not in VISSL's dataset catalog .*config\.DATA\.TRAIN\.DATA_PATHS is empty"),
    (["config.DATA.TRAIN.DATASET_NAMES=[a,b]"], r"DATASET_NAMES has 2 entries .*DATA_SOURCES has 1"),
    (["config.DATA.TRAIN.DATASET_NAMES=[a,b]", "config.DATA.TRAIN.DATA_SOURCES=[disk_folder,disk_folder]",
      "config.DATA.TRAIN.DATA_PATHS=[{f},{f}]", "config.DATA.TRAIN.LABEL_PATHS=[{f}]"],
     r"LABEL_PATHS has 1 entries .*DATA_SOURCES has 2"),
])
def test_dataset_lists_vissl_would_reject_in_the_workers_fail_at_launch(tmp_path, extra, match):
    """VISSL's own ``get_data_files`` (what each worker calls) fails on these inputs with a
    bare KeyError / AssertionError / IndexError; the launch check names the key first."""
    from vissl.data.dataset_catalog import get_data_files

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.registries import run_launch_checks

    folder = tmp_path / "imgs"
    cfg, _ = _folder_cfg(tmp_path, *[e.replace("{f}", str(folder)) for e in extra])
    with pytest.raises((KeyError, AssertionError, IndexError)):
        get_data_files("TRAIN", cfg.DATA)
    with pytest.raises(ConfigError, match=match):
        run_launch_checks(cfg)


def test_a_close_registered_dataset_name_is_suggested(tmp_path):
    from vissl.data.dataset_catalog import VisslDatasetCatalog

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.registries import run_launch_checks

    cfg, folder = _folder_cfg(tmp_path, "config.DATA.TRAIN.DATASET_NAMES=[my_test_foldr]")
    VisslDatasetCatalog.register_data("my_test_folder", {"train": [str(folder), str(folder)], "val": ["", ""]})
    try:
        with pytest.raises(ConfigError, match=r"'my_test_foldr' is not in VISSL's dataset catalog \(did you mean 'my_test_folder'\?\)"):
            run_launch_checks(cfg)
        good, _ = _folder_cfg(tmp_path / "b", "config.DATA.TRAIN.DATASET_NAMES=[my_test_folder]")
        run_launch_checks(good)  # registered: VISSL finds its labels' path in the catalog
    finally:
        VisslDatasetCatalog.remove("my_test_folder")


def test_data_and_label_paths_given_need_no_catalog(tmp_path):
    from vissl.data.dataset_catalog import get_data_files

    from vissl_swav_plugin.config.registries import run_launch_checks

    cfg, folder = _folder_cfg(tmp_path, "config.DATA.TRAIN.DATASET_NAMES=[mine]")
    cfg.DATA.TRAIN.LABEL_PATHS = [str(folder)]
    assert get_data_files("TRAIN", cfg.DATA)[0] == [str(folder)]
    run_launch_checks(cfg)


def test_an_unregistered_dataset_fails_in_the_launcher_before_any_worker(monkeypatch, tmp_path):
    import torch.multiprocessing
    from vissl.utils import distributed_launcher as dl

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.tools import launch
    from testkit import make_image_folder

    folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=4, size=8)
    started = []
    monkeypatch.setattr(dl, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(torch.multiprocessing, "start_processes", lambda *a, **k: started.append("start_processes"))
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: started.append("spawn"))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: started.append("_distributed_worker"))
    with pytest.raises(ConfigError, match="not in VISSL's dataset catalog"):
        launch.main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}", "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                     "config.DATA.TRAIN.DATA_LIMIT=-1", f"config.DATA.TRAIN.DATA_PATHS=[{folder}]",
                     "config.DATA.TRAIN.DATASET_NAMES=[mine]"])
    assert started == []


def test_keys_a_plugin_registers_are_accepted(monkeypatch, tmp_path):
    """A key another plugin adds in a config file is an unknown key until it is registered (with
    ``+`` on the command line it is accepted, test_vissl_stays_open.py); a registered section's
    own keys are left to its consumer."""
    from vissl_swav_plugin.config import registries
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.registries import register_plugin_config_keys

    monkeypatch.setattr(registries, "_PLUGIN_KEYS", dict(registries._PLUGIN_KEYS))
    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "mine", "  MODEL:\n    MY_BLOCK:\n      a: 1\n")
    with pytest.raises(ConfigError, match=r"config\.MODEL\.MY_BLOCK: unknown key 'MY_BLOCK'"):
        compose(["config=mine"])
    register_plugin_config_keys("MODEL.MY_BLOCK", section=True)
    assert compose(["config=mine"]).MODEL.MY_BLOCK.a == 1
    register_plugin_config_keys("OTHER_PLUGIN.SETTING")
    cfg = compose([QUICK, "+config.MODEL.MY_BLOCK={a:1,anything:2}", "+config.OTHER_PLUGIN.SETTING=3"])
    assert cfg.MODEL.MY_BLOCK.anything == 2 and cfg.OTHER_PLUGIN.SETTING == 3
    with pytest.raises(ConfigError, match=r"config\.OTHER_PLUGIN\.SETTNG: unknown key 'SETTNG' \(did you mean 'SETTING'\?\)"):
        compose([QUICK, "+config.OTHER_PLUGIN.SETTNG=3"])
