"""Linear and low-shot probes of frozen features: the SwAV paper's own protocols (Sec. 4.1,
a linear classifier on frozen features; Sec. 4.2 / App., learning from few labels), at the
scale of the demo, with scikit-learn's logistic regression.

The protocol (the demo's and ``swav-plugin-eval``'s):

* a fixed validation split of the *training* images (``val_fraction`` of each class,
  seeded) chooses the inverse regularisation ``C`` of the classifier from ``grid``; the
  test images are never used for a choice;
* features are standardised with the mean and spread of all training images (labels are
  not needed for that, as in semi-supervised learning the unlabelled images are there);
* linear: multinomial L2 logistic regression (lbfgs) trained on every training image
  outside the validation split, with the chosen ``C``; top-1 on the test images;
* low-shot: ``k`` labelled images per class drawn (seeded, ``draws`` times) from the
  training images outside the validation split; per draw ``C`` is chosen on the validation
  split, whose labels serve only that choice; mean, spread and range over the draws.

Accuracies are in percent.  This module imports neither VISSL nor Classy Vision.
"""
from typing import Dict, Iterable, Sequence, Tuple

import numpy as np

__all__ = ["DEFAULT_GRID", "DEFAULT_SHOTS", "stratified_split", "draw_per_class", "choose_c", "linear_probe",
           "low_shot", "probe_report", "format_probes"]

#: values of the logistic regression's inverse regularisation C tried on the validation split
DEFAULT_GRID = (0.001, 0.01, 0.1, 1.0)
#: labelled images per class of the low-shot protocol
DEFAULT_SHOTS = (1, 10, 100)


def _as_numpy(x, dtype):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def stratified_split(labels, val_fraction: float = 0.1, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """``(train indices, validation indices)``: ``round(val_fraction * n_c)`` (at least one)
    images of each class ``c`` go to validation, drawn with ``seed``; both sorted."""
    labels = _as_numpy(labels, np.int64).reshape(-1)
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n = min(len(idx) - 1, max(1, int(round(val_fraction * len(idx)))))
        if n < 1:
            raise ValueError(f"class {int(c)} has {len(idx)} training image(s): too few to hold one out for validation")
        val.append(rng.choice(idx, size=n, replace=False))
    val = np.sort(np.concatenate(val))
    return np.setdiff1d(np.arange(len(labels)), val), val


def draw_per_class(labels, pool, k: int, rng) -> np.ndarray:
    """``k`` indices of each class drawn without replacement from ``pool`` (sorted); a class
    with fewer than ``k`` images in the pool is an error naming it."""
    labels = _as_numpy(labels, np.int64).reshape(-1)
    out = []
    for c in np.unique(labels[pool]):
        idx = pool[labels[pool] == c]
        if len(idx) < k:
            raise ValueError(f"class {int(c)} has {len(idx)} training image(s) outside the validation split, fewer than {k}")
        out.append(rng.choice(idx, size=k, replace=False))
    return np.sort(np.concatenate(out))


def _one_blas_thread(fn):
    """Run ``fn`` with NumPy's BLAS on one thread (see :func:`choose_c`)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


def _accuracy(clf, x, y) -> float:
    return float(100.0 * (clf.predict(x) == y).mean())


def feasible_shots(labels, pool, shots) -> list:
    """The ``shots`` (labels per class) that every class's images in ``pool`` can hold."""
    labels = _as_numpy(labels, np.int64).reshape(-1)
    smallest = min(int((labels[pool] == c).sum()) for c in np.unique(labels)) if len(pool) else 0
    return [int(k) for k in shots if int(k) <= smallest]


@_one_blas_thread
def choose_c(train_x, train_y, val_x, val_y, grid: Sequence[float] = DEFAULT_GRID, max_iter: int = 200):
    """``(best C, {C: validation top-1 %}, classifier trained with the best C)``; ties go to
    the smaller ``C`` (the stronger regularisation).  The grid is walked from the strongest
    regularisation up, each fit starting from the previous solution (``warm_start``).

    NumPy's BLAS runs on one thread here: these matrices are small, and beside torch's
    OpenMP threads (the demo's process) a multi-threaded OpenBLAS waits on itself (measured:
    the 100-labels-per-class probe 25 times slower with 2 BLAS threads than with one)."""
    import copy

    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=max_iter, tol=1e-4, warm_start=True)
    scores, fitted = {}, {}
    for c in sorted(grid):
        clf.set_params(C=c).fit(train_x, train_y)
        fitted[c] = copy.deepcopy(clf)
        scores[c] = _accuracy(clf, val_x, val_y)
    best = max(sorted(grid), key=lambda c: (scores[c], -c))
    return best, scores, fitted[best]


