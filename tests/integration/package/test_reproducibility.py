"""What docs/development.md's "Reproducibility" paragraph claims of one machine: the demo's own
config (channels-last ResNet-10 in fp32, multi-crop, precise BN, the collapse detector) trained
twice with the same seed gives bit-identical weights, and another seed gives other weights (so the
comparison can see a difference).  The three runs are in the test process at world size 1
(``testkit.train_in_process``), one after the other: nothing a run leaves in the process may
change the next.  Tiny data, so it is a check of the code path, not of the figures.

Two 2-process runs (gloo) of one config, one through VISSL's launcher and one through torchrun,
are compared bit for bit (the losses of every rank at every iteration, every final weight) in
``tests/integration/tools/test_launch_paths_integration.py``."""
import pytest
import torch

from testkit import folder_data_overrides, make_image_folder, train_in_process


def train(root, images, seed, name):
    ckpt = root / name
    train_in_process(
        ["config=pretrain/swav/swav_fashion_mnist_cpu", *folder_data_overrides(images),
         "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4", "config.OPTIMIZER.num_epochs=2",
         "config.LOSS.swav_plugin_loss.freeze_prototypes_niters=2",
         "config.HOOKS.PRECISE_BN.NUM_BATCHES=2", f"config.SEED_VALUE={seed}",
         f"config.CHECKPOINT.DIR={ckpt}"],
        cwd=root,
    )
    state = torch.load(ckpt / "model_final_checkpoint_phase1.torch", map_location="cpu",
                       weights_only=False)["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in state[part].items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    # 8 images, 4 per batch: 2 iterations per epoch, the prototypes frozen for the first 2
    images = make_image_folder(root / "images", classes=2, per_class=4, size=28)
    return [train(root, images, seed, name) for seed, name in ((3, "a"), (3, "b"), (4, "c"))]


def test_same_seed_same_weights_bit_for_bit(runs):
    a, b, _ = runs
    assert a.keys() == b.keys()
    assert any("running_mean" in k for k in a)  # BatchNorm statistics (precise BN) are compared too
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"same seed, different tensors: {different[:5]}"


def test_another_seed_other_weights(runs):
    a, _, c = runs
    trained = [k for k in a if a[k].is_floating_point() and "num_batches_tracked" not in k]
    assert sum(not torch.equal(a[k], c[k]) for k in trained) > len(trained) // 2
