"""A stand-in ``pkg_resources`` for environments whose setuptools no longer ships it.

VISSL 0.1.6 does ``import pkg_resources`` (``vissl.utils.misc`` for the default dataset
catalog path, ``vissl.utils.collect_env`` for apex's version).  setuptools removed
``pkg_resources`` (84.x has none), while torch 2.14 requires ``setuptools>=77.0.3``: pinning
an old setuptools for VISSL makes pip report a conflict with torch.  Instead,
:func:`install` (run at interpreter start-up by ``vissl_swav_plugin.pth``, through
``_autoload.install``) appends a finder to the *end* of ``sys.meta_path``: a real
``pkg_resources`` anywhere on ``sys.path`` is always found first; only when there is none
does ``import pkg_resources`` give this module's two functions.

The stand-in provides what VISSL uses:

* :func:`resource_filename` ``(package, resource)`` -> the file's path, via
  :mod:`importlib.resources`;
* :func:`get_distribution` ``(name)`` -> an object with ``project_name`` and ``version``,
  via :mod:`importlib.metadata`; :class:`DistributionNotFound` when not installed.

Example::

    >>> import pkg_resources  # with setuptools >= 81, this module's stand-in
    >>> pkg_resources.get_distribution("torch").version
    '2.14.1'
"""
import importlib.abc
import importlib.util
import sys

NAME = "pkg_resources"
__all__ = ["DistributionNotFound", "Distribution", "get_distribution", "resource_filename",
           "fixup_namespace_packages", "declare_namespace"]


class DistributionNotFound(Exception):
    """The named distribution is not installed (as ``pkg_resources.DistributionNotFound``)."""


class Distribution:
    """An installed distribution: ``project_name`` and ``version`` (strings)."""

    def __init__(self, project_name: str, version: str):
        self.project_name = project_name
        self.version = version

    def __repr__(self) -> str:
        return f"{self.project_name} {self.version}"


def get_distribution(name: str) -> Distribution:
    """The installed distribution ``name``.

    Args:
        name: a distribution name (``"torch"``), optionally with a version specifier,
            which is ignored (``"torch>=2"``).

    Returns:
        :class:`Distribution` with its name and version.

    Raises:
        DistributionNotFound: ``name`` is not installed.
    """
    import importlib.metadata as metadata
    import re

    bare = re.split(r"[\s<>=!~;\[]", name.strip(), maxsplit=1)[0]
    try:
        dist = metadata.distribution(bare)
    except metadata.PackageNotFoundError:
        raise DistributionNotFound(f"The '{name}' distribution was not found") from None
    return Distribution(dist.metadata["Name"] or bare, dist.version)


def fixup_namespace_packages(path_item: str, parent=None) -> None:
    """No-op: legacy ``pkg_resources``-style namespace packages do not exist on this stack
    (pytest's ``monkeypatch.syspath_prepend`` calls it whenever ``pkg_resources`` is imported)."""


def declare_namespace(package_name: str) -> None:
    """No-op, for the same reason as :func:`fixup_namespace_packages`."""


def resource_filename(package: str, resource: str) -> str:
    """The filesystem path of ``resource`` (a ``/``-separated path) inside ``package``.

    Args:
        package: an importable package name, e.g. ``"configs"``.
        resource: a path relative to it, e.g. ``"config/dataset_catalog.json"``.

    Returns:
        The path as a string (whether or not the file exists, as ``pkg_resources`` does).
    """
    import importlib.resources

    return str(importlib.resources.files(package).joinpath(*resource.split("/")))


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        module.__doc__ = __doc__
        for name in __all__:
            setattr(module, name, globals()[name])


class _FallbackFinder(importlib.abc.MetaPathFinder):
    """Finds ``pkg_resources`` as this module's stand-in; placed after every other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        return importlib.util.spec_from_loader(NAME, _Loader(), origin=__file__)


def install() -> None:
    """Append the fallback finder to ``sys.meta_path`` (idempotent; cheap: nothing is
    imported until something imports ``pkg_resources`` and no real one exists)."""
    if not any(isinstance(f, _FallbackFinder) for f in sys.meta_path):
        sys.meta_path.append(_FallbackFinder())
