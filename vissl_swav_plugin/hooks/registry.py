"""The hook registry: attaches the plugin's hooks to VISSL's hook generator.

VISSL builds its hook list in ``vissl.hooks.default_hook_generator``, which calls the
module-level ``vissl.hooks.add_loss_hooks(hooks, loss_cfg, cfg)``.  The patch
``plugin_loss_hooks`` (:mod:`vissl_swav_plugin.compat.loss_hooks`) wraps that function so
that :func:`hooks_for_config`, which this module provides when it is imported, appends our
hooks right after VISSL's own loss hooks -- i.e. before VISSL's checkpoint hook, which
matters for the queue gather: for a loss name registered with :func:`register_loss_hooks`,
that loss's hooks.  Nothing else of VISSL's hook list changes, so VISSL's stock launcher and
any custom launcher that uses ``default_hook_generator`` get our hooks.  Monitors
(:func:`register_monitor_hooks`) are asked for hooks in every run, whatever the loss.

Each loss's hooks live beside this module (:mod:`.swav_hooks`, :mod:`.memory_bank_hooks`);
this module imports none of them, so a monitor that registers here imports no loss.
"""
from typing import Callable, Dict, List

from classy_vision.hooks.classy_hook import ClassyHook

from vissl_swav_plugin.compat import loss_hooks as loss_hooks_patch

_LOSS_HOOK_FACTORIES: Dict[str, Callable] = {}


def register_loss_hooks(loss_name: str):
    """Decorator: ``factory(cfg) -> List[ClassyHook]`` added when ``LOSS.name == loss_name``."""

    def deco(factory):
        if loss_name in _LOSS_HOOK_FACTORIES and _LOSS_HOOK_FACTORIES[loss_name] is not factory:
            raise ValueError(f"vissl_swav_plugin: hooks for loss '{loss_name}' already registered")
        _LOSS_HOOK_FACTORIES[loss_name] = factory
        return factory

    return deco


_MONITOR_FACTORIES: List[Callable] = []


def register_monitor_hooks(factory):
    """Decorator: ``factory(cfg) -> List[ClassyHook]`` is asked for hooks in every run, whatever
    the loss (progress line, collapse detector, online kNN, ...); it returns ``[]`` when its
    config section switches it off.  Monitors come after the loss's own hooks."""
    if factory not in _MONITOR_FACTORIES:
        _MONITOR_FACTORIES.append(factory)
    return factory


def hooks_for_config(cfg) -> List[ClassyHook]:
    """Our hooks for this config: the loss's own (by ``LOSS.name``), then the monitors."""
    factory = _LOSS_HOOK_FACTORIES.get(cfg.LOSS.name)
    hooks = list(factory(cfg)) if factory else []
    for monitor in _MONITOR_FACTORIES:
        hooks.extend(monitor(cfg))
    return hooks


class NoOpHook(ClassyHook):
    """A ClassyHook whose unimplemented events are no-ops (base of all our hooks)."""

    on_start = ClassyHook._noop
    on_phase_start = ClassyHook._noop
    on_forward = ClassyHook._noop
    on_loss_and_meter = ClassyHook._noop
    on_backward = ClassyHook._noop
    on_update = ClassyHook._noop
    on_step = ClassyHook._noop
    on_phase_end = ClassyHook._noop
    on_end = ClassyHook._noop
    on_exception = ClassyHook._noop


# what the patch plugin_loss_hooks calls (compat may not import this layer)
loss_hooks_patch.hooks_for_config.provide(hooks_for_config)
