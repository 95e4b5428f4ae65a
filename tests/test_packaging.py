"""The wheel ships only vissl_swav_plugin (+ its start-up .pth and configs as data)."""
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    (whl,) = tmp_path.glob("vissl_swav_plugin-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"vissl_swav_plugin", "vissl_swav_plugin.pth", *[t for t in top if t.endswith(".dist-info")]}
    assert "vissl_swav_plugin/_configs/config/pretrain/swav/swav_8node_resnet.yaml" in names
    pth = zipfile.ZipFile(whl).read("vissl_swav_plugin.pth").decode()
    assert pth == (REPO / "vissl_swav_plugin.pth").read_text()


def test_repo_dirs_vissl_owns_are_not_packages():
    for d in ("configs", "tools", "tests"):
        assert not (REPO / d / "__init__.py").exists(), f"{d}/__init__.py would shadow VISSL's '{d}'"


def test_wheel_configs_found_by_search_path(tmp_path, monkeypatch):
    """search_path.configs_dir() prefers a packaged _configs copy over the repository."""
    import vissl_swav_plugin.search_path as sp

    assert sp.configs_dir() == REPO / "configs"  # editable install: the repository's
