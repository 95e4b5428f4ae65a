"""A ``config=<name>`` that no configs folder holds is a bare Hydra error.

What breaks: ``vissl/utils/hydra_config.py``, ``compose_hydra_configuration(overrides)``
lets Hydra's ``MissingConfigException`` through for a misspelt ``config=<name>``: it names
the search path, not the config the user meant.  And the overrides a config was composed
with are lost by the time VISSL's inference runs, although the check of inferred values
needs them (a config file's value that the command line made stale is no conflict).

And a config-group option of a group no configs folder holds (``+config/dataset_stats=mine``
run from a directory without ``./configs/config/dataset_stats/``) composes without a word:
Hydra takes ``config/dataset_stats`` for a new top-level key, which VISSL never reads, so the
run goes on without the file (VISSL alone does the same).

Fix (patch ``plugin_config_names``): ``compose_hydra_configuration`` first hands the
overrides to the slot :data:`record_overrides`; when Hydra cannot find the ``config=``
name itself, it raises what the slot :data:`unknown_config_error` builds for that name (an
``UnknownConfigError`` listing the closest config names), chained to Hydra's error; when the
composed config has a top-level ``config/<group>`` key, it raises what the slot
:data:`unknown_group_option_error` builds for that group and option.  The slots are provided
by :mod:`vissl_swav_plugin.config.config_names`.

The patch is applied when this module is imported (``register(now=True)``), before
``apply_all`` applies the other patches, as it was before it moved here, so
``shim_native_amp`` still wraps this replacement, not the reverse.
"""
import functools
from typing import Optional, Tuple

from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.slots import Slot

PATCH = "plugin_config_names"
PROVIDER = "vissl_swav_plugin.config.config_names"
#: ``fn(overrides)``: records the command-line overrides of the config being composed
record_overrides = Slot(PATCH, "record_overrides", PROVIDER)
#: ``fn(name) -> Exception``: the error for a ``config=<name>`` that no configs folder holds
unknown_config_error = Slot(PATCH, "unknown_config_error", PROVIDER)
#: ``fn(group, option) -> Exception``: the error for ``+config/<group>=<option>`` whose group no
#: configs folder holds (Hydra made it a top-level key)
unknown_group_option_error = Slot(PATCH, "unknown_group_option_error", PROVIDER)


def stray_group_key(cfg) -> Optional[Tuple[str, str]]:
    """``(group, option)`` of the first top-level ``config/<group>`` key of a composed config
    (a group option Hydra found no folder for), or None."""
    for key in cfg.keys():
        if isinstance(key, str) and key.startswith("config/"):
            return key, str(cfg[key])
    return None


def missing_config_name(overrides) -> Optional[str]:
    """The ``<name>`` of the first ``config=<name>`` override (not a sweep ``a,b``), or None."""
    for o in overrides:
        if isinstance(o, str) and o.startswith("config=") and "," not in o:
            return o[len("config="):]
    return None


@register(now=True)
def plugin_config_names():
    """vissl/utils/hydra_config.py, compose_hydra_configuration(): overrides recorded, a
    missing ``config=`` name reported with the closest names, a group option of a group no
    configs folder holds reported by name."""
    import vissl.utils.hydra_config as hc
    from hydra.errors import MissingConfigException

    original = raw(hc, "compose_hydra_configuration")

    @functools.wraps(original)
    def compose_hydra_configuration(overrides):
        record_overrides(overrides)
        try:
            cfg = original(overrides)
        except MissingConfigException as e:
            name = missing_config_name(overrides)
            if name is None or f"config/{name}" not in str(e):
                raise
            raise unknown_config_error(name) from e
        stray = stray_group_key(cfg)
        if stray is not None:
            raise unknown_group_option_error(*stray)
        return cfg

    patch(PATCH, hc, "compose_hydra_configuration", compose_hydra_configuration)
