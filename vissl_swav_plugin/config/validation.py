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
import functools
import os
from pathlib import Path
import numbers
from typing import Callable, Dict, Iterable, List, Optional

_INFERENCE: Dict[str, Callable] = {}
_CROP_COUNTERS: Dict[str, Callable] = {}
_CHECKS: List[Callable] = []
_LAUNCH_CHECKS: List[Callable] = []
_GLOBAL_INFERENCE: Dict[str, Callable] = {}
_PRE_CHECKS: List[Callable] = []
#: ``{loss name: {inferred key: placeholder}}``: a key VISSL's or our inference fills in, and
#: the value that means "not set" (for VISSL's losses: ``defaults.yaml``'s value, looked up
#: when the loss is not listed here); see :func:`check_inferred_values`
_INFERRED_PLACEHOLDERS: Dict[str, Dict[str, object]] = {}
#: inferred keys whose replacement does not change training: a warning, not an error
WARN_ONLY_INFERRED_KEYS = ("output_dir", "queue_length")


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


_PLUGIN_KEYS: Dict[str, bool] = {}


def register_plugin_config_keys(*keys: str, section: bool = False) -> None:
    """Declare keys a plugin adds to VISSL's config (dotted, without ``config.``; e.g.
    ``"DATA.TRAIN.NORMALIZE"``), so that the check of VISSL's sections
    (:mod:`vissl_swav_plugin.config.vissl_schema`) accepts them.  ``section=True``: the key
    is a mapping whose own keys its consumer checks (not looked into)."""
    for key in keys:
        parts = str(key).split(".")
        for i in range(1, len(parts)):
            _PLUGIN_KEYS.setdefault(".".join(parts[:i]), False)
        _PLUGIN_KEYS[str(key)] = bool(section) or _PLUGIN_KEYS.get(str(key), False)


def plugin_config_keys() -> Dict[str, bool]:
    """``{dotted key: is a section}`` of :func:`register_plugin_config_keys`."""
    return dict(_PLUGIN_KEYS)


def register_pre_inference_check(fn):
    """Decorator: ``fn(cfg)`` checks every composed config *before* VISSL's loss inference
    (which fails with a bare ``AssertionError`` on some inputs, and adds keys of its own);
    it raises :class:`ConfigError` naming the key."""
    if fn not in _PRE_CHECKS:
        _PRE_CHECKS.append(fn)
    return fn


def register_inferred_keys(loss_name: str, placeholders: Dict[str, object]):
    """Declare the keys of ``LOSS.<loss_name>`` that the inference fills in, each with the
    value that means "not set by the user" (``queue.local_queue_length`` for a nested key;
    ``None``: any value is the user's).  A user's value that the inference replaces by
    another is a :class:`ConfigError` naming both (a warning for
    :data:`WARN_ONLY_INFERRED_KEYS`)."""
    _INFERRED_PLACEHOLDERS[loss_name] = dict(placeholders)


def _leaves(block, prefix=""):
    """``{dotted key: value}`` of the leaves of a nested mapping (lists are leaves)."""
    out = {}
    for k, v in (block or {}).items():
        if hasattr(v, "items"):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def load_yaml(path):
    """A YAML file as plain containers (libyaml's loader where available)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path) as f:
        return yaml.load(f, Loader=loader)


@functools.lru_cache(maxsize=1)
def vissl_defaults() -> dict:
    """VISSL's ``vissl/config/defaults.yaml``, its ``config`` block, as plain containers."""
    import vissl

    return load_yaml(os.path.join(os.path.dirname(os.path.abspath(vissl.__file__)), "config", "defaults.yaml"))["config"]


def _vissl_default_loss_block(loss_name):
    return _leaves(((vissl_defaults().get("LOSS") or {}).get(loss_name)) or {})


