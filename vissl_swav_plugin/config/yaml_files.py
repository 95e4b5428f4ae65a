"""YAML files as plain containers: a file, VISSL's ``defaults.yaml``, the leaves of a block; and
the config files a ``configs/config`` folder holds (:func:`shipped_config_names`,
:func:`shipped_config_files`: every module, tool and test that lists configs uses these).

Importing this module has no side effect (the tests' runner of VISSL's own config tests imports it
with the plugin off); :mod:`~vissl_swav_plugin.config.search_path`, which registers the plugin's
Hydra search path, is imported only to find the plugin's configs folder.
"""
import functools
import os
from pathlib import Path
from typing import List, Optional


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


def leaves(block, prefix=""):
    """``{dotted key: value}`` of the leaves of a nested mapping (lists are leaves)."""
    out = {}
    for k, v in (block or {}).items():
        if hasattr(v, "items"):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def _root(root) -> Optional[Path]:
    if root is not None:
        return Path(root)
    from vissl_swav_plugin.config.search_path import plugin_configs_dir

    return plugin_configs_dir()


def shipped_config_files(prefix: str = "", root=None) -> List[Path]:
    """The config files under ``root``, sorted by their name (:func:`shipped_config_names`).

    Args:
        prefix: only the configs whose name starts with it (a group: ``"benchmark/swav_plugin/"``).
        root: a ``configs/config`` folder (VISSL's: ``search_path.vissl_configs_dir()``); default
            the plugin's (``search_path.plugin_configs_dir()``).

    Returns:
        the ``.yaml`` files; [] when there is no such folder.
    """
    root = _root(root)
    if root is None or not root.is_dir():
        return []
    files = {p.relative_to(root).with_suffix("").as_posix(): p for p in root.rglob("*.yaml")}
    return [files[name] for name in sorted(files) if name.startswith(prefix)]


def shipped_config_names(prefix: str = "", root=None) -> List[str]:
    """The ``config=<name>`` names of the configs under ``root``, sorted: a file's path below
    ``root`` without ``.yaml`` (``pretrain/swav/swav_8node_resnet``); ``prefix`` and ``root`` as
    for :func:`shipped_config_files`."""
    root = _root(root)
    return [p.relative_to(root).with_suffix("").as_posix() for p in shipped_config_files(prefix, root)]
