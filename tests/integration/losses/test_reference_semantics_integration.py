"""The official implementation's semantics (facebookresearch/swav ``main_swav.py``) are the
defaults: the queue is scored only once it is full, prototypes are unit-norm before every
forward pass; our loss also works with VISSL's own ``swav_head``: a VISSL run (VISSL's ResNet-50)
in the test process (world size 1, ``testkit.train_in_process``; a VISSL run starts ``lscpu``).

The in-process tests are in ``tests/unit/losses/test_reference_semantics.py``.
"""

import torch

from testkit import folder_data_overrides, make_image_folder, train_in_process


def test_our_loss_trains_with_vissls_swav_head(tmp_path):
    """Mixing: VISSL's own swav_head with our loss, a run in the test process (world size 1)."""
    data = folder_data_overrides(make_image_folder(tmp_path / "images"))
    head = "config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,64,16],use_bn:True,num_clusters:[20]}]]"
    _, out = train_in_process(["config=test/swav_plugin/quick_cpu", head, "config.OPTIMIZER.num_epochs=1",
                               f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *data], cwd=tmp_path)
    assert "SwAVPluginLoss" in out and "SwAVPrototypesHead" in out
    ckpt = torch.load(tmp_path / "ckpt" / "model_final_checkpoint_phase0.torch", map_location="cpu",
                      weights_only=False)
    w = ckpt["classy_state_dict"]["base_model"]["model"]["heads"]["0.prototypes0.weight"]
    assert torch.isfinite(w).all()
    assert torch.allclose(w.norm(dim=1), torch.ones(20), atol=1e-5)
