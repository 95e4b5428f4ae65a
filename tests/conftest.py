"""Shared fixtures/helpers.  ``tests/`` is not a package (VISSL owns the top-level name)."""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
STOCK_LAUNCHER = SITE / "tools" / "run_distributed_engines.py"
PLUGIN_LAUNCHER = REPO / "tools" / "run_distributed_engines.py"


def run_launcher(overrides, cwd, launcher=STOCK_LAUNCHER, env=None, timeout=900, check=True):
    """Run a VISSL launcher in a fresh interpreter; returns CompletedProcess (stdout+stderr)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("MKL_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(launcher), *overrides],
        cwd=str(cwd),
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-80:])
        raise AssertionError(f"launcher failed (rc={proc.returncode}):\n{tail}")
    return proc


def compose(overrides):
    """Compose + infer a VISSL config exactly as the launchers do (in this process)."""
    import vissl  # noqa: F401  (registers the plugin through the .pth hook)
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    cfg = compose_hydra_configuration(list(overrides))
    _, config = convert_to_attrdict(cfg, dump_config=False)
    return config


@pytest.fixture
def repo():
    return REPO
