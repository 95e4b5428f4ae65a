"""Step 3 of the demo: the trained network's features judged by the paper's protocols, in
this process: kNN, a linear classifier on frozen features with every training label, and
learning from few labels (1, 10, 100 per class), beside the same network at random
initialisations and the raw pixels: :func:`vissl_swav_plugin.tools.feature_eval.evaluate_features`
(the code of ``swav-plugin-eval``, so that the tool on the demo's checkpoint and images gives
the demo's numbers).  Here: the demo's class names and the prototype summary.
"""
from vissl_swav_plugin.tools.feature_eval import (  # noqa: F401  (the demo's evaluation API)
    build_vissl_model,
    extract,
    load_checkpoint,
    mean_probes,
    random_init_seeds,
    to_input,
    transform_stats,
)

from .common import DemoError

CLASS_TITLES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
NUM_CLASSES = len(CLASS_TITLES)


def prototype_summary(scores, labels, top_protos=8, per_row=10):
    """Each image assigned to its best prototype (argmax of ``scores`` [N, K]).

    Returns:
        ``dict(num_prototypes, prototypes_used, purity_pct, rows)``: purity is the share of
        images whose label is the majority label of their prototype; ``rows`` describe the
        ``top_protos`` most-used prototypes (size, majority class, and the indices of their
        ``per_row`` highest-scoring images).
    """
    import numpy as np

    s = scores.numpy()
    assign = s.argmax(1)
    counts = np.bincount(assign, minlength=s.shape[1])
    used = int((counts > 0).sum())
    majority = 0
    for p in np.nonzero(counts)[0]:
        majority += np.bincount(labels[assign == p], minlength=NUM_CLASSES).max()
    purity = 100.0 * majority / len(labels)
    rows = []
    for p in np.argsort(-counts, kind="stable")[:top_protos]:
        members = np.nonzero(assign == p)[0]
        if len(members) == 0:
            continue
        best = members[np.argsort(-s[members, p], kind="stable")[:per_row]]
        hist = np.bincount(labels[members], minlength=NUM_CLASSES)
        rows.append(dict(prototype=int(p), size=int(len(members)), images=best.tolist(),
                         majority_class=CLASS_TITLES[int(hist.argmax())],
                         majority_pct=round(100.0 * hist.max() / len(members), 1)))
    return dict(num_prototypes=int(s.shape[1]), prototypes_used=used, purity_pct=round(purity, 2), rows=rows)


def evaluate(overrides, ckpt_path, data, seed, random_inits=5, log=print, probes=None):
    """kNN of the trained network, of ``random_inits`` randomly initialised copies (the
    first is the training's own starting point; their mean is the baseline, the spread is
    reported) and of the raw pixels, all on the same memory bank and test images; with
    ``probes`` (keyword arguments of :func:`~vissl_swav_plugin.utils.probes.probe_report`)
    the linear and low-shot probes of the same three feature sets too.

    Args:
        overrides: the training's launcher overrides (the same model is built from them).
        ckpt_path: VISSL's final checkpoint.
        data: :func:`vissl_swav_plugin.demo.data.prepare_data`'s dict.
        seed: the training's SEED_VALUE (gives the random-init seeds).
        random_inits: number of random initialisations averaged.
        log: where the one line per model goes.
        probes: None (kNN only) or the probes' settings.

    Returns:
        ``(config, results, protos, timings, probes)``: ``results[method]`` for ``swav``,
        ``random_init`` (with ``range`` and ``per_init``) and ``raw_pixels`` holds
        ``knn20``, ``knn200``, ``nn5_euclid`` (top-1 %) and ``feature_dim``;
        ``protos[method]`` is :func:`prototype_summary` of the test images for ``swav``
        and the first random init; ``timings`` are seconds per model; ``probes`` (``{}``
        without ``probes``): ``{method: probe results}``, the random inits' as
        :func:`~vissl_swav_plugin.tools.feature_eval.mean_probes`.

    Raises:
        DemoError: the checkpoint is not a VISSL training checkpoint.
    """
    from vissl_swav_plugin.tools.feature_eval import FeatureEvalError, evaluate_features

    try:
        r = evaluate_features(overrides, ckpt_path, data, seed, random_inits, probes, NUM_CLASSES, log)
    except FeatureEvalError as e:
        raise DemoError(str(e)) from None
    yte = data["test_y"].astype("int64")
    protos = {key: prototype_summary(scores, yte) for key, scores in r["scores"].items()}
    return r["config"], r["knn"], protos, r["timings"], r["probes"]
