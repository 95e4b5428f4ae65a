"""The registries through which the plugin's components extend a config's inference and checks.

A module registers with a decorator when it is imported (``COMPONENT_MODULES`` in
``vissl_swav_plugin/__init__.py``); the inference driver (:mod:`.validation`) and the launch
patch (``plugin_launch_checks``) run what is registered here:

* :func:`register_pre_inference_check` -- ``fn(cfg)`` before VISSL's loss inference;
* :func:`register_global_inference` -- ``fn(cfg)`` after it, for every config;
* :func:`register_config_inference` -- ``fn(cfg)`` for one ``LOSS.name``;
* :func:`register_config_check` -- ``fn(cfg)`` after the inference, for every config;
* :func:`register_launch_check` -- ``fn(cfg)`` when the run is launched (:func:`run_launch_checks`);
* :func:`register_inferred_keys` -- the keys a loss's inference fills in, and their placeholders;
* :func:`register_plugin_config_keys` -- keys a plugin adds to VISSL's sections;
* :func:`register_crop_counter` -- the crops a multi-crop transform produces (:func:`total_num_crops`).

Every check raises :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the key.
"""
from typing import Callable, Dict, List, Optional

_INFERENCE: Dict[str, Callable] = {}
_CROP_COUNTERS: Dict[str, Callable] = {}
_CHECKS: List[Callable] = []
_LAUNCH_CHECKS: List[Callable] = []
_GLOBAL_INFERENCE: Dict[str, Callable] = {}
_PRE_CHECKS: List[Callable] = []
#: ``{loss name: {inferred key: placeholder}}``: a key VISSL's or our inference fills in, and
#: the value that means "not set" (for VISSL's losses: ``defaults.yaml``'s value, looked up
#: when the loss is not listed here); see
#: :func:`~vissl_swav_plugin.config.validation.check_inferred_values`
_INFERRED_PLACEHOLDERS: Dict[str, Dict[str, object]] = {}
#: ``{dotted key: is a section}``: the keys plugins add to VISSL's sections
_PLUGIN_KEYS: Dict[str, bool] = {}


def register_config_inference(loss_name: str):
    """Decorator: ``fn(cfg)`` runs (after VISSL's inference) when ``LOSS.name == loss_name``."""

    def deco(fn):
        _INFERENCE[loss_name] = fn
        return fn

    return deco


def register_config_check(fn):
    """Decorator: ``fn(cfg)`` checks every composed config (whatever the loss), after the
    loss inference; it raises :class:`~vissl_swav_plugin.config.checkers.ConfigError`
    naming the key."""
    if fn not in _CHECKS:
        _CHECKS.append(fn)
    return fn


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
    it raises :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the key."""
    if fn not in _PRE_CHECKS:
        _PRE_CHECKS.append(fn)
    return fn


def register_inferred_keys(loss_name: str, placeholders: Dict[str, object]):
    """Declare the keys of ``LOSS.<loss_name>`` that the inference fills in, each with the
    value that means "not set by the user" (``queue.local_queue_length`` for a nested key;
    ``None``: any value is the user's).  A user's value that the inference replaces by
    another is a :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming both (a warning for
    :data:`~vissl_swav_plugin.config.validation.WARN_ONLY_INFERRED_KEYS`)."""
    _INFERRED_PLACEHOLDERS[loss_name] = dict(placeholders)


def inferred_placeholders(loss_name: str) -> Optional[Dict[str, object]]:
    """The placeholders of :func:`register_inferred_keys` for ``loss_name``, or None when the
    loss declared none (one of VISSL's losses)."""
    return _INFERRED_PLACEHOLDERS.get(loss_name)


def register_launch_check(fn):
    """Decorator: ``fn(cfg)`` checks a run when it is *launched*, not when its config is
    composed: in the launcher process, before any worker starts (VISSL's
    ``launch_distributed`` and ``launch_distributed_on_slurm`` run :func:`run_launch_checks`
    first, patch ``plugin_launch_checks``).  For the checks that need the whole run: head
    against trunk width, dataset size against batch and processes, data paths.  A plain
    composition (a config browser, VISSL's own tests, a script that composes and then
    changes the trunk) does not run them.  ``fn`` raises
    :class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the keys."""
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


def pre_inference_checks() -> List[Callable]:
    """The checks of :func:`register_pre_inference_check`, in registration order."""
    return list(_PRE_CHECKS)


def global_inferences() -> List[Callable]:
    """The inferences of :func:`register_global_inference`, in registration order."""
    return list(_GLOBAL_INFERENCE.values())


def loss_inference(loss_name: str) -> Optional[Callable]:
    """The inference of :func:`register_config_inference` for ``loss_name``, or None."""
    return _INFERENCE.get(loss_name)


def config_checks() -> List[Callable]:
    """The checks of :func:`register_config_check`, in registration order."""
    return list(_CHECKS)
