"""VISSL's own config tests are the guard of what the plugin's checks leave open.

Every override set of VISSL v0.1.6's ``tests/test_configs.py`` and ``tests/test_losses_config.py``
(``tests/helpers/vissl_own_config_cases.py``: the explicit ones copied, the parameterised ones over
the installed VISSL's configs, as VISSL lists them) is composed in two fresh interpreters, one with
the plugin active and one with ``VISSL_SWAV_PLUGIN_DISABLE=1``, in a working directory without a
``configs/`` folder.  Wherever VISSL alone passes, the plugin must pass with the values VISSL's test
checks; wherever VISSL alone fails, the plugin may pass (a host breakage its compat layer mends) or
fail the same way.  The configs VISSL's tests only compose are converted too (``converted:``
cases), so that every config VISSL ships (but its detectron2 ones) goes through the plugin's checks.
"""
import json
import subprocess
import sys

from testkit import HANG_S, REPO, launcher_env
from vissl_own_config_cases import EXPLICIT

RUNNER = REPO / "tests" / "helpers" / "vissl_own_config_cases.py"


def _outcomes(tmp_path):
    procs = {}
    for side, env in (("on", {}), ("off", {"VISSL_SWAV_PLUGIN_DISABLE": "1"})):
        out = tmp_path / f"{side}.json"
        procs[side] = (out, subprocess.Popen([sys.executable, str(RUNNER), str(out)], cwd=str(tmp_path),
                                             env=launcher_env(env), stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True))
    result = {}
    for side, (out, proc) in procs.items():
        text, _ = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 0, f"plugin {side}: the runner failed:\n{text[-4000:]}"
        result[side] = json.loads(out.read_text())
    return result["on"], result["off"]


def test_vissl_own_config_tests_have_the_same_outcome_with_the_plugin_active(tmp_path):
    on, off = _outcomes(tmp_path)
    assert set(on) == set(off)
    assert set(EXPLICIT) <= set(on) and len(on) > 500  # VISSL v0.1.6: 9 explicit + 692 parameterised
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
