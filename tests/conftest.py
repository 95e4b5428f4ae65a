"""Test layout and markers.

``tests/unit/`` holds the tests that run in this process only; ``tests/integration/`` the
ones that start VISSL's launcher, gloo workers or any other process.  Every test gets the
marker of its folder (``unit`` / ``integration``), so ``pytest -m "not integration"`` and
``make test-fast`` (``tests/unit``) select the fast subset.  A unit test that starts a process
fails with a message that says to move it.  Shared helpers live in ``tests/helpers/`` (put
on ``sys.path`` here; ``tests/`` is not a package: VISSL owns the top-level name ``tests``).
"""
import multiprocessing.process
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))

from testkit import REPO  # noqa: E402

KINDS = ("unit", "integration")

# the demo's measured --amp auto keeps its answer in a per-user cache: the suite (and every demo
# or launcher it starts, which inherit the variable) uses a folder of its own, never the user's
if "VISSL_SWAV_PLUGIN_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["VISSL_SWAV_PLUGIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="vissl_swav_plugin_test_cache_")


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: runs in the test process only (tests/unit; make test-fast)")
    config.addinivalue_line("markers", "integration: starts a launcher, gloo workers or a subprocess (tests/integration)")
    share_the_cores()


def share_the_cores():
    """A pytest-xdist worker runs its own torch and BLAS work on its share of the cores
    (cores // workers, at least 1) instead of on every core: beside the other workers, a pool
    of one thread per core waits on itself (OpenMP threads spin for the core another worker
    holds; measured in docs/development.md, "Where make test's time goes").  Only this process:
    the environment, and with it every process a test starts, is left as it is; outside
    pytest-xdist nothing changes."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    # the thread pools of libraries loaded later keep their defaults: SciPy's own OpenBLAS and
    # scikit-learn's own OpenMP are loaded here, before the limit
    import scipy.linalg  # noqa: F401
    import sklearn  # noqa: F401
    import torch
    from threadpoolctl import threadpool_limits

    share = max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(share)
    threadpool_limits(limits=share)


def kind_of(path) -> str:
    """``unit`` or ``integration`` from the test file's folder (anything else is an error)."""
    rel = Path(path).resolve().relative_to(TESTS)
    if rel.parts[0] not in KINDS:
        raise pytest.UsageError(f"{rel}: every test file lives under tests/unit or tests/integration")
    return rel.parts[0]


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(kind_of(item.path))


class ProcessStarted(AssertionError):
    """A unit test started a process."""


def _refuse(what):
    def refuse(*args, **kwargs):
        raise ProcessStarted(f"a unit test started a process ({what}): move the test to tests/integration")

    return refuse


_imported = False


def _import_once():
    """VISSL and what it imports, imported before the first unit test: some libraries run a
    command the first time they are imported (``ctypes.util.find_library`` runs ``ldconfig``;
    matplotlib's font manager runs ``fc-list`` when it builds its font cache, the first time on
    a machine), which is the import's doing, not the test's."""
    global _imported
    if not _imported:
        import matplotlib.font_manager  # noqa: F401
        import vissl  # noqa: F401  (registers the plugin through the .pth hook)
        import vissl.data  # noqa: F401
        import vissl.models  # noqa: F401
        import vissl.utils.distributed_launcher  # noqa: F401

        _imported = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test of ``tests/unit`` -- its fixtures' set-up and tear-down included, module-scoped
    ones too -- cannot start a process: ``subprocess``, ``multiprocessing`` and ``os.fork``
    raise :class:`ProcessStarted`."""
    if item.get_closest_marker("integration") is not None:
        yield
        return
    _import_once()
    saved = [(subprocess.Popen, "__init__", subprocess.Popen.__init__),
             (multiprocessing.process.BaseProcess, "start", multiprocessing.process.BaseProcess.start),
             (os, "fork", os.fork)]
    subprocess.Popen.__init__ = _refuse("subprocess")
    multiprocessing.process.BaseProcess.start = _refuse("multiprocessing")
    os.fork = _refuse("os.fork")
    try:
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


@pytest.fixture
def repo():
    """The repository's root folder."""
    return REPO
