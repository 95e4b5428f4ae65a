"""HOOKS.PRECISE_BN: the trunk's BatchNorm statistics re-estimated on the global crops: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/hooks/test_precise_bn.py``.
"""

import torch

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_gloo_workers, run_launcher
from precise_bn_cases import expected_stats, multicrop_batches, tiny_trunk  # noqa: F401


def _rank_stats(rank):
    from vissl_swav_plugin.hooks.precise_bn import recompute_bn_stats

    net = tiny_trunk()
    batches = multicrop_batches(2, seed=10 + rank)
    local = expected_stats(net, batches, crops_used=(0, 1))
    recompute_bn_stats(net, batches, num_batches=2)
    return {"mean": net[1].running_mean.tolist(), "var": net[1].running_var.tolist(),
            "local_mean": local["1"][0].tolist(), "local_var": local["1"][1].tolist()}


def test_two_processes_average_their_statistics():
    r0, r1 = run_gloo_workers(_rank_stats)
    for key in ("mean", "var"):
        avg = (torch.tensor(r0[f"local_{key}"]) + torch.tensor(r1[f"local_{key}"])) / 2
        assert torch.allclose(torch.tensor(r0[key]), avg, atol=1e-5)
        assert torch.allclose(torch.tensor(r1[key]), avg, atol=1e-5)
        assert not torch.allclose(torch.tensor(r0[f"local_{key}"]), avg, atol=1e-3)  # premise: ranks differ


def test_e2e_final_checkpoint_holds_the_reestimated_statistics(tmp_path):
    """Through VISSL's launcher (2 gloo processes): the hook runs before the checkpoint hook,
    so the saved trunk's BatchNorm layers have counted one forward call per global crop of
    NUM_BATCHES batches (cumulative average), not the training's calls."""
    data = folder_data_overrides(make_image_folder(tmp_path / "images"))
    overrides = ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK,
                 "config.OPTIMIZER.num_epochs=2", "+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCHES:1}",
                 f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *data]
    out = run_launcher(overrides, cwd=tmp_path).stdout
    assert out.count("Precise BN: trunk BatchNorm statistics re-estimated on the global crops of 1 training") == 2
    ckpt = torch.load(tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch", map_location="cpu",
                      weights_only=False)
    trunk = ckpt["classy_state_dict"]["base_model"]["model"]["trunk"]
    counts = {k: int(v) for k, v in trunk.items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {2}, counts  # 1 batch x 2 global crops (quick_cpu: 2x32 + 2x16)
