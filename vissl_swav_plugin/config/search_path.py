"""Hydra search path: which ``configs`` tree a ``config=<name>`` comes from.

VISSL's own Hydra plugin puts two entries in front of Hydra's search path: ``file://configs``
(a ``configs/`` folder in the working directory) and ``pkg://configs`` (VISSL's packaged
configs).  With the plugin on, the order is:

1. the **user's working directory** (``./configs/config/<name>.yaml``): a user's own config
   wins, as in stock VISSL;
2. **ours** (:func:`configs_dir`): ``config=pretrain/swav/swav_8node_resnet`` means the
   plugin's config (which uses our loss) from any working directory without such a file;
3. **VISSL's** packaged configs: every VISSL config we do not ship;
4. **VISSL's originals under the prefix** ``vissl/``: ``config=vissl/pretrain/swav/swav_8node_resnet``
   is VISSL's own config of that name, even though ours shadows it (config groups too:
   ``+config/vissl/pretrain/swav/models=resnext101``).

Each entry is served by a :class:`LoggedConfigSource`, which writes one line per config
file under ``config/`` that Hydra loads, naming the file and where it came from::

    config pretrain/swav/swav_8node_resnet from /home/me/configs/config/pretrain/swav/swav_8node_resnet.yaml (user working directory)

The line goes to VISSL's log when logging is set up, else to stdout (VISSL's launcher
composes the config before it sets up logging).
"""
import importlib.resources
import logging
import os
from pathlib import Path
from typing import List, Optional

from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.config_search_path import ConfigSearchPath, SearchPathElement
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "vissl_swav_plugin"  # the provider name our search-path entries show in Hydra
CWD_CONFIGS = "file://configs"  # VISSL's working-directory entry
VISSL_CONFIGS = "pkg://configs"  # VISSL's packaged configs
ORIGINALS_PREFIX = "vissl"  # config=vissl/<name>: VISSL's own config <name>
GROUP = "config"  # VISSL's configs all live in the "config" group
LABEL_CWD, LABEL_OURS, LABEL_VISSL = "user working directory", "vissl-swav-plugin", "VISSL"


def configs_dir() -> Path:
    """Our ``configs`` root: packaged copy (wheel install) or the repository (editable).

    Returns:
        the package's ``_configs`` (a wheel's copy) if it holds a ``config`` folder, else the
        repository's ``configs`` next to the package.

    Raises:
        FileNotFoundError: neither exists (a broken install).
    """
    pkg = Path(__file__).resolve().parents[1]  # the package (this module is in config/)
    for candidate in (pkg / "_configs", pkg.parent / "configs"):
        if (candidate / "config").is_dir():
            return candidate
    raise FileNotFoundError(
        f"vissl_swav_plugin: no configs directory found (looked in {pkg / '_configs'} "
        f"and {pkg.parent / 'configs'}); reinstall the package"
    )


def _emit(line: str) -> None:
    """Log ``line`` at INFO through VISSL's logger, or print it when logging is not set up."""
    if logging.root.handlers:
        logging.info(line)
    else:
        print(f"INFO vissl_swav_plugin: {line}", flush=True)


class LoggedConfigSource(ConfigSource):
    """A Hydra config source that delegates to another one and reports what it loads.

    Its search-path entry is ``swav-plugin://<inner url>``, e.g.
    ``swav-plugin://file://configs``; the inner source is Hydra's own for that scheme.
    Loading a config under ``config/`` logs its name, file and origin (see the module
    docstring).  Subclasses map config paths (:meth:`inner_path`).
    """

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        inner_scheme = self.path.split("://", 1)[0] if "://" in self.path else "file"
        self.inner = SourcesRegistry.instance().resolve(inner_scheme)(provider, self.path)

    @staticmethod
    def scheme() -> str:
        """The URL scheme of this source: ``swav-plugin``."""
        return "swav-plugin"

    def inner_path(self, config_path: str) -> Optional[str]:
        """The path in the inner source that serves ``config_path`` (here: itself)."""
        return config_path

    def label(self, file: str) -> str:
        """Where ``file`` comes from: ours (under :func:`configs_dir`), VISSL's, or the user's."""
        ours = str(configs_dir().resolve())
        if file == ours or file.startswith(ours + os.sep):
            return LABEL_OURS
        return LABEL_VISSL if self.inner.scheme() == "pkg" else LABEL_CWD

    def _file_of(self, path: str) -> str:
        name = self._normalize_file_name(path)
        if self.inner.scheme() == "pkg":
            try:
                return str(importlib.resources.files(self.inner.path).joinpath(name))
            except (ImportError, TypeError):
                return f"{self.inner.full_path()}/{name}"
        return os.path.realpath(os.path.join(self.inner.path, name))

    def load_config(self, config_path: str) -> ConfigResult:
        """Load ``config_path`` from the inner source; log it when it is a VISSL config."""
        path = self.inner_path(config_path)
        result = self.inner.load_config(path)
        if config_path.startswith(GROUP + "/"):
            file = self._file_of(path)
            name, label = config_path[len(GROUP) + 1:], self.label(file)
            _emit(f"config {name} from {file} ({label})")
        return result

    def available(self) -> bool:
        """Whether the inner source exists (e.g. the working directory has ``configs/``)."""
        return self.inner.available()

    def is_group(self, config_path: str) -> bool:
        """Whether ``config_path`` is a config group (a folder) here."""
        path = self.inner_path(config_path)
        return path is not None and self.inner.is_group(path)

    def is_config(self, config_path: str) -> bool:
        """Whether ``config_path`` is a config (a YAML file) here."""
        path = self.inner_path(config_path)
        return path is not None and self.inner.is_config(path)

    def list(self, config_path: str, results_filter) -> List[str]:
        """Names of the configs / groups in the group ``config_path``."""
        path = self.inner_path(config_path)
        return [] if path is None else self.inner.list(path, results_filter)


