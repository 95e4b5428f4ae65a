"""The demo package's pieces (vissl_swav_plugin.demo) without running the demo: cheap
imports, the log parsing, the Hydra overrides, the loss-curve reading, the command line.
The demo itself runs in test_real_data_swav.py: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/demo/test_demo.py``.
"""
import subprocess
import sys


from testkit import REPO, launcher_env


def test_demo_package_imports_nothing_heavy():
    code = ("import sys, vissl_swav_plugin.demo as d\n"
            "from vissl_swav_plugin.demo import cli, common, data, evaluation, report, training\n"
            "print(sorted(m for m in ('torch', 'vissl', 'matplotlib', 'numpy', 'classy_vision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=launcher_env(), stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_tools_demo_help_lists_every_option():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "demo.py"), "--help"], env=launcher_env(),
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    for opt in ("--quick", "--out", "--data-dir", "--source", "--seed", "--procs", "--random-inits", "--threads",
                "--amp", "--amp-remeasure", "--train-per-class", "--test-per-class", "--epochs", "--batch", "--queue", "--freeze",
                "--prototypes", "--temperature", "--precise-bn", "--color-strength", "--color-warmup-iters",
                "--normalize", "--override",
                "--device"):
        assert opt in out, opt
