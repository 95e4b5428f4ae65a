"""The schema of VISSL's own config sections: the keys a composed config may have, checked when
a config is composed (in the launcher process, before any worker starts).  The checks of their
values are :mod:`~vissl_swav_plugin.config.vissl_values`; the names of ``config=<name>``,
:mod:`~vissl_swav_plugin.config.config_names`.

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
"""
import difflib
import functools
import logging
import os
from typing import Iterable, Optional

from vissl_swav_plugin.config.checkers import ConfigError, check_known_keys, typo_of
from vissl_swav_plugin.config.overrides import added_keys, composed_overrides
from vissl_swav_plugin.config.registries import (
    plugin_config_keys,
    register_plugin_config_keys,
    register_pre_inference_check,
)
from vissl_swav_plugin.config.search_path import plugin_configs_dir, vissl_configs_dir
from vissl_swav_plugin.config.yaml_files import load_yaml as _load_yaml, shipped_config_files, vissl_defaults

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

@functools.lru_cache(maxsize=1)
def _shipped_blocks():
    """``(VISSL's, ours)``: the ``config`` blocks of the shipped configs (read once)."""
    def blocks(root):
        files = shipped_config_files(root=root) if root is not None else []
        return [b for b in (_config_block(p) for p in files) if b is not None]

    return blocks(vissl_configs_dir()), blocks(plugin_configs_dir())


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
