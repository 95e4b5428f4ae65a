"""``config.DATA.TRAIN.DEVICE_AUGMENT``: end-to-end VISSL runs on the CPU (world size 1, in the
test process: ``testkit.train_in_process``; one loader worker, a process) with the uint8 crops
normalised (``normalize``), augmented and normalised (``photometric``), or decoded, cropped,
augmented and normalised (``decode``) by the plugin's train step.

The tests without a run are in ``tests/unit/transforms/test_device_augment.py``."""
import json

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, train_in_process

TRANSFORMS = ("[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[40,24],"
              "crop_scales:[[0.14,1],[0.05,0.14]],color_jitter_p:0.8,grayscale_p:0.2,blur_p:0.5}]")


COLLATORS = {"normalize": "multicrop_collator", "photometric": "multicrop_device_collator",
             "decode": "multicrop_decode_collator"}


@pytest.mark.parametrize("mode, data", [("normalize", "synthetic"), ("photometric", "synthetic"),
                                        ("decode", "synthetic"), ("decode", "jpeg_folder")])
def test_quick_cpu_trains_with_device_augment(tmp_path, mode, data):
    """The quick CPU config (SwAV) for one epoch with the key set: the config inference picks the
    train step and the collator, the loader worker sends uint8 crops, or (``decode``) the images
    with the crops' parameters -- JPEG files undecoded, synthetic images as pixels -- (the ResNet
    would reject them: the step must have converted them) and every iteration's loss is finite."""
    ckpt = tmp_path / "ckpt"
    source = [] if data == "synthetic" else [*folder_data_overrides(make_image_folder(
        tmp_path / "imgs", per_class=8, ext="jpg")), "config.DATA.TRAIN.DATA_LIMIT=-1"]
    _, log = train_in_process([
        "config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, *source,
        f"config.DATA.TRAIN.TRANSFORMS={TRANSFORMS}",
        f"config.DATA.TRAIN.DEVICE_AUGMENT={mode}",
        "config.DATA.NUM_DATALOADER_WORKERS=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={ckpt}",
    ], cwd=tmp_path)
    collator = COLLATORS[mode]
    assert f"device_augment_train_step: config.DATA.TRAIN.DEVICE_AUGMENT={mode} on cpu, collator {collator}" in log
    rows = [json.loads(line) for line in (ckpt / "stdout.json").read_text().splitlines()]
    assert [r["iter"] for r in rows] == list(range(16 // 4))
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in rows)


def _run(tmp_path, name, overrides):
    ckpt = tmp_path / name / "ckpt"
    (tmp_path / name).mkdir()
    train_in_process([*overrides, "config.DISTRIBUTED.NUM_PROC_PER_NODE=1", f"config.CHECKPOINT.DIR={ckpt}"],
                     cwd=tmp_path / name)
    losses = [json.loads(line)["loss"] for line in (ckpt / "stdout.json").read_text().splitlines()]
    final = sorted(ckpt.glob("model_final_checkpoint_phase*.torch"))
    assert final, sorted(p.name for p in ckpt.iterdir())
    import torch

    state = torch.load(final[-1], map_location="cpu", weights_only=False)["classy_state_dict"]["base_model"]["model"]
    bn = {k: v for k, v in state["trunk"].items() if k.endswith(("running_mean", "running_var"))}
    assert bn
    return losses, bn


def test_code_that_reads_the_training_loader_sees_what_the_model_trains_on(tmp_path):
    """``normalize`` sends the crops of ``off`` as uint8: a run with it must equal the run
    without it, losses and the final BatchNorm statistics, also where code of ours reads the
    training loader outside the train step (it used to get the uint8 crops: precise BN then
    estimated the statistics of 0-255 inputs and the features were lost).  One run reads the
    loader both ways: DeepCluster-v2 fills its memory bank with a pass over the training loader
    before training (its pseudo-labels, hence the losses, come from that bank), and precise BN
    re-estimates the statistics on the loader's batches after the last epoch."""
    import torch

    overrides = ["config=pretrain/deepcluster_v2/deepclusterv2_quick_cpu", "config.DATA.NUM_DATALOADER_WORKERS=1",
                 "+config.HOOKS.PRECISE_BN.ENABLED=true", "+config.HOOKS.PRECISE_BN.NUM_BATCHES=2"]

    off_losses, off_bn = _run(tmp_path, "off", overrides)
    on_losses, on_bn = _run(tmp_path, "normalize", [*overrides, "config.DATA.TRAIN.DEVICE_AUGMENT=normalize"])
    assert on_losses == off_losses
    assert off_bn.keys() == on_bn.keys()
    worst = max((off_bn[k] - on_bn[k]).abs().max().item() for k in off_bn)
    assert worst <= 1e-5, worst
    assert all(torch.isfinite(v).all() for v in on_bn.values())
