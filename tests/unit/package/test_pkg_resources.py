"""``import pkg_resources`` is setuptools' own module, with the whole resource API that VISSL's
test utilities and code built on VISSL use (``resource_isdir``, ``resource_listdir``,
``resource_filename``, ``get_distribution``, ``iter_entry_points``, ``parse_version``)."""
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _requirement_range(text):
    m = re.search(r"^setuptools([<>=!,.0-9 ]+)$", text, re.M)
    assert m, "no setuptools requirement"
    return m.group(1).replace(" ", "")


def test_pkg_resources_is_setuptools_own():
    import importlib.metadata as md

    import pkg_resources
    import setuptools

    assert Path(pkg_resources.__file__).parent.name == "pkg_resources"
    assert Path(pkg_resources.__file__).parent.parent == Path(setuptools.__file__).parent.parent
    # the installed setuptools is in the range both files ask for (and ships pkg_resources)
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(_requirement_range((REPO / "requirements-host.txt").read_text()))
    assert md.version("setuptools") in spec
    setup_py = (REPO / "setup.py").read_text()
    assert f'"setuptools{spec}"' in setup_py.replace(" ", "") or all(
        str(s) in setup_py for s in spec), "setup.py and requirements-host.txt disagree on setuptools"
    # torch's own requirement on setuptools is met by that range's installed release
    torch_reqs = [r for r in (md.requires("torch") or []) if r.startswith("setuptools")]
    for r in torch_reqs:
        floor = re.search(r">=\s*([0-9.]+)", r)
        if floor:
            assert pkg_resources.parse_version(md.version("setuptools")) >= pkg_resources.parse_version(floor.group(1))


def _walk_resources(pkg, path):
    """Every file below ``path`` of package ``pkg``, through pkg_resources alone."""
    import pkg_resources

    out = []
    for name in pkg_resources.resource_listdir(pkg, path):
        sub = f"{path}/{name}" if path else name
        if pkg_resources.resource_isdir(pkg, sub):
            out.extend(_walk_resources(pkg, sub))
        else:
            out.append(sub)
    return out


def test_resource_api_on_vissls_configs():
    """As VISSL's test utilities list its configs: resource_isdir / resource_listdir on the
    ``configs`` package that VISSL's wheel installs, against the files on disk."""
    import configs  # VISSL's top-level configs package
    import pkg_resources

    root = Path(configs.__file__).parent
    assert pkg_resources.resource_isdir("configs", "config/pretrain/swav")
    assert not pkg_resources.resource_isdir("configs", "config/pretrain/swav/swav_8node_resnet.yaml")
    listed = sorted(p for p in _walk_resources("configs", "config") if p.endswith(".yaml"))
    # the files on disk, listed here and not by the package's lister (config.yaml_files): the
    # independent truth that pkg_resources' listing is compared with
    on_disk = sorted(str(p.relative_to(root)).replace(os.sep, "/") for p in (root / "config").rglob("*.yaml"))
    assert listed == on_disk and len(listed) > 100
    assert pkg_resources.resource_filename("configs", "config/dataset_catalog.json") == str(
        root / "config" / "dataset_catalog.json")


def test_distribution_api():
    import importlib.metadata as md

    import pkg_resources

    assert pkg_resources.get_distribution("vissl").version == md.version("vissl")
    with pytest.raises(pkg_resources.DistributionNotFound):
        pkg_resources.get_distribution("no-such-distribution-for-this-test")
    scripts = {ep.name for ep in pkg_resources.iter_entry_points("console_scripts")}
    assert "swav-plugin-train" in scripts
    assert pkg_resources.parse_version("0.1.10") > pkg_resources.parse_version("0.1.9")
