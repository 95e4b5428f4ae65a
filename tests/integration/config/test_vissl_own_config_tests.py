"""VISSL's own config tests are the guard of what the plugin's checks leave open.

Every override set of VISSL v0.1.6's ``tests/test_configs.py`` and VISSL's ``tests/test_losses_config.py``
(facebookresearch/vissl tag v0.1.6; :data:`EXPLICIT`: the explicit ones, copied as data -- the
overrides, not the files; :func:`parameterized_cases`: the parameterised ones, over the installed
VISSL's configs, listed the way VISSL's ``tests/utils.py`` lists them) is composed with the plugin
active, and with ``VISSL_SWAV_PLUGIN_DISABLE=1`` wherever the verdict depends on VISSL alone's
outcome (the cases the plugin fails, and those whose test checks values), in a working directory
without a ``configs/`` folder: the plugin's outcomes in the test process (which loaded the plugin,
as a fresh interpreter does), VISSL alone's in a fresh interpreter (this file run as a script,
``python test_vissl_own_config_tests.py OUT.json ONLY.json``: one where the plugin never loaded;
it writes ``{case id: {"outcome": "ok" | exception class, "values": {...}}}`` for the case ids listed
in ``ONLY.json``).  ``values`` holds what VISSL's test asserts for that case (a trunk depth, a
learning rate, an added key, the loss built).  Wherever VISSL alone passes, the plugin must pass
with the values VISSL's test checks; wherever VISSL alone fails, the plugin may pass (a host
breakage its compat layer mends) or fail the same way.  The configs VISSL's tests only compose are
converted too (``converted:`` cases), so that every config VISSL ships (but its detectron2 ones)
goes through the plugin's checks.
"""
import contextlib
import importlib.util
import json
import logging
import sys
from pathlib import Path

QUICK_SIMCLR = "config=test/integration_test/quick_simclr"
SYNTHETIC = ["config.DATA.TRAIN.DATA_SOURCES=[synthetic]", "config.DATA.TEST.DATA_SOURCES=[synthetic]"]

#: ``{case id: (overrides, what VISSL's test checks)}``, test_configs.py and test_losses_config.py
EXPLICIT = {
    "TestConfigsFail.test_cfg_fail_on_empty": ([], "compose"),
    "TestConfigsPass.test_load_cfg_success": ([QUICK_SIMCLR], "compose"),
    "TestConfigsComposition.test_cfg_composition": (
        [QUICK_SIMCLR, "+config/pretrain/simclr/models=resnext101"], "depth"),
    "TestConfigsFailComposition.test_cfg_fail_composition": (
        [QUICK_SIMCLR, "config/pretrain/simclr/models=resnext101"], "compose"),
    "TestConfigsCliComposition.test_cfg_cli_composition": (
        [QUICK_SIMCLR, "+config/pretrain/simclr/models=resnext101", "config.MODEL.TRUNK.RESNETS.GROUPS=32",
         "config.MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP=16"], "groups"),
    "TestScalingTypeConfig.test_sqrt_lr_scaling": (
        [QUICK_SIMCLR, "+config/pretrain/simclr/models=resnext101",
         "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=True",
         'config.OPTIMIZER.param_schedulers.lr.name="linear"',
         'config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type="sqrt"'], "end_value"),
    "TestScalingTypeConfig.test_linear_lr_scaling": (
        [QUICK_SIMCLR, "+config/pretrain/simclr/models=resnext101",
         "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=True",
         'config.OPTIMIZER.param_schedulers.lr.name="linear"',
         'config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type="linear"'], "end_value"),
    "TestConfigsKeyAddition.test_cfg_key_addition": (
        [QUICK_SIMCLR, "+config.LOSS.simclr_info_nce_loss.buffer_params.MY_TEST_KEY=dummy"], "my_test_key"),
    "TestRootConfigsLossesBuild.test_pytorch_loss": (
        [QUICK_SIMCLR, "config.LOSS.name=CosineEmbeddingLoss", "+config.LOSS.CosineEmbeddingLoss.margin=1.0",
         *SYNTHETIC], "build_loss"),
}


