"""``pretrain/swav/swav_1gpu_resnet`` composes with the values of the README's scaling table
and runs 2 iterations on CPU (small images, bf16 autocast) through VISSL's ``launch_distributed``
in the test process (``testkit.train_in_process``; no loader worker).

The in-process tests are in ``tests/unit/package/test_one_gpu_config.py``.
"""
import json

import torch

from testkit import folder_data_overrides, make_image_folder, train_in_process
from one_gpu_config_cases import CONFIG  # noqa: F401


def test_two_iterations_on_cpu(tmp_path):
    data = folder_data_overrides(make_image_folder(tmp_path / "images", per_class=2))
    _, out = train_in_process([
        CONFIG, *data, "config.MACHINE.DEVICE=cpu", "config.DISTRIBUTED.BACKEND=gloo",
        "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16", "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2", "config.DATA.TRAIN.DATA_LIMIT=4",
        "config.DATA.TRAIN.TRANSFORMS.0.size_crops=[32,16]", "config.OPTIMIZER.num_epochs=1",
        "config.LOG_FREQUENCY=1", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}",
    ], cwd=tmp_path)
    assert "SwAVPluginLoss" in out
    stats = [json.loads(line) for line in (tmp_path / "ckpt" / "stdout.json").read_text().splitlines()]
    losses = [s["loss"] for s in stats if "loss" in s]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
