"""Ctrl-C / SIGTERM of a launcher exits non-zero, and no process outlives the launcher.

Compat patch ``shim_launcher_signals`` (see :mod:`vissl_swav_plugin.compat`).  What breaks
in VISSL 0.1.6 and the fix:

Ctrl-C / SIGTERM reported as success
    ``vissl/utils/distributed_launcher.py``, ``launch_distributed`` wraps
    ``torch.multiprocessing.spawn`` in ``except (KeyboardInterrupt, RuntimeError)``: a
    Ctrl-C is logged ("Wrapping up, caught exception") and swallowed, the launcher prints
    "All Done!" and exits with code 0 -- a scheduler or a shell script takes the
    interrupted run for a finished one.  Now ``launch_distributed`` (every launcher that
    calls it: VISSL's stock ``tools/run_distributed_engines.py`` and the plugin's) turns
    SIGINT, SIGTERM and SIGHUP into :class:`LauncherStopped`, which VISSL does not catch;
    the launcher then stops every process it started (training ranks, forkservers,
    DataLoader workers: SIGTERM, after :data:`GRACE_S` seconds SIGKILL), says so, and
    exits with ``128 + signal`` (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP) without
    "All Done!".  Processes that stay after any other end of the launcher (a rank killed,
    an exception) are stopped the same way before it exits.

Orphans holding the output pipe
    When a rank dies (``kill -9``, OOM killer), torch's ``spawn`` SIGTERMs the other ranks
    and raises, but the ranks' forkserver and DataLoader worker processes are not the
    launcher's children: they are re-parented to init, keep each other alive (the worker
    watches its parent, the forkserver; the forkserver waits for the worker) and hold the
    launcher's stdout, so ``launcher | tee log`` never ends.  Now the launcher is a child
    sub-reaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux): orphans of its ranks become its
    children, and it stops them before it exits.  Every process of the run (ranks,
    forkservers, spawned and forked DataLoader workers) also watches the launcher
    (``VISSL_SWAV_PLUGIN_LAUNCHER=<pid>:<start time>``, a ``pidfd`` or a 1 s poll) and
    exits as soon as the launcher is gone, even after a ``kill -9`` of the launcher.

A caller that goes on after ``launch_distributed`` (a notebook, tests that train in their own
process as VISSL's do) gets its state back when the run ends: its own multiprocessing
forkserver is left running (multiprocessing reuses it for the next run; it exits with the
process), and the sub-reaper flag and ``VISSL_SWAV_PLUGIN_LAUNCHER`` are what they were.
"""
import logging
import os
import select
import signal
import sys
import threading
import time

from vissl_swav_plugin.compat.engine import after_import, original, patch, patched_by, raw, register

logger = logging.getLogger(__name__)

NAME = "shim_launcher_signals"
#: ``<pid>:<start time>`` of the launcher of this run (set by the launcher, inherited).
LAUNCHER_ENV = "VISSL_SWAV_PLUGIN_LAUNCHER"
#: Seconds the launcher's processes get between SIGTERM and SIGKILL.
GRACE_S = 10.0
SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_watching = {"pid": None}  # the process that runs a watchdog thread


class LauncherStopped(BaseException):
    """A signal stopped the launcher (a BaseException: VISSL's handlers do not catch it).

    Attributes:
        signum: the signal number; the launcher exits with ``128 + signum``.
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# --------------------------------------------------------------------------------------
# /proc helpers (Linux); elsewhere they find nothing and the launcher only exits non-zero
# --------------------------------------------------------------------------------------
def _stat(pid: int):
    """(parent pid, start time) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[19].decode()


def _descendants(root: int) -> dict:
    """pid -> start time of every live descendant of ``root``."""
    children = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        st = _stat(pid)
        if st:
            children.setdefault(st[0], []).append((pid, st[1]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), ()):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _reap(pids) -> None:
    """Collect those of ``pids`` that exited and are our children (orphans adopted as
    sub-reaper included); other children's exit statuses are left to their owners."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _signal_all(procs: dict, sig) -> None:
    for pid, start in procs.items():
        st = _stat(pid)
        if st and st[1] == start:  # the same process, not a re-used pid
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _alive(procs: dict) -> dict:
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st and st[1] == start and not _zombie(pid):
            out[pid] = start
    return out


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _run_processes(me: int, keep: dict) -> dict:
    return {p: s for p, s in _descendants(me).items()
            if keep.get(p) != s and b"resource_tracker" not in _cmdline(p)}


def stop_processes(grace_s: float = GRACE_S, keep=None) -> int:
    """Stop every process this one started (and orphans it adopted): SIGTERM, then after
    ``grace_s`` seconds SIGKILL.  multiprocessing's resource tracker is left to exit by
    itself (it cleans up shared memory when the others are gone).

    Args:
        grace_s: seconds between SIGTERM and SIGKILL.
        keep: ``{pid: start time}`` of processes to leave alone (those that existed before
            the launch, e.g. in a notebook that calls ``launch_distributed``).
    Returns:
        The number of processes that were running."""
    me, keep = os.getpid(), keep or {}
    procs = _alive(_run_processes(me, keep))
    if not procs:
        return 0
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(list(procs))
        # processes started meanwhile (a worker being forked) are stopped too
        procs.update(_run_processes(me, keep))
        left = _alive(procs)
        if not left:
            break
        _signal_all(left, signal.SIGTERM)
        time.sleep(0.2)
    _signal_all(_alive(procs), signal.SIGKILL)
    time.sleep(0.2)
    _reap(list(procs))
    return len(procs)


def _subreaper(value=None) -> int:
    """This process's child sub-reaper flag (Linux ``prctl``; 0 where unavailable), set to
    ``value`` first unless None."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        if value is not None:
            prctl(36, int(value), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        flag = ctypes.c_int(0)
        prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        return flag.value
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_CHILD_SUBREAPER) unavailable")
        return 0


