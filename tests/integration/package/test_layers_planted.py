"""The architecture contracts can fail: a copy of the package with one planted import breaks
them (``lint-imports`` in a fresh interpreter that imports the copy)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import HANG_S, REPO


def _lint(tmp_path, plant_in, line):
    copy = tmp_path / "src"
    shutil.copytree(REPO / "vissl_swav_plugin", copy / "vissl_swav_plugin",
                    ignore=shutil.ignore_patterns("__pycache__", "_configs"))
    target = copy / "vissl_swav_plugin" / plant_in
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(copy)
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--config", str(REPO / ".importlinter"), "--no-cache"], cwd=copy, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=HANG_S)
    return proc


def test_the_unchanged_copy_passes(tmp_path):
    proc = _lint(tmp_path, "utils/knn.py", "")
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("plant_in, line, lower, upper", [
    ("utils/knn.py", "from vissl_swav_plugin.hooks import registry", "vissl_swav_plugin.utils.knn",
     "vissl_swav_plugin.hooks.registry"),
    ("losses/swav_loss.py", "import vissl_swav_plugin.hooks.swav_hooks", "vissl_swav_plugin.losses.swav_loss",
     "vissl_swav_plugin.hooks.swav_hooks"),
    ("compat/numpy2.py", "from vissl_swav_plugin.config import validation", "vissl_swav_plugin.compat.numpy2",
     "vissl_swav_plugin.config.validation"),
])
def test_an_upward_import_breaks_the_layers_contract(tmp_path, plant_in, line, lower, upper):
    proc = _lint(tmp_path, plant_in, line)
    assert proc.returncode == 1, proc.stdout
    assert "BROKEN" in proc.stdout and lower in proc.stdout and upper in proc.stdout, proc.stdout


def test_vissl_in_the_bottom_layer_breaks_its_contract(tmp_path):
    proc = _lint(tmp_path, "utils/sinkhorn.py", "import vissl.utils.misc")
    assert proc.returncode == 1, proc.stdout
    assert "utils) imports neither vissl nor classy_vision BROKEN" in proc.stdout.replace("\n", " ") or (
        "vissl_swav_plugin.utils.sinkhorn -> vissl" in proc.stdout), proc.stdout
