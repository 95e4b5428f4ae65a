"""Run-wide monitors (issue 13, items 5-7) on a real 2-process run through VISSL's stock
launcher: the progress line (vissl_swav_plugin.hooks.progress), TensorBoard (VISSL's
SSLTensorboardHook with our configs) and the online kNN (vissl_swav_plugin.hooks.online_knn).

One quick run (config test/swav_plugin/quick_cpu: 2 epochs x 2 iterations, 2 gloo
processes) serves the three; truths: VISSL's own loss log (stdout.json), the saved
checkpoints (features recomputed here, the kNN of tests/helpers/reference_swav.py) and the definitions.
"""
import re

import pytest

from testkit import compose, make_image_folder
from run_monitors_cases import HAVE_TB, PROGRESS, run  # noqa: F401


def test_progress_line_is_not_parsed_as_a_vissl_line_by_the_demo():
    from vissl_swav_plugin.demo.training import parse_log_line
    from vissl_swav_plugin.hooks.progress import progress_line

    line = "INFO 2026 progress.py: 1: " + progress_line(0, 12, 5, 468, 8.25, [0.3, 0.3], 2.0)
    assert PROGRESS.search(line) and parse_log_line(line) is None
    assert progress_line(1, 2, 3, 4, 1.0, [0.1, 5.0], 0.0).endswith("lr [0.1, 5] | 0.00 it/s | ETA ?")


def test_progress_config_defaults_validation_and_switch(tmp_path):
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.hooks.progress import ProgressHook, progress_config, progress_hooks

    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_config(cfg) == {"ENABLED": True, "FREQUENCY": 1}
    assert [type(h) for h in progress_hooks(cfg)] == [ProgressHook]
    # a config without the block (VISSL's defaults lack it): the defaults
    bench = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_config(bench) == {"ENABLED": True, "FREQUENCY": 10}
    off = compose(["config=test/swav_plugin/quick_cpu", "config.HOOKS.PROGRESS.ENABLED=false",
                   f"config.CHECKPOINT.DIR={tmp_path}"])
    assert progress_hooks(off) == []
    for override, key in [("config.HOOKS.PROGRESS.FREQUENCY=0", "HOOKS.PROGRESS.FREQUENCY"),
                          ("config.HOOKS.PROGRESS.ENABLED=3", "HOOKS.PROGRESS.ENABLED"),
                          ("+config.HOOKS.PROGRESS.FREQ=5", "HOOKS.PROGRESS.FREQ")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            compose(["config=test/swav_plugin/quick_cpu", override, f"config.CHECKPOINT.DIR={tmp_path}"])


def test_online_knn_config_validation(tmp_path):
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.hooks.online_knn import DEFAULTS, online_knn_config, online_knn_hooks

    base = ["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path}"]
    cfg = compose(base)
    assert online_knn_hooks(cfg) == [] and online_knn_config(cfg)["ENABLED"] is False
    bench = compose(["config=benchmark/swav_plugin/knn_fashion_mnist_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert online_knn_config(bench) == DEFAULTS
    folder = make_image_folder(tmp_path / "f", classes=2, per_class=2)
    on = ["config.HOOKS.ONLINE_KNN.ENABLED=true", f"config.HOOKS.ONLINE_KNN.TRAIN_PATH={folder}",
          f"config.HOOKS.ONLINE_KNN.TEST_PATH={folder}"]
    assert len(online_knn_hooks(compose(base + on))) == 1
    for override, key in [("config.HOOKS.ONLINE_KNN.TOPK=0", "HOOKS.ONLINE_KNN.TOPK"),
                          ("config.HOOKS.ONLINE_KNN.TEMPERATURE=-1", "HOOKS.ONLINE_KNN.TEMPERATURE"),
                          ("config.HOOKS.ONLINE_KNN.STD=[1,0,1]", "HOOKS.ONLINE_KNN.STD"),
                          ("config.HOOKS.ONLINE_KNN.EVERY_N_EPOCHS=x", "HOOKS.ONLINE_KNN.EVERY_N_EPOCHS"),
                          ("+config.HOOKS.ONLINE_KNN.TOP_K=5", "HOOKS.ONLINE_KNN.TOP_K"),
                          (f"config.HOOKS.ONLINE_KNN.TEST_PATH={tmp_path}/missing", "HOOKS.ONLINE_KNN.TEST_PATH")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            compose(base + on + [override])
    with pytest.raises(ConfigError, match=r"HOOKS\.ONLINE_KNN\.TRAIN_PATH"):
        compose(base + ["config.HOOKS.ONLINE_KNN.ENABLED=true"])
