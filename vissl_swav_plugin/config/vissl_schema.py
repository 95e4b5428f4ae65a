"""Checks of VISSL's own config sections, when a config is composed (in the launcher
process, before any worker starts).

* **Unknown keys** (:func:`check_vissl_keys`): a key is known when what reads it knows it.
  VISSL reads the keys its ``vissl/config/defaults.yaml`` defines, so a key that neither
  ``defaults.yaml``, one of VISSL's shipped configs nor one of the plugin's configs defines is
  a :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the key with the closest
  known one (the schema: :func:`known_schema`).  Where the reader can be inspected exactly,
  its keys are the known ones: the block ``LOSS.<name>`` of a ``torch.nn`` loss holds the
  constructor's arguments (Classy Vision's ``build_loss`` passes them on;
  :func:`torch_loss_keys`), so ``margn`` is refused naming ``margin``, from a file or with a
  ``+``.  Sections whose keys are free (:func:`is_open`, :func:`open_paths`): a mapping that is
  empty in ``defaults.yaml`` (``COLLATE_FUNCTION_PARAMS``, ``MODEL.TRUNK.REGNET``,
  ``SLURM.ADDITIONAL_PARAMETERS``, ...), ``MODEL.AMP_PARAMS.AMP_ARGS`` (apex's keyword
  arguments), the block of a registered loss or meter that ``defaults.yaml`` lacks (a user's
  component reads what it likes; a loss of this plugin is checked by its own table), the
  entries of lists (``TRANSFORMS``, ``HEAD.PARAMS``: checked by their consumers).  The keys of
  a parameter scheduler (``OPTIMIZER.param_schedulers.<name>``) are ``defaults.yaml``'s plus
  every key a shipped config (VISSL's or ours) gives a scheduler.
* **Keys added on purpose**: a key added with ``+`` (or ``++``) on the command line, which a
  user's own component may read, is accepted and logged once (``added key config....: read by
  no built-in component; fine if yours reads it``) unless it is a typo of a known key of its
  section (one character away, two for keys of 8 or more:
  :func:`~vissl_swav_plugin.config.checkers.typo_of`): ``+config.OPTIMIZER.nam=sgd`` is still
  refused naming ``name``.  A key from a config file gets no such leeway.
* **Switching it off** (:func:`key_check_settings`): ``config.KEY_CHECKS.OPEN_SECTIONS`` (a
  list of dotted sections, ``all`` for every one), ``config.KEY_CHECKS.ENABLED: false``, or the
  environment variable ``VISSL_SWAV_PLUGIN_OPEN_SECTIONS`` (comma-separated, ``all``).  A
  section named there must be one of the composed config or one VISSL or the plugin reads:
  ``config.NOPE`` is refused, naming the key or the variable and the closest sections.
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
* **``config=<name>``** (patch ``plugin_config_names``): a name Hydra cannot find is a
  :class:`UnknownConfigError` listing the closest config names (ours, VISSL's, the working
  directory's).  The same patch records the command-line overrides for
  :func:`~vissl_swav_plugin.config.validation.check_inferred_values`.
"""
import difflib
import functools
import logging
import math
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from vissl_swav_plugin.compat import config_names as names_patch
from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys, typo_of
from vissl_swav_plugin.config.overrides import added_keys, composed_overrides, remember_overrides
from vissl_swav_plugin.config.registries import (
    plugin_config_keys,
    register_config_check,
    register_plugin_config_keys,
    register_pre_inference_check,
)
from vissl_swav_plugin.config.search_path import plugin_configs_dir, vissl_configs_dir
from vissl_swav_plugin.config.yaml_files import load_yaml as _load_yaml, vissl_defaults

#: the marker of a leaf in a schema tree
LEAF = None
#: the mapping of parameter schedulers (``lr``, ``lr_head``, ``weight_decay``, ...: any
#: optimizer option); each one's keys depend on its ``name`` (see :func:`scheduler_keys`)
SCHEDULER_PATH = ("OPTIMIZER", "param_schedulers")
#: sections passed on as keyword arguments (apex's ``amp.initialize``): any key
OPEN_PATHS = {("MODEL", "AMP_PARAMS", "AMP_ARGS")}
#: the plugin's block that switches the unknown-key check off (:func:`key_check_settings`)
KEY_CHECKS = "KEY_CHECKS"
KEY_CHECKS_KEYS = ("ENABLED", "OPEN_SECTIONS")
#: environment variable: comma-separated sections whose keys are not checked (``all``: none is)
OPEN_SECTIONS_ENV = "VISSL_SWAV_PLUGIN_OPEN_SECTIONS"


