"""VISSL / Classy Vision code that NumPy 2 (>= 2.4) breaks.

What breaks:

* ``np.float`` / ``np.int`` / ``np.in1d`` (removed in NumPy 2) are used by
  ``vissl/utils/svm_utils/evaluate.py``, ``vissl/meters/mean_ap_meter.py``,
  ``vissl/utils/instance_retrieval_utils/{rmac,evaluate}.py`` and
  ``classy_vision/dataset/transforms/autoaugment.py``.
* ``vissl/utils/svm_utils/evaluate.py``, ``get_precision_recall`` returns the AP as a
  size-1 array which VISSL's SVM trainers (``svm_trainer.SVMTrainer.test``,
  ``svm_low_shot_trainer.SVMLowShotTrainer.test``) store with ``ap_matrix[c][0] = ap``:
  "setting an array element with a sequence" in NumPy >= 2.4.
* ``SVMLowShotTrainer.test`` then stores ``np.mean(local_cost_ap, axis=0)`` (shape (1,))
  in a scalar slot of ``sample_ap_matrix``: the same error, no low-shot result written.

Fix: ``shim_numpy2_removed_aliases`` gives those modules (and only those) a module-local
``np`` that supplies the old names (NumPy itself is not touched);
``shim_svm_ap_scalar`` hands the trainers a float AP; ``shim_svm_low_shot_mean_ap_scalar``
gives the low-shot trainer a module-local ``np`` whose ``zeros`` arrays accept a size-1
array in a scalar slot, as NumPy < 2.4 did.
"""
import functools
import types

from vissl_swav_plugin.compat.engine import after_import, patch, raw, register


def _in1d(ar1, ar2, assume_unique=False, invert=False, *, kind=None):
    """NumPy 1.x ``np.in1d``: ``np.isin`` on the flattened first argument."""
    import numpy as np

    return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert, kind=kind)


class _NumpyWithRemovedAliases(types.ModuleType):
    """`numpy` as seen by one legacy module: NumPy plus the aliases NumPy 2 removed."""

    ALIASES = {"float": float, "int": int, "object": object, "bool": bool, "in1d": _in1d}

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name):
        if name in self.ALIASES:
            return self.ALIASES[name]
        import numpy

        return getattr(numpy, name)


# module -> what it uses (for the record; the proxy supplies all aliases)
NUMPY2_LEGACY_MODULES = {
    "vissl.utils.svm_utils.evaluate": "np.float (get_precision_recall)",
    "vissl.meters.mean_ap_meter": "np.float (MeanAPMeter.value, VOC linear eval)",
    "vissl.utils.instance_retrieval_utils.rmac": "np.int (get_rmac_region_coordinates)",
    "vissl.utils.instance_retrieval_utils.evaluate": "np.in1d (compute_map)",
    "classy_vision.dataset.transforms.autoaugment": "np.int (get_image_op_settings)",
}


def _give_module_legacy_numpy(module) -> None:
    if not isinstance(module.__dict__.get("np"), _NumpyWithRemovedAliases):
        patch("shim_numpy2_removed_aliases", module, "np", _NumpyWithRemovedAliases())


@register
def shim_numpy2_removed_aliases():
    """Module-local: only these modules see the old names, so new code elsewhere still gets
    NumPy 2's AttributeError for them.
    """
    for module_name in NUMPY2_LEGACY_MODULES:
        after_import(module_name, _give_module_legacy_numpy)


@register
def shim_svm_ap_scalar():
    """vissl/utils/svm_utils/svm_trainer.py, SVMTrainer.test (and svm_low_shot_trainer.py,
    SVMLowShotTrainer.test): `ap_matrix[cls_num][0] = ap` where get_precision_recall's
    `ap` is a shape-(1,) array (vissl/utils/svm_utils/evaluate.py, calculate_ap);
    NumPy >= 2.4 rejects it ("setting an array element with a sequence").  Fixed at
    these call sites (the trainers' own `get_precision_recall` name): MeanAPMeter, the
    other caller, indexes `ap[0]` and keeps the array.
    """
    def patch_trainer(trainer_module):
        orig = raw(trainer_module, "get_precision_recall")

        @functools.wraps(orig)
        def get_precision_recall(*args, **kwargs):
            import numpy as np

            P, R, score, ap = orig(*args, **kwargs)
            return P, R, score, float(np.asarray(ap, dtype=np.float64).reshape(-1)[0])

        patch("shim_svm_ap_scalar", trainer_module, "get_precision_recall", get_precision_recall)

    for name in ("vissl.utils.svm_utils.svm_trainer", "vissl.utils.svm_utils.svm_low_shot_trainer"):
        after_import(name, patch_trainer)


@functools.lru_cache(maxsize=None)
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
    """`numpy` as seen by one legacy module: ``zeros`` gives arrays that take a size-1
    array for a scalar slot, as NumPy < 2.4 did."""

    def __init__(self):
        super().__init__("numpy")

    def zeros(self, *args, **kwargs):
        import numpy

        return numpy.zeros(*args, **kwargs).view(_scalar_tolerant_array_type())

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)


@register
def shim_svm_low_shot_mean_ap_scalar():
    """vissl/utils/svm_utils/svm_low_shot_trainer.py, SVMLowShotTrainer.test:
        local_cost_ap = np.zeros((self.num_classes, 1)); ...
        mean_cost_ap = np.mean(local_cost_ap, axis=0)        # shape (1,)
        sample_ap_matrix[0][cost_idx] = mean_cost_ap         # scalar slot
    NumPy >= 2.4 raises "setting an array element with a sequence", so every low-shot SVM
    run (tools/train_svm_low_shot.py) dies after training its SVMs, before writing any
    test_ap_sample*_k*.npy.  That module (only) gets a numpy whose `zeros` arrays accept a
    size-1 array in a scalar slot (shim_svm_ap_scalar fixes the `ap` one line above).
    """
    def patch_module(module):
        if not isinstance(module.__dict__.get("np"), _NumpyScalarTolerantZeros):
            patch("shim_svm_low_shot_mean_ap_scalar", module, "np", _NumpyScalarTolerantZeros())

    after_import("vissl.utils.svm_utils.svm_low_shot_trainer", patch_module)
