"""Small, dependency-free kNN classifiers over feature vectors (pure torch, CPU).

Two protocols, both used by ``tools/demo.py`` and the real-data test:

* :func:`weighted_knn_accuracy` -- the kNN monitor of Wu et al. 2018 ("Unsupervised
  feature learning via non-parametric instance discrimination"), also VISSL's
  ``run_knn_at_layer``: features are L2-normalised, the ``k`` most cosine-similar training
  samples vote for their class with weight ``exp(similarity / T)`` (T = 0.07), the class
  with the largest summed weight wins.
* :func:`euclidean_knn_accuracy` -- the plain k-nearest-neighbour classifier (Euclidean
  distance, one vote per neighbour, ties go to the smallest class index, as in
  scikit-learn's ``KNeighborsClassifier``).  With k = 5 on raw Fashion-MNIST pixels
  (60k train / 10k test, values in [0, 1]) this is the 85.5% of the Fashion-MNIST
  benchmark table.

Both work on chunks of the query set, so memory stays at ``chunk x num_train`` floats.
Accuracies are returned in percent.
"""
from typing import Dict, Iterable, Optional, Sequence

import torch

__all__ = [
    "weighted_knn_predict",
    "weighted_knn_accuracy",
    "euclidean_knn_predict",
    "euclidean_knn_accuracy",
    "knn_report",
    "mean_over_inits",
    "format_metrics",
    "DEFAULT_TEMPERATURE",
]

#: T of the weighted kNN's vote ``exp(cos / T)`` (Wu et al. 2018), the demo's and the
#: baselines' of ``tools/knn_eval.py``
DEFAULT_TEMPERATURE = 0.07


def _check(train_x, train_y, test_x, k):
    """Raise ``ValueError`` naming the problem if the shapes or ``k`` do not fit."""
    if train_x.dim() != 2 or test_x.dim() != 2:
        raise ValueError(
            f"kNN: features must be 2-D [N, D], got train {tuple(train_x.shape)} / test {tuple(test_x.shape)}"
        )
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"kNN: feature sizes differ: train {train_x.shape[1]} vs test {test_x.shape[1]}")
    if train_y.dim() != 1 or train_y.shape[0] != train_x.shape[0]:
        raise ValueError(f"kNN: {tuple(train_y.shape)} train labels for {train_x.shape[0]} train features")
    if not 1 <= k <= train_x.shape[0]:
        raise ValueError(f"kNN: k={k} must lie in [1, {train_x.shape[0]}] (the number of train samples)")


def _as_tensor(x, dtype):
    """``x`` (tensor, array or list) as a tensor of ``dtype``."""
    return x.to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=dtype)


def weighted_knn_predict(
    train_x, train_y, test_x, k: int = 20, temperature: float = DEFAULT_TEMPERATURE,
    num_classes: Optional[int] = None, chunk: int = 2048,
) -> torch.Tensor:
    """Class predictions of the weighted cosine kNN (Wu et al. 2018) for ``test_x``.

    Each test feature's ``k`` most cosine-similar train features vote for their labels
    with weight ``exp(cos / temperature)``; the class with the largest total wins.

    Args:
        train_x: ``[N, D]`` train features (tensor or array; L2-normalised here).
        train_y: ``[N]`` integer train labels in ``[0, num_classes)``.
        test_x: ``[M, D]`` test features.
        k: number of neighbours, ``1 <= k <= N`` (20 and 200 in the papers).
        temperature: T of the vote weights (0.07 in Wu et al.), > 0.
        num_classes: number of classes; default ``max(train_y) + 1``.
        chunk: test features handled at once (memory ``chunk x N`` floats).

    Returns:
        ``[M]`` long tensor of predicted classes.

    Raises:
        ValueError: mismatched shapes, ``k`` out of range or ``temperature <= 0``.

    Example::

        pred = weighted_knn_predict(train_feats, train_labels, test_feats, k=20)
    """
    train_x, test_x = _as_tensor(train_x, torch.float32), _as_tensor(test_x, torch.float32)
    train_y = _as_tensor(train_y, torch.long)
    _check(train_x, train_y, test_x, k)
    if not temperature > 0:
        raise ValueError(f"kNN: temperature must be > 0, got {temperature}")
    c = int(num_classes or int(train_y.max()) + 1)
    bank = torch.nn.functional.normalize(train_x, dim=1)
    preds = []
    for q in torch.split(torch.nn.functional.normalize(test_x, dim=1), chunk):
        sim, idx = (q @ bank.T).topk(k, dim=1)
        votes = torch.zeros(q.shape[0], c).scatter_add_(1, train_y[idx], (sim / temperature).exp())
        preds.append(votes.argmax(dim=1))
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def euclidean_knn_predict(train_x, train_y, test_x, k: int = 5,
                          num_classes: Optional[int] = None, chunk: int = 1024) -> torch.Tensor:
    """Class predictions of the plain (majority-vote, Euclidean) kNN for ``test_x``.

    Each test feature's ``k`` nearest train features (Euclidean distance, computed in
    float64) vote once each; ties go to the smallest class index, as in scikit-learn.

    Args:
        train_x: ``[N, D]`` train features (tensor or array).
        train_y: ``[N]`` integer train labels in ``[0, num_classes)``.
        test_x: ``[M, D]`` test features.
        k: number of neighbours, ``1 <= k <= N``.
        num_classes: number of classes; default ``max(train_y) + 1``.
        chunk: test features handled at once (memory ``chunk x N`` floats).

    Returns:
        ``[M]`` long tensor of predicted classes.

    Raises:
        ValueError: mismatched shapes or ``k`` out of range.
    """
    train_x, test_x = _as_tensor(train_x, torch.float32), _as_tensor(test_x, torch.float32)
    train_y = _as_tensor(train_y, torch.long)
    _check(train_x, train_y, test_x, k)
    c = int(num_classes or int(train_y.max()) + 1)
    sq_train = (train_x * train_x).sum(dim=1)
    preds = []
    for q in torch.split(test_x, chunk):
        # |q - t|^2 up to the per-query constant |q|^2 (the ranking does not need it);
        # float64 so that near-ties rank as with exact distances
        d = sq_train.double()[None, :] - 2.0 * (q.double() @ train_x.double().T)
        idx = d.topk(k, dim=1, largest=False).indices
        votes = torch.zeros(q.shape[0], c).scatter_add_(1, train_y[idx], torch.ones(idx.shape))
        preds.append(votes.argmax(dim=1))  # argmax: first (smallest) class among ties
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def _accuracy(pred, test_y) -> float:
    """Percentage of ``pred`` equal to ``test_y`` (NaN for an empty test set)."""
    test_y = _as_tensor(test_y, torch.long)
    if pred.shape[0] != test_y.shape[0]:
        raise ValueError(f"kNN: {test_y.shape[0]} test labels for {pred.shape[0]} test features")
    return 100.0 * float((pred == test_y).double().mean()) if len(test_y) else float("nan")


