"""Compatibility shims needed by VISSL's evaluation tools (owned by the evaluation suite).

These belong with the others in :mod:`vissl_swav_plugin.compat` and should move there
(same conventions: one named shim per breakage, idempotent, module-local where possible);
they live here until then so that the evaluation suite works.  They use compat's
``_after_import`` / ``_patch`` helpers, so ``VISSL_SWAV_PLUGIN_DISABLE=1`` switches them off
with the rest of the plugin (``VISSL_SWAV_PLUGIN_COMPAT_SKIP`` will know their names once
they are registered in compat's ``SHIMS``; until then compat rejects them as unknown).

``shim_svm_low_shot_mean_ap_scalar``
    ``vissl/utils/svm_utils/svm_low_shot_trainer.py``, ``SVMLowShotTrainer.test``::

        local_cost_ap = np.zeros((self.num_classes, 1))
        ...
        mean_cost_ap = np.mean(local_cost_ap, axis=0)          # shape (1,)
        sample_ap_matrix[0][cost_idx] = mean_cost_ap           # scalar slot

    NumPy >= 2.4 raises ``ValueError: setting an array element with a sequence`` (a size-1
    array into a scalar slot, deprecated since NumPy 1.25), so every low-shot SVM run
    (``tools/train_svm_low_shot.py``) dies after training its SVMs and before writing any
    ``test_ap_sample*_k*.npy``.  Fix: that module (only) gets a ``np`` whose ``zeros``
    returns arrays that accept size-1 arrays in scalar slots, as NumPy < 2.4 did.
    (``compat.shim_svm_ap_scalar`` already fixes the ``ap`` of ``get_precision_recall``
    one line above; this is the next statement.)
"""
import logging
import os
import types

logger = logging.getLogger(__name__)

SHIM_NAMES = ["shim_svm_low_shot_mean_ap_scalar"]


def _skipped():
    """``all`` in VISSL_SWAV_PLUGIN_COMPAT_SKIP leaves these shims out too."""
    raw = os.environ.get("VISSL_SWAV_PLUGIN_COMPAT_SKIP", "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    return set(SHIM_NAMES) if "all" in names else set()


def _scalar_tolerant_array_type():
    import numpy as np

    class ScalarTolerantArray(np.ndarray):
        """ndarray that stores a size-1 array given for a scalar slot as its one value."""

        def __setitem__(self, key, value):
            if isinstance(value, np.ndarray) and value.size == 1 and value.ndim > 0:
                target = np.ndarray.__getitem__(self.view(np.ndarray), key)
                if np.ndim(target) == 0:
                    value = value.reshape(()).item()
            np.ndarray.__setitem__(self, key, value)

    return ScalarTolerantArray


class _NumpyScalarTolerantZeros(types.ModuleType):
    """``numpy`` as seen by one legacy module: ``zeros`` gives ScalarTolerantArray."""

    def __init__(self):
        super().__init__("numpy")
        self._array_type = _scalar_tolerant_array_type()

    def zeros(self, *args, **kwargs):
        import numpy

        return numpy.zeros(*args, **kwargs).view(self._array_type)

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)


def _give_low_shot_trainer_tolerant_zeros(module) -> None:
    from vissl_swav_plugin import compat

    if not isinstance(module.__dict__.get("np"), _NumpyScalarTolerantZeros):
        compat._patch("shim_svm_low_shot_mean_ap_scalar", module, "np", _NumpyScalarTolerantZeros())


def apply_all() -> None:
    from vissl_swav_plugin import compat

    if "shim_svm_low_shot_mean_ap_scalar" not in _skipped():
        compat._after_import("vissl.utils.svm_utils.svm_low_shot_trainer",
                             _give_low_shot_trainer_tolerant_zeros)


apply_all()
