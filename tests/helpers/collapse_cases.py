"""Definitions shared by ``tests/unit/hooks/test_collapse.py`` and its integration part."""
from types import SimpleNamespace
import torch
from vissl_swav_plugin.hooks import collapse as C


T = 0.1

# -- synthetic model outputs ------------------------------------------------------------------
def uniform_scores(n, K):
    """Every sample scores every prototype the same: uniform predictions."""
    return torch.zeros(n, K)

def healthy_scores(K, margin=0.2, repeats=2):
    """Row i prefers prototype i % K by ``margin`` (logit gap margin / T): confident,
    diverse predictions whose batch mean is exactly uniform."""
    s = torch.zeros(repeats * K, K)
    s[torch.arange(repeats * K), torch.arange(repeats * K) % K] = margin
    return s

def figures(scores, temperature=T):
    return C.head_figures(C.prediction_sums(scores, temperature))

class FakeLoss:
    def __init__(self, temperature=T, code_stats=None):
        self.temperature = temperature
        self.last_code_stats = code_stats

def fake_task(scores, loss, iteration, epoch=0, loss_module=None, hooks=()):
    scores = scores if isinstance(scores, list) else [scores]
    out = [torch.zeros(scores[0].shape[0], 4), *scores]
    return SimpleNamespace(train=True, iteration=iteration, train_phase_idx=epoch, hooks=list(hooks),
                           loss=loss_module or FakeLoss(), optimizer=None,
                           last_batch=SimpleNamespace(model_output=out, loss=torch.tensor(float(loss))))

def make_hook(**settings):
    return C.CollapseDetectorHook("swav_plugin_loss", {**C.DEFAULTS, **settings})

def drive(hook, steps, epoch=0, start_iter=0, end_epoch=True, **kw):
    """One epoch: ``steps`` = [(scores, loss), ...] through the hook's events."""
    task = fake_task(steps[0][0], steps[0][1], start_iter, epoch, **kw)
    hook.on_start(task)
    hook.on_phase_start(task)
    for i, (scores, loss) in enumerate(steps):
        task = fake_task(scores, loss, start_iter + i, epoch, **kw)
        hook.on_loss_and_meter(task)
    if end_epoch:
        hook.on_phase_end(task)
    return task

D = "config.HOOKS.COLLAPSE_DETECTOR"
