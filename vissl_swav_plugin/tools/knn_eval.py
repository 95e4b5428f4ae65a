#!/usr/bin/env python
"""kNN evaluation with several k at once, through VISSL's own kNN benchmark.

VISSL's ``tools/nearest_neighbor_test.py`` extracts features once and then classifies with
one ``config.NEAREST_NEIGHBOR.TOPK``.  The paper (App. "KNN classifiers on ImageNet")
reports 20-NN *and* 200-NN; this tool runs VISSL's ``extract_features`` engine once (same
launcher call as VISSL's tool, 1 or N processes) and then calls VISSL's
``nearest_neighbor_test`` function (weighted vote ``exp(sim / SIGMA)`` over the top-k
training features) for each k.  Nothing of the kNN is re-implemented here (the baseline
table below uses the plugin's :mod:`vissl_swav_plugin.utils.knn`, the demo's kNN).

usage: swav-plugin-knn [--topk 20,200] [--output-json PATH]
           [--random-init] [--random-inits N] [--raw-pixels] [--temperature T]
           config=... [hydra overrides]
       (in a checkout also: python tools/knn_eval.py ...)

options:
  --topk K1,K2,...   the k of the weighted kNN (default: config.NEAREST_NEIGHBOR.TOPK)
  --output-json PATH where the results go (default: CHECKPOINT.DIR/knn_results.json)
  --random-init      baseline: the same network at random initialisations (no weights
                     loaded; features extracted by the same VISSL engine, config and
                     data), the mean over --random-inits initialisations (default 5;
                     initialisation i uses config.SEED_VALUE + i)
  --random-inits N   number of random initialisations averaged (implies --random-init)
  --raw-pixels       baseline: the images themselves as features: the config's
                     DATA.TRAIN / DATA.TEST transforms without Normalize (values in [0, 1],
                     C x H x W floats per image, so meant for small images / data sets)
  --temperature T    T of the baseline table's weighted vote exp(cos / T)
                     (default 0.07, the demo's: vissl_swav_plugin.utils.knn.DEFAULT_TEMPERATURE)

e.g. ``python tools/knn_eval.py --topk 20,200 config=benchmark/swav_plugin/knn_fashion_mnist_cpu
config.MODEL.WEIGHTS_INIT.PARAMS_FILE=ckpt/model_final_checkpoint_phase9.torch
config.CHECKPOINT.DIR=out/knn``.

Without ``--topk`` the config's ``NEAREST_NEIGHBOR.TOPK`` is used.  Results are logged as
VISSL's tool logs them and written to ``CHECKPOINT.DIR/knn_results.json``::

    {"res5avg": {"20": {"top1": 71.2, "top5": 97.1}, "200": {...}}, "num_train": N, "num_test": M}

Baselines (--random-init / --raw-pixels): the trained network, each random initialisation
and the raw pixels are classified with the *same* kNN as the demo's
(:func:`vissl_swav_plugin.utils.knn.knn_report`: weighted cosine kNN for each --topk at
temperature T, plain Euclidean 5-NN), so that the three are comparable; one line each is
logged and the JSON gets::

    "baselines": {"temperature": 0.07, "topk": [20, 200],
                  "checkpoint": {"res5avg": {"knn20": .., "knn200": .., "nn5_euclid": .., "feature_dim": D}},
                  "random_init": {"res5avg": {"knn20": <mean>, .., "range": {..}, "per_init": [..]}},
                  "raw_pixels": {"knn20": .., "knn200": .., "nn5_euclid": .., "feature_dim": C*H*W}}

(VISSL's own numbers above stay those of config.NEAREST_NEIGHBOR.SIGMA.)
"""
import json
import logging
import sys
from pathlib import Path


class KnnEvalError(ValueError):
    """Bad argument or data for the kNN run; the message names it."""


OPTIONS = ("--topk", "--output-json", "--random-init", "--random-inits", "--raw-pixels", "--temperature")
#: random initialisations averaged by --random-init (as the demo)
DEFAULT_RANDOM_INITS = 5


def _value(a, it, name):
    """The value of option ``a`` (``--name=V`` or ``--name V``)."""
    value = a.split("=", 1)[1] if "=" in a else next(it, None)
    if value is None:
        raise KnnEvalError(f"{name} needs a value")
    return value


def _positive(value, name, kind):
    try:
        v = kind(value)
    except ValueError:
        raise KnnEvalError(f"{name} must be a {kind.__name__} > 0, got {value!r}") from None
    if not v > 0 or v == float("inf"):
        raise KnnEvalError(f"{name} must be a {kind.__name__} > 0, got {value!r}")
    return v