def check_inferred_values(before: Dict[str, object], cfg) -> None:
    """Compare the loss block as the user composed it (``before``: :func:`_leaves` of
    ``LOSS.<name>`` before any inference) with the inferred one: a value the user set
    (it differs from the placeholder: our table, else VISSL's ``defaults.yaml``) that the
    inference replaced by another raises :class:`ConfigError` naming the key, both values
    and where the inferred one comes from.  ``output_dir`` and ``queue_length`` only warn,
    and so does every key of VISSL's own losses (VISSL's inference replaces them by design
    and its shipped configs carry such values, e.g. ``quick_deepcluster_v2``'s
    ``BATCHSIZE_PER_REPLICA: 64``)."""
    import logging

    name = cfg.LOSS.name
    after = _leaves(cfg.LOSS.get(name) or {})
    placeholders = _INFERRED_PLACEHOLDERS.get(name)
    vissl_loss = placeholders is None  # VISSL's inference: its own configs carry stale values
    if vissl_loss:
        placeholders = _vissl_default_loss_block(name)
    inferred = set(placeholders)
    overrides = composed_overrides()
    conflicts = []
    for key in sorted(inferred):
        if key not in before or key not in after or before[key] == after[key]:
            continue
        if placeholders.get(key) is not None and before[key] == placeholders[key]:
            continue  # the placeholder: not the user's value
        msg = (f"config.LOSS.{name}.{key}={before[key]!r} is replaced by the inferred value "
               f"{after[key]!r} ({INFERRED_SOURCES.get(key, 'inferred from the rest of the config')})")
        if overrides is not None and not _overridden(overrides, f"LOSS.{name}.{key}") and any(
                _overridden(overrides, src) for src in _source_keys(name, key)):
            # the command line changed what it is inferred from, not the key: the config
            # file's value is stale, as expected
            logging.info(msg)
            continue
        if vissl_loss or key.split(".")[-1] in WARN_ONLY_INFERRED_KEYS:
            logging.warning(f"{msg}; remove the key to silence this warning")
        else:
            conflicts.append(msg)
    if conflicts:
        raise ConfigError(
            "; ".join(conflicts) + ": the run would train with the inferred value, not yours; remove the key "
            "or set the setting it is inferred from"
        )


_composed_overrides: List[Optional[List[str]]] = [None]
#: the overrides of the config under inference now (taken from the above when it starts)
_inferring_overrides: List[Optional[List[str]]] = [None]


def remember_overrides(overrides) -> None:
    """Record the command-line overrides of the config being composed (VISSL's
    ``compose_hydra_configuration``, patched by ``config.vissl_schema``), for
    :func:`check_inferred_values`: a config file's value that is stale because the command
    line changed what it is inferred from (``MODEL.HEAD.PARAMS`` and not
    ``num_prototypes``) is no conflict."""
    _composed_overrides[0] = [str(o) for o in overrides]


def composed_overrides() -> Optional[List[str]]:
    """The command-line overrides of the config under inference now (recorded by
    :func:`remember_overrides` when it was composed, taken when the inference starts), or
    None when it was not composed through VISSL's ``compose_hydra_configuration`` (or no
    inference is running)."""
    return None if _inferring_overrides[0] is None else list(_inferring_overrides[0])


def added_keys(overrides) -> List[str]:
    """The dotted keys (without ``config.``) that overrides add on purpose: ``+config.X=v``
    and ``++config.X=v`` (Hydra refuses a key that is not in the config without the ``+``)."""
    out = []
    for o in overrides or []:
        if o.startswith("+") and "=" in o:
            key = o.split("=", 1)[0].lstrip("+")
            if key.startswith("config."):
                out.append(key[len("config."):])
    return out


def _take_overrides() -> Optional[List[str]]:
    out, _composed_overrides[0] = _composed_overrides[0], None
    return out


def _override_key(o: str) -> str:
    key = o.split("=", 1)[0].lstrip("+~")
    return key[len("config."):] if key.startswith("config.") else key


def _overridden(overrides, prefix: str) -> bool:
    """Whether an override sets ``config.<prefix>`` (or a part of it), or picks a config
    group (``+config/...``: anything may change)."""
    for o in overrides:
        key = _override_key(o)
        if key == "config":  # the config file itself
            continue
        if key.startswith("config/"):  # a config group: the keys its file sets
            if _group_sets(key, o.split("=", 1)[1] if "=" in o else "", prefix):
                return True
            continue
        if key == prefix or key.startswith(prefix + ".") or prefix.startswith(key + "."):
            return True
    return False


def _group_file(group: str, name: str):
    """The YAML file of ``+<group>=<name>`` (``config/pretrain/swav/transforms``,
    ``multicrop_2x224``): the working directory's configs, ours, then VISSL's; None if none."""
    from vissl_swav_plugin.config.search_path import plugin_configs_dir, vissl_configs_dir

    rel = Path(*group.split("/")[1:]) / f"{name}.yaml"
    for root in (Path(os.getcwd()) / "configs" / "config", plugin_configs_dir(), vissl_configs_dir()):
        if root is not None and (root / rel).is_file():
            return root / rel
    return None


