"""A CPU run of our config (VISSL's ResNet-50 trunk) through the plugin's launcher code
(``vissl_swav_plugin.tools.launch.main``, what ``tools/run_distributed_engines.py`` and
``swav-plugin-train`` call), then VISSL's own linear-evaluation benchmark from its checkpoint.
Both in the test process at world size 1 (``main`` in ``testkit.vissl_run_state``; the linear
evaluation by ``testkit.train_in_process``); integration because every VISSL run starts ``lscpu``.

The launcher as processes: ``python -m vissl_swav_plugin.tools.launch`` with 2 gloo processes (the
reference of torchrun and SLURM) in ``tests/integration/tools/test_launch_paths_integration.py``,
``tools/run_distributed_engines.py`` in ``tests/integration/compat/test_launcher_signals.py``; what a run does
step by step (our loss, the frozen then moving prototypes, the queue of each process) and its kill
and AUTO_RESUME are checked on the runs of ``tests/integration/compat/test_reliability.py``."""
import pytest
import torch

from testkit import train_in_process, vissl_run_state


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """One epoch of ``test/swav_plugin/quick_cpu`` through the plugin's launcher code, one process:
    (the run's log.txt, final checkpoint)."""
    from vissl_swav_plugin.tools.launch import main

    root = tmp_path_factory.mktemp("swav_e2e")
    with vissl_run_state(root):
        assert main(["config=test/swav_plugin/quick_cpu", "config.OPTIMIZER.num_epochs=1",
                     "config.DISTRIBUTED.NUM_PROC_PER_NODE=1", f"config.CHECKPOINT.DIR={root / 'ck'}"]) == 0
    return (root / "ck" / "log.txt").read_text(), root / "ck" / "model_final_checkpoint_phase0.torch"


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
    _, log = train_in_process([
        "config=benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ours}", *data,
        "config.DATA.NUM_DATALOADER_WORKERS=0", "config.OPTIMIZER.num_epochs=1",
        "config.OPTIMIZER.param_schedulers.lr.name=constant", "config.OPTIMIZER.param_schedulers.lr.value=0.01",
        "config.DISTRIBUTED.BACKEND=gloo", "config.MACHINE.DEVICE=cpu",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False", f"config.CHECKPOINT.DIR={out}",
    ], cwd=tmp_path)
    assert "test_accuracy_list_meter" in log
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