class VisslOriginalsConfigSource(LoggedConfigSource):
    """VISSL's packaged configs under the prefix ``config/vissl/``: serves
    ``config/vissl/<name>`` from VISSL's ``config/<name>``, and nothing else (plus the
    group ``vissl`` in the ``config`` listing).  Search-path entry:
    ``swav-plugin-vissl://pkg://configs``."""

    @staticmethod
    def scheme() -> str:
        """The URL scheme of this source: ``swav-plugin-vissl``."""
        return "swav-plugin-vissl"

    def inner_path(self, config_path: str) -> Optional[str]:
        """``config/vissl/<rest>`` -> ``config/<rest>``; any other path -> None."""
        prefix = f"{GROUP}/{ORIGINALS_PREFIX}"
        if config_path == prefix or config_path.startswith(prefix + "/"):
            return GROUP + config_path[len(prefix):]
        return None

    def label(self, file: str) -> str:
        """Always ``"VISSL"``."""
        return LABEL_VISSL

    def is_group(self, config_path: str) -> bool:
        """``config`` (holding ``vissl``) and the groups of VISSL's tree under ``config/vissl``."""
        return config_path == GROUP or super().is_group(config_path)

    def list(self, config_path: str, results_filter) -> List[str]:
        """``["vissl"]`` for the ``config`` group; VISSL's listing under ``config/vissl``."""
        if config_path == GROUP:
            return [] if results_filter == ObjectType.CONFIG else [ORIGINALS_PREFIX]
        return super().list(config_path, results_filter)


class VisslSwavPluginSearchPath(SearchPathPlugin):
    """Hydra search-path plugin: user's working directory, ours, VISSL's, VISSL's under
    ``vissl/`` (see the module docstring)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Replace VISSL's two entries by the four of the module docstring, in front of
        the search path (Hydra calls this when it composes a config)."""
        elements = search_path.get_path()
        ours = [
            SearchPathElement("vissl", f"{LoggedConfigSource.scheme()}://{CWD_CONFIGS}"),
            SearchPathElement(PROVIDER, f"{LoggedConfigSource.scheme()}://file://{configs_dir()}"),
            SearchPathElement("vissl", f"{LoggedConfigSource.scheme()}://{VISSL_CONFIGS}"),
            SearchPathElement(PROVIDER, f"{VisslOriginalsConfigSource.scheme()}://{VISSL_CONFIGS}"),
        ]
        replaced = {CWD_CONFIGS, VISSL_CONFIGS} | {e.path for e in ours}
        elements[:] = ours + [e for e in elements if e.path not in replaced]


def register() -> None:
    """Register the search-path plugin and the two config sources with Hydra's plugin
    registry, once (idempotent; called on import of this module)."""
    plugins = Plugins.instance()
    for cls in (LoggedConfigSource, VisslOriginalsConfigSource, VisslSwavPluginSearchPath):
        if f"{cls.__module__}.{cls.__name__}" not in plugins.class_name_to_class:
            plugins.register(cls)


register()


def vissl_configs_dir() -> Optional[Path]:
    """VISSL's packaged ``configs/config`` folder (site-packages/configs), or None."""
    try:
        import configs  # VISSL installs its YAML files as the top-level package ``configs``

        root = Path(list(configs.__path__)[0]) / "config"
        return root if root.is_dir() else None
    except Exception:  # noqa: BLE001 - not installed: no VISSL configs
        return None


def plugin_configs_dir() -> Optional[Path]:
    """The plugin's ``configs/config`` folder, or None."""
    try:
        root = configs_dir() / "config"
    except FileNotFoundError:
        return None
    return root if root.is_dir() else None