def split_args(argv):
    """Our options (see the module docstring) and the Hydra overrides (everything else).

    Returns:
        ``dict(topk, out_json, random_inits, raw_pixels, temperature, overrides)``;
        ``random_inits`` is 0 without ``--random-init`` / ``--random-inits``.
    """
    from vissl_swav_plugin.utils.knn import DEFAULT_TEMPERATURE

    opts = dict(topk=None, out_json=None, random_inits=0, raw_pixels=False, temperature=DEFAULT_TEMPERATURE,
                overrides=[])
    it = iter(argv)
    for a in it:
        name = a.split("=", 1)[0]
        if name == "--topk":
            value = _value(a, it, "--topk")
            try:
                opts["topk"] = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                raise KnnEvalError(f"--topk must be a comma list of integers, got {value!r}") from None
            if not opts["topk"] or min(opts["topk"]) < 1:
                raise KnnEvalError(f"--topk values must be >= 1, got {value!r}")
        elif name == "--output-json":
            opts["out_json"] = _value(a, it, "--output-json")
        elif name == "--random-init":
            opts["random_inits"] = opts["random_inits"] or DEFAULT_RANDOM_INITS
        elif name == "--random-inits":
            opts["random_inits"] = _positive(_value(a, it, "--random-inits"), "--random-inits", int)
        elif name == "--raw-pixels":
            opts["raw_pixels"] = True
        elif name == "--temperature":
            opts["temperature"] = _positive(_value(a, it, "--temperature"), "--temperature", float)
        elif a in ("-h", "--help"):
            print(__doc__[__doc__.index("usage: "):] + "\n" + __doc__[:__doc__.index("usage: ")])
            sys.exit(0)
        elif a.startswith("--"):
            raise KnnEvalError(f"unknown option {a!r} (known: {', '.join(OPTIONS)}; the rest are Hydra overrides)")
        else:
            opts["overrides"].append(a)
    if not any(o.startswith("config=") for o in opts["overrides"]):
        raise KnnEvalError("missing config=..., e.g. config=benchmark/swav_plugin/knn_fashion_mnist_cpu")
    return opts


def _vissl_knn_module():
    # VISSL's installed tools package (a regular package: it wins over our tools/ folder,
    # which is deliberately not a package).  The plugin's compat layer patches its
    # nearest_neighbor_test for CPU runs when it is imported.
    import importlib

    return importlib.import_module("tools.nearest_neighbor_test")


def _extract(config, node_id):
    """VISSL's extract_features engine on ``config`` (as VISSL's nearest_neighbor_test.main)."""
    from vissl.hooks import default_hook_generator
    from vissl.utils.distributed_launcher import launch_distributed

    launch_distributed(config, node_id, engine_name="extract_features", hook_generator=default_hook_generator)


def _feature_knn(folder, layer, topk, temperature):
    """:func:`knn_report` of the train / test features VISSL extracted into ``folder``."""
    from vissl.utils.misc import merge_features
    from vissl_swav_plugin.utils.knn import knn_report

    train, test = merge_features(folder, "train", layer), merge_features(folder, "test", layer)
    r = knn_report(train["features"], train["targets"].reshape(-1), test["features"], test["targets"].reshape(-1),
                   weighted_ks=topk, temperature=temperature)
    r["feature_dim"] = int(train["features"].shape[1])
    return r


def _log_row(name, r):
    from vissl_swav_plugin.utils.knn import format_metrics

    logging.info(f"baseline table: {name:24s} ({r['feature_dim']}-d): {format_metrics(r)}")


def random_init_baseline(config, node_id, layers, topk, temperature, count):
    """The same network, ``count`` random initialisations (no weights file; initialisation
    i with ``config.SEED_VALUE + i``), features extracted by VISSL into
    ``CHECKPOINT.DIR/random_init_<i>``; returns ``{layer: mean_over_inits(...)}``."""
    import copy

    from vissl.utils.checkpoint import get_checkpoint_folder
    from vissl_swav_plugin.utils.knn import mean_over_inits

    per_init = {layer: [] for layer in layers}
    base_dir = get_checkpoint_folder(config)
    for i in range(count):
        cfg = copy.deepcopy(config)
        cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE = ""
        cfg.SEED_VALUE = int(config.SEED_VALUE) + i
        cfg.CHECKPOINT.DIR = str(Path(base_dir) / f"random_init_{i}")
        _extract(cfg, node_id)
        for layer in layers:
            r = dict(_feature_knn(cfg.CHECKPOINT.DIR, layer, topk, temperature), seed_value=cfg.SEED_VALUE)
            _log_row(f"random_init[{i}] {layer}", r)
            per_init[layer].append(r)
    return {layer: mean_over_inits(rows) for layer, rows in per_init.items()}


