"""The one patch engine: named, idempotent, undoable replacements of host attributes.

Every change the plugin makes to code it does not own (VISSL, Classy Vision, torch) goes
through this module.  A *patch* is a function registered with :func:`register`; when it
runs it installs replacements with :func:`patch` (``owner.attr = replacement``, or
``owner[key]`` for a dict) and/or arms :func:`after_import` callbacks for modules that are
imported later.  The engine

* applies every registered patch once per process (:func:`apply_all`, called first by
  :func:`vissl_swav_plugin.register_all`, i.e. in every process that imports ``vissl``);
  a patch registered after that is applied as soon as it is registered;
* leaves out the patches named in ``VISSL_SWAV_PLUGIN_COMPAT_SKIP=name1,name2`` (or
  ``all``), warning about names it does not know;
* records what each patch replaced: :func:`original` gives the value before the patch,
  :func:`disabled` undoes patches for the duration of a ``with`` block, :func:`applied`
  lists the patches in effect.

It imports only the standard library, so the start-up hook (``_autoload``) can use its
import hook (:func:`after_import`) in every Python process at negligible cost.

Example::

    from vissl_swav_plugin.compat import engine

    @engine.register
    def shim_example():
        from vissl.utils import misc
        orig = engine.raw(misc, "is_apex_available")
        engine.patch("shim_example", misc, "is_apex_available", lambda: False)

    with engine.disabled("shim_example"):
        ...  # VISSL's own is_apex_available
"""
import contextlib
import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Callable, Dict, List, Optional, Set

logger = logging.getLogger(__name__)

#: Comma-separated patch names (or ``all``) that are not applied in this process.
SKIP_ENV = "VISSL_SWAV_PLUGIN_COMPAT_SKIP"

#: Modules that register patches, in the order their patches are listed and applied (all of
#: them in compat/: the engine imports nothing above compat; a patch that calls the plugin's
#: own code reaches it through a slot that the module above fills, see :mod:`.slots`).  The
#: last four register with ``now=True``: they are applied as they are imported, before the
#: others, so the replacements of the others wrap theirs.
PATCH_MODULES = [
    "vissl_swav_plugin.compat.larc",
    "vissl_swav_plugin.compat.amp",
    "vissl_swav_plugin.compat.cpu_device",
    "vissl_swav_plugin.compat.numpy2",
    "vissl_swav_plugin.compat.torch_io",
    "vissl_swav_plugin.compat.pillow",
    "vissl_swav_plugin.compat.checkpoint_io",
    "vissl_swav_plugin.compat.checkpoint_load",
    "vissl_swav_plugin.compat.checkpoint_checksums",
    "vissl_swav_plugin.compat.data_safety",
    "vissl_swav_plugin.compat.persistent_workers",
    "vissl_swav_plugin.compat.cpu_threads",
    "vissl_swav_plugin.compat.signals",
    "vissl_swav_plugin.compat.slurm",
    "vissl_swav_plugin.compat.config_inference",
    "vissl_swav_plugin.compat.config_names",
    "vissl_swav_plugin.compat.loss_hooks",
    "vissl_swav_plugin.compat.launch_checks",
]

_lock = threading.RLock()
_MARK = "__vissl_swav_compat_shim__"
_NOT_OWN = object()  # the class inherited the attribute: undo = delete ours
# patch name -> (rank of its module, registration number, patch function)
_REGISTRY: Dict[str, tuple] = {}
# patch name -> [(owner, attribute, value before the patch or _NOT_OWN, replacement)]
_PATCHES: Dict[str, List[tuple]] = {}
_APPLIED: Set[str] = set()
_active = False  # apply_all() ran: later registrations are applied at once


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------
def register(fn: Optional[Callable[[], None]] = None, *, now: bool = False):
    """Register ``fn`` as the patch named ``fn.__name__`` (decorator; idempotent).

    Args:
        fn: a function of no arguments that installs the patch with :func:`patch` /
            :func:`after_import`.  It must be idempotent (``patch`` already is).
        now: apply it immediately (unless skipped), even before :func:`apply_all`.
    Returns:
        ``fn``.  Registering another function under a name in use raises ``ValueError``.
    """
    if fn is None:
        return lambda f: register(f, now=now)
    name = fn.__name__
    with _lock:
        known = _REGISTRY.get(name)
        if known is None:
            module = getattr(fn, "__module__", "")
            rank = PATCH_MODULES.index(module) if module in PATCH_MODULES else len(PATCH_MODULES)
            _REGISTRY[name] = (rank, len(_REGISTRY), fn)
        elif (known[2].__module__, known[2].__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"compat patch {name!r} is already registered by {known[2].__module__}")
        if now or _active:
            apply(name)
    return fn