class UnknownConfigError(ConfigError):
    """``config=<name>`` names no config file; the message lists the closest names."""


def _vissl_configs_dir() -> Optional[Path]:
    return vissl_configs_dir()


def _our_configs_dir() -> Optional[Path]:
    return plugin_configs_dir()


def _config_block(path) -> Optional[dict]:
    """The ``config`` block of a shipped YAML (``# @package _global_`` files), or None."""
    try:
        data = _load_yaml(path)
    except Exception:  # noqa: BLE001 - a file Hydra would reject is reported by Hydra itself
        return None
    block = data.get("config") if isinstance(data, dict) else None
    return block if isinstance(block, dict) else None


def _tree(node):
    """The schema tree of a mapping: ``{key: subtree}``, a non-mapping value is :data:`LEAF`;
    an empty mapping is ``{}`` (an open section)."""
    if isinstance(node, dict):
        return {str(k): _tree(v) for k, v in node.items()}
    return LEAF


def _merge(a, b):
    """Union of two schema trees (a mapping wins over a leaf)."""
    if not isinstance(a, dict):
        return b if isinstance(b, dict) else a
    if not isinstance(b, dict):
        return a
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(a[k], v) if k in a else v
    return out


def _yaml_files(root: Optional[Path]) -> List[Path]:
    return sorted(root.rglob("*.yaml")) if root is not None else []


@functools.lru_cache(maxsize=1)
def _shipped_blocks():
    """``(VISSL's, ours)``: the ``config`` blocks of the shipped configs (read once)."""
    def blocks(root):
        return [b for b in (_config_block(p) for p in _yaml_files(root)) if b is not None]

    return blocks(_vissl_configs_dir()), blocks(_our_configs_dir())


@functools.lru_cache(maxsize=1)
def known_schema() -> dict:
    """The keys VISSL and the plugin read: ``defaults.yaml`` merged with every config VISSL
    ships (keys its code reads that ``defaults.yaml`` lacks: a loss's ``ignore_index``,
    LARS's ``exclude_bias_and_norm``, ...) and every config the plugin ships (its blocks:
    ``HOOKS.PROGRESS``, ``LOSS.swav_plugin_loss``, ...), plus the keys the plugin adds to
    VISSL's schema (``compat.amp.PLUGIN_CONFIG_KEYS``)."""
    from vissl_swav_plugin.compat.amp import PLUGIN_CONFIG_KEYS

    schema = _tree(vissl_defaults())
    vissl_blocks, our_blocks = _shipped_blocks()
    for block in vissl_blocks + our_blocks:
        schema = _merge(schema, _tree(block))
    for key in PLUGIN_CONFIG_KEYS:
        parts = key.split(".")[1:]  # without the leading "config"
        node = schema
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node.setdefault(parts[-1], LEAF)
    return schema


@functools.lru_cache(maxsize=1)
def scheduler_keys() -> frozenset:
    """Every key a parameter scheduler block may have: ``defaults.yaml``'s ``lr`` block and
    every key of an ``OPTIMIZER.param_schedulers.<name>`` block (or of its ``schedulers``
    list) in a shipped config, VISSL's or ours."""
    keys = set(vissl_defaults()["OPTIMIZER"]["param_schedulers"]["lr"])
    vissl_blocks, our_blocks = _shipped_blocks()
    for block in vissl_blocks + our_blocks:
        scheds = (block.get("OPTIMIZER") or {}).get("param_schedulers") if isinstance(block.get("OPTIMIZER"), dict) else None
        for sched in (scheds or {}).values() if isinstance(scheds, dict) else []:
            if isinstance(sched, dict):
                keys |= set(map(str, sched))
                for sub in sched.get("schedulers") or []:
                    if isinstance(sub, dict):
                        keys |= set(map(str, sub))
    return frozenset(keys)


def _registered(kind) -> Iterable[str]:
    if kind == "LOSS":
        from classy_vision.losses import LOSS_REGISTRY

        return LOSS_REGISTRY.keys()
    if kind == "METERS":
        from classy_vision.meters import METER_REGISTRY

        return METER_REGISTRY.keys()
    return ()


