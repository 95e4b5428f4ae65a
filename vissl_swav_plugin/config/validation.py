"""Config inference and validation for the plugin's losses.

VISSL fills in derived loss settings (number of crops, prototypes, queue length per
process, ...) in ``vissl.utils.hydra_config.infer_losses_config``, called by
``convert_to_attrdict`` when any launcher composes a config.  :func:`install` wraps that
function so that, after VISSL's own inference, the inference registered here for our loss
names runs too; it also *validates*: a wrong value raises :class:`ConfigError` naming the
full key (``config.LOSS.swav_plugin_loss.epsilon must be > 0, got 0``) before any process
is started.
"""
import difflib
import numbers
from typing import Callable, Dict, Iterable, List, Optional

_INFERENCE: Dict[str, Callable] = {}
_CROP_COUNTERS: Dict[str, Callable] = {}
_CHECKS: List[Callable] = []
_LAUNCH_CHECKS: List[Callable] = []
_GLOBAL_INFERENCE: Dict[str, Callable] = {}


class ConfigError(ValueError):
    """A config value is wrong; the message names the key."""


def register_config_inference(loss_name: str):
    """Decorator: ``fn(cfg)`` runs (after VISSL's inference) when ``LOSS.name == loss_name``."""

    def deco(fn):
        _INFERENCE[loss_name] = fn
        return fn

    return deco


def register_config_check(fn):
    """Decorator: ``fn(cfg)`` checks every composed config (whatever the loss), after the
    loss inference; it raises :class:`ConfigError` naming the key."""
    if fn not in _CHECKS:
        _CHECKS.append(fn)
    return fn
def register_launch_check(fn):
    """Decorator: ``fn(cfg)`` checks a run when it is *launched*, not when its config is
    composed: in the launcher process, before any worker starts (VISSL's
    ``launch_distributed`` and ``launch_distributed_on_slurm`` run :func:`run_launch_checks`
    first, patch ``plugin_launch_checks``).  For the checks that need the whole run: head
    against trunk width, dataset size against batch and processes, data paths.  A plain
    composition (a config browser, VISSL's own tests, a script that composes and then
    changes the trunk) does not run them.  ``fn`` raises :class:`ConfigError` naming the keys."""
    if fn not in _LAUNCH_CHECKS:
        _LAUNCH_CHECKS.append(fn)
    return fn


def launch_checks() -> List[Callable]:
    """The registered launch checks, in registration order."""
    return list(_LAUNCH_CHECKS)


def run_launch_checks(cfg) -> None:
    """Run every launch check (:func:`register_launch_check`) on a composed config.  VISSL's
    launchers call it through the patched ``launch_distributed``; a launcher of your own that
    starts workers in another way calls it itself, before the first worker."""
    for check in _LAUNCH_CHECKS:
        check(cfg)


def register_global_inference(name: str):
    """Decorator: ``fn(cfg)`` runs (after VISSL's inference, before the loss's) for every
    config, whatever its loss; ``name`` identifies it (re-registering replaces it)."""

    def deco(fn):
        _GLOBAL_INFERENCE[name] = fn
        return fn

    return deco


def register_crop_counter(transform_name: str):
    """Decorator: ``fn(transform_cfg) -> int`` total crops produced by a multi-crop transform."""

    def deco(fn):
        _CROP_COUNTERS[transform_name] = fn
        return fn

    return deco


def total_num_crops(cfg):
    """Total number of crops the train transforms produce, or None if not multi-crop."""
    for t in cfg.DATA.TRAIN.TRANSFORMS or []:
        if "total_num_crops" in t:
            return int(t["total_num_crops"])
        counter = _CROP_COUNTERS.get(t.get("name"))
        if counter is not None:
            return int(counter(t))
    return None


def world_size_of(cfg) -> int:
    """The run's number of processes: ``DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE``."""
    return int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


# -- small checkers, each naming the key --------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def require_positive_number(value, key):
    """Raise :class:`ConfigError` naming ``config.<key>`` unless ``value`` is a number > 0."""
    if not _is_num(value) or not value > 0 or value == float("inf"):
        raise ConfigError(f"config.{key} must be a finite number > 0, got {value!r}")


def require_bool(value, key):
    """Raise :class:`ConfigError` naming ``config.<key>`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ConfigError(f"config.{key} must be true or false, got {value!r}")


def require_int(value, key, minimum=0):
    """Raise :class:`ConfigError` naming ``config.<key>`` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not _is_int(value) or value < minimum:
        raise ConfigError(f"config.{key} must be an integer >= {minimum}, got {value!r}")


