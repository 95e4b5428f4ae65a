"""A 2-process gloo CPU run of our config (VISSL's ResNet-50 trunk) through the plugin's
launcher, then VISSL's own linear-evaluation benchmark from its checkpoint.

What a run does step by step (our loss, the frozen then moving prototypes, the queue of each
process) and its kill and AUTO_RESUME are checked on the runs of
``tests/integration/compat/test_reliability.py``."""
import pytest
import torch

from testkit import PLUGIN_LAUNCHER, run_launcher


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """One epoch of ``test/swav_plugin/quick_cpu`` through the plugin's launcher: (log, final checkpoint)."""
    root = tmp_path_factory.mktemp("swav_e2e")
    proc = run_launcher(["config=test/swav_plugin/quick_cpu", "config.OPTIMIZER.num_epochs=1",
                         f"config.CHECKPOINT.DIR={root / 'ck'}"], cwd=root, launcher=PLUGIN_LAUNCHER)
    return proc.stdout, root / "ck" / "model_final_checkpoint_phase0.torch"


def test_plugin_launcher_runs_our_components(pretrained):
    log, _ = pretrained
    assert "SwAVPluginLoss" in log and "All Done" in log


def test_vissl_linear_eval_trains_from_our_checkpoint(pretrained, tmp_path):
    _, ours = pretrained
    out = tmp_path / "linear"
    data = []
    for split in ("TRAIN", "TEST"):
        data += [f"config.DATA.{split}.{k}=[synthetic]" for k in ("DATA_SOURCES", "LABEL_SOURCES", "DATASET_NAMES")]
        data += [f"config.DATA.{split}.DATA_LIMIT=4", f"config.DATA.{split}.BATCHSIZE_PER_REPLICA=2"]
    proc = run_launcher([
        "config=benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ours}", *data,
        "config.DATA.NUM_DATALOADER_WORKERS=0", "config.OPTIMIZER.num_epochs=1",
        "config.OPTIMIZER.param_schedulers.lr.name=constant", "config.OPTIMIZER.param_schedulers.lr.value=0.01",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DISTRIBUTED.BACKEND=gloo", "config.MACHINE.DEVICE=cpu",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False", f"config.CHECKPOINT.DIR={out}",
    ], cwd=tmp_path)
    assert "test_accuracy_list_meter" in proc.stdout
    pre = torch.load(ours, map_location="cpu", weights_only=False)["classy_state_dict"]["base_model"]["model"]["trunk"]
    post = torch.load(out / "model_final_checkpoint_phase0.torch", map_location="cpu",
                      weights_only=False)["classy_state_dict"]["base_model"]["model"]["trunk"]
    assert len(pre) > 100
    # VISSL's eval model wraps the trunk as a feature extractor ("base_model." prefix)
    post = {k.split("base_model.", 1)[-1]: v for k, v in post.items()}
    for k, v in pre.items():  # frozen trunk == our pretrained trunk, every tensor
        if k.endswith("num_batches_tracked"):
            continue  # a counter VISSL does not carry over into evaluation models
        assert torch.equal(post[k], v), k