def torch_loss_keys(name) -> Optional[frozenset]:
    """The keys the block ``LOSS.<name>`` of a ``torch.nn`` loss may have, or None when
    ``name`` is no such loss (or a registered one, which Classy Vision builds first) or its
    constructor takes ``**kwargs``.  Classy Vision's ``build_loss`` passes the block as the
    constructor's keyword arguments (less ``name``, which VISSL's ``_build_loss`` adds), so
    the constructor's parameters are exactly the keys it reads."""
    import inspect

    import torch.nn.modules.loss as torch_losses

    if name in set(_registered("LOSS")):
        return None
    cls = getattr(torch_losses, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, torch_losses._Loss)):
        return None
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.name != "self" and p.kind is not p.VAR_POSITIONAL) | {"name"}


def exact_reader_keys(path, key) -> Optional[frozenset]:
    """The keys of ``<path>.<key>`` when its reader can be inspected exactly (a ``torch.nn``
    loss block: :func:`torch_loss_keys`): any other key would fail in the workers, with or
    without a ``+``.  None where no such reader is known."""
    if len(path) == 1 and path[0] == "LOSS":
        return torch_loss_keys(key)
    return None


def is_open(path, key) -> bool:
    """Whether ``<path>.<key>`` is a section whose keys are not checked here: the block of a
    registered loss / meter that ``defaults.yaml`` lacks (a user's component reads what it
    likes; the plugin's losses check their own blocks)."""
    return len(path) == 1 and path[0] in ("LOSS", "METERS") and key in set(_registered(path[0]))


@functools.lru_cache(maxsize=1)
def open_paths() -> frozenset:
    """The sections whose keys are free: :data:`OPEN_PATHS` and every mapping that is
    empty in ``defaults.yaml`` (even where a shipped config fills it)."""
    out = set(OPEN_PATHS)

    def visit(node, path):
        for k, v in node.items():
            if isinstance(v, dict):
                if not v:
                    out.add(path + (str(k),))
                visit(v, path + (str(k),))

    visit(vissl_defaults(), ())
    return frozenset(out)


#: the plugin's own sections, whose keys its own tables check (``hook_block`` and the
#: trunk's, the losses' and ``dataset_stats``' checks); other modules add theirs with
#: :func:`~vissl_swav_plugin.config.registries.register_plugin_config_keys`
register_plugin_config_keys("HOOKS.PROGRESS", "HOOKS.COLLAPSE_DETECTOR", "HOOKS.ONLINE_KNN", "HOOKS.PRECISE_BN",
                            "MODEL.TRUNK.RESNET_SMALL_PLUGIN", "DATA.TRAIN.NORMALIZE", "DATA.TEST.NORMALIZE",
                            KEY_CHECKS, section=True)


# -- switching the key checks off: config.KEY_CHECKS and the environment ----------------------
def _section_path(name, where) -> tuple:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where} must name sections as dotted strings (e.g. 'HOOKS.MY_HOOK'), got {name!r}")
    name = name.strip()
    if name == "config" or name.lower() == "all":
        return ()
    return tuple(name[len("config."):].split(".") if name.startswith("config.") else name.split("."))


def _section_in(node, path) -> Optional[bool]:
    """Whether ``path`` leads to a mapping of ``node`` (a config or a schema tree): True, a
    value there: False, nothing there: None."""
    for part in path:
        if not hasattr(node, "items") or part not in node:
            return None
        node = node[part]
    return hasattr(node, "items")


def _sections(node, path=()) -> Iterable[str]:
    """Every dotted section (mapping) of ``node``, depth first."""
    if not hasattr(node, "items"):
        return
    for key, value in node.items():
        if hasattr(value, "items"):
            sub = path + (str(key),)
            yield ".".join(sub)
            yield from _sections(value, sub)


