"""Mixed precision and SyncBatchNorm without NVIDIA apex; native autocast on CPU.

What breaks:

* ``vissl/trainer/train_task.py``, ``SelfSupervisionTask.set_amp_args`` asserts a CUDA
  device ("Mixed precision is only available on CUDA"), offers no dtype, and
  ``AMP_TYPE: apex`` raises without apex; ``vissl/trainer/train_steps/
  standard_train_step.py`` hard-codes ``torch.cuda.amp.autocast()`` (fp16, CUDA only,
  silently disabled on CPU).
* ``vissl/models/model_helpers.py``, ``convert_sync_bn`` with ``SYNC_BN_TYPE: apex`` (VISSL's
  SwAV and DeepCluster-v2 configs) calls the missing apex module (``NameError``).

Fix:

* ``shim_native_amp``: with ``MODEL.AMP_PARAMS.USE_AMP=True`` the train step runs
  ``torch.autocast`` on the task's device with ``MODEL.AMP_PARAMS.AMP_DTYPE`` (new key:
  ``float16`` default, or ``bfloat16``); a GradScaler is used for float16 only.
  ``AMP_TYPE: apex`` without apex falls back to native float16 autocast (with a warning).
  ``config.MODEL.AMP_PARAMS.AMP_DTYPE=...`` overrides need no leading ``+``.
* ``shim_syncbn_without_apex``: ``SYNC_BN_TYPE: apex`` without apex converts to PyTorch
  SyncBatchNorm (with a warning).  On CPU VISSL itself keeps plain BatchNorm.
"""
import functools
import logging
import types
from typing import Optional

from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.persistent_workers import PERSISTENT_WORKERS_KEY


AMP_DTYPE_KEY = "config.MODEL.AMP_PARAMS.AMP_DTYPE"
_AMP_DTYPE_NAMES = {
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}
# Keys the plugin adds to VISSL's config schema: `key=value` overrides of these are
# rewritten to `++key=value` so they need no leading '+' on the command line (the other
# modules' keys are listed here too: config.vissl_schema reads this list).
PLUGIN_CONFIG_KEYS = [AMP_DTYPE_KEY, PERSISTENT_WORKERS_KEY,
                      "config.DATA.TRAIN.DEVICE_AUGMENT"]  # transforms/device_step.py (a layer above)


def amp_dtype_from_config(amp_params):
    """torch dtype named by MODEL.AMP_PARAMS.AMP_DTYPE (default float16)."""
    import torch

    value = amp_params.get("AMP_DTYPE", "float16") if hasattr(amp_params, "get") else "float16"
    name = _AMP_DTYPE_NAMES.get(str(value).lower().replace("torch.", ""))
    if name is None:
        raise ValueError(
            f"{AMP_DTYPE_KEY}={value!r} is not supported; use one of: float16, bfloat16"
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


@register
def shim_native_amp():
    """Native autocast (CUDA or CPU, float16 or bfloat16) for ``MODEL.AMP_PARAMS.USE_AMP``:
    replaces ``SelfSupervisionTask.set_amp_args``, the ``torch`` seen by
    ``standard_train_step`` and lets ``compose_hydra_configuration`` take the new key."""
    import torch
    from classy_vision.tasks.classification_task import AmpType
    from vissl.trainer import train_task as tt
    from vissl.trainer.train_steps import standard_train_step as sts

    # vissl/trainer/train_task.py, SelfSupervisionTask.set_amp_args:
    # `assert self.device.type == "cuda", "Mixed precision is only available on CUDA..."`,
    # no dtype choice, and AMP_TYPE=apex raises without apex.
    orig_set_amp_args = raw(tt.SelfSupervisionTask, "set_amp_args")

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

    patch("shim_native_amp", tt.SelfSupervisionTask, "set_amp_args", set_amp_args)

    # vissl/trainer/train_steps/standard_train_step.py: `torch.cuda.amp.autocast()`
    # (fp16 on CUDA only).  The module gets a `torch` whose cuda.amp.autocast is ours.
    if not isinstance(sts.__dict__.get("torch"), _TorchWithNativeAutocast):
        patch("shim_native_amp", sts, "torch", _TorchWithNativeAutocast())

    # vissl/utils/hydra_config.py, compose_hydra_configuration: the new AMP_DTYPE key (and
    # any other plugin key) is not in VISSL's defaults.yaml; Hydra 1.3 refuses
    # `config.X=v` for a missing key, so such overrides become `++config.X=v`.
    from vissl.utils import hydra_config as hc

    orig_compose = raw(hc, "compose_hydra_configuration")

    @functools.wraps(orig_compose)
    def compose_hydra_configuration(overrides):
        return orig_compose([_plugin_key_override(o) for o in overrides])

    patch("shim_native_amp", hc, "compose_hydra_configuration", compose_hydra_configuration)


def _plugin_key_override(override):
    if not isinstance(override, str) or override[:1] in "+~":
        return override
    key = override.split("=", 1)[0].strip()
    return "++" + override if key in PLUGIN_CONFIG_KEYS else override


@register
def shim_syncbn_without_apex():
    """vissl/models/model_helpers.py, convert_sync_bn: SYNC_BN_TYPE=apex (VISSL's SwAV and
    DeepCluster-v2 configs) calls `apex.parallel...` -> NameError without apex.
    """
    from vissl.models import model_helpers as mh
    import vissl.models as vm
    from vissl.trainer import train_task as tt

    orig_convert = raw(mh, "convert_sync_bn")

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
            patch("shim_syncbn_without_apex", owner, "convert_sync_bn", convert_sync_bn)
