"""Definitions shared by ``tests/unit/demo/test_recipe_table.py`` and its integration part."""
import json
import math
from testkit import load_script
from vissl_swav_plugin.hooks.collapse_report import epoch_line


def _module():
    return load_script("benchmarks/recipe_table.py")

def _fake_run(out, name, extra, knn20, used=97, K=100):
    """A finished demo run folder: the report's fields the table reads, and a training log whose
    detector lines come from the detector's own formatter."""
    run = out / name
    (run / "run").mkdir(parents=True)
    lk = math.log(K)
    head = dict(K=K, ln_k=lk, sample_entropy=0.8 * lk, mean_entropy=0.99 * lk)
    codes = dict(code_entropy=0.9 * lk, code_used=K)
    settings = dict(PATIENCE_ITERS=100, ON_COLLAPSE="warn")
    log = "\n".join("INFO collapse.py: " + epoch_line("swav_plugin_loss", e, 0.7 * lk, [dict(head, used=u, **c)], [], 39,
                                                     n, n, settings)
                    for e, u, c, n in ((0, used, codes, 5), (1, used + 1, {}, 0)))
    (run / "run" / "train_log.txt").write_text(log + "\n")
    knn = {"knn20": knn20, "knn200": 60.0, "nn5_euclid": 70.0}
    report = dict(loss_curve=[{"loss": 0.7 * lk}] * 40, knn=dict(swav=knn, random_init=knn, raw_pixels=knn),
                  config=dict(mode=dict(epochs=2)), times_s=dict(train_launcher=10.0))
    (run / "swav_demo_report.json").write_text(json.dumps(report))
    if extra is not None:
        (run / "recipe_table_args.json").write_text(json.dumps(extra))
    return run
