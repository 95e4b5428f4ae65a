"""Hydra search path: make ``config=pretrain/swav/...`` resolve to *our* configs.

VISSL's own Hydra plugin prepends ``pkg://configs`` (VISSL's configs) and
``file://configs`` (the working directory).  We register, at run time, a search-path
plugin that prepends our configs directory in front of both, so our configs (which
share some names with VISSL's, e.g. ``pretrain/swav/swav_8node_resnet``) win from any
working directory, while every VISSL config we do not ship stays reachable.
"""
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "vissl_swav_plugin"


def configs_dir() -> Path:
    """Our ``configs`` root: packaged copy (wheel install) or the repository (editable)."""
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "_configs", pkg.parent / "configs"):
        if (candidate / "config").is_dir():
            return candidate
    raise FileNotFoundError(
        f"vissl_swav_plugin: no configs directory found (looked in {pkg / '_configs'} "
        f"and {pkg.parent / 'configs'}); reinstall the package"
    )


class VisslSwavPluginSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.prepend(provider=PROVIDER, path=f"file://{configs_dir()}")


def register() -> None:
    plugins = Plugins.instance()
    name = f"{VisslSwavPluginSearchPath.__module__}.{VisslSwavPluginSearchPath.__name__}"
    if name not in plugins.class_name_to_class:
        plugins.register(VisslSwavPluginSearchPath)


register()
