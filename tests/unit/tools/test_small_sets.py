"""tools/make_small_sets.py: Animal-MNIST and the upscaled digits as IDX files the demo reads.

Independent truths: the IDX reader of the data tool (``data_sources.read_idx``, written for
Fashion-MNIST's files), scikit-learn's own digits and labels, and a fake Animal-MNIST wheel
built here with known arrays.
"""

import gzip
import pickle
import zipfile

import numpy as np
import pytest

from testkit import load_script


def test_idx_round_trip_through_the_data_tools_reader(tmp_path):
    from vissl_swav_plugin.tools.data_sources import read_idx
    from vissl_swav_plugin.tools.small_sets import write_idx

    rng = np.random.default_rng(0)
    for shape in [(7, 28, 28), (5, 3, 9), (11,)]:
        a = rng.integers(0, 256, shape).astype(np.uint8)
        write_idx(tmp_path / "a.gz", a)
        assert np.array_equal(read_idx(tmp_path / "a.gz"), a)


def test_stratified_split_is_disjoint_balanced_and_seeded():
    from vissl_swav_plugin.tools.data_sources import DataToolError
    from vissl_swav_plugin.tools.small_sets import stratified_split

    labels = np.repeat(np.arange(4), [10, 12, 9, 15])
    np.random.default_rng(1).shuffle(labels)
    tr, te = stratified_split(labels, 5, 3, seed=3)
    assert not set(tr) & set(te)
    assert np.bincount(labels[tr]).tolist() == [5] * 4 and np.bincount(labels[te]).tolist() == [3] * 4
    tr2, te2 = stratified_split(labels, 5, 3, seed=3)
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    assert not np.array_equal(np.sort(stratified_split(labels, 5, 3, seed=4)[0]), np.sort(tr))
    with pytest.raises(DataToolError, match="class 2 has 9 images"):
        stratified_split(labels, 7, 3)


def test_digits_are_sklearns_digits_upscaled(tmp_path):
    from sklearn.datasets import load_digits

    from vissl_swav_plugin.tools.fashion_mnist import load_split
    from vissl_swav_plugin.tools.small_sets import SPLITS, digits_arrays, make_set

    images, labels = digits_arrays()
    d = load_digits()
    assert images.shape == (len(d.target), 28, 28) and images.dtype == np.uint8
    assert np.array_equal(labels, d.target)
    # each 28x28 image, averaged back to 8x8 cells, is its 8x8 original (0-16 -> 0-255)
    cells = np.linspace(0, 28, 9).round().astype(int)
    back = np.stack([[images[:, a:b, c:e].mean(axis=(1, 2)) for c, e in zip(cells, cells[1:])]
                     for a, b in zip(cells, cells[1:])], axis=-1).transpose(1, 2, 0)
    corr = np.corrcoef(back.reshape(-1), (d.images * 255 / 16).reshape(-1))[0, 1]
    assert corr > 0.95, corr
    folder = make_set("digits", tmp_path)
    for split, per_class in (("train", SPLITS["digits"][0]), ("val", SPLITS["digits"][1])):
        x, y = load_split(folder, split)  # the demo's reader
        assert x.shape == (10 * per_class, 28, 28) and np.bincount(y).tolist() == [per_class] * 10
        # every image is one of the digits, with its own label
        flat = images.reshape(len(images), -1).astype(np.int16)
        for i in range(0, len(x), 97):
            j = np.flatnonzero((flat == x[i].reshape(-1)).all(1))
            assert len(j) >= 1 and (labels[j] == y[i]).all()


def _fake_wheel(path, images, labels):
    from vissl_swav_plugin.tools.small_sets import ANIMAL_MEMBERS

    with zipfile.ZipFile(path, "w") as z:
        for member, arr in zip(ANIMAL_MEMBERS, (images, labels)):
            z.writestr(member, gzip.compress(pickle.dumps(arr)))
    return path


def test_animal_mnist_from_a_wheel_and_bad_sources(tmp_path, capsys):
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

    # the checkout's script (python tools/make_small_sets.py): a file that is not a wheel is
    # named in one error line, exit code 2, no traceback
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    capsys.readouterr()
    assert load_script("tools/make_small_sets.py").main(["--out", str(tmp_path / "o"), "--set", "animal_mnist",
                                                          "--animal-mnist", str(bad)]) == 2
    out = capsys.readouterr()
    assert "bad.whl" in out.err and "Traceback" not in out.out + out.err
    assert main(["--out", str(tmp_path / "o"), "--set", "animal_mnist",
                 "--animal-mnist", str(tmp_path / "missing_dir")]) == 2
