"""``config.DATA.TRAIN.DEVICE_AUGMENT``: end-to-end VISSL runs on the CPU (the launcher, one
process, one loader worker) with the uint8 crops normalised (``normalize``) or augmented and
normalised (``photometric``) by the plugin's train step: the tests that start processes.

The in-process tests are in ``tests/unit/transforms/test_device_augment.py``."""
import json

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from testkit import run_launcher, STOCK_LAUNCHER

TRANSFORMS = ("[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[40,24],"
              "crop_scales:[[0.14,1],[0.05,0.14]],color_jitter_p:0.8,grayscale_p:0.2,blur_p:0.5}]")


@pytest.mark.parametrize("mode", ["normalize", "photometric"])
def test_quick_cpu_trains_with_device_augment(tmp_path, mode):
    """The quick CPU config (SwAV, synthetic images) for one epoch with the key set: the config
    inference picks the train step (and, for ``photometric``, the collator), the loader worker
    sends uint8 crops (the ResNet would reject them: the step must have converted them) and
    every iteration's loss is finite."""
    ckpt = tmp_path / "ckpt"
    proc = run_launcher([
        "config=test/swav_plugin/quick_cpu",
        f"config.DATA.TRAIN.TRANSFORMS={TRANSFORMS}",
        f"config.DATA.TRAIN.DEVICE_AUGMENT={mode}",
        "config.DATA.NUM_DATALOADER_WORKERS=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={ckpt}",
    ], cwd=tmp_path, launcher=STOCK_LAUNCHER)
    log = proc.stdout
    collator = "multicrop_device_collator" if mode == "photometric" else "multicrop_collator"
    assert f"device_augment_train_step: config.DATA.TRAIN.DEVICE_AUGMENT={mode} on cpu, collator {collator}" in log
    rows = [json.loads(line) for line in (ckpt / "stdout.json").read_text().splitlines()]
    assert [r["iter"] for r in rows] == list(range(16 // 4))
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in rows)