def _vissl_config_root() -> Path:
    return Path(list(importlib.util.find_spec("configs").submodule_search_locations)[0])


def _config_names(group, exclude):
    """``config=<name>.yaml`` of every VISSL config of ``group`` (a name prefix) whose name holds none
    of ``exclude`` (VISSL's ``list_config_files`` + ``create_valid_input``).  ``yaml_files`` has no
    side effect on import, so the plugin-off run stays off."""
    from vissl_swav_plugin.config.yaml_files import shipped_config_names

    names = shipped_config_names(group, root=_vissl_config_root() / "config")
    return [f"config={name}.yaml" for name in names if not any(x in name for x in exclude)]


def parameterized_cases():
    """The cases of the parameterised tests, over the installed VISSL's configs."""
    cases = {}
    for name in _config_names("benchmark/", ["object_detection"]):
        cases[f"TestBenchmarkConfigs:{name}"] = ([name], "compose")
    for name in _config_names("pretrain/", []):
        cases[f"TestPretrainConfigs:{name}"] = ([name], "compose")
    for name in _config_names("test/integration_test/", []):
        cases[f"TestIntegrationTestConfigs:{name}"] = ([name], "compose")
    root = _config_names("", ["models", "optimization", "object_detection", "nearest_neighbor",
                                    "feature_extraction", "fb", "test/transforms"])
    for name in root:
        cases[f"TestRootConfigsLossesBuild.test_loss_build:{name}"] = ([name, *SYNTHETIC], "convert")
    # not VISSL's: the configs its tests only compose are converted too, so that the plugin's
    # checks (which run in the conversion) see every one of them
    for name in sorted({ov[0] for ov, check in cases.values() if check == "compose"} - set(root)):
        cases[f"converted:{name}"] = ([name], "convert")
    return cases


def all_cases():
    return {**EXPLICIT, **parameterized_cases()}


def _values(config, check):
    if check == "depth":
        return {"DEPTH": config.MODEL.TRUNK.RESNETS.DEPTH}
    if check == "groups":
        return {"GROUPS": config.MODEL.TRUNK.RESNETS.GROUPS,
                "WIDTH_PER_GROUP": config.MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP}
    if check == "end_value":
        return {"end_value": config.OPTIMIZER.param_schedulers.lr.end_value}
    if check == "my_test_key":
        return {"MY_TEST_KEY in buffer_params": "MY_TEST_KEY" in config.LOSS.simclr_info_nce_loss.buffer_params}
    if check == "build_loss":
        from classy_vision.generic.distributed_util import set_cpu_device
        from vissl.trainer.train_task import SelfSupervisionTask

        set_cpu_device()
        task = SelfSupervisionTask.from_config(config)
        task.datasets, _ = task.build_datasets()
        return {"loss": type(task._build_loss()).__name__}
    return {}


def run_case(overrides, check):
    """``{"outcome", "values"}`` of one case: as VISSL's test composes it (``compose``: Hydra
    only, as ``SSLHydraConfig.from_configs``), then ``convert_to_attrdict`` (VISSL's inference,
    where the plugin's checks run) for the other checks."""
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    try:
        cfg = compose_hydra_configuration(list(overrides))
        if check == "compose":
            return {"outcome": "ok", "values": {}}
        _, config = convert_to_attrdict(cfg, dump_config=False)
        return {"outcome": "ok", "values": _values(config, check)}
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return {"outcome": type(e).__name__, "values": {}, "error": str(e)[:400]}


