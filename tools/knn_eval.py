#!/usr/bin/env python
"""kNN evaluation with several k at once, through VISSL's own kNN benchmark.

VISSL's ``tools/nearest_neighbor_test.py`` extracts features once and then classifies with
one ``config.NEAREST_NEIGHBOR.TOPK``.  The paper (App. "KNN classifiers on ImageNet")
reports 20-NN *and* 200-NN; this tool runs VISSL's ``extract_features`` engine once (same
launcher call as VISSL's tool, 1 or N processes) and then calls VISSL's
``nearest_neighbor_test`` function (weighted vote ``exp(sim / SIGMA)`` over the top-k
training features) for each k.  Nothing of the kNN is re-implemented here.

usage::

    python tools/knn_eval.py [--topk 20,200] [--output-json PATH] config=... [hydra overrides]

e.g. ``python tools/knn_eval.py --topk 20,200 config=benchmark/swav_plugin/knn_fashion_mnist_cpu
config.MODEL.WEIGHTS_INIT.PARAMS_FILE=ckpt/model_final_checkpoint_phase9.torch
config.CHECKPOINT.DIR=out/knn``.

Without ``--topk`` the config's ``NEAREST_NEIGHBOR.TOPK`` is used.  Results are logged as
VISSL's tool logs them and written to ``CHECKPOINT.DIR/knn_results.json``::

    {"res5avg": {"20": {"top1": 71.2, "top5": 97.1}, "200": {...}}, "num_train": N, "num_test": M}
"""
import json
import logging
import sys
from pathlib import Path


class KnnEvalError(ValueError):
    """Bad argument or data for the kNN run; the message names it."""


def split_args(argv):
    """Our ``--topk`` / ``--output-json`` options, and the Hydra overrides (everything else)."""
    topk, out_json, overrides = None, None, []
    it = iter(argv)
    for a in it:
        if a.startswith("--topk"):
            value = a.split("=", 1)[1] if "=" in a else next(it, None)
            if value is None:
                raise KnnEvalError("--topk needs a value, e.g. --topk 20,200")
            try:
                topk = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                raise KnnEvalError(f"--topk must be a comma list of integers, got {value!r}")
            if not topk or min(topk) < 1:
                raise KnnEvalError(f"--topk values must be >= 1, got {value!r}")
        elif a.startswith("--output-json"):
            out_json = a.split("=", 1)[1] if "=" in a else next(it, None)
            if out_json is None:
                raise KnnEvalError("--output-json needs a path")
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a.startswith("--"):
            raise KnnEvalError(f"unknown option {a!r} (known: --topk, --output-json; the rest are Hydra overrides)")
        else:
            overrides.append(a)
    if not any(o.startswith("config=") for o in overrides):
        raise KnnEvalError("missing config=..., e.g. config=benchmark/swav_plugin/knn_fashion_mnist_cpu")
    return topk, out_json, overrides


def _vissl_knn_module():
    # VISSL's installed tools package (a regular package: it wins over our tools/ folder,
    # which is deliberately not a package).  The plugin's compat layer patches its
    # nearest_neighbor_test for CPU runs when it is imported.
    import importlib

    return importlib.import_module("tools.nearest_neighbor_test")


def run(topk, overrides, out_json=None):
    import vissl  # noqa: F401  (registers the plugin + compat shims)
    from vissl.hooks import default_hook_generator
    from vissl.models.model_helpers import get_trunk_output_feature_names
    from vissl.utils.checkpoint import get_checkpoint_folder
    from vissl.utils.distributed_launcher import launch_distributed
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
    # same call as VISSL's nearest_neighbor_test.main()
    launch_distributed(config, args.node_id, engine_name="extract_features",
                       hook_generator=default_hook_generator)

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
    path = Path(out_json) if out_json else Path(output_dir) / "knn_results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    logging.info(f"kNN results written to {path}: {results}")
    shutdown_logging()
    return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        topk, out_json, overrides = split_args(argv)
        run(topk, overrides, out_json)
    except KnnEvalError as e:
        print(f"knn_eval: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
