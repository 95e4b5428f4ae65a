"""Step 3 of the demo: kNN accuracy of the trained network's features, in this process.

The final checkpoint is loaded (strictly) into the VISSL model built from the training's
own config; the trunk's ``res5avg`` features of the training subset (the memory bank)
and of the test images are classified with the kNN protocols of
:func:`vissl_swav_plugin.utils.knn.knn_report` (weighted cosine 20-NN / 200-NN of Wu et al.
2018, plain Euclidean 5-NN).  The baselines, on the same images: the same network at
``random_inits`` random initialisations (the first being the training's own starting
point) and the raw pixels.
"""
import os
import time

from .common import DemoError, compose_config

CLASS_TITLES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
NUM_CLASSES = len(CLASS_TITLES)


def build_vissl_model(overrides, seed):
    """``(config, model)``: the VISSL model of the config ``overrides`` compose to, its
    weights initialised after ``torch.manual_seed(seed)``, in eval mode."""
    import torch
    from vissl.models import build_model

    config = compose_config(overrides)
    torch.manual_seed(seed)
    model = build_model(config.MODEL, config.OPTIMIZER)
    return config, model.eval()


def load_checkpoint(model, ckpt_path):
    """Strict load of the trunk and heads saved by VISSL's checkpoint hook into ``model``.

    Returns:
        The whole checkpoint dict.

    Raises:
        DemoError: the file is not a VISSL training checkpoint.
    """
    import torch

    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    try:
        state = ckpt["classy_state_dict"]["base_model"]["model"]
    except (KeyError, TypeError):
        raise DemoError(f"{ckpt_path}: not a VISSL training checkpoint (no classy_state_dict/base_model)") from None
    model.trunk.load_state_dict(state["trunk"], strict=True)
    model.heads.load_state_dict(state["heads"], strict=True)
    return ckpt


def transform_stats(config):
    """How the training's ``multicrop_plugin`` transform normalises its crops:
    ``{"mean": [r, g, b], "std": [r, g, b], "min_std": None}`` (``normalize: dataset``; its
    defaults: ImageNet's), ``{"mean": None, "std": None, "min_std": m}`` (``normalize:
    per_image``), or the identity ``([0, 0, 0], [1, 1, 1])`` without such a transform."""
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
    from vissl_swav_plugin.transforms.multicrop_config import check_config_keys

    for t in config.DATA.TRAIN.TRANSFORMS:
        if t["name"] == "multicrop_plugin":
            mc = MultiCropPlugin(**check_config_keys(t))
            return dict(mean=mc.mean and list(mc.mean), std=mc.std and list(mc.std), min_std=mc.min_std)
    return dict(mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0], min_std=None)


def to_input(images_u8, norm):
    """uint8 [N, 28, 28] gray -> normalised float [N, 3, 28, 28], exactly what the training
    pipeline does to a full image (PNG -> RGB -> tensor -> normalise), without cropping;
    ``norm`` is :func:`transform_stats`'s dict."""
    import torch
    from vissl_swav_plugin.transforms.standardize import standardize_

    x = torch.from_numpy(images_u8).float().div_(255.0)[:, None].expand(-1, 3, -1, -1)
    if norm["min_std"] is not None:
        return standardize_(x.contiguous(), norm["min_std"])
    m = torch.tensor(norm["mean"], dtype=torch.float32)[None, :, None, None]
    s = torch.tensor(norm["std"], dtype=torch.float32)[None, :, None, None]
    return (x - m) / s


def extract(model, images_u8, norm, batch=500):
    """``(features, scores)``: res5avg trunk features [N, D] and the head's prototype
    scores [N, K] of uint8 images (fp32, eval mode, no gradients); ``norm``: see
    :func:`to_input`."""
    import torch

    feats, scores = [], []
    with torch.no_grad():
        for i in range(0, len(images_u8), batch):
            x = to_input(images_u8[i:i + batch], norm)
            f = model.trunk(x, out_feat_keys=["res5avg"])[0].flatten(1)
            out = model.heads[0](f)
            feats.append(f)
            scores.append(out[-1])
    return torch.cat(feats), torch.cat(scores)


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


def random_init_seeds(seed, num_epochs, count):
    """Torch seeds of the random-init baselines: first the training's own starting point
    (VISSL's ``set_seeds`` seeds rank 0 with ``(SEED_VALUE + 0) * num_epochs`` and DDP gives
    every rank rank 0's weights), then ``count - 1`` other initialisations.

    Example: ``random_init_seeds(1, 12, 3) == [12, 1012, 2012]``.
    """
    first = int(seed) * int(num_epochs)
    return [first] + [first + 1000 * j for j in range(1, count)]


