"""VISSL's stock launcher runs the plugin's launch checks in the launcher process: a VISSL
head fragment for RegNet trunks on the default ResNet-50 trunk fails there, naming both
widths, before any worker starts (a worker's first action is to open ``log.txt`` in the
checkpoint folder; composing the config only dumps it there)."""
from testkit import run_launcher


def test_stock_launcher_refuses_a_head_wider_than_the_trunk_before_any_worker(tmp_path):
    proc = run_launcher(["config=pretrain/swav/heads/d10444_d8192_d8192_d256_proto16k", "config.MACHINE.DEVICE=cpu",
                         "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}",
                         "config.DATA.TRAIN.DATA_SOURCES=[synthetic]", "config.DATA.TRAIN.DATASET_NAMES=[synthetic]"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "dims[0]=10444 but the trunk MODEL.TRUNK.NAME=resnet outputs 2048 features" in proc.stdout, proc.stdout[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["train_config.yaml"]


import pytest  # noqa: E402


@pytest.mark.parametrize("extra,message", [
    (["+config.OPTIMIZER.nam=sgd"], "config.OPTIMIZER.nam: unknown key 'nam' (did you mean 'name'?)"),
    (["config.LOSS.swav_plugin_loss.num_prototypes=[30]"],
     "config.LOSS.swav_plugin_loss.num_prototypes=[30] is replaced by the inferred value [20]"),
    (["config.MODEL.AMP_PARAMS.AMP_DTYPE=float8"], "config.MODEL.AMP_PARAMS.AMP_DTYPE='float8' is not supported"),
])
def test_stock_launcher_refuses_bad_vissl_values_before_any_worker(tmp_path, extra, message):
    """The checks of VISSL's own sections, when the stock launcher composes the config:
    nothing is written to the checkpoint folder (not even the config dump)."""
    proc = run_launcher(["config=test/swav_plugin/quick_cpu", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *extra],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert message in proc.stdout, proc.stdout[-3000:]
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
