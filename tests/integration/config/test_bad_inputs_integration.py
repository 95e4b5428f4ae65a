"""Bad input catalogue: every case gets an error naming the key or the file (or is handled
as documented), and nothing already written is lost: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/config/test_bad_inputs.py``.
"""
import shutil

import pytest

from reliability_helpers import run_failing_launcher, snapshot
from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_launcher
from bad_inputs_cases import QUICK, _corrupt  # noqa: F401

SMALL = [
    QUICK,
    *SMALL_TRUNK,
    "config.DATA.TRAIN.DATA_LIMIT=-1",
]


# --------------------------------------------------------------------------------------
# end to end through VISSL's stock launcher, 2 processes
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interrupted_checkpoint(tmp_path_factory):
    """model_phase0.torch of a 2-process run (2 epochs; the final checkpoint removed, as
    if the run had been interrupted during epoch 1)."""
    root = tmp_path_factory.mktemp("bad_inputs_ckpt")
    data = folder_data_overrides(make_image_folder(root / "images", per_class=8))
    run_launcher(SMALL + data + ["config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={root / 'ck'}"],
                 cwd=root)
    assert (root / "ck" / "model_phase0.torch").is_file()
    return root, data


def _resume_into(root, data, name, overrides):
    ck = root / name
    ck.mkdir()
    shutil.copy(root / "ck" / "model_phase0.torch", ck / "model_phase0.torch")
    before = snapshot(ck)
    proc = run_failing_launcher(SMALL + data + ["config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={ck}"]
                                + overrides, cwd=root)
    after = snapshot(ck)
    return proc, ck, before, after


def test_resume_from_another_models_checkpoint_names_the_file(interrupted_checkpoint):
    root, data = interrupted_checkpoint
    proc, ck, before, after = _resume_into(root, data, "other_model", [
        "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[30]}]]"])
    assert proc.returncode != 0
    assert "CheckpointMismatchError" in proc.stdout
    assert f"checkpoint file {ck / 'model_phase0.torch'} does not fit this run" in proc.stdout
    assert "prototypes0" in proc.stdout  # the original message says which tensor
    assert after["model_phase0.torch"] == before["model_phase0.torch"]  # not overwritten
    assert not [k for k in after if k.startswith("model_") and k != "model_phase0.torch"]


def test_resume_with_another_world_size_names_the_file(interrupted_checkpoint):
    root, data = interrupted_checkpoint
    proc, ck, before, after = _resume_into(root, data, "one_process", ["config.DISTRIBUTED.NUM_PROC_PER_NODE=1"])
    assert proc.returncode != 0
    assert f"checkpoint file {ck / 'model_phase0.torch'} does not fit this run" in proc.stdout
    assert "queues of 2 processes but this run has 1" in proc.stdout
    assert after["model_phase0.torch"] == before["model_phase0.torch"]


DECODE = ["config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],"
          "size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]}]", "config.DATA.TRAIN.DEVICE_AUGMENT=decode"]


@pytest.mark.parametrize("mode", ["off", "decode"])
def test_corrupt_image_stops_a_real_run_naming_the_file(tmp_path, mode):
    """A truncated JPEG: decoded in a loader worker (``off``), or its header read there and its
    body decoded in the training process (``DEVICE_AUGMENT=decode``): the same error either way."""
    root = make_image_folder(tmp_path / "imgs", per_class=8)
    bad = root / "class1" / "broken.jpg"
    _corrupt("truncated_jpg" if mode == "off" else "truncated_jpg_body", bad)
    proc = run_failing_launcher(SMALL + folder_data_overrides(root) + (DECODE if mode == "decode" else []) + [
        "config.OPTIMIZER.num_epochs=1", "config.DATA.NUM_DATALOADER_WORKERS=1",
        f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "BadImageError" in proc.stdout and f"cannot read image file {bad}" in proc.stdout
    # off: raised in a worker, re-raised in training; decode: raised by the train step
    assert ("DataLoader worker" in proc.stdout) == (mode == "off")
    assert ("device_augment_train_step" in proc.stdout) == (mode == "decode")
