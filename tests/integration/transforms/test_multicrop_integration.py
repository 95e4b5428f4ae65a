"""multicrop_plugin: crop geometry, per-crop augmentations, VISSL pipeline / collator
compatibility and VISSL's built-in multi-crop SimCLR loss training with it (1 and 2
processes): the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/transforms/test_multicrop.py``.
"""
import json

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from testkit import make_image_folder, run_launcher, STOCK_LAUNCHER


# -- VISSL's built-in multi-crop SimCLR loss, trained with our transform ------------------
def simclr_overrides(ckpt, nproc, workers):
    return [
        "config=pretrain/simclr/simclr_8node_resnet",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
        "config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],"
        "size_crops:[32,16],crop_scales:[[0.14,1.0],[0.05,0.14]],mean:[0.5,0.5,0.5],std:[0.25,0.25,0.25]}]",
        "config.DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator",
        "config.LOSS.name=multicrop_simclr_info_nce_loss",
        "config.LOSS.multicrop_simclr_info_nce_loss.buffer_params.embedding_dim=16",
        "config.MODEL.TRUNK.NAME=resnet_small_plugin",
        "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,32],use_relu:True}],[mlp,{dims:[32,16]}]]",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
        "config.OPTIMIZER.use_larc=False",
        "config.OPTIMIZER.num_epochs=1",
        "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=False",
        "config.OPTIMIZER.param_schedulers.lr.name=constant",
        "config.OPTIMIZER.param_schedulers.lr.value=0.1",
        "config.DISTRIBUTED.BACKEND=gloo",
        "config.DISTRIBUTED.NUM_NODES=1",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        "config.DISTRIBUTED.RUN_ID=auto",
        "config.MACHINE.DEVICE=cpu",
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False",
        "config.LOG_FREQUENCY=1",
        f"config.CHECKPOINT.DIR={ckpt}",
    ]


@pytest.mark.parametrize("nproc, workers", [(1, 0), (2, 1)])
def test_vissl_multicrop_simclr_trains_with_our_transform(tmp_path, nproc, workers):
    """VISSL's stock launcher, VISSL's multicrop_simclr_info_nce_loss (paper appendix:
    SimCLR with multi-crop), our transform + small trunk.  The 2-process run uses gloo, a
    DataLoader worker (spawned processes must find the transform registered) and data
    prepared by tools/prepare_fashion_mnist.py, found through its dataset catalog."""
    from multicrop_helpers import load_data_tool, make_fake_fashion
    from testkit import folder_data_overrides

    env = None
    if nproc == 1:
        folder = make_image_folder(tmp_path / "imgs", classes=2, per_class=8, size=32)
        data = folder_data_overrides(folder)
    else:
        make_fake_fashion(tmp_path / "idx", n_train=16, n_val=10)
        summary = load_data_tool().prepare(tmp_path / "fm", source=tmp_path / "idx", splits=["train"],
                                           verbose=False)
        env = {"VISSL_DATASET_CATALOG_PATH": summary["catalog"]}
        data = ["config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]"]
    ckpt = tmp_path / "ckpt"
    proc = run_launcher(simclr_overrides(ckpt, nproc, workers) + data, cwd=tmp_path,
                        launcher=STOCK_LAUNCHER, env=env)
    log = proc.stdout
    assert "MultiCropSimclrInfoNCELoss" in log
    assert log.count("Setting multicrop num_crops: 4") == nproc  # inferred from our transform
    rows = [json.loads(line) for line in (ckpt / "stdout.json").read_text().splitlines()]
    iters = 16 // (4 * nproc)
    assert [r["iter"] for r in rows] == list(range(iters))
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in rows)
    assert (ckpt / "model_final_checkpoint_phase0.torch").is_file()
