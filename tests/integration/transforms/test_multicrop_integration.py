"""multicrop_plugin: VISSL's built-in multi-crop SimCLR loss trained with our transform, in the
test process at world size 1 (``testkit.train_in_process``), without a loader worker and with one
(a process: integration).

The in-process tests are in ``tests/unit/transforms/test_multicrop.py``.
"""
import contextlib
import json
import re

import numpy as np
import pytest

import vissl  # noqa: F401  (registers the plugin)
from testkit import catalog_env, folder_data_overrides, load_script, make_image_folder, train_in_process


# -- VISSL's built-in multi-crop SimCLR loss, trained with our transform ------------------
def simclr_overrides(ckpt, workers):
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
        "config.DISTRIBUTED.RUN_ID=auto",
        "config.MACHINE.DEVICE=cpu",
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False",
        "config.LOG_FREQUENCY=1",
        f"config.CHECKPOINT.DIR={ckpt}",
    ]


@pytest.mark.parametrize("workers", [0, 1])
def test_vissl_multicrop_simclr_trains_with_our_transform(tmp_path, workers):
    """VISSL's multicrop_simclr_info_nce_loss (paper appendix: SimCLR with multi-crop), our
    transform + small trunk, one process.  The run with a DataLoader worker (a process that must
    find the transform registered) reads data prepared by tools/prepare_fashion_mnist.py, found
    through its dataset catalog."""
    from multicrop_helpers import make_fake_fashion

    catalog = contextlib.nullcontext()
    if workers == 0:
        data = folder_data_overrides(make_image_folder(tmp_path / "imgs", classes=2, per_class=8, size=32))
    else:
        make_fake_fashion(tmp_path / "idx", n_train=16, n_val=10)
        summary = load_script("tools/prepare_fashion_mnist.py").prepare(tmp_path / "fm", source=tmp_path / "idx",
                                                                        splits=["train"], verbose=False)
        catalog = catalog_env({"VISSL_DATASET_CATALOG_PATH": summary["catalog"]})
        data = ["config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]"]
    with catalog:
        ckpt, log = train_in_process(simclr_overrides(tmp_path / "ckpt", workers) + data, cwd=tmp_path)
    assert "MultiCropSimclrInfoNCELoss" in log
    world = int(re.search(r"Using Distributed init method: \S+, world_size: (\d+)", log).group(1))
    assert log.count("Setting multicrop num_crops: 4") == world  # once per process; inferred from our transform
    rows = [json.loads(line) for line in (ckpt / "stdout.json").read_text().splitlines()]
    iters = 16 // (4 * world)  # 16 images, 4 per replica
    assert [r["iter"] for r in rows] == list(range(iters))
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in rows)
    assert (ckpt / "model_final_checkpoint_phase0.torch").is_file()
