"""HOOKS.PRECISE_BN: the trunk's BatchNorm statistics re-estimated on the global crops.

Independent truths: the batch mean / unbiased variance of each BatchNorm layer's input,
recorded with forward hooks on a copy of the network and averaged by hand; a second
process (the statistics averaged over 2 gloo ranks equal the mean of each rank's own);
VISSL's launcher and checkpoint (the saved statistics are the re-estimated ones).
"""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from conftest import compose, folder_data_overrides, make_image_folder, run_gloo_workers, run_launcher


def tiny_trunk(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 5, 3, stride=2, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def multicrop_batches(n, seed=0, big=12, small=6):
    """``multicrop_collator``-shaped batches: 2 global crops (big px) then 2 small ones, each
    with its own mean, so that mixing them in would show."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        crops = [torch.randn(4, 3, big, big, generator=g) + 1.0, torch.randn(4, 3, big, big, generator=g) * 2,
                 torch.randn(4, 3, small, small, generator=g) - 3.0, torch.randn(4, 3, small, small, generator=g)]
        out.append({"data": [crops], "data_idx": [torch.arange(16)]})
    return out


def expected_stats(net, batches, crops_used):
    """Average over forward calls of each BN layer's input batch mean / unbiased variance."""
    net = copy.deepcopy(net).train()
    records = {}

    def hook(name):
        def f(mod, inp, out):
            x = inp[0].transpose(0, 1).flatten(1)
            records.setdefault(name, []).append((x.mean(1), x.var(1, unbiased=True)))
        return f

    for name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(hook(name))
    with torch.no_grad():
        for b in batches:
            for c in crops_used:
                net(b["data"][0][c])
    return {k: (torch.stack([r[0] for r in v]).mean(0), torch.stack([r[1] for r in v]).mean(0))
            for k, v in records.items()}


def test_statistics_are_the_average_over_global_crops_only():
    from vissl_swav_plugin.hooks.precise_bn import recompute_bn_stats

    net = tiny_trunk()
    net.eval()
    batches = multicrop_batches(5)
    want = expected_stats(net, batches[:3], crops_used=(0, 1))
    with_small = expected_stats(net, batches[:3], crops_used=(0, 1, 2, 3))
    momentum = net[1].momentum
    assert recompute_bn_stats(net, batches, num_batches=3) == 3
    assert not net.training and net[1].momentum == momentum  # mode and momentum restored
    for name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.allclose(m.running_mean, want[name][0], atol=1e-5), name
            assert torch.allclose(m.running_var, want[name][1], atol=1e-4), name
            assert not torch.allclose(m.running_mean, with_small[name][0], atol=1e-2), name  # premise


def test_no_batches_leaves_the_statistics_alone():
    from vissl_swav_plugin.hooks.precise_bn import recompute_bn_stats

    net = tiny_trunk()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert recompute_bn_stats(net, [], num_batches=3) == 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = tiny_trunk()
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5))])


def _task(phase, phases, batches):
    return SimpleNamespace(train=True, train_phase_idx=phase, num_train_phases=phases, base_model=Model(),
                           dataloaders={"train": batches}, device=torch.device("cpu"))


def test_hook_acts_at_the_end_of_the_last_training_phase_and_only_on_the_trunk():
    from vissl_swav_plugin.hooks.precise_bn import PreciseBatchNormHook

    batches = multicrop_batches(4)
    for phase, every, acts in ((0, False, False), (1, False, True), (0, True, True)):
        task = _task(phase, 2, batches)
        trunk0 = copy.deepcopy(task.base_model.trunk.state_dict())
        head0 = copy.deepcopy(task.base_model.heads.state_dict())
        want = expected_stats(task.base_model.trunk, batches[:2], crops_used=(0, 1))
        PreciseBatchNormHook(num_batches=2, every_phase=every).on_phase_end(task)
        bn = task.base_model.trunk[1]
        assert torch.allclose(bn.running_mean, want["1"][0], atol=1e-5) == acts, (phase, every)
        assert torch.equal(bn.running_mean, trunk0["1.running_mean"]) != acts
        assert all(torch.equal(v, head0[k]) for k, v in task.base_model.heads.state_dict().items())


def test_config_block_unknown_keys_and_default_off():
    from vissl_swav_plugin.config.validation import ConfigError
    from vissl_swav_plugin.hooks.registry import hooks_for_config
    from vissl_swav_plugin.hooks.precise_bn import PreciseBatchNormHook

    def ours(overrides):
        return [h for h in hooks_for_config(compose(["config=test/swav_plugin/quick_cpu", *overrides]))
                if isinstance(h, PreciseBatchNormHook)]

    assert ours([]) == []  # off unless asked: the reference keeps the last running statistics
    hooks = ours(["+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCHES:7}"])
    assert len(hooks) == 1 and hooks[0].num_batches == 7 and not hooks[0].every_phase
    with pytest.raises(ConfigError, match="HOOKS.PRECISE_BN.NUM_BATCH"):
        ours(["+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCH:7}"])
    with pytest.raises(ConfigError, match="HOOKS.PRECISE_BN.NUM_BATCHES"):
        ours(["+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCHES:0}"])


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
    overrides = ["config=test/swav_plugin/quick_cpu", "config.MODEL.TRUNK.NAME=resnet_small_plugin",
                 "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
                 "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[20]}]]",
                 "config.OPTIMIZER.num_epochs=2", "+config.HOOKS.PRECISE_BN={ENABLED:True,NUM_BATCHES:1}",
                 f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}", *data]
    out = run_launcher(overrides, cwd=tmp_path).stdout
    assert out.count("Precise BN: trunk BatchNorm statistics re-estimated on the global crops of 1 training") == 2
    ckpt = torch.load(tmp_path / "ckpt" / "model_final_checkpoint_phase1.torch", map_location="cpu",
                      weights_only=False)
    trunk = ckpt["classy_state_dict"]["base_model"]["model"]["trunk"]
    counts = {k: int(v) for k, v in trunk.items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {2}, counts  # 1 batch x 2 global crops (quick_cpu: 2x32 + 2x16)


@pytest.mark.parametrize("mode", ["fp16-cuda-like", "bf16-cuda-like", "bf16-cpu"])
def test_statistics_are_fp32_under_amp(mode):
    """Under the AMP settings users run (CUDA-like fp16 / bf16 emulated on CPU, CPU bf16) the
    re-estimated statistics are those of the fp32 computation: the hook turns autocast off."""
    from _autocast import AMP_MODES

    from vissl_swav_plugin.hooks.precise_bn import recompute_bn_stats

    batches = multicrop_batches(3)
    ref, net = tiny_trunk(), tiny_trunk()
    recompute_bn_stats(ref, batches, num_batches=3)
    with AMP_MODES[mode]():
        recompute_bn_stats(net, batches, num_batches=3)
    for (name, a), b in zip(ref.named_buffers(), net.buffers()):
        if a.is_floating_point():
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (mode, name)
