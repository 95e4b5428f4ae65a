"""BatchNorm statistics of the global crops for the saved trunk (config ``HOOKS.PRECISE_BN``).

Why: with multi-crop, every training step runs the trunk once per crop size, the small
crops last, so each BatchNorm layer's running mean / variance (an exponential average over
forward calls) ends up dominated by the small crops.  Features extracted in eval mode from
the checkpoint -- VISSL's kNN / linear benchmarks, the demo's kNN -- then normalise full-size
images with small-crop statistics.  Measured on the demo's quick run (Fashion-MNIST, 2x28 +
4x16 crops, 2026-11-23): with this hook one run's 20-NN went from 73.7% to 75.2%; re-estimating
on full 28-px images after training gave 75.9%, and 72.8% -> 75.0% in a second run (docs/multicrop_and_trunks.md).

What: at the end of the last training epoch (or of every epoch with ``EVERY_PHASE``), before
VISSL's checkpoint hook saves the model, :class:`PreciseBatchNormHook` resets the trunk's
BatchNorm statistics and re-estimates them as the plain average over ``NUM_BATCHES`` batches
of the training loader of the batch statistics of the **largest crops only** (the global
crops), in train mode without gradients and in fp32; the averages are then averaged over all
processes.  Only the trunk's BatchNorm layers change (the head is not used for features).

Off by default: the reference implementation keeps the last running statistics, and so do
the configs we ship (the demo's config lists the block, off).  Config::

    config:
      HOOKS:
        PRECISE_BN:
          ENABLED: false     # true: re-estimate the trunk's BatchNorm statistics
          NUM_BATCHES: 50    # training batches used (fewer when the loader has fewer)
          EVERY_PHASE: false # true: at the end of every training epoch, not only the last
"""
import logging
from typing import List

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from vissl_swav_plugin.utils import distributed
from vissl_swav_plugin.config.checkers import hook_block, require_bool, require_int
from vissl_swav_plugin.config.registries import register_config_check
from vissl_swav_plugin.hooks.registry import NoOpHook, register_monitor_hooks
from vissl_swav_plugin.transforms.device_step import train_batches
from vissl_swav_plugin.utils.memory_bank import batch_crops
from vissl_swav_plugin.utils.precision import autocast_disabled

#: every key of ``config.HOOKS.PRECISE_BN`` with its default
DEFAULTS = {"ENABLED": False, "NUM_BATCHES": 50, "EVERY_PHASE": False}


@register_config_check
def precise_bn_config(cfg) -> dict:
    """``config.HOOKS.PRECISE_BN`` with defaults filled in.

    Raises:
        ConfigError: unknown key, ``ENABLED`` / ``EVERY_PHASE`` not a bool or ``NUM_BATCHES``
            not an int >= 1.
    """
    return hook_block(cfg, "PRECISE_BN", DEFAULTS, {
        "ENABLED": require_bool,
        "EVERY_PHASE": require_bool,
        "NUM_BATCHES": lambda v, k: require_int(v, k, minimum=1),
    })


def global_crops(batch) -> List[torch.Tensor]:
    """The crops of a ``multicrop_collator`` batch (``batch["data"][0]``: one tensor per crop,
    or one tensor) whose spatial size is the largest, e.g. the two 28-px crops of 2x28 + 4x16."""
    crops = batch_crops(batch)
    largest = max(c.shape[-2] * c.shape[-1] for c in crops)
    return [c for c in crops if c.shape[-2] * c.shape[-1] == largest]


@torch.no_grad()
def recompute_bn_stats(module: torch.nn.Module, batches, num_batches: int, device=None,
                       distributed_avg: bool = True, out_feat_keys=None) -> int:
    """Reset the running statistics of ``module``'s BatchNorm layers and set them to the plain
    average, over at most ``num_batches`` of ``batches``, of the batch mean and (unbiased)
    variance of their inputs on the global crops (:func:`global_crops`), each global crop
    being one forward call in train mode; then average them over all processes.
    ``out_feat_keys``: passed to each call as VISSL's model passes it to its trunk (VISSL's
    ResNeXt maps the names and cannot be called without them); None: ``module(x)``.

    Returns:
        The number of batches used (0: nothing changed).
    """
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not bns:
        return 0
    saved = [(m.momentum, m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
             for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average of every forward call's batch statistics
    was_training = module.training
    module.train()
    used = 0
    try:
        for batch in batches:
            if used >= num_batches:
                break
            for crop in global_crops(batch):
                x = crop.to(device or crop.device).float()
                with autocast_disabled(x):
                    module(x) if out_feat_keys is None else module(x, out_feat_keys)
            used += 1
    finally:
        module.train(was_training)
        for m, (momentum, mean, var, tracked) in zip(bns, saved):
            m.momentum = momentum
            if used == 0:
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(tracked)
    if used and distributed_avg and distributed.active():
        n = float(distributed.world_size())
        for m in bns:
            distributed.all_reduce_(m.running_mean).div_(n)
            distributed.all_reduce_(m.running_var).div_(n)
    return used


class PreciseBatchNormHook(NoOpHook):
    """Re-estimates the trunk's BatchNorm statistics on the global crops at the end of the
    last training epoch (all epochs with ``every_phase``), before the final checkpoint."""

    def __init__(self, num_batches: int = 50, every_phase: bool = False):
        super().__init__()
        self.num_batches = int(num_batches)
        self.every_phase = bool(every_phase)

    def on_phase_end(self, task) -> None:
        """After the last training epoch, re-estimate the BatchNorm statistics on the global crops before the final checkpoint."""
        if not getattr(task, "train", True) or "train" not in getattr(task, "dataloaders", {}):
            return
        last = int(getattr(task, "train_phase_idx", 0)) + 1 >= int(getattr(task, "num_train_phases", 1))
        if not (last or self.every_phase):
            return
        model = task.base_model
        trunk = getattr(model, "trunk", model)
        # the trunk is called as VISSL's model calls it in training (its output feature names)
        names = getattr(model, "_output_feature_names", None) if trunk is not model else None
        used = recompute_bn_stats(trunk, train_batches(task), self.num_batches,
                                  device=getattr(task, "device", None), out_feat_keys=names)
        logging.info(f"Precise BN: trunk BatchNorm statistics re-estimated on the global crops of {used} "
                     f"training batches (HOOKS.PRECISE_BN)")


@register_monitor_hooks
def precise_bn_hooks(cfg) -> list:
    """``[PreciseBatchNormHook]`` when ``HOOKS.PRECISE_BN.ENABLED``, else ``[]``."""
    block = precise_bn_config(cfg)
    if not block["ENABLED"]:
        return []
    return [PreciseBatchNormHook(block["NUM_BATCHES"], block["EVERY_PHASE"])]
