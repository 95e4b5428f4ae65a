"""Checks of the values of VISSL's own config sections, when a config is composed (in the launcher
process, before any worker starts); which keys those sections may have is
:mod:`~vissl_swav_plugin.config.vissl_schema`.

* **Ranges** (:func:`check_optimizer_values`): learning rates (every value of
  ``OPTIMIZER.param_schedulers``, the scheduler lists included) finite and >= 0,
  ``weight_decay`` >= 0, ``momentum`` in [0, 1), ``nesterov`` / ``use_larc`` true or
  false, LARC's ``trust_coefficient`` and ``eps`` > 0, ``num_epochs`` an integer >= 1,
  ``OPTIMIZER.name`` a registered optimizer.
* **AMP dtype** (:func:`check_amp_dtype`): ``MODEL.AMP_PARAMS.AMP_DTYPE`` one of the
  supported names (the workers would reject it ~10 s later).
* **Persistent loader workers** (:func:`check_persistent_workers`): ``DATA.PERSISTENT_WORKERS``
  true or false, also in a run without loader workers (which never reads it).
* **VISSL's ``swav_loss`` with a head it cannot use** (:func:`check_vissl_swav_loss_head`):
  VISSL's inference would stop on a bare ``AssertionError``.
"""
import difflib
import math

from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.registries import register_config_check, register_pre_inference_check


# -- ranges of VISSL's optimizer values ------------------------------------------------------
def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: keys of a parameter scheduler that hold learning-rate (or weight-decay) values
SCHEDULER_VALUE_KEYS = ("value", "values", "start_value", "end_value", "base_value")


def _check_scheduler(block, key):
    if not hasattr(block, "items"):
        return
    for k, v in block.items():
        full = f"{key}.{k}"
        if k in SCHEDULER_VALUE_KEYS:
            for i, x in enumerate(v if isinstance(v, (list, tuple)) else [v]):
                where = f"{full}[{i}]" if isinstance(v, (list, tuple)) else full
                if not _is_real(x) or not math.isfinite(x) or x < 0:
                    raise ConfigError(f"{where} must be a finite number >= 0 (a learning rate), got {x!r}")
        elif k == "schedulers" and isinstance(v, (list, tuple)):
            for i, sub in enumerate(v):
                _check_scheduler(sub, f"{full}[{i}]")
        elif hasattr(v, "items"):
            _check_scheduler(v, full)


def _require_range(value, key, low, high=None, high_open=True):
    ok = _is_real(value) and math.isfinite(value) and value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        rng = f">= {low}" if high is None else f"in [{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(f"{key} must be a finite number {rng}, got {value!r}")


@register_config_check
def check_optimizer_values(cfg) -> None:
    """Ranges of ``config.OPTIMIZER``: learning rates >= 0, ``weight_decay`` >= 0,
    ``momentum`` in [0, 1), flags true or false, LARC's coefficients > 0, ``num_epochs``
    >= 1, a registered optimizer ``name`` (with the closest one)."""
    opt = cfg.get("OPTIMIZER")
    if not hasattr(opt, "get"):
        return
    key = "config.OPTIMIZER"
    name = opt.get("name")
    import vissl.optimizers  # noqa: F401  (registers VISSL's own optimizers: lars, sgd_fsdp, ...)
    from classy_vision.optim import OPTIMIZER_REGISTRY

    if name not in OPTIMIZER_REGISTRY:
        near = difflib.get_close_matches(str(name), list(OPTIMIZER_REGISTRY), n=1, cutoff=0.6)
        raise ConfigError(
            f"{key}.name={name!r} is not a registered optimizer"
            + (f" (did you mean {near[0]!r}?)" if near else "") + f"; known: {sorted(OPTIMIZER_REGISTRY)}"
        )
    for sched_name, sched in (opt.get("param_schedulers") or {}).items():
        _check_scheduler(sched, f"{key}.param_schedulers.{sched_name}")
    _require_range(opt.get("weight_decay", 0.0), f"{key}.weight_decay", 0.0)
    hop = opt.get("head_optimizer_params") or {}
    if "weight_decay" in hop:
        _require_range(hop["weight_decay"], f"{key}.head_optimizer_params.weight_decay", 0.0)
    _require_range(opt.get("momentum", 0.0), f"{key}.momentum", 0.0, 1.0)
    for flag in ("nesterov", "use_larc", "regularize_bn", "regularize_bias", "use_zero"):
        if flag in opt and not isinstance(opt[flag], bool):
            raise ConfigError(f"{key}.{flag} must be true or false, got {opt[flag]!r}")
    larc = opt.get("larc_config") or {}
    for k in ("trust_coefficient", "eps"):
        if k in larc and (not _is_real(larc[k]) or not math.isfinite(larc[k]) or larc[k] <= 0):
            raise ConfigError(f"{key}.larc_config.{k} must be a finite number > 0, got {larc[k]!r}")
    if "clip" in larc and not isinstance(larc["clip"], bool):
        raise ConfigError(f"{key}.larc_config.clip must be true or false, got {larc['clip']!r}")
    epochs = opt.get("num_epochs")
    if not cfg.get("TEST_ONLY", False) and (not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1):
        raise ConfigError(f"{key}.num_epochs must be an integer >= 1, got {epochs!r}")


@register_config_check
def check_amp_dtype(cfg) -> None:
    """``MODEL.AMP_PARAMS.AMP_DTYPE``, when set, names a supported dtype (checked now,
    not in the workers)."""
    from vissl_swav_plugin.compat.amp import amp_dtype_from_config

    amp = (cfg.get("MODEL") or {}).get("AMP_PARAMS") or {}
    if hasattr(amp, "get") and "AMP_DTYPE" in amp:
        try:
            amp_dtype_from_config(amp)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@register_config_check
def check_persistent_workers(cfg) -> None:
    """``DATA.PERSISTENT_WORKERS``, when set, is true or false: checked now, not only where
    loader workers start (a run without workers never reads it)."""
    from vissl_swav_plugin.compat.persistent_workers import persistent_workers_enabled

    try:
        persistent_workers_enabled(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


#: VISSL's losses whose inference requires one VISSL head, and the heads it accepts
VISSL_HEAD_LOSSES = {"swav_loss": ("swav_head", "swav_head_fsdp"), "swav_momentum_loss": ("swav_head",),
                     "dino_loss": ("swav_head",)}
#: the plugin's loss for a head of the plugin, by VISSL loss
PLUGIN_LOSS_FOR = {"swav_loss": "swav_plugin_loss"}


@register_pre_inference_check
def check_vissl_swav_loss_head(cfg) -> None:
    """VISSL's SwAV-type losses need exactly one head, VISSL's ``swav_head`` (its inference
    asserts it): any other head is a :class:`ConfigError` naming both and the fix."""
    name = cfg.LOSS.name
    if name not in VISSL_HEAD_LOSSES:
        return
    heads = [h[0] for h in (cfg.MODEL.HEAD.PARAMS or []) if isinstance(h, (list, tuple)) and h]
    accepted = VISSL_HEAD_LOSSES[name]
    if len(heads) == 1 and heads[0] in accepted:
        return
    fix = f"use VISSL's {accepted[0]} as the only head"
    ours = PLUGIN_LOSS_FOR.get(name)
    if ours and any(h.endswith("_plugin_head") for h in heads):
        fix = f"use the plugin's loss (config.LOSS.name={ours}) with this head, or " + fix
    raise ConfigError(
        f"config.LOSS.name={name} (VISSL's loss) needs exactly one head, {' or '.join(accepted)}, "
        f"but config.MODEL.HEAD.PARAMS has {heads}: {fix}"
    )