def run_all(cases):
    """Every case's outcome.  A config that a loss-build case converts (with the synthetic
    data sources) is not composed again for its compose-only case when the conversion passed:
    composing is the conversion's first step, and the two overrides only set existing keys."""
    out, converted = {}, {}
    for case, (ov, check) in cases.items():
        if check == "convert":
            out[case] = converted[ov[0]] = run_case(ov, check)
    for case, (ov, check) in cases.items():
        if case in out:
            continue
        if check == "compose" and len(ov) == 1 and converted.get(ov[0], {}).get("outcome") == "ok":
            out[case] = {"outcome": "ok", "values": {}}
        else:
            out[case] = run_case(ov, check)
    return out


def main(argv):
    """``OUT.json ONLY.json``: the outcome of every case whose id ``ONLY.json`` lists."""
    import vissl  # noqa: F401  (the plugin registers here unless VISSL_SWAV_PLUGIN_DISABLE=1)

    logging.disable(logging.WARNING)
    out, only = (Path(a) for a in argv)
    wanted = set(json.loads(only.read_text()))
    out.write_text(json.dumps(run_all({case: spec for case, spec in all_cases().items() if case in wanted}),
                              indent=1, sort_keys=True))


def _with_the_plugin(cases, cwd):
    """The plugin's outcome on every case (``run_all``), in this process: VISSL's warnings off
    while it composes, as in :func:`main`."""
    import vissl  # noqa: F401  (the plugin registers here, through its .pth hook)

    import vissl_swav_plugin

    assert vissl_swav_plugin.is_registered()
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.chdir(cwd):
            return run_all(cases)
    finally:
        logging.disable(disabled)


def _vissl_alone(cases, cwd):
    """VISSL alone's outcome on the case ids ``cases``: this file run as a script (:func:`main`) in a
    fresh interpreter with ``VISSL_SWAV_PLUGIN_DISABLE=1``."""
    from testkit import run_script  # here: the script run imports no test helper

    only, out = cwd / "off.only.json", cwd / "off.json"
    only.write_text(json.dumps(cases))
    proc = run_script([__file__, out, only], cwd, env={"VISSL_SWAV_PLUGIN_DISABLE": "1"})
    assert proc.returncode == 0, f"the runner failed:\n{proc.stdout[-4000:]}"
    return json.loads(out.read_text())


def needs_vissl_alone(case, outcome_with_plugin):
    """Whether the verdict on ``case`` depends on VISSL alone's outcome: where the plugin passes
    a case whose test checks no value, it passes whatever VISSL alone does."""
    return outcome_with_plugin["outcome"] != "ok" or bool(outcome_with_plugin["values"]) or case in EXPLICIT


def _outcomes(tmp_path):
    """The plugin's outcome on every case, then VISSL alone's on the cases whose verdict needs it."""
    cases = all_cases()
    on = _with_the_plugin(cases, tmp_path)
    needed = sorted(case for case in cases if needs_vissl_alone(case, on[case]))
    off = _vissl_alone(needed, tmp_path)
    assert set(on) == set(cases) and set(off) == set(needed)
    return on, off


def test_vissl_own_config_tests_have_the_same_outcome_with_the_plugin_active(tmp_path):
    on, off = _outcomes(tmp_path)
    assert set(EXPLICIT) <= set(off) and len(on) > 500  # VISSL v0.1.6: 9 explicit + 692 parameterised
    differences = []
    for case in sorted(off):
        a, b = on[case], off[case]
        if b["outcome"] == "ok":
            if a["outcome"] != "ok" or a["values"] != b["values"]:
                differences.append(f"{case}: VISSL alone {b}, with the plugin {a}")
        elif a["outcome"] not in ("ok", b["outcome"]):
            differences.append(f"{case}: VISSL alone fails with {b['outcome']}, the plugin with {a}")
    assert not differences, "\n".join(differences)
    # the two VISSL tests the key checks used to fail, with what VISSL's tests assert
    assert on["TestConfigsKeyAddition.test_cfg_key_addition"]["values"] == {"MY_TEST_KEY in buffer_params": True}
    assert on["TestRootConfigsLossesBuild.test_pytorch_loss"]["values"] == {"loss": "CosineEmbeddingLoss"}


if __name__ == "__main__":
    main(sys.argv[1:])
