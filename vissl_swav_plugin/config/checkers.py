"""``ConfigError`` and the small checkers every config check of the plugin is built from.

Each checker names the full key of a bad value (``config.LOSS.swav_plugin_loss.epsilon must
be a finite number > 0, got 0``); :func:`check_known_keys` rejects the keys a section's
consumer does not read, with the closest known key (:func:`closest_key`, :func:`typo_of`);
:func:`hook_block` reads and checks a ``config.HOOKS.<NAME>`` block of ours.

Example::

    from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys, require_int

    check_known_keys({"temprature": 0.1}, ["temperature"], "config.LOSS.my_loss")
    # ConfigError: config.LOSS.my_loss.temprature: unknown key 'temprature' (did you mean 'temperature'?); ...
"""
import difflib
import numbers
from typing import Iterable, Optional

from vissl_swav_plugin.config.registries import register_plugin_config_keys


class ConfigError(ValueError):
    """A config value is wrong; the message names the key."""


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


def require_str(value, key):
    """``value`` must be a non-empty string, else :class:`ConfigError` naming ``key``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config.{key} must be a non-empty string, got {value!r}")


# -- unknown keys: one helper for every section of ours ------------------------------------
def closest_key(key, known: Iterable[str]) -> Optional[str]:
    """The known key closest to ``key`` (``difflib``, case-insensitive), or None.

    Example::

        closest_key("temprature", ["temperature", "epsilon"])  # -> "temperature"
    """
    by_lower = {str(k).lower(): k for k in known}
    match = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def edit_distance(a: str, b: str) -> int:
    """The optimal-string-alignment distance of ``a`` and ``b``: the fewest characters
    inserted, deleted, changed or swapped with their neighbour (a swap counts once)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def typo_of(key, known: Iterable[str]) -> Optional[str]:
    """The known key that ``key`` is a typo of, or None: at most one character away (two for
    known keys of 8 characters or more; case ignored; ``nam`` -> ``name``,
    ``CHECKPOINT_FREQUECY`` -> ``CHECKPOINT_FREQUENCY``), the nearest first.  Stricter than
    :func:`closest_key`'s suggestion: a name that shares a word with a known key
    (``my_optimizer_option`` / ``head_optimizer_params``) is no typo.  Of keys equally near,
    the one :func:`closest_key` ranks first (``nams``: ``names`` before ``name``)."""
    key = str(key).lower()
    near = [(edit_distance(key, str(k).lower()), -difflib.SequenceMatcher(None, key, str(k).lower()).ratio(), str(k))
            for k in known]
    near = sorted(n for n in near if n[0] <= (2 if len(n[2]) >= 8 else 1))
    return near[0][2] if near else None


def check_known_keys(block, known: Iterable[str], path: str, error=None, suggest=None) -> None:
    """Reject the keys of ``block`` that are not in ``known`` (a typo would otherwise be
    ignored silently and its default used).

    Args:
        block: a mapping (the config section) or None (nothing to check).
        known: every key the section's consumer reads (its known-keys table).
        path: the section's full key path as printed, e.g. ``config.LOSS.swav_plugin_loss``.
        error: exception class to raise (default :class:`ConfigError`).
        suggest: ``fn(key, known) -> known key or None`` tried before :func:`closest_key`.

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
        near = (suggest(key, known) if suggest else None) or closest_key(key, known)
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
    register_plugin_config_keys(f"HOOKS.{name}", section=True)
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