def names() -> List[str]:
    """Every registered patch name, in application order (module order of PATCH_MODULES)."""
    return [n for n, _ in sorted(_REGISTRY.items(), key=lambda item: item[1][:2])]


def applied() -> List[str]:
    """The registered patches applied in this process (skipped ones are absent)."""
    return [n for n in names() if n in _APPLIED]


def _requested_skips() -> Set[str]:
    return {s.strip() for s in os.environ.get(SKIP_ENV, "").split(",") if s.strip()}


def skip_requested(name: str) -> bool:
    """Whether ``VISSL_SWAV_PLUGIN_COMPAT_SKIP`` names ``name`` (or ``all``); read now."""
    requested = _requested_skips()
    return name in requested or "all" in requested


def skipped_names() -> Set[str]:
    """Registered names that ``VISSL_SWAV_PLUGIN_COMPAT_SKIP`` leaves out; unknown entries
    (a typo, or a patch that no longer exists) are reported with a warning."""
    requested = _requested_skips()
    known = names()
    if "all" in requested:
        return set(known)
    unknown = requested - set(known)
    if unknown:
        logger.warning(
            "%s: %s are not patches of vissl_swav_plugin.compat and are ignored (known: %s)",
            SKIP_ENV, ", ".join(sorted(unknown)), ", ".join(known),
        )
    return requested & set(known)


def apply(*patch_names: str) -> None:
    """Apply the named registered patches that are neither applied yet nor skipped."""
    with _lock:
        for name in patch_names:
            if name in _APPLIED:
                continue
            if skip_requested(name):
                logger.debug("vissl_swav_plugin.compat: %s skipped (%s)", name, SKIP_ENV)
                continue
            try:
                _REGISTRY[name][2]()
            except Exception as e:  # name the patch: VISSL or a dependency changed
                raise RuntimeError(f"vissl_swav_plugin.compat.{name} could not be applied: {e!r}") from e
            _APPLIED.add(name)


def apply_all() -> None:
    """Import every module of :data:`PATCH_MODULES` and apply all registered patches
    (once per process; later registrations are applied when registered)."""
    global _active
    for module in PATCH_MODULES:
        importlib.import_module(module)
    with _lock:
        skip = skipped_names()
        apply(*[n for n in names() if n not in skip])
        _active = True


# --------------------------------------------------------------------------------------
# attribute access (classes: the stored attribute, no descriptor binding; dicts: items)
# --------------------------------------------------------------------------------------
def raw(owner, attr: str):
    """``owner.attr`` as stored: for a class the ``__dict__`` entry found along its MRO
    (a classmethod stays a classmethod), for a dict ``owner[attr]``, else ``getattr``."""
    if isinstance(owner, dict):
        return owner[attr]
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
        raise AttributeError(f"{owner!r} has no attribute {attr!r}")
    return getattr(owner, attr)


def _own(owner, attr: str) -> bool:
    if isinstance(owner, dict):
        return attr in owner
    return not isinstance(owner, type) or attr in owner.__dict__


def _store(owner, attr: str, value) -> None:
    if value is _NOT_OWN:
        if isinstance(owner, dict):
            del owner[attr]
        else:
            delattr(owner, attr)
    elif isinstance(owner, dict):
        owner[attr] = value
    else:
        setattr(owner, attr, value)


def _func_of(obj):
    return getattr(obj, "__func__", obj)


def patched_by(obj) -> Optional[str]:
    """Name of the patch that installed ``obj`` (a replacement), else None."""
    return getattr(_func_of(obj), _MARK, None)


def _installed(name: str, owner, attr: str) -> bool:
    """Whether a replacement of patch ``name`` is in effect at ``owner.attr``: on top, or
    under replacements that other patches stacked on it (each wraps the one before)."""
    current, seen = raw(owner, attr), set()
    while patched_by(current) != name:
        if id(current) in seen:
            return False
        seen.add(id(current))
        below = [before for recs in _PATCHES.values() for o, a, before, repl in recs
                 if o is owner and a == attr and repl is current and before is not _NOT_OWN]
        if not below:
            return False
        current = below[0]
    return True


