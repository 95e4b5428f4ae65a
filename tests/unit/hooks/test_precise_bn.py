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

from testkit import compose
from precise_bn_cases import expected_stats, multicrop_batches, tiny_trunk  # noqa: F401


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
    from vissl_swav_plugin.config.checkers import ConfigError
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


@pytest.mark.parametrize("mode", ["fp16-cuda-like", "bf16-cuda-like", "bf16-cpu"])
def test_statistics_are_fp32_under_amp(mode):
    """Under the AMP settings users run (CUDA-like fp16 / bf16 emulated on CPU, CPU bf16) the
    re-estimated statistics are those of the fp32 computation: the hook turns autocast off."""
    from autocast_emulator import AMP_MODES

    from vissl_swav_plugin.hooks.precise_bn import recompute_bn_stats

    batches = multicrop_batches(3)
    ref, net = tiny_trunk(), tiny_trunk()
    recompute_bn_stats(ref, batches, num_batches=3)
    with AMP_MODES[mode]():
        recompute_bn_stats(net, batches, num_batches=3)
    for (name, a), b in zip(ref.named_buffers(), net.buffers()):
        if a.is_floating_point():
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (mode, name)


def test_the_hook_calls_vissls_resnext_trunk_as_vissls_model_does():
    """VISSL's own ResNet trunk maps its output feature names and cannot be called without
    them: the hook passes the model's, and the statistics are those of the global crops."""
    from vissl.models import build_model

    from vissl_swav_plugin.hooks.precise_bn import PreciseBatchNormHook

    config = compose(["config=test/swav_plugin/quick_cpu"])  # VISSL's resnet trunk (ResNet-50)
    assert config.MODEL.TRUNK.NAME == "resnet"
    torch.manual_seed(0)
    model = build_model(config.MODEL, config.OPTIMIZER)
    names = model._output_feature_names
    batches = multicrop_batches(2, big=16, small=8)
    want = expected_stats(model.trunk, batches, crops_used=(0, 1), call=lambda net, x: net(x, names))
    task = SimpleNamespace(train=True, train_phase_idx=0, num_train_phases=1, base_model=model,
                           dataloaders={"train": batches}, device=torch.device("cpu"))
    PreciseBatchNormHook(num_batches=2).on_phase_end(task)
    checked = 0
    for name, m in model.trunk.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.allclose(m.running_mean, want[name][0], atol=1e-4), name
            assert torch.allclose(m.running_var, want[name][1], rtol=1e-3, atol=1e-4), name
            checked += 1
    assert checked == len(want) > 50
