"""docs/own_images.md, followed literally: its ``bash own-images-cpu`` block runs as written
(the console scripts of setup.py on the PATH) on 200 generated PNGs in 5 class folders,
with tiny epochs / batch through the variables the block reads.  Each console script's shim
runs its entry point from this checkout (setup.py's list) in a new interpreter; the scripts of
an installed wheel are ``test_console_scripts_integration.py``'s."""
import os
import re
import stat
import subprocess
import sys

import numpy as np
import pytest
import yaml

from doc_commands import console_scripts
from testkit import REPO, launcher_env

DOC = REPO / "docs" / "own_images.md"


def doc_block(tag):
    """The fenced block whose info string is ``bash <tag>``."""
    m = re.search(rf"^```bash {re.escape(tag)}\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert m, f"no ```bash {tag} block in {DOC}"
    return m.group(1)


def install_shims(bin_dir, python):
    """A shim per console script in ``bin_dir``: ``python`` runs a script that calls the entry
    point, as pip's script does."""
    scripts = console_scripts()
    assert scripts
    bin_dir.mkdir()
    (bin_dir / "entry_points").mkdir()
    for name, (mod, fn) in scripts.items():
        script = bin_dir / "entry_points" / f"{name}.py"
        script.write_text(f"import sys\nfrom {mod} import {fn}\nif __name__ == '__main__':\n    sys.exit({fn}())\n")
        quoted = " ".join(f"'{a}'" for a in [*python, script])
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec {quoted} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def make_images(root, classes=5, per_class=40, size=32, seed=0):
    """PNGs of 5 classes, each a colour family with texture (RGB, L and RGBA modes mixed)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"kind_{c}").mkdir(parents=True)
        base = rng.integers(40, 216, 3)
        for i in range(per_class):
            img = np.clip(base + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(np.uint8)
            im = Image.fromarray(img)
            im = im.convert(("RGB", "L", "RGBA")[i % 3]) if c == 0 else im
            im.save(root / f"kind_{c}" / f"img{i:03d}.png")


@pytest.mark.timeout(1500)
def test_own_images_section_runs_as_written(tmp_path):
    make_images(tmp_path / "my_images")
    work = tmp_path / "work"
    work.mkdir()
    env = launcher_env({
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "IMAGES": str(tmp_path / "my_images"), "EPOCHS": "1", "BATCH": "8", "EVAL_EPOCHS": "1",
        "VAL_FRACTION": "0.5",
    })
    install_shims(tmp_path / "bin", [sys.executable])
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_block("own-images-cpu")], cwd=work, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1400)
    out = r.stdout
    assert r.returncode == 0, out[-6000:]
    # 1. data: 5 classes, half of each held out
    for split in ("train", "val"):
        classes = sorted(p.name for p in (work / "data" / "mine" / split).iterdir())
        assert classes == [f"{c}_kind_{c}" for c in range(5)]
        assert len(list((work / "data" / "mine" / split).rglob("*.png"))) == 100
    # 2. mean/std file = the numbers of the training PNGs as VISSL reads them (RGB)
    from PIL import Image

    stats = yaml.safe_load((work / "configs" / "config" / "dataset_stats" / "mine.yaml").read_text())
    norm = stats["config"]["DATA"]["TRAIN"]["NORMALIZE"]
    px = np.concatenate([np.asarray(Image.open(p).convert("RGB"), np.float64).reshape(-1, 3) / 255
                         for p in sorted((work / "data" / "mine" / "train").rglob("*.png"))])
    np.testing.assert_allclose(norm["MEAN"], px.mean(0), atol=1e-4)
    np.testing.assert_allclose(norm["STD"], px.std(0), atol=1e-4)
    assert stats["config"]["DATA"]["TEST"]["NORMALIZE"] == norm
    # 3. the user's stats config was found in the working directory and used
    assert re.search(r"config dataset_stats/mine from \S+/work/configs/config/dataset_stats/mine\.yaml "
                     r"\(user working directory\)", out)
    assert (work / "runs" / "mine" / "model_final_checkpoint_phase0.torch").is_file()
    used = yaml.safe_load((work / "runs" / "mine" / "train_config.yaml").read_text())
    multicrop = used["DATA"]["TRAIN"]["TRANSFORMS"][0]
    assert multicrop["name"] == "multicrop_plugin"
    assert (multicrop["mean"], multicrop["std"]) == (norm["MEAN"], norm["STD"])
    # 4. kNN and 5. linear results
    assert (work / "runs" / "mine_knn" / "knn_results.json").is_file()
    assert (work / "runs" / "mine_linear" / "metrics.json").is_file()