def _standardise(train_x, *others):
    mean, std = train_x.mean(0), train_x.std(0)
    std = np.where(std > 1e-12, std, 1.0)
    return [(x - mean) / std for x in (train_x, *others)]


@_one_blas_thread
def linear_probe(train_x, train_y, test_x, test_y, grid=DEFAULT_GRID, val_fraction=0.1, seed=0, max_iter=200):
    """Linear probe with every training label (see the module docstring).

    Returns:
        ``dict(top1, C, val_top1={C: %}, train_images, val_images)``.
    """
    xtr, xte = _standardise(_as_numpy(train_x, np.float64), _as_numpy(test_x, np.float64))
    ytr, yte = _as_numpy(train_y, np.int64), _as_numpy(test_y, np.int64)
    fit_idx, val_idx = stratified_split(ytr, val_fraction, seed)
    c, scores, clf = choose_c(xtr[fit_idx], ytr[fit_idx], xtr[val_idx], ytr[val_idx], grid, max_iter)
    return dict(top1=round(_accuracy(clf, xte, yte), 2), C=c, val_top1={str(k): round(v, 2) for k, v in scores.items()},
                train_images=int(len(fit_idx)), val_images=int(len(val_idx)))


@_one_blas_thread
def low_shot(train_x, train_y, test_x, test_y, shots: Iterable[int] = DEFAULT_SHOTS, draws: int = 5,
             grid=DEFAULT_GRID, val_fraction=0.1, seed=0, max_iter=200) -> Dict[str, dict]:
    """Low-shot probes, ``k`` labels per class for each ``k`` in ``shots`` (see the module
    docstring).

    Returns:
        ``{str(k): dict(mean, std, min, max, per_draw=[top-1 %], C=[chosen C per draw])}``;
        a ``k`` larger than some class's images outside the validation split is left out
        (:func:`feasible_shots`).
    """
    xtr, xte = _standardise(_as_numpy(train_x, np.float64), _as_numpy(test_x, np.float64))
    ytr, yte = _as_numpy(train_y, np.int64), _as_numpy(test_y, np.int64)
    pool, val_idx = stratified_split(ytr, val_fraction, seed)
    out = {}
    for k in feasible_shots(ytr, pool, shots):
        rng = np.random.default_rng([seed, int(k)])
        accs, cs = [], []
        for _ in range(draws):
            idx = draw_per_class(ytr, pool, int(k), rng)
            c, _, clf = choose_c(xtr[idx], ytr[idx], xtr[val_idx], ytr[val_idx], grid, max_iter)
            accs.append(round(_accuracy(clf, xte, yte), 2))
            cs.append(c)
        a = np.asarray(accs)
        out[str(k)] = dict(mean=round(float(a.mean()), 2), std=round(float(a.std()), 2), min=float(a.min()),
                           max=float(a.max()), per_draw=accs, C=cs)
    return out


def probe_report(train_x, train_y, test_x, test_y, shots=DEFAULT_SHOTS, draws=5, grid=DEFAULT_GRID,
                 val_fraction=0.1, seed=0) -> dict:
    """``{"linear": linear_probe(...), "low_shot": low_shot(...), "protocol": {...}}``."""
    linear = linear_probe(train_x, train_y, test_x, test_y, grid, val_fraction, seed)
    low = low_shot(train_x, train_y, test_x, test_y, shots, draws, grid, val_fraction, seed)
    return dict(linear=linear, low_shot=low,
                protocol=dict(classifier="multinomial logistic regression (scikit-learn, lbfgs, L2)",
                              grid=list(grid), val_fraction=val_fraction, draws=draws, seed=seed,
                              shots=[int(k) for k in shots],
                              skipped_shots=[int(k) for k in shots if str(int(k)) not in low],
                              standardisation="mean/std of all training images",
                              choice="C with the best top-1 on the validation split of the training images"))


def format_probes(r) -> str:
    """One line: ``linear 85.21%  100/cls 81.60%  10/cls 73.94%  1/cls 50.95%``."""
    parts = [f"linear {r['linear']['top1']:.2f}%"]
    for k, v in sorted(r["low_shot"].items(), key=lambda kv: -int(kv[0])):
        parts.append(f"{k}/cls {v['mean']:.2f}%")
    return "  ".join(parts)
