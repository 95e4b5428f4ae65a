"""Bad input catalogue: every case gets an error naming the key or the file (or is handled
as documented), and nothing already written is lost: end-to-end VISSL runs.  The resumes and
the runs on a corrupt image run in the test process (``testkit.train_in_process``, world size 1;
a loader worker is still a process); the 2-process checkpoint of the world-size test comes from
VISSL's stock launcher (2 ranks: its queue state, one row per rank, is what the test is about).

The tests without a run are in ``tests/unit/config/test_bad_inputs.py``.
"""
import shutil
import traceback

import pytest

from bad_inputs_cases import QUICK, _corrupt  # noqa: F401
from reliability_helpers import snapshot
from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_launcher, train_in_process
from vissl_swav_plugin.compat.checkpoint_files import CheckpointMismatchError
from vissl_swav_plugin.compat.data_safety import BadImageError

SMALL = [
    QUICK,
    *SMALL_TRUNK,
    "config.DATA.TRAIN.DATA_LIMIT=-1",
]


# --------------------------------------------------------------------------------------
# end to end: resumes in the test process
# --------------------------------------------------------------------------------------
def _interrupted(root, data, nproc):
    """model_phase0.torch of a run of ``nproc`` processes (2 epochs; the final checkpoint
    removed, as if the run had been interrupted during epoch 1)."""
    overrides = SMALL + data + ["config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={root / 'ck'}"]
    if nproc == 1:
        train_in_process(overrides, cwd=root)
    else:
        run_launcher(overrides + [f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}"], cwd=root)
    assert (root / "ck" / "model_phase0.torch").is_file()
    return root, data


@pytest.fixture(scope="module")
def interrupted_checkpoint(tmp_path_factory):
    """A 1-process run's (in the test process)."""
    root = tmp_path_factory.mktemp("bad_inputs_ckpt")
    return _interrupted(root, folder_data_overrides(make_image_folder(root / "images", per_class=8)), 1)


@pytest.fixture(scope="module")
def two_process_checkpoint(tmp_path_factory):
    """A 2-process run's, through VISSL's stock launcher: one queue per rank in the loss state."""
    root = tmp_path_factory.mktemp("bad_inputs_ckpt2")
    return _interrupted(root, folder_data_overrides(make_image_folder(root / "images", per_class=8)), 2)


def _resume_into(root, data, name, overrides, error):
    """A resume from model_phase0.torch in the test process (world size 1); it must raise
    ``error``.  Returns the error, the folder, its files before and after."""
    ck = root / name
    ck.mkdir()
    shutil.copy(root / "ck" / "model_phase0.torch", ck / "model_phase0.torch")
    before = snapshot(ck)
    with pytest.raises(error) as raised:
        train_in_process(SMALL + data + ["config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={ck}"]
                         + overrides, cwd=root)
    after = snapshot(ck)
    return raised.value, ck, before, after


def _text(error):
    """What the launcher printed of an error: the traceback, with its chained causes."""
    return "".join(traceback.format_exception(error))


def test_resume_from_another_models_checkpoint_names_the_file(interrupted_checkpoint):
    root, data = interrupted_checkpoint
    error, ck, before, after = _resume_into(root, data, "other_model", [
        "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[30]}]]"],
        CheckpointMismatchError)
    assert f"checkpoint file {ck / 'model_phase0.torch'} does not fit this run" in str(error)
    assert "prototypes0" in _text(error)  # the original message says which tensor
    assert after["model_phase0.torch"] == before["model_phase0.torch"]  # not overwritten
    assert not [k for k in after if k.startswith("model_") and k != "model_phase0.torch"]


def test_resume_with_another_world_size_names_the_file(two_process_checkpoint):
    root, data = two_process_checkpoint
    error, ck, before, after = _resume_into(root, data, "one_process", ["config.DISTRIBUTED.NUM_PROC_PER_NODE=1"],
                                            CheckpointMismatchError)
    assert f"checkpoint file {ck / 'model_phase0.torch'} does not fit this run" in str(error)
    assert "queues of 2 processes but this run has 1" in _text(error)
    assert after["model_phase0.torch"] == before["model_phase0.torch"]


DECODE = ["config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],"
          "size_crops:[32,16],crop_scales:[[0.14,1],[0.05,0.14]]}]", "config.DATA.TRAIN.DEVICE_AUGMENT=decode"]


@pytest.mark.parametrize("mode", ["off", "decode"])
def test_corrupt_image_stops_a_real_run_naming_the_file(tmp_path, mode):
    """A truncated JPEG: decoded in a loader worker (``off``), or its header read there and its
    body decoded in the training process (``DEVICE_AUGMENT=decode``): the same error either way.
    What the launcher printed is the run's log.txt and the error's traceback."""
    root = make_image_folder(tmp_path / "imgs", per_class=8)
    bad = root / "class1" / "broken.jpg"
    _corrupt("truncated_jpg" if mode == "off" else "truncated_jpg_body", bad)
    with pytest.raises(BadImageError) as raised:
        train_in_process(SMALL + folder_data_overrides(root) + (DECODE if mode == "decode" else []) + [
            "config.OPTIMIZER.num_epochs=1", "config.DATA.NUM_DATALOADER_WORKERS=1",
            f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"], cwd=tmp_path)
    out = (tmp_path / "ck" / "log.txt").read_text() + _text(raised.value)
    assert f"cannot read image file {bad}" in str(raised.value)
    # off: raised in a worker, re-raised in training; decode: raised by the train step
    assert ("DataLoader worker" in out) == (mode == "off")
    assert ("device_augment_train_step" in out) == (mode == "decode")
