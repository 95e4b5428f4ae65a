"""VISSL's own config tests are the guard of what the plugin's checks leave open.

Every override set of VISSL v0.1.6's ``tests/test_configs.py`` and VISSL's ``tests/test_losses_config.py``
(``tests/helpers/vissl_own_config_cases.py``: the explicit ones copied, the parameterised ones over
the installed VISSL's configs, as VISSL lists them) is composed with the plugin active, and with
``VISSL_SWAV_PLUGIN_DISABLE=1`` wherever the verdict depends on VISSL alone's outcome (the cases
the plugin fails, and those whose test checks values), in a working directory without a
``configs/`` folder, each runner a new interpreter.  Wherever VISSL alone passes, the plugin must pass with
the values VISSL's test checks; wherever VISSL alone fails, the plugin may pass (a host breakage
its compat layer mends) or fail the same way.  The configs VISSL's tests only compose are
converted too (``converted:`` cases), so that every config VISSL ships (but its detectron2 ones)
goes through the plugin's checks.
"""
import json

from testkit import HANG_S, REPO, start_launcher
from vissl_own_config_cases import EXPLICIT, all_cases

RUNNER = REPO / "tests" / "helpers" / "vissl_own_config_cases.py"


def _run(tmp_path, name, env, only):
    """Start the runner on the case ids ``only`` (a list) (``testkit.start_launcher``); returns (its output file, its log file, the process)."""
    only_file, out, log = tmp_path / f"{name}.only.json", tmp_path / f"{name}.json", tmp_path / f"{name}.log"
    only_file.write_text(json.dumps(only))
    with open(log, "w") as f:
        return out, log, start_launcher([str(out), str(only_file)], tmp_path, f, launcher=RUNNER, env=env)


def _collect(runs):
    result = {}
    for name, (out, log, proc) in runs.items():
        code = proc.wait(timeout=HANG_S)
        assert code == 0, f"{name}: the runner failed:\n{log.read_text()[-4000:]}"
        result.update(json.loads(out.read_text()))
    return result


def needs_vissl_alone(case, outcome_with_plugin):
    """Whether the verdict on ``case`` depends on VISSL alone's outcome: where the plugin passes
    a case whose test checks no value, it passes whatever VISSL alone does."""
    return outcome_with_plugin["outcome"] != "ok" or bool(outcome_with_plugin["values"]) or case in EXPLICIT


def _outcomes(tmp_path):
    """The plugin's outcome on every case (two runners, half the cases each), then VISSL alone's
    (``VISSL_SWAV_PLUGIN_DISABLE=1``) on the cases whose verdict needs it."""
    cases = sorted(all_cases())
    on = _collect({f"on{i}": _run(tmp_path, f"on{i}", {}, cases[i::2]) for i in range(2)})
    needed = sorted(case for case in cases if needs_vissl_alone(case, on[case]))
    off = _collect({"off": _run(tmp_path, "off", {"VISSL_SWAV_PLUGIN_DISABLE": "1"}, needed)})
    assert set(off) == set(needed)
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
