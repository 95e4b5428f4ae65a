"""The wheel installs the plugin's console scripts: built with ``pip wheel --no-deps``,
installed with ``--no-deps`` into a fresh virtualenv that sees this environment's
site-packages (torch, VISSL) through a ``.pth``, each ``swav-plugin-*`` answers ``--help``: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/tools/test_console_scripts.py``.
"""
import os
import subprocess
import sys
import sysconfig

import pytest

from testkit import REPO
from console_scripts_cases import SCRIPTS  # noqa: F401


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp), str(REPO)], check=True, cwd=tmp)
    (whl,) = tmp.glob("vissl_swav_plugin-*.whl")
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(whl)],
                       capture_output=True, text=True, env=clean_env())
    assert r.returncode == 0 and "ERROR" not in r.stdout + r.stderr, r.stdout + r.stderr
    # then torch, VISSL, ... from this environment (after the install, so that pip does not
    # see this environment's own vissl-swav-plugin; a plain path entry: its .pth files, e.g.
    # an editable install of the plugin, are not processed)
    with open(os.path.join(site, "host_site_packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def clean_env():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def test_wheel_plugin_is_the_installed_one(venv, tmp_path):
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import vissl, vissl_swav_plugin as p; print(p.__file__, p.is_registered())"],
                       capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    path, registered = r.stdout.split()
    assert path.startswith(str(venv)) and registered == "True"


@pytest.mark.parametrize("name", SCRIPTS)
def test_console_script_help(venv, name, tmp_path):
    exe = venv / "bin" / name
    assert exe.is_file(), f"{name} not installed"
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("usage: "), r.stdout[:500]
