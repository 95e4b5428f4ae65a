"""The linear and low-shot probes (utils/probes.py) against scikit-learn used directly, closed
forms of the splits and draws, and separable / random data."""
import numpy as np
import pytest

from vissl_swav_plugin.utils import probes


def blobs(n_per_class=60, classes=4, dim=6, sep=4.0, seed=0):
    """``(x, y, x_test, y_test)``: Gaussian classes around the same centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * sep
    y = np.repeat(np.arange(classes), n_per_class)
    x = centres[y] + rng.normal(size=(len(y), dim))
    xt = centres[y] + rng.normal(size=(len(y), dim))
    return x.astype(np.float32), y, xt.astype(np.float32), y.copy()


def test_stratified_split_holds_out_a_share_of_every_class_and_is_seeded():
    y = np.repeat(np.arange(3), [50, 20, 10])
    fit, val = probes.stratified_split(y, 0.1, seed=1)
    assert np.bincount(y[val]).tolist() == [5, 2, 1]
    assert sorted(np.concatenate([fit, val]).tolist()) == list(range(len(y)))
    assert np.array_equal(val, probes.stratified_split(y, 0.1, seed=1)[1])
    assert not np.array_equal(val, probes.stratified_split(y, 0.1, seed=2)[1])
    with pytest.raises(ValueError, match="class 2 has 1 training image"):
        probes.stratified_split(np.array([0, 0, 1, 1, 2]), 0.5)


def test_draws_take_k_per_class_from_the_pool_only():
    y = np.repeat(np.arange(3), 30)
    pool = np.arange(0, 90, 2)  # even indices: 15 per class
    idx = probes.draw_per_class(y, pool, 4, np.random.default_rng(0))
    assert np.bincount(y[idx]).tolist() == [4, 4, 4] and set(idx) <= set(pool)
    with pytest.raises(ValueError, match="fewer than 16"):
        probes.draw_per_class(y, pool, 16, np.random.default_rng(0))


def test_linear_probe_equals_scikit_learn_with_the_chosen_c():
    """The probe's test accuracy is that of scikit-learn's LogisticRegression trained on the
    standardised non-validation images with the C that won on the validation split."""
    from sklearn.linear_model import LogisticRegression

    x, y, xt, yt = blobs(sep=1.2)
    r = probes.linear_probe(x, y, xt, yt, grid=(0.01, 1.0), val_fraction=0.2, seed=3)
    fit, val = probes.stratified_split(y, 0.2, 3)
    mean, std = x.astype(np.float64).mean(0), x.astype(np.float64).std(0)
    clf = LogisticRegression(C=r["C"], max_iter=2000, tol=1e-8).fit((x[fit] - mean) / std, y[fit])
    expected = 100.0 * (clf.predict((xt - mean) / std) == yt).mean()
    assert abs(r["top1"] - expected) <= 100.0 / len(yt) + 1e-9  # at most one test image apart
    assert r["C"] == max((0.01, 1.0), key=lambda c: (r["val_top1"][str(c)], -c))
    assert r["train_images"] + r["val_images"] == len(y)


def test_separable_classes_are_learned_from_one_label_and_random_labels_are_not():
    x, y, xt, yt = blobs(sep=8.0)
    r = probes.probe_report(x, y, xt, yt, shots=(1, 5), draws=3)
    assert r["linear"]["top1"] == 100.0 and r["low_shot"]["1"]["mean"] >= 95.0
    rng = np.random.default_rng(0)
    noise = probes.probe_report(rng.normal(size=x.shape), y, rng.normal(size=xt.shape), yt, shots=(1, 5), draws=3)
    assert noise["linear"]["top1"] < 45.0 and noise["low_shot"]["5"]["mean"] < 45.0  # chance: 25%
    assert len(noise["low_shot"]["5"]["per_draw"]) == 3
    assert "linear" in probes.format_probes(r) and "1/cls" in probes.format_probes(r)


def test_low_shot_sizes_a_class_cannot_hold_are_left_out_and_named():
    x, y, xt, yt = blobs(n_per_class=12)  # 12 per class: 1 held out for validation, 11 in the pool
    r = probes.probe_report(x, y, xt, yt, shots=(1, 11, 12, 100), draws=2)
    assert sorted(r["low_shot"], key=int) == ["1", "11"] and r["protocol"]["skipped_shots"] == [12, 100]
    assert probes.feasible_shots(y, np.arange(len(y)), (12, 13)) == [12]


def test_torch_tensors_are_accepted():
    import torch

    x, y, _, _ = blobs()
    r1 = probes.linear_probe(x, y, x, y)
    r2 = probes.linear_probe(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x), torch.from_numpy(y))
    assert r1 == r2