def _require_section(path, cfg, where, given) -> None:
    """``path`` (from :func:`_section_path`) names a section of the composed config ``cfg`` or
    one that VISSL or the plugin reads (:func:`known_schema`, the plugin's registered sections,
    a parameter scheduler, a registered loss or meter); else a :class:`ConfigError` naming
    ``where`` and the closest sections."""
    if not path:
        return
    dotted = ".".join(path)
    found = [_section_in(cfg, path), _section_in(known_schema(), path)]
    if plugin_config_keys().get(dotted) or (len(path) == 2 and is_open(path[:1], path[1])):
        found.append(True)
    if True in found:
        return
    if False in found:
        raise ConfigError(f"{where}: {given!r} names a value, not a section; name the section that holds it "
                          f"(e.g. {'.'.join(path[:-1]) or 'config'!r}), or 'all' for every section")
    names = sorted(set(_sections(cfg)) | set(_sections(known_schema())))
    near = difflib.get_close_matches(dotted, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""
    raise ConfigError(f"{where}: {given!r} names no section of this config{hint}; allowed: the dotted "
                      f"sections of the config (e.g. 'OPTIMIZER', 'HOOKS.MY_HOOK'), or 'all' for every section")


def key_check_settings(cfg):
    """``(enabled, open sections)`` of the unknown-key check for this config: its
    ``config.KEY_CHECKS`` block (``ENABLED``: true / false; ``OPEN_SECTIONS``: dotted
    sections whose keys are free, ``config`` or ``all`` for every one) and the environment
    variable :data:`OPEN_SECTIONS_ENV` (comma-separated sections, ``all`` for every one).
    A bad block, or a section (from either) that is neither in the composed config nor one
    VISSL or the plugin reads, is a :class:`ConfigError` naming the key or the variable."""
    block = cfg.get(KEY_CHECKS) if hasattr(cfg, "get") else None
    block = {} if block is None else block
    where = f"config.{KEY_CHECKS}"
    if not hasattr(block, "items"):
        raise ConfigError(f"{where} must be a mapping (ENABLED, OPEN_SECTIONS), got {block!r}")
    check_known_keys(block, KEY_CHECKS_KEYS, where)
    enabled = block.get("ENABLED", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.ENABLED must be true or false, got {enabled!r}")
    sections = block.get("OPEN_SECTIONS", [])
    if not isinstance(sections, (list, tuple)):
        raise ConfigError(f"{where}.OPEN_SECTIONS must be a list of dotted sections, got {sections!r}")
    given = [(s, f"{where}.OPEN_SECTIONS") for s in sections]
    env = os.environ.get(OPEN_SECTIONS_ENV, "")
    given += [(s, f"{OPEN_SECTIONS_ENV}={env}") for s in env.split(",") if s.strip()]
    opened = set()
    for name, source in given:
        path = _section_path(name, source)
        _require_section(path, cfg, source, name.strip())
        opened.add(path)
    return enabled and () not in opened, frozenset(opened)


# -- the walk ------------------------------------------------------------------------------------
_logged_added = set()


def _log_added_once(full_key) -> None:
    if full_key not in _logged_added:
        _logged_added.add(full_key)
        logging.getLogger(__name__).warning(
            f"added key {full_key}: read by no built-in component; fine if yours reads it")


class _KeyWalk:
    """One check of a composed config: the keys added with ``+`` (from the overrides VISSL's
    ``compose_hydra_configuration`` was given) and the sections the user opened."""

    def __init__(self, cfg):
        self.enabled, self.opened = key_check_settings(cfg)
        self.added = [tuple(k.split(".")) for k in added_keys(composed_overrides())]

    def is_added(self, path) -> bool:
        n = len(path)
        return any(a[:n] == tuple(path) for a in self.added)

    def check(self, block, known, path) -> Iterable[str]:
        """Check ``block``'s keys against ``known``; an unknown key added with ``+`` that is
        close to no known key is accepted (logged once) and returned, to be left unwalked."""
        where = "config." + ".".join(path) if path else "config"
        known = set(known)
        accepted = []
        for key in block:
            key = str(key)
            if key not in known and self.is_added(tuple(path) + (key,)) and typo_of(key, known) is None:
                accepted.append(key)
        check_known_keys({k: None for k in block if str(k) not in accepted}, known, where, suggest=typo_of)
        for key in accepted:
            n = len(path) + 1
            for a in self.added:
                if a[:n] == tuple(path) + (key,):
                    _log_added_once("config." + ".".join(a))
        return accepted

    def walk(self, block, schema, path):
        if not hasattr(block, "items") or tuple(path) in open_paths() or tuple(path) in self.opened:
            return
        plugin = plugin_config_keys()
        here = ".".join(path)
        if here and plugin.get(here):
            return  # a plugin section: its own consumer checks its keys
        prefix = f"{here}." if here else ""
        added = {k[len(prefix):] for k in plugin if k.startswith(prefix) and "." not in k[len(prefix):]}
        if tuple(path) == SCHEDULER_PATH:
            for name, sched in block.items():
                if hasattr(sched, "items") and tuple(path) + (str(name),) not in self.opened:
                    self.check(sched, scheduler_keys(), list(path) + [str(name)])
            return
        if not isinstance(schema, dict) or not schema:
            schema = {} if added else schema
            if not added:
                return  # a leaf in the schema (a value, any type), or an open section
        readers = {str(k): exact_reader_keys(path, k) for k in block}
        known = (set(schema) | added | {k for k in block if is_open(path, k)}
                 | {k for k, r in readers.items() if r is not None})
        skipped = set(self.check(block, known, path))
        for key, value in block.items():
            key = str(key)
            sub = list(path) + [key]
            if key in skipped or tuple(sub) in self.opened:
                continue
            if readers.get(key) is not None:
                if hasattr(value, "items"):
                    self.check(value, readers[key], sub)
            elif key in schema or key in added:
                self.walk(value, schema.get(key) if isinstance(schema, dict) else None, sub)


@register_pre_inference_check
def check_vissl_keys(cfg) -> None:
    """Every key of the composed config is one its reader knows: VISSL's ``defaults.yaml``
    and shipped configs, the plugin's configs, a ``torch.nn`` loss's constructor (open
    sections, keys added with ``+`` and the switches: see the module's doc); else
    :class:`ConfigError` naming the key and the closest known one."""
    walk = _KeyWalk(cfg)
    if walk.enabled:
        walk.walk(cfg, known_schema(), [])


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


# -- config=<name>: the closest names of a missing config ------------------------------------
def config_names() -> List[str]:
    """Every ``config=<name>`` Hydra can resolve: the working directory's ``configs/config``,
    the plugin's, VISSL's (also as ``vissl/<name>``)."""
    names = set()
    vissl_root = _vissl_configs_dir()
    for root in (Path(os.getcwd()) / "configs" / "config", _our_configs_dir(), vissl_root):
        if root is None or not root.is_dir():
            continue
        for f in _yaml_files(root):
            name = f.relative_to(root).with_suffix("").as_posix()
            names.add(name)
            if root == vissl_root:
                names.add(f"vissl/{name}")
    return sorted(names)


def closest_config_names(name: str, n: int = 5) -> List[str]:
    """The ``n`` config names closest to ``name`` (whole name, then its last part)."""
    names = config_names()
    near = difflib.get_close_matches(name, names, n=n, cutoff=0.6)
    if len(near) < n:
        base = name.rsplit("/", 1)[-1]
        by_base: Dict[str, List[str]] = {}
        for full in names:
            by_base.setdefault(full.rsplit("/", 1)[-1], []).append(full)
        for b in difflib.get_close_matches(base, list(by_base), n=n, cutoff=0.6):
            near += [f for f in by_base[b] if f not in near]
    return near[:n]


def unknown_config_error(name: str) -> UnknownConfigError:
    """The error for ``config=<name>`` that no configs folder holds, with the closest names
    (raised by the patch ``plugin_config_names`` on VISSL's ``compose_hydra_configuration``)."""
    near = closest_config_names(name)
    hint = f"; closest names: {', '.join(near)}" if near else "; no config has a close name"
    return UnknownConfigError(
        f"config={name}: no such config (looked for configs/config/{name}.yaml in the working "
        f"directory, the plugin's and VISSL's configs){hint}"
    )


def unknown_group_option_error(group: str, option: str) -> UnknownConfigError:
    """The error for ``+<group>=<option>`` (``group`` is ``config/...``) when no configs folder
    holds the group, so that Hydra composed it as a top-level key that VISSL never reads
    (raised by the patch ``plugin_config_names``)."""
    name = f"{group[len('config/'):]}/{option}"
    near = closest_config_names(name)
    hint = f"; closest names: {', '.join(near)}" if near else ""
    how = (f" (swav-plugin-mean-std TRAIN_FOLDER --name {option} writes it)" if group == "config/dataset_stats"
           else "")
    return UnknownConfigError(
        f"+{group}={option}: no such config (looked for configs/{group}/{option}.yaml in the working "
        f"directory {os.getcwd()}, the plugin's and VISSL's configs); without it the run would go on "
        f"without the file{hint}. Run from the directory that holds configs/{group}/{option}.yaml, or write the file "
        f"there{how}"
    )


# what the patch plugin_config_names calls (compat may not import this layer)
names_patch.record_overrides.provide(remember_overrides)
names_patch.unknown_config_error.provide(unknown_config_error)
names_patch.unknown_group_option_error.provide(unknown_group_option_error)