def _group_sets(group: str, name: str, prefix: str) -> bool:
    """Whether the config group file of ``+<group>=<name>`` sets ``config.<prefix>`` (or a
    part of it); a file that cannot be found or read may set anything."""
    path = _group_file(group, name.strip())
    try:
        block = (load_yaml(path) or {}).get("config") if path is not None else None
    except Exception:  # noqa: BLE001 - unreadable: Hydra reports it; assume it sets anything
        block = None
    if not hasattr(block, "items"):
        return True
    keys = set(_leaves(block))
    return any(k == prefix or k.startswith(prefix + ".") or prefix.startswith(k + ".") for k in keys)


def _source_keys(loss_name: str, key: str) -> List[str]:
    """The config keys an inferred ``LOSS.<loss_name>.<key>`` is computed from."""
    leaf = key.split(".")[-1]
    if leaf in ("num_prototypes", "num_clusters", "embedding_dim", "output_dim"):
        return ["MODEL.HEAD"]
    if leaf == "num_crops":
        return ["DATA.TRAIN.TRANSFORMS"]
    if leaf in ("local_queue_length", "queue_length"):
        return [f"LOSS.{loss_name}.queue.queue_length", "DISTRIBUTED", "DATA.TRAIN.BATCHSIZE_PER_REPLICA"]
    if leaf == "output_dir":
        return ["CHECKPOINT"]
    return ["DATA.TRAIN", "DISTRIBUTED"]


#: where each inferred key comes from, for messages
INFERRED_SOURCES = {
    "num_prototypes": "the prototype head's num_clusters, config.MODEL.HEAD.PARAMS[-1]",
    "num_clusters": "the prototype head's num_clusters, config.MODEL.HEAD.PARAMS[-1]",
    "embedding_dim": "the head's last dims entry, config.MODEL.HEAD.PARAMS[-1]",
    "output_dim": "the head's num_clusters[0], config.MODEL.HEAD.PARAMS[-1]",
    "num_crops": "the crops of config.DATA.TRAIN.TRANSFORMS",
    "output_dir": "the checkpoint folder, config.CHECKPOINT.DIR",
    "queue.local_queue_length": "queue.queue_length / (DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE)",
    "queue.queue_length": "VISSL rounds it down to a multiple of the global batch size",
    "BATCHSIZE_PER_REPLICA": "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA",
    "DROP_LAST": "config.DATA.TRAIN.DROP_LAST",
}


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


def require_str(value, key):
    """``value`` must be a non-empty string, else :class:`ConfigError` naming ``key``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config.{key} must be a non-empty string, got {value!r}")


def _explain_assertion(error: AssertionError, cfg) -> ConfigError:
    """A :class:`ConfigError` for a bare ``AssertionError`` of VISSL's config inference:
    the loss, the failed condition (its source line) and where it is."""
    import linecache
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    frame = frames[-1] if frames else None
    line = (linecache.getline(frame.filename, frame.lineno).strip() if frame else "") or "?"
    where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    detail = f": {error}" if str(error) else ""
    return ConfigError(
        f"VISSL's config inference for config.LOSS.name={cfg.LOSS.name!r} rejects this config: "
        f"`{line}` is false{where}{detail}"
    )


def install() -> None:
    """Wrap ``vissl.utils.hydra_config.infer_losses_config`` through the compat engine
    (patch ``plugin_config_inference``: applied now and once per process, listed by
    ``compat.applied()``, undone by ``compat.disabled("plugin_config_inference")``)."""
    from vissl_swav_plugin import compat

    def plugin_config_inference():
        import vissl.utils.hydra_config as hc

        original = compat.raw(hc, "infer_losses_config")

        def infer_losses_config(cfg):
            _inferring_overrides[0] = _take_overrides()
            try:
                return _checked_inference(cfg)
            finally:
                _inferring_overrides[0] = None

        def _checked_inference(cfg):
            for pre in _PRE_CHECKS:
                pre(cfg)
            before = _leaves(cfg.LOSS.get(cfg.LOSS.name) or {})
            try:
                cfg = original(cfg) or cfg
            except AssertionError as e:
                raise _explain_assertion(e, cfg) from e
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
            # the checks first: they name a more specific cause (a VISSL fragment's head, a
            # mismatch of head and trunk) than a replaced value would
            for check in _CHECKS:
                check(cfg)
            check_inferred_values(before, cfg)
            return cfg

        infer_losses_config.__wrapped__ = original
        compat.patch("plugin_config_inference", hc, "infer_losses_config", infer_losses_config)

    compat.register(plugin_config_inference, now=True)


install()