def raw_pixels(config, split):
    """``(pixels [N, C*H*W] float in [0, 1], labels [N])`` of ``config.DATA.<split>``:
    VISSL's dataset with the split's transforms minus ``Normalize``, in dataset order."""
    import copy

    import torch
    from vissl.data import build_dataset

    cfg = copy.deepcopy(config)
    cfg.DATA[split].TRANSFORMS = [t for t in cfg.DATA[split].TRANSFORMS if t["name"] != "Normalize"]
    dataset = build_dataset(cfg, split)
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        xs.append(item["data"][0].reshape(-1).float())
        ys.append(int(torch.as_tensor(item["label"][0]).reshape(-1)[0]))
    return torch.stack(xs), torch.tensor(ys)


def raw_pixel_baseline(config, topk, temperature):
    """:func:`knn_report` of the raw pixels (see :func:`raw_pixels`) of train and test."""
    from vissl_swav_plugin.utils.knn import knn_report

    (xtr, ytr), (xte, yte) = raw_pixels(config, "TRAIN"), raw_pixels(config, "TEST")
    r = knn_report(xtr, ytr, xte, yte, weighted_ks=topk, temperature=temperature)
    r["feature_dim"] = int(xtr.shape[1])
    _log_row("raw_pixels", r)
    return r


def baselines(opts, config, node_id, layers, topk):
    """The baseline table (module docstring) of the checkpoint and the requested baselines."""
    from vissl.utils.checkpoint import get_checkpoint_folder

    t = opts["temperature"]
    table = {"temperature": t, "topk": topk, "euclidean_k": [5], "checkpoint": {}}
    for layer in layers:
        table["checkpoint"][layer] = _feature_knn(get_checkpoint_folder(config), layer, topk, t)
        _log_row(f"checkpoint {layer}", table["checkpoint"][layer])
    if opts["random_inits"]:
        table["random_init"] = random_init_baseline(config, node_id, layers, topk, t, opts["random_inits"])
        for layer, r in table["random_init"].items():
            _log_row(f"random_init mean {layer}", r)
    if opts["raw_pixels"]:
        table["raw_pixels"] = raw_pixel_baseline(config, topk, t)
    return table


def run(opts):
    """Extract the features, VISSL's kNN for each k, the baselines; write the JSON."""
    topk, overrides, out_json = opts["topk"], opts["overrides"], opts["out_json"]
    import vissl  # noqa: F401  (registers the plugin + compat shims)
    from vissl.models.model_helpers import get_trunk_output_feature_names
    from vissl.utils.checkpoint import get_checkpoint_folder
    from vissl.utils.env import set_env_vars
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict, print_cfg
    from vissl.utils.logger import setup_logging, shutdown_logging
    from vissl.utils.misc import merge_features

    knn = _vissl_knn_module()
    cfg = compose_hydra_configuration(overrides)
    args, config = convert_to_attrdict(cfg)
    topk = list(topk or [int(config.NEAREST_NEIGHBOR.TOPK)])

    setup_logging(__name__)
    print_cfg(config)
    set_env_vars(local_rank=0, node_id=0, cfg=config)
    _extract(config, args.node_id)

    output_dir = get_checkpoint_folder(config)
    layers = get_trunk_output_feature_names(config.MODEL) or ["heads"]
    results = {}
    for layer in layers:
        n_train = len(merge_features(output_dir, "train", layer)["targets"])
        n_test = len(merge_features(output_dir, "test", layer)["targets"])
        if n_test < 100:  # VISSL's tool splits the queries into 100 chunks of n_test // 100
            raise KnnEvalError(
                f"VISSL's kNN test needs >= 100 query images (config.DATA.TEST), got {n_test}")
        if max(topk) > n_train:
            raise KnnEvalError(
                f"--topk / config.NEAREST_NEIGHBOR.TOPK={max(topk)} exceeds the {n_train} "
                "training (memory bank) images of config.DATA.TRAIN")
        results[layer] = {}
        for k in topk:
            config.NEAREST_NEIGHBOR.TOPK = k
            top1, top5 = knn.nearest_neighbor_test(config, layer_name=layer)
            logging.info(f"layer: {layer} {k}-NN Top1: {top1}, Top5: {top5}")
            results[layer][str(k)] = {"top1": float(top1), "top5": float(top5)}
        results["num_train"], results["num_test"] = n_train, n_test
    results["sigma"] = float(config.NEAREST_NEIGHBOR.SIGMA)
    results["l2_norm_feats"] = bool(config.NEAREST_NEIGHBOR.L2_NORM_FEATS)
    if opts["random_inits"] or opts["raw_pixels"]:
        results["baselines"] = baselines(opts, config, args.node_id, layers, topk)
    path = Path(out_json) if out_json else Path(output_dir) / "knn_results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    logging.info(f"kNN results written to {path}: {results}")
    shutdown_logging()
    return results


def main(argv=None):
    """Console script ``swav-plugin-knn``: exit 0, or 2 with the error on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        run(split_args(argv))
    except KnnEvalError as e:
        print(f"knn_eval: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
