"""Run-wide monitors (issue 13, items 5-7): the progress line (vissl_swav_plugin.hooks.progress),
TensorBoard (VISSL's SSLTensorboardHook with our configs) and the online kNN
(vissl_swav_plugin.hooks.online_knn): their lines, configs, and rank 0 alone logging and writing
(rank faked).

The quick run that checks them end to end (config test/swav_plugin/quick_cpu, in the test process;
truths: VISSL's own loss log (stdout.json), the saved checkpoints (features recomputed there, the
kNN of tests/helpers/reference_swav.py) and the definitions) is in
``tests/integration/hooks/test_run_monitors_integration.py``.
"""
import json
import logging
import re
from types import SimpleNamespace

import pytest

from testkit import compose, make_image_folder
from run_monitors_cases import PROGRESS


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


class _Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, global_step=None):
        self.scalars.append((tag, global_step, value))

    def flush(self):
        pass


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_logs_the_progress_line(caplog, monkeypatch, rank):
    """A 4-iteration epoch, FREQUENCY 1: rank 0 logs one line per iteration (the epoch's end
    is iteration 4's, not logged twice); any other rank (``rank()`` faked) logs none."""
    from vissl_swav_plugin.hooks.progress import ProgressHook

    monkeypatch.setattr("vissl_swav_plugin.utils.distributed.rank", lambda: rank)
    caplog.set_level(logging.INFO)
    hook = ProgressHook(frequency=1)
    task = SimpleNamespace(train=True, iteration=0, train_phase_idx=0, num_train_phases=1, max_iteration=4,
                           optimizer=SimpleNamespace(options_view=SimpleNamespace(lr=0.1)))
    hook.on_start(task)
    for it in range(4):
        task.iteration, task.last_batch = it, SimpleNamespace(loss=float(it))
        hook.on_update(task)
    task.iteration = 4
    hook.on_phase_end(task)
    lines = [m for m in (PROGRESS.search(r.getMessage()) for r in caplog.records) if m]
    assert [int(m.group(3)) for m in lines] == ([1, 2, 3, 4] if rank == 0 else [])


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_logs_and_writes_the_online_knn(tmp_path, caplog, monkeypatch, rank):
    """Every rank evaluates (the features are gathered over the ranks); only rank 0
    (``rank()`` faked) logs the line, appends to online_knn.jsonl and writes TensorBoard."""
    from vissl_swav_plugin.hooks.online_knn import DEFAULTS, OnlineKnnHook

    monkeypatch.setattr("vissl_swav_plugin.utils.distributed.rank", lambda: rank)
    caplog.set_level(logging.INFO)
    hook = OnlineKnnHook({**DEFAULTS, "ENABLED": True, "TOPK": 5}, num_epochs=1)
    rec = dict(epoch=0, iteration=4, layer="res5avg", k=5, temperature=0.07, correct=3, num_test=4, num_train=8,
               top1=75.0, seconds=0.0)
    evaluated = []
    hook.evaluate = lambda task: evaluated.append(task) or dict(rec)
    writer = _Writer()
    task = SimpleNamespace(train=True, train_phase_idx=0, iteration=4, checkpoint_folder=str(tmp_path),
                           hooks=[SimpleNamespace(tb_writer=writer)])
    hook.on_phase_end(task)
    assert evaluated == [task]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("online kNN: ")]
    records = (tmp_path / "online_knn.jsonl").read_text().splitlines() if rank == 0 else []
    if rank == 0:
        assert len(lines) == 1 and "res5avg 5-NN top-1 75.00% (3/4)" in lines[0]
        assert [json.loads(r) for r in records] == [rec]
        assert writer.scalars == [("Online_kNN/top1_res5avg_5NN", 0, 75.0)]
    else:
        assert lines == [] and not (tmp_path / "online_knn.jsonl").exists() and writer.scalars == []
