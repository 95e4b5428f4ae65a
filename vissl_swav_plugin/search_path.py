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

PROVIDER = "vissl_swav_plugin"  # the provider name our search-path entry shows in Hydra


def configs_dir() -> Path:
    """Our ``configs`` root: packaged copy (wheel install) or the repository (editable).

    Returns:
        ``vissl_swav_plugin/_configs`` if it holds a ``config`` folder, else the
        repository's ``configs`` next to the package.

    Raises:
        FileNotFoundError: neither exists (a broken install).
    """
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "_configs", pkg.parent / "configs"):
        if (candidate / "config").is_dir():
            return candidate
    raise FileNotFoundError(
        f"vissl_swav_plugin: no configs directory found (looked in {pkg / '_configs'} "
        f"and {pkg.parent / 'configs'}); reinstall the package"
    )


class VisslSwavPluginSearchPath(SearchPathPlugin):
    """Hydra search-path plugin that puts our configs directory first."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Prepend ``file://<configs_dir()>`` to Hydra's config search path (Hydra calls
        this when it composes a config)."""
        search_path.prepend(provider=PROVIDER, path=f"file://{configs_dir()}")


def register() -> None:
    """Register :class:`VisslSwavPluginSearchPath` with Hydra's plugin registry, once
    (idempotent; called on import of this module)."""
    plugins = Plugins.instance()
    name = f"{VisslSwavPluginSearchPath.__module__}.{VisslSwavPluginSearchPath.__name__}"
    if name not in plugins.class_name_to_class:
        plugins.register(VisslSwavPluginSearchPath)


register()
