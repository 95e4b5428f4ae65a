"""VISSL's stock launcher runs the plugin's launch checks in the launcher process: a VISSL
head fragment for RegNet trunks on the default ResNet-50 trunk fails there, naming both
widths, before any worker starts (a worker's first action is to open ``log.txt`` in the
checkpoint folder; composing the config only dumps it there).

The stock launcher's entry (``hydra_main`` of VISSL's ``tools/run_distributed_engines.py``) runs
in the test process (``testkit.vissl_run_state``), with ``torch.multiprocessing.spawn`` and
``_distributed_worker`` (what the launcher starts or calls per rank) replaced by recorders:
"before any worker" is checked directly, not only through the checkpoint folder."""
import importlib.util

import pytest
import torch.multiprocessing
import vissl.utils.distributed_launcher as dl

from testkit import STOCK_LAUNCHER, vissl_run_state
from vissl_swav_plugin.config.checkers import ConfigError


@pytest.fixture
def stock_launcher(monkeypatch):
    """The stock launcher's ``hydra_main``, and the list of the workers it tried to start."""
    started = []
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: started.append(("spawn", a, k)))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: started.append(("worker", a, k)))
    spec = importlib.util.spec_from_file_location("stock_run_distributed_engines", STOCK_LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hydra_main, started


def test_stock_launcher_refuses_a_head_wider_than_the_trunk_before_any_worker(tmp_path, stock_launcher):
    hydra_main, started = stock_launcher
    with vissl_run_state(tmp_path), pytest.raises(ConfigError) as raised:
        hydra_main(["config=pretrain/swav/heads/d10444_d8192_d8192_d256_proto16k", "config.MACHINE.DEVICE=cpu",
                    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}",
                    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]", "config.DATA.TRAIN.DATASET_NAMES=[synthetic]"])
    assert "dims[0]=10444 but the trunk MODEL.TRUNK.NAME=resnet outputs 2048 features" in str(raised.value)
    assert started == []
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["train_config.yaml"]


@pytest.mark.parametrize("extra,message", [
    (["+config.OPTIMIZER.nam=sgd"], "config.OPTIMIZER.nam: unknown key 'nam' (did you mean 'name'?)"),
    (["config.LOSS.swav_plugin_loss.num_prototypes=[30]"],
     "config.LOSS.swav_plugin_loss.num_prototypes=[30] is replaced by the inferred value [20]"),
    (["config.MODEL.AMP_PARAMS.AMP_DTYPE=float8"], "config.MODEL.AMP_PARAMS.AMP_DTYPE='float8' is not supported"),
])
def test_stock_launcher_refuses_bad_vissl_values_before_any_worker(tmp_path, stock_launcher, extra, message):
    """The checks of VISSL's own sections, when the stock launcher composes the config:
    nothing is written to the checkpoint folder (not even the config dump)."""
    hydra_main, started = stock_launcher
    with vissl_run_state(tmp_path), pytest.raises(ConfigError) as raised:
        hydra_main(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *extra])
    assert message in str(raised.value)
    assert started == []
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
