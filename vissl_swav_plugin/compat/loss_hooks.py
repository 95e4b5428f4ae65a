"""VISSL's hook list has no place for a plugin's hooks.

What is missing: ``vissl/hooks/__init__.py``, ``default_hook_generator`` builds the hook
list of every run and calls the module-level ``add_loss_hooks(hooks, loss_cfg, cfg)`` for
the hooks of VISSL's own losses only: a plugin's loss (its prototype and memory-bank hooks)
and its monitors (progress, collapse detector, online kNN, precise BN, colour warm-up)
cannot get in.

Fix (patch ``plugin_loss_hooks``): ``add_loss_hooks`` appends, after VISSL's own loss
hooks (so before VISSL's checkpoint hook, which matters for the SwAV queue gather), what the
slot :data:`hooks_for_config` returns for the config, provided by
:mod:`vissl_swav_plugin.hooks.registry`.  Nothing else of VISSL's hook list changes, so
VISSL's stock launcher and any launcher that uses ``default_hook_generator`` get the hooks.
``__wrapped__`` is VISSL's function.

The patch is applied when this module is imported (``register(now=True)``), before
``apply_all`` applies the other patches, as it was before it moved here.
"""
from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.slots import Slot

#: ``fn(cfg) -> List[ClassyHook]``: the plugin's hooks for a run (its loss's, then the monitors)
hooks_for_config = Slot("plugin_loss_hooks", "hooks_for_config", "vissl_swav_plugin.hooks.registry")


@register(now=True)
def plugin_loss_hooks():
    """vissl/hooks/__init__.py, add_loss_hooks(): also the plugin's loss hooks and monitors."""
    import vissl.hooks as vh

    original = raw(vh, "add_loss_hooks")

    def add_loss_hooks(hooks, loss_cfg, cfg):
        ours = hooks_for_config.get()  # an empty slot fails before VISSL's part runs
        hooks = original(hooks, loss_cfg, cfg)
        hooks.extend(ours(cfg))
        return hooks

    add_loss_hooks.__wrapped__ = original
    patch("plugin_loss_hooks", vh, "add_loss_hooks", add_loss_hooks)
