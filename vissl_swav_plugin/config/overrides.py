"""The command-line overrides of the config under inference.

VISSL's ``compose_hydra_configuration`` gets the overrides (patch ``plugin_config_names``
records them here: :func:`remember_overrides`); VISSL's ``infer_losses_config`` later gets
only the composed config.  The inference driver (:mod:`.validation`) takes the recorded
overrides when it starts (:func:`inference_overrides`), so that its checks can tell what the
command line set: :func:`composed_overrides`, :func:`overridden`, :func:`added_keys`.
"""
import contextlib
import os
from pathlib import Path
from typing import List, Optional

from vissl_swav_plugin.config.yaml_files import leaves, load_yaml

_composed_overrides: List[Optional[List[str]]] = [None]
#: the overrides of the config under inference now (taken from the above when it starts)
_inferring_overrides: List[Optional[List[str]]] = [None]


def remember_overrides(overrides) -> None:
    """Record the command-line overrides of the config being composed (VISSL's
    ``compose_hydra_configuration``: patch ``plugin_config_names``, whose slot
    :mod:`vissl_swav_plugin.config.config_names` fills with this function), for
    :func:`~vissl_swav_plugin.config.validation.check_inferred_values`: a config file's
    value that is stale because the command line changed what it is inferred from
    (``MODEL.HEAD.PARAMS`` and not ``num_prototypes``) is no conflict."""
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


def _take_composed() -> Optional[List[str]]:
    out, _composed_overrides[0] = _composed_overrides[0], None
    return out


def _override_key(o: str) -> str:
    key = o.split("=", 1)[0].lstrip("+~")
    return key[len("config."):] if key.startswith("config.") else key


def overridden(overrides, prefix: str) -> bool:
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
    keys = set(leaves(block))
    return any(k == prefix or k.startswith(prefix + ".") or prefix.startswith(k + ".") for k in keys)


@contextlib.contextmanager
def inference_overrides():
    """For the ``with`` block (one run of the config inference): :func:`composed_overrides`
    gives the overrides recorded when the config was composed, taken so that they serve one
    inference only; None again after the block."""
    _inferring_overrides[0] = _take_composed()
    try:
        yield
    finally:
        _inferring_overrides[0] = None
