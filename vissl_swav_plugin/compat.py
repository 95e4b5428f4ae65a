"""Compatibility shims: VISSL 0.1.6 on Python 3.11, torch 2.14, NumPy 2.4, Pillow 13, Hydra 1.3.

VISSL 0.1.6 (2021) was written for torch 1.x with NVIDIA apex, CUDA-only tools, NumPy 1.19
and Pillow 8.  The installed VISSL is never edited; instead :func:`apply_all` (called first
by :func:`vissl_swav_plugin.register_all`, i.e. in every process that imports ``vissl``,
spawned/forkserver workers included) patches the few functions that break.  Every shim is a
named function registered in :data:`SHIMS`, is idempotent, fixes one documented breakage,
and is covered by ``tests/test_compat.py`` (which also shows the failure with the shim off).

Shims (in the order they are applied):

``shim_larc_without_apex``
    ``classy_vision.optim.sgd.SGD.prepare`` imports ``apex.parallel.LARC`` and
    ``vissl.trainer.train_task.SelfSupervisionTask._build_optimizer`` asserts apex for
    ``OPTIMIZER.use_larc=True``.  Without apex we wrap the SGD in :class:`LARC`, an
    apex-free re-implementation with apex's semantics (trust_coefficient, clip, eps, weight
    decay folded into the gradient, parameters without gradient or with a zero norm left
    alone).  ``sgd_fsdp`` already carries VISSL's own apex-free LARC and is untouched.
``shim_native_amp``
    ``SelfSupervisionTask.set_amp_args`` asserts a CUDA device and the standard train step
    hard-codes ``torch.cuda.amp.autocast()`` (fp16, CUDA only, silently disabled on CPU).
    With ``MODEL.AMP_PARAMS.USE_AMP=True`` we now run ``torch.autocast`` on the task's
    device with ``MODEL.AMP_PARAMS.AMP_DTYPE`` (new key: ``float16`` default, or
    ``bfloat16``); a GradScaler is used for float16 only.  ``AMP_TYPE: apex`` without apex
    falls back to native float16 autocast (with a warning) instead of raising.
``shim_syncbn_without_apex``
    ``vissl.models.model_helpers.convert_sync_bn`` with ``SYNC_BN_TYPE: apex`` calls the
    missing apex module; without apex it now converts to PyTorch SyncBatchNorm.  (On CPU,
    VISSL itself keeps plain per-process BatchNorm because SyncBatchNorm is GPU only.)
``shim_extract_features_on_cpu``
    ``SelfSupervisionTrainer.extract`` / ``extract_clusters`` (engines ``extract_features``
    and ``extract_cluster``) assert ``MACHINE.DEVICE=gpu`` and move every batch with
    ``.cuda()``; ``vissl.utils.distributed_utils.all_gather_sizes`` /
    ``all_gather_heterogeneous`` allocate on ``cuda``.  They now run on the task's device.
``shim_deepclusterv2_on_cpu``
    ``vissl.losses.deepclusterv2_loss.DeepClusterV2Loss.init_memory`` / ``cluster_memory``
    call ``.cuda()``; they now run on the device of the loss' memory bank.
``shim_knn_tool_on_cpu``
    ``tools/nearest_neighbor_test.py::nearest_neighbor_test`` (VISSL's kNN benchmark) calls
    ``.cuda()`` on features; it now runs on CPU when ``MACHINE.DEVICE=cpu`` or no GPU
    exists, both when imported and when run as a script.
``shim_numpy2_removed_aliases``
    ``np.float``/``np.int``/``np.in1d`` (removed in NumPy 2.x) are used by
    ``vissl.utils.svm_utils.evaluate``, ``vissl.meters.mean_ap_meter``,
    ``vissl.utils.instance_retrieval_utils.{rmac,evaluate}`` and
    ``classy_vision.dataset.transforms.autoaugment``.  Those modules (and only those) get
    a module-local ``np`` that supplies the old names; NumPy itself is not touched.
``shim_svm_ap_scalar``
    ``vissl.utils.svm_utils.evaluate`` returns the AP as a size-1 array which VISSL's SVM
    trainers (``svm_trainer``, ``svm_low_shot_trainer``) store with
    ``ap_matrix[c][0] = ap`` -- an error in NumPy >= 2.4; the trainers now get a float.
``shim_svm_low_shot_mean_ap_scalar``
    ``SVMLowShotTrainer.test`` then stores ``np.mean(local_cost_ap, axis=0)`` (shape (1,))
    in a scalar slot of ``sample_ap_matrix``; that module gets a module-local ``np`` whose
    ``zeros`` arrays accept it, as NumPy < 2.4 did (no low-shot result was written).
``shim_trusted_torch_load``
    ``vissl.utils.cluster_utils.ClusterAssignmentLoader.load_cluster_assigment`` reads the
    file VISSL's own extract_cluster engine wrote (it holds the run's AttrDict config) and
    fails under torch >= 2.6's ``weights_only=True`` default; it now loads that trusted
    file with ``weights_only=False``.  Checkpoints keep the safe default.
``shim_fast_broadcast_object``
    ``classy_vision.generic.distributed_util.broadcast_object`` (used to share every
    loaded checkpoint) builds ``torch.ByteTensor(memoryview)`` element by element (12 s for
    a 190 MB ResNet-50 checkpoint) and re-loads the bytes with ``torch.load`` under the
    ``weights_only`` default.  It now uses ``torch.frombuffer``, skips the round trip in
    single-process runs, and un-pickles the bytes rank 0 produced itself.
``shim_pillow13_posterize``
    ``vissl.data.ssl_transforms.rand_auto_aug.posterize`` (RandAugment/AutoAugment ops
    ``Posterize``/``PosterizeIncreasing``) asks for 0 bits at some magnitudes; Pillow 13
    raises ``ValueError`` where older Pillow returned a black image.  Restores that result.
``shim_cpu_flush_denormal``
    Not a crash, a 10-50x slow-down: on CPU, VISSL runs on tiny or smooth images produce
    denormal floats in backward passes.  ``SelfSupervisionTrainer.__init__`` now turns on
    ``torch.set_flush_denormal(True)`` when ``MACHINE.DEVICE=cpu`` (set
    ``VISSL_SWAV_PLUGIN_FLUSH_DENORMAL=0`` to keep denormals).

Checked and found working on this stack (no shim): Hydra 1.3 composition of VISSL's
configs (``defaults: [_self_, config: ???]``; keys VISSL lacks need ``+``), ``pkg_resources``
(setuptools < 70 is pinned), fairscale 0.3.7 imports, ``np.bool`` (re-added in NumPy 2),
``torch.cuda.amp`` (deprecated, still there), the other VISSL/Classy transforms, VISSL
training checkpoints under ``weights_only=True``, every VISSL/Classy module imports.
On CPU VISSL never converts BatchNorm to SyncBatchNorm (GPU-only in PyTorch): with
``CONVERT_BN_TO_SYNC_BN=True`` a CPU run keeps per-process BatchNorm statistics.

Environment: ``VISSL_SWAV_PLUGIN_COMPAT_SKIP=name1,name2`` (or ``all``) leaves the named
shims out (for tests and bisecting); ``VISSL_SWAV_PLUGIN_DISABLE=1`` switches the whole
plugin, compat included, off (see ``_autoload``).
"""
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import io
import logging
import os
import sys
import tempfile
import threading
import types
from typing import Callable, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

