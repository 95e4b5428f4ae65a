"""The wheel ships only vissl_swav_plugin (+ its start-up .pth and configs as data): the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/package/test_packaging.py``.
"""
import subprocess
import sys
import zipfile


from testkit import REPO


def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    (whl,) = tmp_path.glob("vissl_swav_plugin-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"vissl_swav_plugin", "vissl_swav_plugin.pth", *[t for t in top if t.endswith(".dist-info")]}
    assert "vissl_swav_plugin/_configs/config/pretrain/swav/swav_8node_resnet.yaml" in names
    assert {"vissl_swav_plugin/compat/__init__.py", "vissl_swav_plugin/compat/engine.py"} <= set(names)
    pth = zipfile.ZipFile(whl).read("vissl_swav_plugin.pth").decode()
    assert pth == (REPO / "vissl_swav_plugin.pth").read_text()
