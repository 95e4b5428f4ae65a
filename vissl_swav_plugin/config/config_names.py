"""``config=<name>`` and ``+config/<group>=<option>`` that no configs folder holds: the errors
that name the closest config names, and the command-line overrides recorded for
:func:`~vissl_swav_plugin.config.validation.check_inferred_values`.

VISSL's ``compose_hydra_configuration`` is patched in
:mod:`vissl_swav_plugin.compat.config_names` (patch ``plugin_config_names``); that layer may not
import this one, so this module provides the patch's slots when imported.  It lives in the config
layer, not beside the patch, because it needs the config layer: ``ConfigError``, the recorded
overrides and the configs folders of the search path.
"""
import difflib
import os
from pathlib import Path
from typing import Dict, List

from vissl_swav_plugin.compat import config_names as names_patch
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.overrides import remember_overrides
from vissl_swav_plugin.config.search_path import plugin_configs_dir, vissl_configs_dir
from vissl_swav_plugin.config.yaml_files import shipped_config_names


class UnknownConfigError(ConfigError):
    """``config=<name>`` names no config file; the message lists the closest names."""


def config_names() -> List[str]:
    """Every ``config=<name>`` Hydra can resolve: the working directory's ``configs/config``,
    the plugin's, VISSL's (also as ``vissl/<name>``)."""
    names = set()
    vissl_root = vissl_configs_dir()
    for root in (Path(os.getcwd()) / "configs" / "config", plugin_configs_dir(), vissl_root):
        if root is None or not root.is_dir():
            continue
        for name in shipped_config_names(root=root):
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
