"""Register the plugin in every process that imports VISSL.

``vissl_swav_plugin.pth`` (installed into site-packages) calls :func:`install` at
interpreter start-up.  That only puts a tiny finder on ``sys.meta_path``; nothing heavy
is imported.  When, later, anything imports the top-level ``vissl`` package -- VISSL's
stock ``tools/run_distributed_engines.py``, a worker started with ``spawn`` or
``forkserver`` unpickling ``vissl.utils.distributed_launcher._distributed_worker``, a
notebook -- the finder lets VISSL's own loader run and then calls
:func:`vissl_swav_plugin.register_all`, so our losses, heads, hooks, transforms and Hydra
config search path exist before VISSL looks anything up.

Import order: when the first ``import vissl`` happens *inside* the import of one of our
own modules (``import vissl_swav_plugin.heads`` in a fresh interpreter imports
``vissl.models.heads``), registering at once would import our other modules while that
one is only half initialised (a circular ImportError).  The finder therefore also
watches our own submodules and, in that case, registers right after the outermost of
them has finished importing.  Every module imports in any order.

Set ``VISSL_SWAV_PLUGIN_DISABLE=1`` to switch the automatic registration off.

It also arms the fallback ``pkg_resources`` of :mod:`vissl_swav_plugin.pkg_resources_compat`
(VISSL imports ``pkg_resources``, which recent setuptools no longer ship).
"""
import importlib.abc
import importlib.util
import os
import sys

TRIGGER = "vissl"
PACKAGE = "vissl_swav_plugin"


def _register():
    from vissl_swav_plugin import register_all

    register_all()


class _RegisterAfterVissl(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``vissl`` (register after it) and of our own submodules
    (count how deep we are inside our own imports, to defer registration)."""

    def __init__(self):
        self._busy = set()
        self.depth = 0  # how many of our own modules are executing right now
        self.pending = False  # vissl was imported inside one of them: register after it

    def find_spec(self, fullname, path=None, target=None):
        ours = fullname.startswith(PACKAGE + ".")
        if (fullname != TRIGGER and not ours) or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self, ours)
        return spec

    def after_vissl(self):
        if self.depth > 0:
            self.pending = True
        else:
            _register()

    def after_own_module(self):
        if self.depth == 0 and self.pending:
            self.pending = False
            _register()


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, finder, ours):
        self._inner = inner
        self._finder = finder
        self._ours = ours

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        if not self._ours:
            self._inner.exec_module(module)
            # VISSL's package __init__ is now complete; register our components.
            self._finder.after_vissl()
            return
        self._finder.depth += 1
        try:
            self._inner.exec_module(module)
        finally:
            self._finder.depth -= 1
        self._finder.after_own_module()

    def __getattr__(self, name):  # get_resource_reader, is_package, ... for importlib
        return getattr(self._inner, name)


def install() -> None:
    """Arm the hook (idempotent).  If VISSL is already imported, register now.

    Also, even with ``VISSL_SWAV_PLUGIN_DISABLE=1``, arm the fallback ``pkg_resources``
    (``pkg_resources_compat``: used only where setuptools ships none, so that VISSL imports).
    """
    from vissl_swav_plugin import pkg_resources_compat

    pkg_resources_compat.install()
    if os.environ.get("VISSL_SWAV_PLUGIN_DISABLE"):
        return
    if TRIGGER in sys.modules:
        _register()
        return
    if not any(isinstance(f, _RegisterAfterVissl) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterVissl())
