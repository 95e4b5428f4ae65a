"""tools/offline_bundle.txt, the wheels `make bundle` writes for an offline Python 3.12 GPU
machine (docs/gpu.md), against the environment the tests run in (built by tools/install_env.sh):

* every pin equals the version installed here, so the GPU machine runs what CI tested;
* the bundle is closed: every requirement of a bundled distribution (read from its installed
  metadata, markers evaluated) is bundled too or is one of the packages the GPU machine
  brings itself (torch, torchvision, numpy, scikit-learn/scipy, Pillow, pytest)."""
import importlib.metadata as md
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testkit import REPO

BUNDLE_LIST = REPO / "tools" / "offline_bundle.txt"
# what the GPU machine has without the bundle (docs/gpu.md)
MACHINE_HAS = {"torch", "torchvision", "numpy", "scikit-learn", "scipy", "pillow", "pytest", "joblib",
               "threadpoolctl"}
# VISSL 0.1.6 lists Cython (a build tool of its C extensions, which the wheel does not have)
# and parameterized (a test helper of its own test suite): neither is imported by the
# installed package, and neither is in the tested environment
NOT_NEEDED = {("vissl", "cython"), ("vissl", "parameterized")}


def bundle_pins():
    pins = {}
    for line in BUNDLE_LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            spec = str(req.specifier)
            assert re.fullmatch(r"==[\w.]+", spec), f"{line!r}: pin an exact version (==)"
            pins[canonicalize_name(req.name)] = spec[2:]
    return pins


def test_every_pin_is_the_tested_version():
    wrong = {}
    for name, version in bundle_pins().items():
        installed = md.version(name)
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"tools/offline_bundle.txt pin vs installed here: {wrong}"


@pytest.mark.parametrize("name", sorted(bundle_pins()))
def test_the_bundle_is_closed_under_requirements(name):
    have = set(bundle_pins()) | MACHINE_HAS
    missing = []
    for r in md.requires(name) or []:
        req = Requirement(r)
        if req.marker is not None and not req.marker.evaluate({"extra": "", "python_version": "3.12"}):
            continue
        dep = canonicalize_name(req.name)
        if dep not in have and (name, dep) not in NOT_NEEDED:
            missing.append(dep)
    assert not missing, f"{name} requires {missing}, neither in tools/offline_bundle.txt nor on the GPU machine"


def test_the_plugin_itself_needs_only_bundled_setuptools():
    import ast

    setup = (REPO / "setup.py").read_text()
    call = [n for n in ast.walk(ast.parse(setup)) if isinstance(n, ast.keyword) and n.arg == "install_requires"][0]
    for r in ast.literal_eval(call.value):
        req = Requirement(r)
        assert req.specifier.contains(bundle_pins()[canonicalize_name(req.name)]), r


def test_offline_install_builds_the_editable_plugin_without_an_index():
    """The project has no pyproject.toml: where `wheel` is installed (the GPU machine's image),
    pip without --use-pep517 takes the legacy `setup.py develop` path, and setuptools 80's
    develop re-runs pip with build isolation, which downloads setuptools and fails offline
    (seen on the H200 machine, 2026-11-26). Every editable install of the offline script must
    force the PEP 660 path and must not reach an index."""
    script = (REPO / "tools" / "install_offline.sh").read_text()
    installs = [line for line in script.splitlines() if re.search(r"\$PIP install\b.*\s-e\s", line)]
    assert installs, "tools/install_offline.sh installs the plugin editable"
    for line in installs:
        for flag in ("--use-pep517", "--no-build-isolation", "--no-index"):
            assert flag in line, (flag, line)