class _FeatureKnn:
    """kNN of one model's features on the demo's images; records times, logs one line."""

    def __init__(self, data, norm, timings, log):
        import numpy as np

        self.data, self.norm, self.timings, self.log = data, norm, timings, log
        self.ytr, self.yte = data["train_y"].astype(np.int64), data["test_y"].astype(np.int64)

    def __call__(self, name, model):
        """``(knn results, test prototype scores)`` of ``model``, logged under ``name``."""
        from vissl_swav_plugin.utils.knn import format_metrics, knn_report

        t = time.time()
        ftr, _ = extract(model, self.data["train_x"], self.norm)
        fte, ste = extract(model, self.data["test_x"], self.norm)
        t_feat = time.time() - t
        r = knn_report(ftr, self.ytr, fte, self.yte, num_classes=NUM_CLASSES)
        r["feature_dim"] = int(ftr.shape[1])
        self.timings[name] = dict(extract_s=round(t_feat, 2), total_s=round(time.time() - t, 2))
        self.log(f"  {name:14s} features {tuple(ftr.shape)} + {tuple(fte.shape)}: " + format_metrics(r))
        return r, ste


def raw_pixel_knn(data, timings, log=print):
    """kNN of the raw pixels (values in [0, 1], 784-d) on the demo's images."""
    import numpy as np
    import torch
    from vissl_swav_plugin.utils.knn import format_metrics, knn_report

    t = time.time()
    ytr, yte = data["train_y"].astype(np.int64), data["test_y"].astype(np.int64)
    px_tr = torch.from_numpy(data["train_x"].reshape(len(ytr), -1)).float() / 255.0
    px_te = torch.from_numpy(data["test_x"].reshape(len(yte), -1)).float() / 255.0
    r = knn_report(px_tr, ytr, px_te, yte, num_classes=NUM_CLASSES)
    r["feature_dim"] = int(px_tr.shape[1])
    timings["raw_pixels"] = dict(total_s=round(time.time() - t, 2))
    log(f"  {'raw_pixels':12s} {tuple(px_tr.shape)} + {tuple(px_te.shape)}: " + format_metrics(r))
    return r


def evaluate(overrides, ckpt_path, data, seed, random_inits=5, log=print):
    """kNN of the trained network, of ``random_inits`` randomly initialised copies (the
    first is the training's own starting point; their mean is the baseline, the spread is
    reported) and of the raw pixels, all on the same memory bank and test images.

    Args:
        overrides: the training's launcher overrides (the same model is built from them).
        ckpt_path: VISSL's final checkpoint.
        data: :func:`vissl_swav_plugin.demo.data.prepare_data`'s dict.
        seed: the training's SEED_VALUE (gives the random-init seeds).
        random_inits: number of random initialisations averaged.
        log: where the one line per model goes.

    Returns:
        ``(config, results, protos, timings)``: ``results[method]`` for ``swav``,
        ``random_init`` (with ``range`` and ``per_init``) and ``raw_pixels`` holds
        ``knn20``, ``knn200``, ``nn5_euclid`` (top-1 %) and ``feature_dim``;
        ``protos[method]`` is :func:`prototype_summary` of the test images for ``swav``
        and the first random init; ``timings`` are seconds per model.
    """
    import torch
    from vissl_swav_plugin.utils.knn import mean_over_inits

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config, trained = build_vissl_model(overrides, seed)
    load_checkpoint(trained, ckpt_path)
    results, timings, protos = {}, {}, {}
    features_knn = _FeatureKnn(data, transform_stats(config), timings, log)
    results["swav"], scores = features_knn("swav", trained)
    protos["swav"] = prototype_summary(scores, features_knn.yte)
    per_init = []
    for i, init_seed in enumerate(random_init_seeds(seed, config.OPTIMIZER.num_epochs, random_inits)):
        _, model = build_vissl_model(overrides, init_seed)
        r, scores = features_knn(f"random_init[{i}]", model)
        per_init.append(dict(r, torch_seed=init_seed))
        if i == 0:
            protos["random_init"] = prototype_summary(scores, features_knn.yte)
    results["random_init"] = mean_over_inits(per_init)
    results["raw_pixels"] = raw_pixel_knn(data, timings, log)
    return config, results, protos, timings
