"""A ``config=<name>`` that no configs folder holds is a bare Hydra error.

What breaks: ``vissl/utils/hydra_config.py``, ``compose_hydra_configuration(overrides)``
lets Hydra's ``MissingConfigException`` through for a misspelt ``config=<name>``: it names
the search path, not the config the user meant.  And the overrides a config was composed
with are lost by the time VISSL's inference runs, although the check of inferred values
needs them (a config file's value that the command line made stale is no conflict).

Fix (patch ``plugin_config_names``): ``compose_hydra_configuration`` first hands the
overrides to the slot :data:`record_overrides`; when Hydra cannot find the ``config=``
name itself, it raises what the slot :data:`unknown_config_error` builds for that name (an
``UnknownConfigError`` listing the closest config names), chained to Hydra's error.  Both
slots are provided by :mod:`vissl_swav_plugin.config.vissl_schema`.

The patch is applied when this module is imported (``register(now=True)``), before
``apply_all`` applies the other patches, as it was before it moved here, so
``shim_native_amp`` still wraps this replacement, not the reverse.
"""
import functools
from typing import Optional

from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.slots import Slot

PATCH = "plugin_config_names"
PROVIDER = "vissl_swav_plugin.config.vissl_schema"
#: ``fn(overrides)``: records the command-line overrides of the config being composed
record_overrides = Slot(PATCH, "record_overrides", PROVIDER)
#: ``fn(name) -> Exception``: the error for a ``config=<name>`` that no configs folder holds
unknown_config_error = Slot(PATCH, "unknown_config_error", PROVIDER)


def missing_config_name(overrides) -> Optional[str]:
    """The ``<name>`` of the first ``config=<name>`` override (not a sweep ``a,b``), or None."""
    for o in overrides:
        if isinstance(o, str) and o.startswith("config=") and "," not in o:
            return o[len("config="):]
    return None


@register(now=True)
def plugin_config_names():
    """vissl/utils/hydra_config.py, compose_hydra_configuration(): overrides recorded, a
    missing ``config=`` name reported with the closest names."""
    import vissl.utils.hydra_config as hc
    from hydra.errors import MissingConfigException

    original = raw(hc, "compose_hydra_configuration")

    @functools.wraps(original)
    def compose_hydra_configuration(overrides):
        record_overrides(overrides)
        try:
            return original(overrides)
        except MissingConfigException as e:
            name = missing_config_name(overrides)
            if name is None or f"config/{name}" not in str(e):
                raise
            raise unknown_config_error(name) from e

    patch(PATCH, hc, "compose_hydra_configuration", compose_hydra_configuration)
