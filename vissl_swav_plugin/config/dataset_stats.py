"""Named normalisation keys: ``config.DATA.<TRAIN|TEST>.NORMALIZE: {MEAN: [r, g, b], STD: [r, g, b]}``.

VISSL's transforms are a list, so their mean/std can only be overridden by position
(``config.DATA.TRAIN.TRANSFORMS.0.mean=...``), which depends on each config's transform
chain.  With this key set, the config inference (run by every launcher when it composes a
config, see :mod:`vissl_swav_plugin.config.validation`) copies ``MEAN`` / ``STD`` into every transform of the
split that normalises: ``multicrop_plugin`` and ``Normalize`` (``mean`` / ``std``).  A
``multicrop_plugin`` with ``normalize: per_image`` (:mod:`.standardize`) takes no mean/std and
is left alone; a split where no transform takes them is an error.

``swav-plugin-mean-std`` writes the key for a dataset as a config file,
``configs/config/dataset_stats/<name>.yaml`` (TRAIN and TEST), used with
``+config/dataset_stats=<name>``; on the command line:
``+config.DATA.TRAIN.NORMALIZE={MEAN:[0.5,0.4,0.3],STD:[0.25,0.24,0.26]}``.
"""
import logging
import math
import numbers

from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.registries import register_global_inference

KEY = "NORMALIZE"
SPLITS = ("TRAIN", "TEST")
NORMALIZING = ("multicrop_plugin", "Normalize")  # transforms with mean / std arguments


def _triple(value, key):
    ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise ConfigError(f"config.{key} must be a list of 3 numbers (R, G, B in [0, 1] units), got {value!r}")
    return [float(v) for v in value]


@register_global_inference("dataset_stats")
def apply_normalize_keys(cfg):
    """Copy ``DATA.<split>.NORMALIZE.{MEAN,STD}`` into the split's normalising transforms.

    Args:
        cfg: VISSL's config (AttrDict, the ``config`` node).

    Returns:
        ``cfg``, changed in place.

    Raises:
        ConfigError: a malformed ``NORMALIZE`` (not 3 numbers, STD <= 0, other keys), or a
            split with transforms of which none takes a mean / std.
    """
    for split in SPLITS:
        data = cfg.DATA.get(split) or {}
        spec = data.get(KEY)
        if not spec:
            continue
        key = f"DATA.{split}.{KEY}"
        if not hasattr(spec, "keys") or set(spec.keys()) != {"MEAN", "STD"}:
            raise ConfigError(f"config.{key} must be {{MEAN: [r, g, b], STD: [r, g, b]}}, got {spec!r}")
        mean, std = _triple(spec["MEAN"], f"{key}.MEAN"), _triple(spec["STD"], f"{key}.STD")
        if min(std) <= 0:
            raise ConfigError(f"config.{key}.STD must be > 0, got {std}")
        transforms = data.get("TRANSFORMS") or []
        # a multicrop_plugin with normalize: per_image standardises each crop by itself
        hits = [t for t in transforms if t.get("name") in NORMALIZING and t.get("normalize") != "per_image"]
        if transforms and not hits:
            raise ConfigError(f"config.{key} is set but no transform of config.DATA.{split}.TRANSFORMS "
                              f"takes a mean/std ({', '.join(NORMALIZING)})")
        for t in hits:
            t["mean"], t["std"] = list(mean), list(std)
        if hits:
            logging.info(f"config.{key}: mean {mean}, std {std} -> {len(hits)} transform(s)")
    return cfg