def patch(name: str, owner, attr: str, replacement) -> None:
    """Install ``replacement`` as ``owner.attr`` (``owner[attr]`` for a dict) on behalf of
    patch ``name``; a no-op if that patch already installed it there, also under another
    patch's replacement stacked on it (idempotent)."""
    with _lock:
        current = raw(owner, attr)
        if _installed(name, owner, attr):
            return
        try:
            setattr(_func_of(replacement), _MARK, name)
        except (AttributeError, TypeError):
            pass
        before = current if _own(owner, attr) else _NOT_OWN
        _PATCHES.setdefault(name, []).append((owner, attr, before, replacement))
        _store(owner, attr, replacement)


def original(name: str, owner, attr: str):
    """The value ``owner.attr`` had before patch ``name`` replaced it."""
    for o, a, before, _ in _PATCHES.get(name, []):
        if o is owner and a == attr:
            return raw(owner.__mro__[1], attr) if before is _NOT_OWN else before
    raise KeyError(f"{name} did not patch {owner!r}.{attr}")


@contextlib.contextmanager
def disabled(*patch_names: str):
    """Undo the named patches in this process for the ``with`` block, re-apply on exit
    (tests: show the failure a patch fixes).  Unknown names raise ``ValueError``."""
    with _lock:
        undone = []
        for name in patch_names:
            if name not in _REGISTRY and name not in _PATCHES:
                raise ValueError(f"unknown compat patch {name!r}; known: {names()}")
            for owner, attr, before, repl in reversed(_PATCHES.get(name, [])):
                if raw(owner, attr) is repl:
                    _store(owner, attr, before)
                    undone.append((owner, attr, repl))
        try:
            yield
        finally:
            for owner, attr, repl in reversed(undone):
                _store(owner, attr, repl)


@contextlib.contextmanager
def temporarily(owner, attr: str, value):
    """Set ``owner.attr = value`` for the ``with`` block, then restore what was there
    (an inherited class attribute is restored by deleting ours)."""
    before = raw(owner, attr) if _own(owner, attr) else _NOT_OWN
    _store(owner, attr, value)
    try:
        yield
    finally:
        _store(owner, attr, before)


# --------------------------------------------------------------------------------------
# the import hook
# --------------------------------------------------------------------------------------
class AfterImport(importlib.abc.MetaPathFinder):
    """Meta-path finder that runs callbacks right after a watched module is imported.

    It only wraps the loader the other finders found for a watched name; the module is
    loaded exactly as without it.  One instance serves the process (:func:`after_import`).
    """

    def __init__(self):
        self.callbacks: Dict[str, List[Callable]] = {}
        self._busy: Set[str] = set()

    def watchers(self, fullname: str) -> List[Callable]:
        """The callbacks for ``fullname``: its own, then those of a watched ``package.*``."""
        found = list(self.callbacks.get(fullname, ()))
        for key, cbs in self.callbacks.items():
            if key.endswith(".*") and fullname.startswith(key[:-1]):
                found.extend(cbs)
        return found

    def find_spec(self, fullname, path=None, target=None):
        """Wrap the loader of a watched module so that its callbacks run after the module executed."""
        if fullname in self._busy or not self.watchers(fullname):
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self.watchers(fullname))
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, inner, callbacks):
        self._inner = inner
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for cb in list(self._callbacks):
            cb(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... for importlib
        return getattr(self._inner, name)


_finder: Optional[AfterImport] = None


def after_import(module_name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``module_name`` is imported, else right after its
    import (once per callback: the same function, by module and qualified name, is kept
    once).  ``"package.*"`` watches every submodule of ``package`` imported from now on
    (each time one finishes executing).  The engine's one finder is (re)placed first on
    ``sys.meta_path``."""
    global _finder
    if module_name in sys.modules and not module_name.endswith(".*"):
        callback(sys.modules[module_name])
        return
    with _lock:
        if _finder is None:
            _finder = AfterImport()
        if not sys.meta_path or sys.meta_path[0] is not _finder:
            # first in line again: a finder inserted since (e.g. pytest's assertion
            # rewriter, which claims modules named *_test.py) must not hide the import
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(_finder)
            sys.meta_path.insert(0, _finder)
        cbs = _finder.callbacks.setdefault(module_name, [])
        key = (getattr(callback, "__module__", None), getattr(callback, "__qualname__", None))
        if all((getattr(c, "__module__", None), getattr(c, "__qualname__", None)) != key for c in cbs):
            cbs.append(callback)
