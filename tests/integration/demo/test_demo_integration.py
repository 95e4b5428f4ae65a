"""The demo package imports nothing heavy: a fresh interpreter's imports, the one test of
the demo's pieces that needs its own process (the test process has torch and VISSL loaded).
The demo itself runs in test_real_data_swav_integration.py.

The in-process tests (the log parsing, the Hydra overrides, the loss-curve reading, the
command line and its ``--help``) are in ``tests/unit/demo/test_demo.py``.
"""
import subprocess
import sys


from testkit import launcher_env


def test_demo_package_imports_nothing_heavy():
    code = ("import sys, vissl_swav_plugin.demo as d\n"
            "from vissl_swav_plugin.demo import cli, common, data, evaluation, report, training\n"
            "print(sorted(m for m in ('torch', 'vissl', 'matplotlib', 'numpy', 'classy_vision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=launcher_env(), stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