SKIP_ENV = "VISSL_SWAV_PLUGIN_COMPAT_SKIP"
FLUSH_DENORMAL_ENV = "VISSL_SWAV_PLUGIN_FLUSH_DENORMAL"

#: Registered shims, in application order.
SHIMS: List[Callable[[], None]] = []

_lock = threading.RLock()
_MARK = "__vissl_swav_compat_shim__"
# shim name -> list of (owner, attribute, original attribute value, replacement)
_PATCHES: Dict[str, List[Tuple[object, str, object, object]]] = {}
_APPLIED: set = set()


def shim(fn: Callable[[], None]) -> Callable[[], None]:
    SHIMS.append(fn)
    return fn


def shim_names() -> List[str]:
    return [fn.__name__ for fn in SHIMS]


def _skipped() -> set:
    """Names in VISSL_SWAV_PLUGIN_COMPAT_SKIP that are shims of this module (unknown names
    are logged, in case of a typo)."""
    raw = os.environ.get(SKIP_ENV, "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    if "all" in names:
        return set(shim_names())
    unknown = names - set(shim_names())
    if unknown:
        logger.info(
            "%s: %s are not shims of vissl_swav_plugin.compat (known: %s)",
            SKIP_ENV, sorted(unknown), shim_names(),
        )
    return names & set(shim_names())


def apply_all() -> None:
    """Apply every registered shim (idempotent; called by ``register_all``)."""
    with _lock:
        skip = _skipped()
        for fn in SHIMS:
            if fn.__name__ in skip:
                logger.debug("vissl_swav_plugin.compat: %s skipped (%s)", fn.__name__, SKIP_ENV)
                continue
            try:
                fn()
            except Exception as e:  # name the shim: VISSL or a dependency changed
                raise RuntimeError(
                    f"vissl_swav_plugin.compat.{fn.__name__} could not be applied: {e!r}"
                ) from e
            _APPLIED.add(fn.__name__)


def applied() -> List[str]:
    return [n for n in shim_names() if n in _APPLIED]


# --------------------------------------------------------------------------------------
# Patching helpers
# --------------------------------------------------------------------------------------
def _raw(owner, attr):
    """The attribute as stored (no descriptor binding) for classes, else getattr."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
        raise AttributeError(f"{owner!r} has no attribute {attr!r}")
    return getattr(owner, attr)


def _func_of(obj):
    return getattr(obj, "__func__", obj)


def _patch(shim_name: str, owner, attr: str, replacement) -> None:
    """Install ``replacement`` as ``owner.attr`` unless this shim already did (idempotent)."""
    current = _raw(owner, attr)
    if getattr(_func_of(current), _MARK, None) == shim_name:
        return
    try:
        setattr(_func_of(replacement), _MARK, shim_name)
    except (AttributeError, TypeError):
        pass
    had_own = not isinstance(owner, type) or attr in owner.__dict__
    _PATCHES.setdefault(shim_name, []).append(
        (owner, attr, current if had_own else _NOT_OWN, replacement)
    )
    setattr(owner, attr, replacement)


_NOT_OWN = object()


def original(shim_name: str, owner, attr: str):
    """The value ``owner.attr`` had before ``shim_name`` patched it."""
    for o, a, orig, _ in _PATCHES.get(shim_name, []):
        if o is owner and a == attr:
            return _raw(owner.__mro__[1], attr) if orig is _NOT_OWN else orig
    raise KeyError(f"{shim_name} did not patch {owner!r}.{attr}")


@contextlib.contextmanager
def disabled(*names: str):
    """Temporarily undo the named shims in this process (tests: show the failure)."""
    with _lock:
        undone = []
        for name in names:
            if name not in shim_names() and name not in _PATCHES:
                raise ValueError(f"unknown shim {name!r}; known: {shim_names()}")
            for owner, attr, orig, repl in reversed(_PATCHES.get(name, [])):
                if _raw(owner, attr) is repl:
                    if orig is _NOT_OWN:
                        delattr(owner, attr)
                    else:
                        setattr(owner, attr, orig)
                    undone.append((owner, attr, repl))
        try:
            yield
        finally:
            for owner, attr, repl in reversed(undone):
                setattr(owner, attr, repl)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run callbacks right after a watched module has been imported."""

    def __init__(self):
        self.callbacks: Dict[str, List[Callable]] = {}
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self.callbacks[fullname])
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

    def __getattr__(self, name):
        return getattr(self._inner, name)


