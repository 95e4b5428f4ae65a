"""VISSL's own config tests are the guard of what the plugin's checks leave open.

Every override set of VISSL v0.1.6's ``tests/test_configs.py`` and VISSL's ``tests/test_losses_config.py``
(``tests/helpers/vissl_own_config_cases.py``: the explicit ones copied, the parameterised ones over
the installed VISSL's configs, as VISSL lists them) is composed with the plugin active, and with
``VISSL_SWAV_PLUGIN_DISABLE=1`` wherever the verdict depends on VISSL alone's outcome (the cases
the plugin fails, and those whose test checks values), in a working directory without a
``configs/`` folder: the plugin's outcomes in the test process (which loaded the plugin, as a fresh
interpreter does), VISSL alone's in a fresh interpreter (``tests/helpers/vissl_own_config_cases.py``
run as a script: one where the plugin never loaded).  Wherever VISSL alone passes, the plugin must pass with
the values VISSL's test checks; wherever VISSL alone fails, the plugin may pass (a host breakage
its compat layer mends) or fail the same way.  The configs VISSL's tests only compose are
converted too (``converted:`` cases), so that every config VISSL ships (but its detectron2 ones)
goes through the plugin's checks.
"""
import contextlib
import json
import logging

import vissl_swav_plugin
from testkit import REPO, run_script
from vissl_own_config_cases import EXPLICIT, all_cases, run_all

RUNNER = REPO / "tests" / "helpers" / "vissl_own_config_cases.py"


def _with_the_plugin(cases, cwd):
    """The plugin's outcome on every case (``run_all``), in this process: VISSL's warnings off
    while it composes, as in the runner."""
    import vissl  # noqa: F401  (the plugin registers here, through its .pth hook)

    assert vissl_swav_plugin.is_registered()
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.chdir(cwd):
            return run_all(cases)
    finally:
        logging.disable(disabled)


def _vissl_alone(cases, cwd):
    """VISSL alone's outcome on the case ids ``cases``: the runner in a fresh interpreter with
    ``VISSL_SWAV_PLUGIN_DISABLE=1``."""
    only, out = cwd / "off.only.json", cwd / "off.json"
    only.write_text(json.dumps(cases))
    proc = run_script([RUNNER, out, only], cwd, env={"VISSL_SWAV_PLUGIN_DISABLE": "1"})
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
