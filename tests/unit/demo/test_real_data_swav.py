"""SwAV on real images: a short run of `tools/demo.py --quick` (VISSL's launcher, 2 gloo
processes, our loss / head / multi-crop / small trunk, Fashion-MNIST) must give features
whose kNN accuracy beats the *same* network at its random initialisation.

The independent truth is the labelled test set: kNN top-1 of the trained network's
res5avg features vs the random-init network's (same config, same seed, same extraction,
same memory bank and test images).  The kNN classifiers themselves are checked against
scikit-learn's ``KNeighborsClassifier``.
"""

import numpy as np
import pytest
import torch


def test_weighted_knn_matches_sklearn():
    from sklearn.neighbors import KNeighborsClassifier
    from vissl_swav_plugin.utils.knn import weighted_knn_predict

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(5, 16))
    ytr = rng.integers(0, 5, 400)
    xtr = centers[ytr] + 1.5 * rng.normal(size=(400, 16))
    yte = rng.integers(0, 5, 300)
    xte = centers[yte] + 1.5 * rng.normal(size=(300, 16))
    for k in (1, 20, 200):
        ref = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute",
                                   weights=lambda d: np.exp((1.0 - d) / 0.07)).fit(xtr, ytr).predict(xte)
        ours = weighted_knn_predict(torch.tensor(xtr), torch.tensor(ytr), torch.tensor(xte), k=k).numpy()
        assert (ours == ref).mean() >= 0.99, k  # float rounding may flip a near-tie
        assert (ours == yte).mean() > 0.5  # a real classifier on these blobs


def test_euclidean_knn_matches_sklearn():
    from sklearn.neighbors import KNeighborsClassifier
    from vissl_swav_plugin.utils.knn import euclidean_knn_accuracy, euclidean_knn_predict

    rng = np.random.default_rng(1)
    xtr = rng.random((500, 30)).astype(np.float32)
    ytr = rng.integers(0, 10, 500)
    xte = rng.random((200, 30)).astype(np.float32)
    yte = rng.integers(0, 10, 200)
    for k in (1, 5, 9):
        ref = KNeighborsClassifier(n_neighbors=k, algorithm="brute").fit(xtr, ytr).predict(xte)
        ours = euclidean_knn_predict(xtr, ytr, xte, k=k).numpy()
        assert (ours == ref).all(), k
        assert euclidean_knn_accuracy(xtr, ytr, xte, yte, k=k) == pytest.approx(100.0 * (ref == yte).mean())


def test_knn_bad_input_names_the_problem():
    from vissl_swav_plugin.utils.knn import weighted_knn_accuracy

    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="k=5"):
        weighted_knn_accuracy(x, torch.zeros(4, dtype=torch.long), x, torch.zeros(4), k=5)
    with pytest.raises(ValueError, match="feature sizes differ"):
        weighted_knn_accuracy(x, torch.zeros(4, dtype=torch.long), torch.zeros(2, 5), torch.zeros(2), k=1)
