"""Register the plugin in every process that imports VISSL.

``vissl_swav_plugin.pth`` (installed into site-packages) calls :func:`install` at
interpreter start-up.  That only arms the compat engine's import hook
(:func:`vissl_swav_plugin.compat.engine.after_import`, standard library only); nothing
heavy is imported.  When, later, anything imports the top-level ``vissl`` package --
VISSL's stock ``tools/run_distributed_engines.py``, a worker started with ``spawn`` or
``forkserver`` unpickling ``vissl.utils.distributed_launcher._distributed_worker``, a
notebook -- the hook lets VISSL's own loader run and then calls
:func:`vissl_swav_plugin.register_all`, so our patches, losses, heads, hooks, transforms
and Hydra config search path exist before VISSL looks anything up.

Set ``VISSL_SWAV_PLUGIN_DISABLE=1`` to switch the automatic registration off.
"""
import os

TRIGGER = "vissl"


def _register_plugin(_vissl_module) -> None:
    from vissl_swav_plugin import register_all

    register_all()


def install() -> None:
    """Arm the hook (idempotent).  If VISSL is already imported, register now."""
    if os.environ.get("VISSL_SWAV_PLUGIN_DISABLE"):
        return
    from vissl_swav_plugin.compat.engine import after_import

    after_import(TRIGGER, _register_plugin)