def _own_forkserver(me: int) -> dict:
    """pid -> start time of the multiprocessing forkserver that ``me`` itself started (a
    direct child): multiprocessing reuses it for the next run, and it exits with ``me``."""
    return {p: s for p, s in _descendants(me).items()
            if (_stat(p) or (None,))[0] == me and b"multiprocessing.forkserver" in _cmdline(p)}


# --------------------------------------------------------------------------------------
# every process of the run: exit when the launcher is gone
# --------------------------------------------------------------------------------------
def _launcher() -> tuple:
    value = os.environ.get(LAUNCHER_ENV, "")
    pid, _, start = value.partition(":")
    return (int(pid), start) if pid.isdigit() else (None, None)


def _launcher_gone(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is None or st[1] != start or _zombie(pid)


def _wait_for_launcher(pid: int, start: str) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None and not _launcher_gone(pid, start):
        select.select([fd], [], [])  # readable once the launcher has exited
    while not _launcher_gone(pid, start):
        time.sleep(1.0)
    try:
        sys.stderr.write(f"vissl_swav_plugin: the launcher (pid {pid}) is gone; process {os.getpid()} "
                         "of its run exits\n")
        sys.stderr.flush()
    finally:
        os._exit(1)


def watch_launcher() -> bool:
    """In a process of a launcher's run (``VISSL_SWAV_PLUGIN_LAUNCHER`` set, not the
    launcher itself): start a daemon thread that ends this process when the launcher is
    gone.  Idempotent per process.  Returns whether a watchdog runs."""
    pid, start = _launcher()
    me = os.getpid()
    if pid is None or pid == me:
        return False
    if _watching["pid"] != me:
        _watching["pid"] = me
        threading.Thread(target=_wait_for_launcher, args=(pid, start), name="vissl_swav_plugin_launcher_watch",
                         daemon=True).start()
    return True


def _worker_loop(*args, **kwargs):
    """torch's DataLoader ``_worker_loop`` with the launcher watchdog (a worker forked from
    a forkserver inherits no thread)."""
    from torch.utils.data._utils import worker

    watch_launcher()
    inner = raw(worker, "_worker_loop")
    if patched_by(inner) == NAME:
        inner = original(NAME, worker, "_worker_loop")
    return inner(*args, **kwargs)


# --------------------------------------------------------------------------------------
# the launcher
# --------------------------------------------------------------------------------------
def _raise_stopped(signum, _frame):
    raise LauncherStopped(signum)


def _launch_distributed(cfg, node_id, engine_name, hook_generator, *args, **kwargs):
    """VISSL's ``launch_distributed`` that exits ``128 + signal`` on SIGINT / SIGTERM /
    SIGHUP and never leaves a process of the run behind (see the module docstring)."""
    from vissl.utils import distributed_launcher as dl

    me = os.getpid()
    start, keep = _stat(me), _descendants(me)
    caller = os.environ.get(LAUNCHER_ENV), _subreaper()
    os.environ[LAUNCHER_ENV] = f"{me}:{start[1] if start else ''}"
    _subreaper(1)
    main = threading.current_thread() is threading.main_thread()
    before = {}
    if main:
        for name in SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                before[sig] = signal.signal(sig, _raise_stopped)
    inner = original(NAME, dl, "launch_distributed")
    try:
        return inner(cfg, node_id, engine_name, hook_generator, *args, **kwargs)
    except LauncherStopped as stop:
        for sig in before:  # a second Ctrl-C must not interrupt the clean-up
            signal.signal(sig, signal.SIG_IGN)
        n = stop_processes(keep=keep)
        code = 128 + stop.signum
        logging.error(f"Launcher {stop}: stopped {n} process(es) of the run (training ranks, forkservers, "
                      f"DataLoader workers); exit code {code}. The run did NOT finish.")
        raise SystemExit(code) from None
    finally:
        for sig in before:
            signal.signal(sig, signal.SIG_IGN)
        stop_processes(keep={**keep, **_own_forkserver(me)})  # orphans of a failed rank, adopted as sub-reaper
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if caller[0] is None:
            os.environ.pop(LAUNCHER_ENV, None)
        else:
            os.environ[LAUNCHER_ENV] = caller[0]
        _subreaper(caller[1])


@register
def shim_launcher_signals():
    """vissl/utils/distributed_launcher.py, launch_distributed (swallows KeyboardInterrupt,
    exits 0; leaves orphaned forkservers / DataLoader workers); torch's DataLoader
    ``_worker_loop`` (launcher watchdog in every worker).  In a process of a run, starts
    the launcher watchdog."""
    from torch.utils.data._utils import worker

    after_import("vissl.utils.distributed_launcher", _patch_launcher)
    patch(NAME, worker, "_worker_loop", _worker_loop)
    watch_launcher()


def _patch_launcher(dl) -> None:
    patch(NAME, dl, "launch_distributed", _launch_distributed)
