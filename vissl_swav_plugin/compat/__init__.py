"""Compatibility layer: VISSL 0.1.6 on Python 3.11, torch 2.14, NumPy 2.4, Pillow 13, Hydra 1.3.

The installed VISSL is never edited: the functions that break are replaced at run time through
one patch engine (:mod:`.engine`).  Every patch is a named, idempotent function that fixes one
breakage, applied once per process by :func:`apply_all` (called first by
:func:`vissl_swav_plugin.register_all`, i.e. in every process that imports ``vissl``, spawned /
forkserver workers included), listed by :func:`applied` and undone for a ``with`` block by
:func:`disabled`.  Each patch module opens with what breaks in VISSL (file and function) and how
it is fixed.  The patches by module and what each fixes (a table generated from the registered
patches), the slots (:mod:`.slots`) through which four of them call the layers above, what was
checked and needs no patch, and ``VISSL_SWAV_PLUGIN_COMPAT_SKIP``: docs/compat.md.

Importing this package imports only :mod:`.engine` (standard library); the patch modules are
imported by :func:`apply_all`.
"""
from vissl_swav_plugin.compat.engine import (  # noqa: F401  (the public API)
    PATCH_MODULES,
    SKIP_ENV,
    after_import,
    applied,
    apply,
    apply_all,
    disabled,
    names,
    original,
    patch,
    patched_by,
    raw,
    register,
    skip_requested,
    skipped_names,
    temporarily,
)
