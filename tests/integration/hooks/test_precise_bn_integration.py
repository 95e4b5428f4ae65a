"""HOOKS.PRECISE_BN: the trunk's BatchNorm statistics re-estimated on the global crops: the
average over 2 gloo processes, and an end-to-end VISSL run in the test process (world size 1,
``testkit.train_in_process``; a VISSL run starts ``lscpu``).

The in-process tests are in ``tests/unit/hooks/test_precise_bn.py``.
"""

import torch

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, run_gloo_workers, train_in_process
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
    """A VISSL run (world size 1, in the test process): the hook runs after the last epoch
    only, in every process, before the checkpoint hook, so the saved trunk's BatchNorm layers
    have counted one forward call per global crop of NUM_BATCHES batches (cumulative average),
    not the training's calls."""
    world = 1
    data = folder_data_overrides(make_image_folder(tmp_path / "images"))
    overrides = ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, "config.DATA.TRAIN.DATA_LIMIT=8",
                 "config.OPTIMIZER.num_epochs=2", "+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCHES:1}",
                 f"config.DISTRIBUTED.NUM_PROC_PER_NODE={world}", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *data]
    _, out = train_in_process(overrides, cwd=tmp_path)
    # once per process, after the last of the 2 epochs
    assert out.count("Precise BN: trunk BatchNorm statistics re-estimated on the global crops of 1 training") == world
    ckpt = torch.load(tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch", map_location="cpu",
                      weights_only=False)
    trunk = ckpt["classy_state_dict"]["base_model"]["model"]["trunk"]
    counts = {k: int(v) for k, v in trunk.items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {2}, counts  # 1 batch x 2 global crops (quick_cpu: 2x32 + 2x16)
