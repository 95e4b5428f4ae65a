"""The config inference driver: VISSL's loss inference with the plugin's inference and checks.

VISSL fills in derived loss settings (number of crops, prototypes, queue length per
process, ...) in ``vissl.utils.hydra_config.infer_losses_config``, called by
``convert_to_attrdict`` when any launcher composes a config.  The patch
``plugin_config_inference`` (:mod:`vissl_swav_plugin.compat.config_inference`) hands every
call to :func:`infer_and_check`, which this module provides when it is imported: after
VISSL's own inference, the inference registered for our loss names runs too
(:mod:`.registries`), and the config is *validated*: a wrong value raises
:class:`~vissl_swav_plugin.config.checkers.ConfigError` naming the full key
(``config.LOSS.swav_plugin_loss.epsilon must be > 0, got 0``) before any process is started,
and a user's value that the inference replaced is an error (:func:`check_inferred_values`).

The pieces live beside this module: ``ConfigError`` and the key / value checkers in
:mod:`.checkers`, the ``register_*`` decorators in :mod:`.registries`, the command-line
overrides in :mod:`.overrides`, the YAML helpers in :mod:`.yaml_files`.
"""
import logging
import os
from typing import Dict, List

from vissl_swav_plugin.compat import config_inference as inference_patch
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.overrides import composed_overrides, inference_overrides, overridden
from vissl_swav_plugin.config.registries import (
    config_checks,
    global_inferences,
    inferred_placeholders,
    loss_inference,
    pre_inference_checks,
)
from vissl_swav_plugin.config.yaml_files import leaves, vissl_defaults

#: inferred keys whose replacement does not change training: a warning, not an error
WARN_ONLY_INFERRED_KEYS = ("output_dir", "queue_length")


def _vissl_default_loss_block(loss_name):
    return leaves(((vissl_defaults().get("LOSS") or {}).get(loss_name)) or {})


def check_inferred_values(before: Dict[str, object], cfg) -> None:
    """Compare the loss block as the user composed it (``before``: the
    :func:`~vissl_swav_plugin.config.yaml_files.leaves` of ``LOSS.<name>`` before any
    inference) with the inferred one: a value the user set
    (it differs from the placeholder: our table, else VISSL's ``defaults.yaml``) that the
    inference replaced by another raises :class:`ConfigError` naming the key, both values
    and where the inferred one comes from.  ``output_dir`` and ``queue_length`` only warn,
    and so does every key of VISSL's own losses (VISSL's inference replaces them by design
    and its shipped configs carry such values, e.g. ``quick_deepcluster_v2``'s
    ``BATCHSIZE_PER_REPLICA: 64``)."""
    name = cfg.LOSS.name
    after = leaves(cfg.LOSS.get(name) or {})
    placeholders = inferred_placeholders(name)
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
        if overrides is not None and not overridden(overrides, f"LOSS.{name}.{key}") and any(
                overridden(overrides, src) for src in _source_keys(name, key)):
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


def infer_and_check(cfg, vissl_infer_losses_config):
    """The whole inference of a composed config, in the order that names the most specific
    cause of a problem: the pre-inference checks, VISSL's inference
    (``vissl_infer_losses_config``; a failed assertion becomes a :class:`ConfigError`), the
    global inferences, the inference of ``LOSS.name``, the config checks, then
    :func:`check_inferred_values`.  Meanwhile the overrides recorded when the config was
    composed are :func:`~vissl_swav_plugin.config.overrides.composed_overrides`.

    Returns:
        the inferred config (VISSL's ``infer_losses_config`` contract).
    """
    with inference_overrides():
        for pre in pre_inference_checks():
            pre(cfg)
        before = leaves(cfg.LOSS.get(cfg.LOSS.name) or {})
        try:
            cfg = vissl_infer_losses_config(cfg) or cfg
        except AssertionError as e:
            raise _explain_assertion(e, cfg) from e
        for global_fn in global_inferences():
            cfg = global_fn(cfg) or cfg
        fn = loss_inference(cfg.LOSS.name)
        if fn is not None:
            if cfg.LOSS.name not in cfg.LOSS:
                raise ConfigError(
                    f"config.LOSS.{cfg.LOSS.name} is missing: LOSS.name is {cfg.LOSS.name!r} but "
                    "its parameter block is absent (use one of the plugin's configs)"
                )
            cfg = fn(cfg) or cfg
        # the checks first: they name a more specific cause (a VISSL fragment's head, a
        # mismatch of head and trunk) than a replaced value would
        for check in config_checks():
            check(cfg)
        check_inferred_values(before, cfg)
        return cfg


# what the patch plugin_config_inference calls (compat may not import this layer)
inference_patch.inference.provide(infer_and_check)