def weighted_knn_accuracy(train_x, train_y, test_x, test_y, k: int = 20, temperature: float = DEFAULT_TEMPERATURE,
                          num_classes: Optional[int] = None) -> float:
    """Top-1 accuracy (%) of :func:`weighted_knn_predict`.

    Args:
        train_x, train_y, test_x, k, temperature, num_classes: as for
            :func:`weighted_knn_predict`.
        test_y: ``[M]`` integer test labels.

    Returns:
        ``100 * mean(pred == test_y)``; NaN when there are no test samples.

    Raises:
        ValueError: as :func:`weighted_knn_predict`, or a test-label count that differs
            from the number of test features.
    """
    return _accuracy(weighted_knn_predict(train_x, train_y, test_x, k, temperature, num_classes), test_y)


def euclidean_knn_accuracy(train_x, train_y, test_x, test_y, k: int = 5,
                           num_classes: Optional[int] = None) -> float:
    """Top-1 accuracy (%) of :func:`euclidean_knn_predict`, the plain kNN's counterpart
    of :func:`weighted_knn_accuracy`.

    Args:
        train_x, train_y, test_x, test_y: features and integer labels, as for
            :func:`weighted_knn_accuracy`.
        k, num_classes: as for :func:`euclidean_knn_predict`.

    Returns:
        The accuracy in percent (NaN without test samples); raises ``ValueError`` on the
        same bad inputs as :func:`weighted_knn_accuracy`.
    """
    return _accuracy(euclidean_knn_predict(train_x, train_y, test_x, k, num_classes), test_y)


def knn_report(train_x, train_y, test_x, test_y, weighted_ks: Iterable[int] = (20, 200),
               euclidean_ks: Sequence[int] = (5,), temperature: float = DEFAULT_TEMPERATURE,
               num_classes: Optional[int] = None) -> Dict[str, float]:
    """Both kNN protocols for several ``k``: ``{"knn20": .., "knn200": .., "nn5_euclid": ..}``.

    Each ``k`` is capped at the number of train samples.

    Args:
        train_x, train_y, test_x, test_y: features and integer labels (see
            :func:`weighted_knn_accuracy`).
        weighted_ks: ``k`` values of the weighted cosine kNN (keys ``knn{k}``).
        euclidean_ks: ``k`` values of the plain Euclidean kNN (keys ``nn{k}_euclid``).
        temperature: T of the weighted kNN.
        num_classes: number of classes; default ``max(train_y) + 1``.

    Returns:
        Accuracies in percent, keyed as above.

    Example::

        knn_report(tr_f, tr_y, te_f, te_y)  # {"knn20": .., "knn200": .., "nn5_euclid": ..}
    """
    n = len(train_y)
    out = {}
    for k in weighted_ks:
        out[f"knn{k}"] = weighted_knn_accuracy(train_x, train_y, test_x, test_y, min(k, n), temperature,
                                               num_classes)
    for k in euclidean_ks:
        out[f"nn{k}_euclid"] = euclidean_knn_accuracy(train_x, train_y, test_x, test_y, min(k, n), num_classes)
    return out


def mean_over_inits(per_init):
    """Mean of each kNN metric of :func:`knn_report` over several initialisations.

    Args:
        per_init: one :func:`knn_report` dict per initialisation (with ``feature_dim``,
            and any other keys, e.g. the seed).

    Returns:
        ``{metric: mean, ..., "feature_dim": D, "range": {metric: [min, max]},
        "per_init": per_init}`` (min and max rounded to 2 decimals).

    Example::

        mean_over_inits([{"knn20": 30.0, "feature_dim": 8}, {"knn20": 40.0, "feature_dim": 8}])["knn20"] == 35.0
    """
    import numpy as np

    metrics = [k for k in per_init[0] if k.startswith(("knn", "nn"))]
    out = {m: float(np.mean([r[m] for r in per_init])) for m in metrics}
    out["feature_dim"] = per_init[0]["feature_dim"]
    out["range"] = {m: [round(min(r[m] for r in per_init), 2), round(max(r[m] for r in per_init), 2)]
                    for m in metrics}
    out["per_init"] = per_init
    return out


def format_metrics(r) -> str:
    """``"knn20 71.20%, knn200 65.00%, nn5_euclid 80.10%"``: the accuracies of a
    :func:`knn_report` dict (other keys ignored)."""
    return ", ".join(f"{k} {v:.2f}%" for k, v in r.items() if k.startswith(("knn", "nn")))