_after_import_finder: Optional[_AfterImport] = None


def _after_import(module_name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` now if imported, else right after its import."""
    global _after_import_finder
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    if _after_import_finder is None:
        _after_import_finder = _AfterImport()
        sys.meta_path.insert(0, _after_import_finder)
    cbs = _after_import_finder.callbacks.setdefault(module_name, [])
    if all(getattr(c, "__qualname__", None) != callback.__qualname__ for c in cbs):
        cbs.append(callback)


# --------------------------------------------------------------------------------------
# CUDA calls -> the run's device
# --------------------------------------------------------------------------------------
_redirect_lock = threading.RLock()
_redirect_depth = 0
_redirect_saved: dict = {}


@contextlib.contextmanager
def cuda_calls_to(device):
    """While active, ``Tensor.cuda()`` / ``Module.cuda()`` move to ``device`` instead.

    Used around VISSL functions that hard-code ``.cuda()`` (kNN tool, feature and cluster
    extraction, DeepCluster-v2 memory) when the run is on CPU.  A no-op for CUDA devices.
    ``torch.cuda.current_device()`` answers 0 meanwhile when no GPU exists (VISSL passes
    it to ``.cuda()``).
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        yield
        return
    global _redirect_depth
    with _redirect_lock:
        if _redirect_depth == 0:

            def tensor_cuda(self, device_=None, non_blocking=False, **kwargs):
                return self.to(_redirect_saved["device"], non_blocking=non_blocking)

            def module_cuda(self, device_=None):
                return self.to(_redirect_saved["device"])

            _redirect_saved.update(
                device=device,
                tensor_own="cuda" in torch.Tensor.__dict__,
                tensor=torch.Tensor.__dict__.get("cuda"),
                module=torch.nn.Module.cuda,
                current_device=torch.cuda.current_device,
            )
            torch.Tensor.cuda = tensor_cuda
            torch.nn.Module.cuda = module_cuda
            if not torch.cuda.is_available():
                torch.cuda.current_device = lambda: 0
        elif _redirect_saved["device"] != device:
            raise RuntimeError(
                f"nested cuda_calls_to({device}) inside cuda_calls_to({_redirect_saved['device']})"
            )
        _redirect_depth += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirect_depth -= 1
            if _redirect_depth == 0:
                if _redirect_saved["tensor_own"]:
                    torch.Tensor.cuda = _redirect_saved["tensor"]
                else:
                    del torch.Tensor.cuda
                torch.nn.Module.cuda = _redirect_saved["module"]
                torch.cuda.current_device = _redirect_saved["current_device"]
                _redirect_saved.clear()


def _run_device(cfg):
    """torch.device a VISSL config runs on (cpu when MACHINE.DEVICE=cpu or no GPU)."""
    import torch

    if cfg["MACHINE"]["DEVICE"] == "gpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


# --------------------------------------------------------------------------------------
# 1. LARC without apex
# --------------------------------------------------------------------------------------
class LARC:
    """Layer-wise Adaptive Rate Control around a torch optimizer, apex-free.

    Same contract and semantics as ``apex.parallel.LARC`` (You et al. 2017): before
    each step, for every parameter ``p`` with a gradient ``g`` and in a group with
    learning rate ``lr`` and weight decay ``wd``::

        local_lr = trust_coefficient * ||p|| / (||g|| + wd * ||p|| + eps)
        clip=True :  g <- (g + wd * p) * min(local_lr / lr, 1)   # effective lr = min(local_lr, lr)
        clip=False:  g <- (g + wd * p) * local_lr                # effective lr = lr * local_lr

    The wrapped optimizer then steps with its weight decay temporarily set to 0 (weight
    decay is folded into the gradient above).  Parameters without a gradient, or whose
    weight norm or gradient norm is 0, are left to the plain optimizer step with no
    weight decay, as apex does.  Computed without host synchronisation.
    """

    def __init__(self, optimizer, trust_coefficient: float = 0.02, clip: bool = True, eps: float = 1e-8):
        if trust_coefficient <= 0:
            raise ValueError(
                f"config.OPTIMIZER.larc_config.trust_coefficient must be > 0, got {trust_coefficient}"
            )
        if eps < 0:
            raise ValueError(f"config.OPTIMIZER.larc_config.eps must be >= 0, got {eps}")
        self.optim = optimizer
        self.trust_coefficient = float(trust_coefficient)
        self.clip = bool(clip)
        self.eps = float(eps)

    # -- the torch.optim.Optimizer surface that ClassyOptimizer / GradScaler use --------
    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    def __repr__(self):
        return f"LARC(trust_coefficient={self.trust_coefficient}, clip={self.clip}, eps={self.eps}, {self.optim!r})"

    @property
    def state(self):
        return self.optim.state

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    @property
    def defaults(self):
        return self.optim.defaults

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self, closure=None):
        import torch

        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                wd = group.get("weight_decay", 0.0) or 0.0
                weight_decays.append(group.get("weight_decay", None))
                group["weight_decay"] = 0.0
                lr = group["lr"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad
                    p_norm = torch.linalg.vector_norm(p.detach())
                    g_norm = torch.linalg.vector_norm(g)
                    active = (p_norm != 0) & (g_norm != 0)
                    local_lr = self.trust_coefficient * p_norm / (g_norm + wd * p_norm + self.eps)
                    if self.clip:
                        local_lr = torch.clamp(local_lr / lr, max=1.0)
                    scale = torch.where(active, local_lr, torch.ones_like(local_lr))
                    if wd != 0:
                        g.add_(p.detach() * (wd * active.to(p.dtype)))
                    g.mul_(scale.to(g.dtype))
        try:
            return self.optim.step() if closure is None else self.optim.step(closure)
        finally:
            for group, wd in zip(self.optim.param_groups, weight_decays):
                if wd is None:
                    group.pop("weight_decay", None)
                else:
                    group["weight_decay"] = wd


def _apex_larc_available() -> bool:
    try:
        from apex.parallel.LARC import LARC as _  # noqa: F401
    except Exception:
        return False
    return True


@shim
def shim_larc_without_apex():
    # classy_vision/optim/sgd.py, SGD.prepare: `from apex.parallel.LARC import LARC`
    # -> RuntimeError("Apex needed for LARC").  Build the SGD as Classy does, then wrap it
    # in our LARC (only when apex is missing: a real apex keeps its own LARC).
    from classy_vision.optim.sgd import SGD

    orig_prepare = _raw(SGD, "prepare")

    @functools.wraps(orig_prepare)
    def prepare(self, param_groups):
        if not self._use_larc or _apex_larc_available():
            return orig_prepare(self, param_groups)
        self._use_larc = False
        try:
            orig_prepare(self, param_groups)
        finally:
            self._use_larc = True
        self.optimizer = LARC(optimizer=self.optimizer, **dict(self._larc_config or {}))

    _patch("shim_larc_without_apex", SGD, "prepare", prepare)

    # vissl/trainer/train_task.py, SelfSupervisionTask._build_optimizer:
    # `assert is_apex_available(), "Apex must be available to use LARC"`.
    from vissl.trainer import train_task as tt

    orig_build = _raw(tt.SelfSupervisionTask, "_build_optimizer")

    @functools.wraps(orig_build)
    def _build_optimizer(self):
        optimizer_config = self.config["OPTIMIZER"]
        if optimizer_config.use_larc and not tt.is_apex_available():
            return tt.build_optimizer(optimizer_config)
        return orig_build(self)

    _patch("shim_larc_without_apex", tt.SelfSupervisionTask, "_build_optimizer", _build_optimizer)


# --------------------------------------------------------------------------------------
# 2. Native AMP (fp16 / bf16, CUDA or CPU) and SyncBN without apex
# --------------------------------------------------------------------------------------
AMP_DTYPE_KEY = "config.MODEL.AMP_PARAMS.AMP_DTYPE"
_AMP_DTYPE_NAMES = {
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}
# Keys the plugin adds to VISSL's config schema: `key=value` overrides of these are
# rewritten to `++key=value` so they need no leading '+' on the command line.
PLUGIN_CONFIG_KEYS = [AMP_DTYPE_KEY]


def amp_dtype_from_config(amp_params):
    """torch dtype named by MODEL.AMP_PARAMS.AMP_DTYPE (default float16)."""
    import torch

    raw = amp_params.get("AMP_DTYPE", "float16") if hasattr(amp_params, "get") else "float16"
    name = _AMP_DTYPE_NAMES.get(str(raw).lower().replace("torch.", ""))
    if name is None:
        raise ValueError(
            f"{AMP_DTYPE_KEY}={raw!r} is not supported; use one of: float16, bfloat16"
        )
    return getattr(torch, name)


class _AmpRuntime:
    """The autocast settings of the task running in this process (set by set_amp_args)."""

    device_type: Optional[str] = None
    dtype = None


def _native_autocast(*args, **kwargs):
    # Replaces `torch.cuda.amp.autocast()` inside VISSL's standard_train_step.
    import torch

    if _AmpRuntime.device_type is None:  # no task configured it: VISSL's original meaning
        return torch.autocast("cuda", *args, **kwargs)
    return torch.autocast(_AmpRuntime.device_type, dtype=_AmpRuntime.dtype)


class _AmpNamespace:
    autocast = staticmethod(_native_autocast)

    def __getattr__(self, name):
        import torch

        return getattr(torch.cuda.amp, name)


class _CudaNamespace:
    amp = _AmpNamespace()

    def __getattr__(self, name):
        import torch

        return getattr(torch.cuda, name)


class _TorchWithNativeAutocast(types.ModuleType):
    """`torch` as seen by VISSL's standard_train_step: only `torch.cuda.amp.autocast` differs."""

    cuda = _CudaNamespace()

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)


@shim
def shim_native_amp():
    import torch
    from classy_vision.tasks.classification_task import AmpType
    from vissl.trainer import train_task as tt
    from vissl.trainer.train_steps import standard_train_step as sts

    # vissl/trainer/train_task.py, SelfSupervisionTask.set_amp_args:
    # `assert self.device.type == "cuda", "Mixed precision is only available on CUDA..."`,
    # no dtype choice, and AMP_TYPE=apex raises without apex.
    orig_set_amp_args = _raw(tt.SelfSupervisionTask, "set_amp_args")

    @functools.wraps(orig_set_amp_args)
    def set_amp_args(self):
        amp_params = self.config.MODEL.AMP_PARAMS
        if not amp_params.USE_AMP:
            _AmpRuntime.device_type = _AmpRuntime.dtype = None
            return orig_set_amp_args(self)
        type_name = str(amp_params.AMP_TYPE).upper()
        if type_name not in AmpType.__members__:
            raise ValueError(
                f"config.MODEL.AMP_PARAMS.AMP_TYPE={amp_params.AMP_TYPE!r} is not "
                f"supported; use one of: pytorch, apex"
            )
        amp_type = AmpType[type_name]
        if amp_type == AmpType.APEX and tt.is_apex_available() and self.device.type == "cuda":
            _AmpRuntime.device_type = _AmpRuntime.dtype = None
            return orig_set_amp_args(self)  # a real apex install: VISSL's own path
        dtype = amp_dtype_from_config(amp_params)
        if amp_type == AmpType.APEX:
            logging.warning(
                "config.MODEL.AMP_PARAMS.AMP_TYPE=apex but NVIDIA apex is not installed: "
                "using PyTorch native autocast (%s) instead of apex %s",
                dtype, dict(amp_params.get("AMP_ARGS", {}) or {}),
            )
        device_type = self.device.type
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"AMP is supported on cuda and cpu devices, not {device_type}")
        self.amp_type = AmpType.PYTORCH
        self.amp_dtype = dtype
        if dtype == torch.float16:
            if self.config["OPTIMIZER"]["name"] == "zero" and device_type == "cuda":
                self._init_pytorch_grad_scaler()  # fairscale ShardedGradScaler
            else:
                self.amp_grad_scaler = torch.amp.GradScaler(device_type)
        else:
            # bfloat16 has float32's exponent range: no loss scaling (a disabled scaler
            # keeps VISSL's train step code path: scale() and step() pass through).
            self.amp_grad_scaler = torch.amp.GradScaler(device_type, enabled=False)
        _AmpRuntime.device_type, _AmpRuntime.dtype = device_type, dtype
        logging.info(
            "Setting AMP: pytorch autocast(device_type=%s, dtype=%s), grad scaler %s",
            device_type, dtype, "on" if self.amp_grad_scaler.is_enabled() else "off",
        )

    _patch("shim_native_amp", tt.SelfSupervisionTask, "set_amp_args", set_amp_args)

    # vissl/trainer/train_steps/standard_train_step.py: `torch.cuda.amp.autocast()`
    # (fp16 on CUDA only).  The module gets a `torch` whose cuda.amp.autocast is ours.
    if not isinstance(sts.__dict__.get("torch"), _TorchWithNativeAutocast):
        _patch("shim_native_amp", sts, "torch", _TorchWithNativeAutocast())

    # vissl/utils/hydra_config.py, compose_hydra_configuration: the new AMP_DTYPE key (and
    # any other plugin key) is not in VISSL's defaults.yaml; Hydra 1.3 refuses
    # `config.X=v` for a missing key, so such overrides become `++config.X=v`.
    from vissl.utils import hydra_config as hc

    orig_compose = _raw(hc, "compose_hydra_configuration")

    @functools.wraps(orig_compose)
    def compose_hydra_configuration(overrides):
        return orig_compose([_plugin_key_override(o) for o in overrides])

    _patch("shim_native_amp", hc, "compose_hydra_configuration", compose_hydra_configuration)


def _plugin_key_override(override):
    if not isinstance(override, str) or override[:1] in "+~":
        return override
    key = override.split("=", 1)[0].strip()
    return "++" + override if key in PLUGIN_CONFIG_KEYS else override


@shim
def shim_syncbn_without_apex():
    # vissl/models/model_helpers.py, convert_sync_bn: SYNC_BN_TYPE=apex (VISSL's SwAV and
    # DeepCluster-v2 configs) calls `apex.parallel...` -> NameError without apex.
    from vissl.models import model_helpers as mh
    import vissl.models as vm
    from vissl.trainer import train_task as tt

    orig_convert = _raw(mh, "convert_sync_bn")

    @functools.wraps(orig_convert)
    def convert_sync_bn(config, model):
        sync_cfg = config.MODEL.SYNC_BN_CONFIG
        if sync_cfg["SYNC_BN_TYPE"] == "apex" and not mh.is_apex_available():
            logging.warning(
                "config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=apex but NVIDIA apex is not "
                "installed: converting to PyTorch SyncBatchNorm instead"
            )
            sync_cfg["SYNC_BN_TYPE"] = "pytorch"
            try:
                return orig_convert(config, model)
            finally:
                sync_cfg["SYNC_BN_TYPE"] = "apex"
        return orig_convert(config, model)

    for owner in (mh, vm, tt):
        if getattr(owner, "convert_sync_bn", None) is not None:
            _patch("shim_syncbn_without_apex", owner, "convert_sync_bn", convert_sync_bn)


# --------------------------------------------------------------------------------------
# 3. CUDA-only paths on CPU: extraction, DeepCluster-v2, kNN tool
# --------------------------------------------------------------------------------------
@shim
def shim_extract_features_on_cpu():
    import torch
    from vissl.trainer import trainer_main as tm

    Trainer = tm.SelfSupervisionTrainer
    name = "shim_extract_features_on_cpu"

    # vissl/trainer/trainer_main.py, SelfSupervisionTrainer.extract:
    # `assert self.task.device.type == "cuda", "Set MACHINE.DEVICE = gpu"`.
    orig_extract = _raw(Trainer, "extract")

    @functools.wraps(orig_extract)
    def extract(self, output_folder: str) -> None:
        if self.task.device.type == "cuda":
            return orig_extract(self, output_folder)
        # Same steps as VISSL's extract(), on the task's (CPU) device.
        self.task.prepare_extraction(pin_memory=self.cfg.DATA.PIN_MEMORY)
        self._add_dummy_layer()
        self.task.init_distributed_data_parallel_model()
        if tm.is_primary():
            logging.info("Model is:\n {}".format(self.task.model))
        feat_names = tm.get_trunk_output_feature_names(self.cfg.MODEL) or ["heads"]
        for split in self.task.available_splits:
            logging.info(f"Extracting features for partition: {split.lower()} on {self.task.device}")
            self.task.data_iterator = iter(self.task.dataloaders[split.lower()])
            self._extract_split_features(feat_names, self.task, split, output_folder)
        self._cleanup_task()

    _patch(name, Trainer, "extract", extract)

    # ..._extract_split_features / _get_cluster_assignment_for_split: `.cuda(non_blocking=True)`
    for attr in ("_extract_split_features", "_get_cluster_assignment_for_split"):
        orig = _raw(Trainer, attr)

        def make(orig):
            @functools.wraps(orig)
            def on_task_device(self, *args, **kwargs):
                with cuda_calls_to(self.task.device):
                    return orig(self, *args, **kwargs)

            return on_task_device

        _patch(name, Trainer, attr, make(orig))

    # ...extract_clusters: same assert as extract().
    orig_clusters = _raw(Trainer, "extract_clusters")

    @functools.wraps(orig_clusters)
    def extract_clusters(self):
        if self.task.device.type == "cuda":
            return orig_clusters(self)
        self.task.prepare_extraction(pin_memory=self.cfg.DATA.PIN_MEMORY)
        if not self.task.base_model.is_clustering_model():
            raise ValueError(
                "Extracting clusters is only available for pre-training methods based on "
                "clusters (config.MODEL.HEAD.PARAMS must contain a prototypes head)"
            )
        self._add_dummy_layer()
        self.task.init_distributed_data_parallel_model()
        assignments = {}
        for split in self.task.available_splits:
            assignments[split] = self._get_cluster_assignment_for_split(self.task, split)
        self._cleanup_task()
        with cuda_calls_to(self.task.device):
            return self._merge_cluster_assignments(assignments)

    _patch(name, Trainer, "extract_clusters", extract_clusters)

    # vissl/utils/distributed_utils.py, all_gather_sizes / all_gather_heterogeneous (used by
    # _merge_cluster_assignments): buffers made with device=torch.device("cuda", ...).
    # For CPU tensors: same results, buffers on the tensor's device (padded gather, so it
    # also works with gloo).
    from vissl.utils import distributed_utils as du

    orig_sizes = _raw(du, "all_gather_sizes")
    orig_hetero = _raw(du, "all_gather_heterogeneous")

    @functools.wraps(orig_sizes)
    def all_gather_sizes(x):
        if x.is_cuda:
            return orig_sizes(x)
        import torch.distributed as dist

        sizes = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=x.device)
        sizes[dist.get_rank()] = x.shape[0]
        dist.all_reduce(sizes)
        return [int(s) for s in sizes.tolist()]

    @functools.wraps(orig_hetero)
    def all_gather_heterogeneous(sizes, x):
        if x.is_cuda:
            return orig_hetero(sizes, x)
        import torch.distributed as dist

        longest = max(sizes)
        padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        gathered = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, padded)
        return [g[:n] for g, n in zip(gathered, sizes)]

    for owner in (du, tm):
        _patch(name, owner, "all_gather_sizes", all_gather_sizes)
        _patch(name, owner, "all_gather_heterogeneous", all_gather_heterogeneous)


@shim
def shim_deepclusterv2_on_cpu():
    # vissl/losses/deepclusterv2_loss.py, DeepClusterV2Loss.init_memory (inputs .cuda()) and
    # cluster_memory (centroids/counts/emb_sums .cuda()); used by InitMemoryHook and
    # ClusterMemoryHook.  Run them on the device holding the loss' memory bank.
    from vissl.losses.deepclusterv2_loss import DeepClusterV2Loss

    for attr in ("init_memory", "cluster_memory"):
        orig = _raw(DeepClusterV2Loss, attr)

        def make(orig):
            @functools.wraps(orig)
            def on_memory_device(self, *args, **kwargs):
                with cuda_calls_to(self.local_memory_embeddings.device):
                    return orig(self, *args, **kwargs)

            return on_memory_device

        _patch("shim_deepclusterv2_on_cpu", DeepClusterV2Loss, attr, make(orig))


def _knn_on_run_device(orig):
    @functools.wraps(orig)
    def nearest_neighbor_test(cfg, layer_name: str = "heads"):
        with cuda_calls_to(_run_device(cfg)):
            return orig(cfg, layer_name)

    return nearest_neighbor_test


def _is_vissl_knn_function(fn) -> bool:
    code = getattr(fn, "__code__", None)
    return (
        code is not None
        and os.path.basename(code.co_filename) == "nearest_neighbor_test.py"
        and "cuda" in code.co_names
    )


def _patch_knn_in(module) -> None:
    fn = getattr(module, "nearest_neighbor_test", None)
    if fn is not None and (
        getattr(fn, _MARK, None) == "shim_knn_tool_on_cpu" or _is_vissl_knn_function(fn)
    ):
        _patch("shim_knn_tool_on_cpu", module, "nearest_neighbor_test", _knn_on_run_device(fn))


@shim
def shim_knn_tool_on_cpu():
    # tools/nearest_neighbor_test.py, nearest_neighbor_test(): `.cuda()` on the train/test
    # features and labels.  Patched when the module is imported, and -- when the tool runs
    # as a script (`python .../nearest_neighbor_test.py`, module __main__, whose function is
    # defined after `import vissl` ran us) -- when its main() calls launch_distributed.
    _after_import("tools.nearest_neighbor_test", _patch_knn_in)

    from vissl.utils import distributed_launcher as dl

    orig_launch = _raw(dl, "launch_distributed")

    @functools.wraps(orig_launch)
    def launch_distributed(*args, **kwargs):
        main = sys.modules.get("__main__")
        if main is not None:
            _patch_knn_in(main)
        return orig_launch(*args, **kwargs)

    _patch("shim_knn_tool_on_cpu", dl, "launch_distributed", launch_distributed)


# --------------------------------------------------------------------------------------
# 4. NumPy 2
# --------------------------------------------------------------------------------------
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
        _patch("shim_numpy2_removed_aliases", module, "np", _NumpyWithRemovedAliases())


@shim
def shim_numpy2_removed_aliases():
    # Module-local: only these modules see the old names, so new code elsewhere still gets
    # NumPy 2's AttributeError for them.
    for module_name in NUMPY2_LEGACY_MODULES:
        _after_import(module_name, _give_module_legacy_numpy)


@shim
def shim_svm_ap_scalar():
    # vissl/utils/svm_utils/svm_trainer.py, SVMTrainer.test (and svm_low_shot_trainer.py,
    # SVMLowShotTrainer.test): `ap_matrix[cls_num][0] = ap` where get_precision_recall's
    # `ap` is a shape-(1,) array (vissl/utils/svm_utils/evaluate.py, calculate_ap);
    # NumPy >= 2.4 rejects it ("setting an array element with a sequence").  Fixed at
    # these call sites (the trainers' own `get_precision_recall` name): MeanAPMeter, the
    # other caller, indexes `ap[0]` and keeps the array.
    def patch(trainer_module):
        orig = _raw(trainer_module, "get_precision_recall")

        @functools.wraps(orig)
        def get_precision_recall(*args, **kwargs):
            import numpy as np

            P, R, score, ap = orig(*args, **kwargs)
            return P, R, score, float(np.asarray(ap, dtype=np.float64).reshape(-1)[0])

        _patch("shim_svm_ap_scalar", trainer_module, "get_precision_recall", get_precision_recall)

    for name in ("vissl.utils.svm_utils.svm_trainer", "vissl.utils.svm_utils.svm_low_shot_trainer"):
        _after_import(name, patch)


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


@shim
def shim_svm_low_shot_mean_ap_scalar():
    # vissl/utils/svm_utils/svm_low_shot_trainer.py, SVMLowShotTrainer.test:
    #     local_cost_ap = np.zeros((self.num_classes, 1)); ...
    #     mean_cost_ap = np.mean(local_cost_ap, axis=0)        # shape (1,)
    #     sample_ap_matrix[0][cost_idx] = mean_cost_ap         # scalar slot
    # NumPy >= 2.4 raises "setting an array element with a sequence", so every low-shot SVM
    # run (tools/train_svm_low_shot.py) dies after training its SVMs, before writing any
    # test_ap_sample*_k*.npy.  That module (only) gets a numpy whose `zeros` arrays accept a
    # size-1 array in a scalar slot (shim_svm_ap_scalar fixes the `ap` one line above).
    def patch(module):
        if not isinstance(module.__dict__.get("np"), _NumpyScalarTolerantZeros):
            _patch("shim_svm_low_shot_mean_ap_scalar", module, "np", _NumpyScalarTolerantZeros())

    _after_import("vissl.utils.svm_utils.svm_low_shot_trainer", patch)


# --------------------------------------------------------------------------------------
# 5. torch.load / checkpoint broadcast
# --------------------------------------------------------------------------------------
@shim
def shim_trusted_torch_load():
    # vissl/utils/cluster_utils.py, ClusterAssignmentLoader.load_cluster_assigment:
    # `torch.load(f)` of the file VISSL's extract_cluster engine wrote; it stores the run's
    # config as an AttrDict, which weights_only=True (torch >= 2.6 default) rejects and
    # cannot allow-list (a dict subclass).  These files are VISSL's own output.
    def patch(cu):
        orig = _raw(cu.ClusterAssignmentLoader, "load_cluster_assigment")

        def load_cluster_assigment(cls, file_path: str):
            import torch

            with cu.g_pathmgr.open(file_path, "rb") as f:
                content = torch.load(f, map_location="cpu", weights_only=False)
            return cu.ClusterAssignment(
                config=content[cls._CONFIG_KEY],
                cluster_assignments=content[cls._ASSIGN_KEY],
            )

        functools.update_wrapper(load_cluster_assigment, _func_of(orig))
        _patch(
            "shim_trusted_torch_load", cu.ClusterAssignmentLoader,
            "load_cluster_assigment", classmethod(load_cluster_assigment),
        )

    _after_import("vissl.utils.cluster_utils", patch)


def broadcast_object(obj, src: int = 0, use_disk: bool = True):
    """Drop-in for Classy Vision's ``broadcast_object`` (same protocol and result).

    Differences: no copy at all when there is one process; the payload tensor is made with
    ``torch.frombuffer`` (not element by element); receivers un-pickle with
    ``weights_only=False`` since the bytes are what the source rank serialised from an
    object it already holds (e.g. the checkpoint it loaded under torch's default rules).
    """
    import torch
    import torch.distributed as dist
    from classy_vision.generic import distributed_util as du

    if not du.is_distributed_training_run():
        return obj
    if du.get_rank() == src:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = buffer.getbuffer()
        du.broadcast(torch.tensor([len(payload)], dtype=torch.long), src=src)
        data = torch.frombuffer(payload, dtype=torch.uint8) if len(payload) else torch.empty(0, dtype=torch.uint8)
        du.broadcast(data, src=src)
        del data, payload
        return obj
    length = du.broadcast(torch.zeros(1, dtype=torch.long), src=src)
    data = du.broadcast(torch.empty(int(length.item()), dtype=torch.uint8), src=src)
    if use_disk:
        with tempfile.TemporaryFile("w+b") as f:
            f.write(data.numpy().tobytes())
            del data
            f.seek(0)
            return torch.load(f, weights_only=False)
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


@shim
def shim_fast_broadcast_object():
    # classy_vision/generic/distributed_util.py, broadcast_object: `torch.ByteTensor(
    # buffer.getbuffer())` converts byte by byte (12 s per 190 MB ResNet-50 checkpoint, paid
    # by every resume / weights init, also with one process) and receivers `torch.load`
    # under the weights_only default.  classy_vision/generic/util.py imports it by name.
    from classy_vision.generic import distributed_util as du
    from classy_vision.generic import util as cu

    for owner in (du, cu):
        _patch("shim_fast_broadcast_object", owner, "broadcast_object", broadcast_object)


# --------------------------------------------------------------------------------------
# 6. Pillow 13
# --------------------------------------------------------------------------------------
@shim
def shim_pillow13_posterize():
    # vissl/data/ssl_transforms/rand_auto_aug.py, posterize(): levels map to 0..4 bits for
    # "Posterize" (magnitude < 2.5) and "PosterizeIncreasing" (magnitude > 7.5).  Pillow < 10
    # returned a black image for 0 bits; Pillow 13 raises "bits must be between or equal to
    # 1 and 8".  The op table NAME_TO_OP holds the function object, so patch both.
    from vissl.data.ssl_transforms import rand_auto_aug as raa

    orig = _raw(raa, "posterize")

    @functools.wraps(orig)
    def posterize(img, bits_to_keep, **kwargs):
        if bits_to_keep <= 0:  # keep no bit: every channel value becomes 0 (old Pillow)
            from PIL import ImageOps

            return ImageOps.posterize(img, 1).point(lambda _: 0)
        return orig(img, int(bits_to_keep), **kwargs)

    _patch("shim_pillow13_posterize", raa, "posterize", posterize)
    for key, fn in list(raa.NAME_TO_OP.items()):
        if fn is orig:
            _patch("shim_pillow13_posterize", _DictSlot(raa.NAME_TO_OP), key, posterize)


class _DictSlot:
    """Attribute view of a dict, so ``_patch`` can record and undo dict entries."""

    def __init__(self, d):
        self.__dict__["_d"] = d

    def __getattr__(self, key):
        try:
            return self._d[key]
        except KeyError:
            raise AttributeError(key)

    def __setattr__(self, key, value):
        self._d[key] = value

    def __delattr__(self, key):
        del self._d[key]

    def __eq__(self, other):
        return isinstance(other, _DictSlot) and other._d is self._d

    def __hash__(self):
        return id(self._d)


# --------------------------------------------------------------------------------------
# 7. CPU speed
# --------------------------------------------------------------------------------------
def flush_denormals_for(cfg) -> bool:
    """Flush denormal floats to zero for a CPU run (unless VISSL_SWAV_PLUGIN_FLUSH_DENORMAL=0)."""
    import torch

    if cfg["MACHINE"]["DEVICE"] != "cpu" or os.environ.get(FLUSH_DENORMAL_ENV, "1") == "0":
        return False
    if torch.set_flush_denormal(True):
        logging.info("CPU run: denormal floats are flushed to zero (%s=0 to keep them)", FLUSH_DENORMAL_ENV)
        return True
    return False


@shim
def shim_cpu_flush_denormal():
    # vissl/trainer/trainer_main.py, SelfSupervisionTrainer.__init__ (every engine builds
    # one in each worker): on CPU, denormal floats (e.g. BatchNorm over near-constant crops
    # of small images) make backward passes 10-50x slower.  Flush them to zero on CPU runs.
    from vissl.trainer import trainer_main as tm

    orig_init = _raw(tm.SelfSupervisionTrainer, "__init__")

    @functools.wraps(orig_init)
    def __init__(self, cfg, *args, **kwargs):
        flush_denormals_for(cfg)
        return orig_init(self, cfg, *args, **kwargs)

    _patch("shim_cpu_flush_denormal", tm.SelfSupervisionTrainer, "__init__", __init__)