def require_int_list(value, key, minimum=0, nonempty=True):
    """Raise :class:`ConfigError` naming ``config.<key>`` unless ``value`` is a non-empty list of ints >= ``minimum``."""
    if not isinstance(value, (list, tuple)) or (nonempty and not value):
        raise ConfigError(f"config.{key} must be a non-empty list of integers, got {value!r}")
    for v in value:
        if not _is_int(v) or v < minimum:
            raise ConfigError(f"config.{key} must contain integers >= {minimum}, got {value!r}")


# -- unknown keys: one helper for every section of ours ------------------------------------
def closest_key(key, known: Iterable[str]) -> Optional[str]:
    """The known key closest to ``key`` (``difflib``, case-insensitive), or None.

    Example::

        closest_key("temprature", ["temperature", "epsilon"])  # -> "temperature"
    """
    by_lower = {str(k).lower(): k for k in known}
    match = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def check_known_keys(block, known: Iterable[str], path: str, error=None) -> None:
    """Reject the keys of ``block`` that are not in ``known`` (a typo would otherwise be
    ignored silently and its default used).

    Args:
        block: a mapping (the config section) or None (nothing to check).
        known: every key the section's consumer reads (its known-keys table).
        path: the section's full key path as printed, e.g. ``config.LOSS.swav_plugin_loss``.
        error: exception class to raise (default :class:`ConfigError`).

    Raises:
        ``error``: naming every unknown key by full path, each with the closest known key,
            e.g. ``config.LOSS.swav_plugin_loss.temprature: unknown key 'temprature' (did
            you mean 'temperature'?); known keys: [...]``.
    """
    if block is None:
        return
    known = sorted(str(k) for k in known)
    unknown = sorted(str(k) for k in block if str(k) not in known)
    if not unknown:
        return
    parts = []
    for key in unknown:
        near = closest_key(key, known)
        parts.append(f"{path}.{key}: unknown key '{key}'" + (f" (did you mean '{near}'?)" if near else ""))
    raise (error or ConfigError)(f"{'; '.join(parts)}; known keys: {known}")


# -- run-wide blocks of our own (config.HOOKS.<NAME>), whatever the loss --------------------
def hook_block(cfg, name, defaults, checks):
    """``config.HOOKS.<name>`` as a plain dict, ``defaults`` filled in for absent keys
    (VISSL's defaults lack our blocks, so a config without it gets all defaults).

    Args:
        cfg: the composed config.
        name: the block under ``HOOKS`` (e.g. ``"PROGRESS"``).
        defaults: every allowed key with its default value.
        checks: ``{key: fn(value, full_key)}`` raising :class:`ConfigError` on a bad value.

    Returns:
        ``dict`` of all keys of ``defaults``.

    Raises:
        ConfigError: an unknown key (names it and the known ones) or a bad value.

    Example::

        hook_block(cfg, "PROGRESS", {"ENABLED": True, "FREQUENCY": 10},
                   {"ENABLED": require_bool, "FREQUENCY": require_int})
    """
    block = (cfg.get("HOOKS") or {}).get(name)
    if block is None:
        block = {}
    if not hasattr(block, "items"):
        raise ConfigError(f"config.HOOKS.{name} must be a mapping of settings, got {block!r}")
    check_known_keys(block, defaults, f"config.HOOKS.{name}")
    out = {k: block.get(k, v) for k, v in defaults.items()}
    for key, check in checks.items():
        check(out[key], f"HOOKS.{name}.{key}")
    return out


def require_str(value, key):
    """``value`` must be a non-empty string, else :class:`ConfigError` naming ``key``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config.{key} must be a non-empty string, got {value!r}")


def install() -> None:
    """Wrap ``vissl.utils.hydra_config.infer_losses_config`` through the compat engine
    (patch ``plugin_config_inference``: applied now and once per process, listed by
    ``compat.applied()``, undone by ``compat.disabled("plugin_config_inference")``)."""
    from vissl_swav_plugin import compat

    def plugin_config_inference():
        import vissl.utils.hydra_config as hc

        original = compat.raw(hc, "infer_losses_config")

        def infer_losses_config(cfg):
            cfg = original(cfg) or cfg
            for global_fn in _GLOBAL_INFERENCE.values():
                cfg = global_fn(cfg) or cfg
            fn = _INFERENCE.get(cfg.LOSS.name)
            if fn is not None:
                if cfg.LOSS.name not in cfg.LOSS:
                    raise ConfigError(
                        f"config.LOSS.{cfg.LOSS.name} is missing: LOSS.name is {cfg.LOSS.name!r} but "
                        "its parameter block is absent (use one of the plugin's configs)"
                    )
                cfg = fn(cfg) or cfg
            for check in _CHECKS:
                check(cfg)
            return cfg

        infer_losses_config.__wrapped__ = original
        compat.patch("plugin_config_inference", hc, "infer_losses_config", infer_losses_config)

    compat.register(plugin_config_inference, now=True)


install()
