"""Slots: the plugin functions that a compat patch calls, provided by the layers above.

Four patches extend a VISSL function with the plugin's own work: its config inference
(:mod:`.config_inference`), the closest names of a missing config (:mod:`.config_names`),
its hooks (:mod:`.loss_hooks`) and its launch checks (:mod:`.launch_checks`).  That work
lives in ``config``, ``hooks`` and ``checks``, which may import ``compat`` but never the
reverse (``.importlinter``).  So the patch's module declares a :class:`Slot`, the module
above fills it when it is imported (``slot.provide(fn)``), and the patch's replacement calls
the slot at call time (dependency inversion).

When a slot is filled: :func:`vissl_swav_plugin.register_all` applies the patches
(``compat.apply_all()``) and then imports every module of ``COMPONENT_MODULES``, the
providers among them, before it returns; nothing calls VISSL in between, and every process
that imports ``vissl`` (spawned and forkserver workers included) runs ``register_all``
before its first VISSL call.  A provider imported on its own fills its slot as it is
imported, too.  A slot that is still empty when VISSL calls the patched function (the
patches applied by hand with ``compat.apply_all()`` alone, or a ``register_all`` that
failed half-way) is a bug: the call raises :class:`EmptySlotError` naming the patch and
the module that provides the slot, rather than running VISSL's function without the
plugin's part.

Example::

    # compat/loss_hooks.py (the patch)
    hooks_for_config = Slot("plugin_loss_hooks", "hooks_for_config", "vissl_swav_plugin.hooks.registry")
    ...  hooks.extend(hooks_for_config(cfg))

    # hooks/registry.py (the provider, imported by register_all)
    loss_hooks.hooks_for_config.provide(hooks_for_config)
"""
from typing import Callable, Optional


class EmptySlotError(RuntimeError):
    """A patched VISSL function was called before the module that provides its slot was imported."""


class Slot:
    """One function a compat patch calls, provided by a module of a higher layer.

    Args:
        patch: the name of the patch that calls it (for messages).
        name: the slot's name (for messages).
        provider: the module that provides it when imported (a name only: never imported here).
    """

    def __init__(self, patch: str, name: str, provider: str):
        self.patch = patch
        self.name = name
        self.provider = provider
        self._fn: Optional[Callable] = None

    def provide(self, fn: Callable) -> Callable:
        """Fill the slot with ``fn`` (a later call replaces it: a reloaded provider); returns
        ``fn``, so it also works as a decorator."""
        self._fn = fn
        return fn

    @property
    def filled(self) -> bool:
        """Whether a function was provided."""
        return self._fn is not None

    def get(self) -> Callable:
        """The provided function; :class:`EmptySlotError` when none was."""
        fn = self._fn
        if fn is None:
            raise EmptySlotError(
                f"vissl_swav_plugin.compat patch {self.patch!r} needs {self.name!r}, which {self.provider} "
                f"provides when it is imported, but it was not imported: call vissl_swav_plugin.register_all() "
                f"(run by `import vissl` unless VISSL_SWAV_PLUGIN_DISABLE is set) before using VISSL"
            )
        return fn

    def __call__(self, *args, **kwargs):
        return self.get()(*args, **kwargs)

    def __repr__(self) -> str:
        state = "filled" if self.filled else "empty"
        return f"Slot({self.patch!r}, {self.name!r}, provided by {self.provider}: {state})"
