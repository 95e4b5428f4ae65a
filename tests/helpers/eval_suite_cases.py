"""Definitions shared by ``tests/unit/tools/test_eval_suite.py`` and its integration part."""
from pathlib import Path
import pytest
import torch
from testkit import REPO, SMALL_TRUNK, run_launcher, run_script


FMNIST = Path("/usr/share/datasets/fashion-mnist")

PER_CLASS = 50  # train and val images per class: 500 + 500

TRUNK = ["config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.DEPTH=10", "config.MODEL.TRUNK.RESNET_SMALL_PLUGIN.WIDTH=8"]

def _trunk_of(path):
    ck = torch.load(path, map_location="cpu", weights_only=False)
    return ck["classy_state_dict"]["base_model"]["model"]["trunk"]

def _tool(script, *args, cwd):
    proc = run_script([script, *args], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout

@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    if not FMNIST.is_dir():
        pytest.skip("Fashion-MNIST not installed (Debian package dataset-fashion-mnist)")
    root = tmp_path_factory.mktemp("eval_suite")
    data = root / "fmnist"
    _tool(REPO / "tools" / "prepare_fashion_mnist.py", "--out", data, "--limit-per-class", PER_CLASS, cwd=root)
    catalog = data / "dataset_catalog.json"
    _tool(REPO / "tools" / "make_label_subsets.py", "--catalog", catalog, "--dataset", "fashion_mnist_filelist",
          "--percent", "1,10", cwd=root)
    env = {"VISSL_DATASET_CATALOG_PATH": str(catalog)}
    # our checkpoint: a short SwAV run (1 process, 1 epoch of 32 images) on Fashion-MNIST
    ckpt_dir = root / "pretrain"
    run_launcher(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK,
                  "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.DATASET_NAMES=[fashion_mnist_folder]",
                  "config.DATA.TRAIN.DATA_LIMIT=32", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
                  "config.OPTIMIZER.num_epochs=1", f"config.CHECKPOINT.DIR={ckpt_dir}"], cwd=root, env=env)
    ckpt = ckpt_dir / "model_final_checkpoint_phase0.torch"
    assert ckpt.is_file()
    return dict(root=root, data=data, catalog=catalog, env=env, ckpt=ckpt, trunk=_trunk_of(ckpt))
