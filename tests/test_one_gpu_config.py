"""``pretrain/swav/swav_1gpu_resnet`` composes with the values of the README's scaling table
and runs 2 iterations on CPU (small images, bf16 autocast) through VISSL's stock launcher."""
import json

import torch

from conftest import compose, folder_data_overrides, make_image_folder, run_launcher

CONFIG = "config=pretrain/swav/swav_1gpu_resnet"
IMAGENET_TRAIN = 1281167


def test_composes_with_scaled_recipe():
    cfg = compose([CONFIG])
    bs = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    lc = cfg.LOSS.swav_plugin_loss
    assert world == 1 and bs == 64
    assert lc.num_crops == 8 and list(lc.crops_for_assign) == [0, 1]
    # the official small-batch recipe (batch 256, lr 0.6, freeze one epoch) scaled to 64
    lr = cfg.OPTIMIZER.param_schedulers.lr
    assert abs(lr.start_value - 0.6 * bs / 256) < 1e-12 and abs(lr.end_value - lr.start_value / 1000) < 1e-12
    assert lc.freeze_prototypes_niters == IMAGENET_TRAIN // bs
    assert lc.queue.local_queue_length == lc.queue.queue_length == 3840
    assert lc.queue.queue_length + bs >= lc.num_prototypes[0]
    assert lc.queue.use_before_full is False
    assert cfg.MODEL.AMP_PARAMS.USE_AMP and cfg.MODEL.AMP_PARAMS.AMP_DTYPE == "float16"
    assert cfg.MACHINE.DEVICE == "gpu" and not cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN


def test_two_iterations_on_cpu(tmp_path):
    data = folder_data_overrides(make_image_folder(tmp_path / "images", per_class=2))
    out = run_launcher([
        CONFIG, *data, "config.MACHINE.DEVICE=cpu", "config.DISTRIBUTED.BACKEND=gloo",
        "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16", "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2", "config.DATA.TRAIN.DATA_LIMIT=4",
        "config.DATA.TRAIN.TRANSFORMS.0.size_crops=[32,16]", "config.OPTIMIZER.num_epochs=1",
        "config.LOG_FREQUENCY=1", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}",
    ], cwd=tmp_path).stdout
    assert "SwAVPluginLoss" in out
    stats = [json.loads(line) for line in (tmp_path / "ckpt" / "stdout.json").read_text().splitlines()]
    losses = [s["loss"] for s in stats if "loss" in s]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
