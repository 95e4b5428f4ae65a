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

Import order: when the first ``import vissl`` happens *inside* the import of one of our
own modules (``import vissl_swav_plugin.models.heads`` in a fresh interpreter imports
``vissl.models.heads``), registering at once would import our other modules while that
one is only half initialised (a circular ImportError).  Registration is then deferred
until our outermost module has finished executing (the hook also watches our own
submodules).  Every module imports in any order.

Set ``VISSL_SWAV_PLUGIN_DISABLE=1`` to switch the automatic registration off.
"""
import os
import sys

TRIGGER = "vissl"
PACKAGE = "vissl_swav_plugin"
_pending = False  # vissl was imported while one of our modules was executing


def _own_modules_executing(finished=None):
    """Names of our submodules whose code is running now (``finished`` excluded)."""
    return [name for name, module in list(sys.modules.items())
            if name.startswith(PACKAGE + ".") and name != finished
            and getattr(getattr(module, "__spec__", None), "_initializing", False)]


def _register() -> None:
    from vissl_swav_plugin import register_all

    register_all()


def _after_vissl(_vissl_module) -> None:
    global _pending
    if _own_modules_executing():
        _pending = True
    else:
        _register()


def _after_own_module(module) -> None:
    global _pending
    if _pending and not _own_modules_executing(finished=module.__name__):
        _pending = False
        _register()


def install() -> None:
    """Arm the hook (idempotent).  If VISSL is already imported, register now."""
    if os.environ.get("VISSL_SWAV_PLUGIN_DISABLE"):
        return
    from vissl_swav_plugin.compat.engine import after_import

    after_import(PACKAGE + ".*", _after_own_module)
    after_import(TRIGGER, _after_vissl)
