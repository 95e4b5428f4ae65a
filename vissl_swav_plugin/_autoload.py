"""Register the plugin in every process that imports VISSL.

``vissl_swav_plugin.pth`` (installed into site-packages) calls :func:`install` at
interpreter start-up.  That only puts a tiny finder on ``sys.meta_path``; nothing heavy
is imported.  When, later, anything imports the top-level ``vissl`` package -- VISSL's
stock ``tools/run_distributed_engines.py``, a worker started with ``spawn`` or
``forkserver`` unpickling ``vissl.utils.distributed_launcher._distributed_worker``, a
notebook -- the finder lets VISSL's own loader run and then calls
:func:`vissl_swav_plugin.register_all`, so our losses, heads, hooks, transforms and Hydra
config search path exist before VISSL looks anything up.

Set ``VISSL_SWAV_PLUGIN_DISABLE=1`` to switch the automatic registration off.
"""
import importlib.abc
import importlib.util
import os
import sys

TRIGGER = "vissl"


class _RegisterAfterVissl(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRIGGER or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        # VISSL's package __init__ is now complete; register our components.
        from vissl_swav_plugin import register_all

        register_all()

    def __getattr__(self, name):  # get_resource_reader, is_package, ... for importlib
        return getattr(self._inner, name)


def install() -> None:
    """Arm the hook (idempotent).  If VISSL is already imported, register now."""
    if os.environ.get("VISSL_SWAV_PLUGIN_DISABLE"):
        return
    if TRIGGER in sys.modules:
        from vissl_swav_plugin import register_all

        register_all()
        return
    if not any(isinstance(f, _RegisterAfterVissl) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterVissl())
