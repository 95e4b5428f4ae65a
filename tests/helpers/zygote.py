"""A warm start for the suite's VISSL launcher runs (tests only; never shipped).

Every run of VISSL's launcher in a fresh interpreter imports torch, torchvision, VISSL,
Classy Vision, Hydra and the plugin (about 4 CPU-seconds on the 2-core CI machine), and so
does each of its spawned training ranks: a 2-process run pays it three times, and the suite
makes over a hundred such runs.  Most of those tests check what a run *does* (its losses,
checkpoints, logs), not how its processes start.  For them ``testkit.run_launcher`` asks this
zygote: an interpreter of the test process that has imported all of that once, and forks a
copy for each run (one zygote per environment the runs need, :data:`POOL_SIZE` of them kept).
The copy sets the run's working directory, environment, argv and output, then runs the
launcher script as ``__main__``; its ranks are forked from it too (torch's
``start_processes(start_method="fork")`` in place of ``spawn``).

What a fork cannot show, the tests that exist for it still run in fresh interpreters
(``fresh=True``): registration in spawned ranks
and workers, the launcher's signals, the import order, the console scripts.  Set
``VISSL_SWAV_PLUGIN_TEST_FRESH=1`` to run every launcher fresh (the slow, literal way).
``tests/integration/package/test_zygote_integration.py`` checks that a zygote run and a fresh
run of the same config give the same losses and weights, bit for bit.

``testkit.run_script`` runs any Python script (or ``-m`` module) this way.  A copy's own
``subprocess.Popen`` of ``python script.py`` (the demo's launcher, the GPU check's sections)
is a fork of the copy, reset to the state the copy started from, wherever a fork gives what a
new interpreter would (:func:`_nestable`); the zygote test checks a demo run so against one
whose every process is fresh.  A shell command runs a script so through :func:`main`
(``testkit.python_command``: the own-images section's console-script shims).

Protocol: a Unix SOCK_SEQPACKET socket; the client sends one JSON message (argv, cwd, env)
with its output file descriptor attached; the zygote answers ``pid N`` at once and
``exit CODE`` when that copy has ended (``CODE`` negative: killed by signal ``-CODE``).
"""
import atexit
import gc
import io
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

# the plugin itself is not named: importing vissl loads it (the .pth hook), unless the run's
# environment turns it off (VISSL_SWAV_PLUGIN_DISABLE=1), as in a fresh interpreter
PRELOAD = (
    "torch", "torchvision", "vissl", "classy_vision", "hydra",
    "vissl.utils.distributed_launcher", "vissl.utils.hydra_config", "vissl.engines.train",
    "vissl.hooks", "vissl.trainer", "vissl.models", "vissl.data", "vissl.losses",
)


# --------------------------------------------------------------------------------------
# the server (its own interpreter)
# --------------------------------------------------------------------------------------
def _forked_rank(i, fn, *args):
    """A training rank forked from the launcher copy: the default signal handlers (the
    launcher's are its own), and the plugin's launcher watchdog that a spawned rank starts
    when it imports the plugin."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the launcher's exit functions are not the rank's
    atexit.register(logging.shutdown)
    if not os.environ.get("VISSL_SWAV_PLUGIN_DISABLE"):  # the plugin is on in this run
        from vissl_swav_plugin.compat.signals import watch_launcher

        watch_launcher()
    try:
        return fn(i, *args)
    finally:
        _finalize()


def _finalize():
    """What an interpreter does at exit and a fork that ends in ``os._exit`` skips: the
    atexit functions, and the flush of files left open (VISSL's ``stdout.json``, written by
    a rank, or by the launcher itself in a 1-process run); sys.stdout and sys.stderr included."""
    atexit._run_exitfuncs()
    _flush_open_files()


def _flush_open_files():
    """Flush every open, writable file object of this process (``type(obj)``, not
    ``isinstance``: an object's ``__class__`` may be a property that warns, as a torch
    deprecated alias does)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:
                pass


def _fork_spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """``torch.multiprocessing.spawn`` with the ranks forked (same signature)."""
    import torch.multiprocessing as tmp

    return tmp.start_processes(_forked_rank, args=(fn, *args), nprocs=nprocs, join=join, daemon=daemon,
                               start_method="fork")


def _run_copy(request, out_fd):
    """In the forked copy: become the run's process and execute its script; never returns."""
    code = 1
    try:
        os.setsid()  # its own process group, as ``start_new_session=True`` gives a fresh one
        # (the signal handlers are the zygote's: a new interpreter's, which it never changes)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        helpers = os.path.dirname(os.path.abspath(__file__))
        sys.path[1:] = [p for p in sys.path[1:] if p != helpers]
        import torch.multiprocessing

        torch.multiprocessing.spawn = _fork_spawn
        _START.update(_snapshot())
        subprocess.Popen = _nested_popen_class(subprocess.Popen)
        code = _execute(list(request["argv"]))
    finally:
        os._exit(code)


def _execute(argv):
    """Run ``argv`` (a script and its arguments, or ``-m`` and a module) as ``__main__`` in
    this process, then what an interpreter does at exit; its exit code."""
    import runpy

    rest = sys.path[1:]
    code = 1
    try:
        if argv[0] == "-m":  # ``python -m module args``: the working directory first on sys.path
            sys.argv = argv[1:]
            sys.path[:] = [os.getcwd()] + rest
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:  # ``python script args``: the script's folder first
            sys.argv = argv
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0]))] + rest
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    _finalize()
    return code


# --------------------------------------------------------------------------------------
# nested runs: a Python script that a copy starts (``python script.py`` through
# subprocess.Popen: the demo's launcher, the GPU check's sections) runs in a fork of the
# copy, reset to the state the copy started from, instead of a new interpreter
# --------------------------------------------------------------------------------------
_START = {}
# variables a nested run may change without a new interpreter: the ones below are applied
# in the fork as an interpreter applies them at start; any other change starts one
_APPLIED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED", "PYTHONWARNINGS", "PYTHONPATH")


def _loggers():
    """Every logger of this process by name (the root under None)."""
    loggers = {name: lg for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    loggers[None] = logging.getLogger()
    return loggers


def _snapshot():
    """What a nested run is reset to: the copy's state before its script ran."""
    import random
    import warnings

    import torch

    loggers = _loggers()
    state = dict(
        path=list(sys.path[1:]), warnings=list(warnings.filters), random=random.getstate(),
        torch_rng=torch.get_rng_state(), grad=torch.is_grad_enabled(), dtype=torch.get_default_dtype(),
        threads=torch.get_num_threads(), environ=dict(os.environ),
        logging={k: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for k, lg in loggers.items()},
        disable=logging.root.manager.disable)
    if "numpy" in sys.modules:
        state["numpy_rng"] = sys.modules["numpy"].random.get_state()
    return state


def _threads():
    with open("/proc/self/status") as f:
        return int(f.read().split("Threads:")[1].split()[0])


def _nestable(args, kw):
    """Whether ``Popen(args, **kw)`` can run in a fork of this process: ``python script.py
    ...`` or ``python -m module ...``, output to a pipe, a file or inherited, stderr not a
    pipe of its own, no shell or pre-exec function, an environment that differs from the
    copy's start only in :data:`_APPLIED_ENV`, and this process single-threaded (a fork
    of a process with other threads may inherit a lock they hold)."""
    if isinstance(args, (str, bytes)) or len(args) < 2 or str(args[0]) != sys.executable:
        return False
    first = str(args[1])
    if first == "-m":
        if len(args) < 3:
            return False
    elif first.startswith("-") or not first.endswith(".py") or not os.path.isfile(
            os.path.join(str(kw.get("cwd") or "."), first)):
        return False
    allowed = {"cwd", "env", "stdin", "stdout", "stderr", "text", "universal_newlines", "bufsize",
               "start_new_session", "close_fds", "encoding", "errors"}
    if set(kw) - allowed or kw.get("stdin") not in (None, subprocess.DEVNULL) or kw.get("stderr") == subprocess.PIPE:
        return False
    env = kw.get("env")
    if env is not None:
        start = _START["environ"]
        changed = {k for k in set(env) | set(start) if env.get(k) != start.get(k)}
        if changed - set(_APPLIED_ENV) or "OMP_NUM_THREADS" not in env:
            return False
    import threading

    return threading.active_count() == 1 and _threads() == 1


def _nested_popen_class(base):
    class Popen(base):
        """subprocess.Popen; a nestable Python run (:func:`_nestable`) is forked instead."""

        def __new__(cls, args, *a, **kw):
            if cls is Popen and not a and _nestable(args, kw):
                return _ForkedRun([str(x) for x in args], **kw)
            return super().__new__(cls)

    return Popen


def _reset_to_start(env):
    """In a nested fork: the state the copy started from, the run's environment applied."""
    import random
    import warnings

    import torch

    st = _START
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if signal.getsignal(sig) not in (None, signal.SIG_DFL):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.alarm(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    atexit._clear()
    atexit.register(logging.shutdown)
    loggers = _loggers()
    for name, lg in loggers.items():
        handlers, level, propagate, disabled = st["logging"].get(name, ([], logging.NOTSET, True, False))
        lg.handlers[:] = handlers
        lg.level, lg.propagate, lg.disabled = level, propagate, disabled
    logging.disable(st["disable"])
    logging.Logger.manager._clear_cache()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    warnings.filters[:] = st["warnings"]
    opts = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    if opts:
        warnings._processoptions(opts)
    warnings._filters_mutated()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in st["path"]]
    sys.path[:] = [""] + extra + st["path"]
    random.setstate(st["random"])
    if "numpy_rng" in st:
        sys.modules["numpy"].random.set_state(st["numpy_rng"])
    torch.set_rng_state(st["torch_rng"])
    torch.set_grad_enabled(st["grad"])
    torch.set_default_dtype(st["dtype"])
    threads = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(threads) if threads and threads.isdigit() and int(threads) > 0 else st["threads"])


class _ForkedRun:
    """The part of subprocess.Popen's interface that callers use, for a nested run forked
    from this process (:func:`_nested_popen_class`)."""

    def __init__(self, args, cwd=None, env=None, stdin=None, stdout=None, stderr=None, text=None,
                 universal_newlines=None, bufsize=-1, start_new_session=False, close_fds=True, encoding=None,
                 errors=None):
        self.args, self.returncode, self.stdin, self.stderr, self.stdout = args, None, None, None, None
        text_mode = bool(text or universal_newlines or encoding or errors)
        _flush_open_files()  # nothing buffered here may be written again by the fork
        read_fd = write_fd = None
        if stdout == subprocess.PIPE:
            read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if start_new_session:
                    os.setsid()
                if read_fd is not None:
                    os.close(read_fd)
                _redirect(0, stdin)
                _redirect(1, write_fd if write_fd is not None else stdout)
                _redirect(2, 1 if stderr == subprocess.STDOUT else stderr)
                if write_fd is not None:
                    os.close(write_fd)
                if cwd is not None:
                    os.chdir(str(cwd))
                _reset_to_start(env)
                code = _execute(args[1:])
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.pid = pid
        trace = os.environ.get("VISSL_SWAV_PLUGIN_TEST_ZYGOTE_TRACE")
        if trace:  # which runs were forked (tests/integration/package/test_zygote_integration.py)
            with open(trace, "a") as f:
                f.write(json.dumps(dict(pid=pid, argv=args[1:])) + "\n")
        if read_fd is not None:
            os.close(write_fd)
            raw = io.open(read_fd, "rb", -1 if bufsize in (0, 1) else bufsize)
            if text_mode:
                import locale

                raw = io.TextIOWrapper(raw, encoding=encoding or locale.getpreferredencoding(False), errors=errors)
            self.stdout = raw

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.stdout is not None:
            self.stdout.close()
        self.wait()

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        if input:
            raise ValueError("a forked nested run has no stdin")
        if self.stdout is None:
            self.wait(timeout)
            return None, None
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks = []
        fd = self.stdout.fileno()
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout, output=self._join(chunks))
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        self.stdout.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._join(chunks), None

    def _join(self, chunks):
        data = b"".join(chunks)
        if isinstance(self.stdout, io.TextIOWrapper):
            text = data.decode(self.stdout.encoding, self.stdout.errors or "strict")
            return text.replace("\r\n", "\n").replace("\r", "\n")  # as Popen's text mode
        return data

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _redirect(fd, target):
    """``fd`` (0, 1 or 2) of a nested fork: inherited (None), /dev/null, a descriptor or a file."""
    if target is None:
        return
    if target == subprocess.DEVNULL:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, fd)
        os.close(null)
        return
    src = target if isinstance(target, int) else target.fileno()
    if src != fd:
        os.dup2(src, fd)


def serve(path):
    """Import everything once, then fork a copy per request until the parent is gone."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(16)
    print("ready", flush=True)
    children = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([srv], [], [], 0.2)
        if ready:
            conn, _ = srv.accept()
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                _run_copy(request, fds[0])
            os.close(fds[0])
            conn.send(f"pid {pid}".encode())
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    conn.send(f"exit {code}".encode())
                except OSError:
                    pass
                conn.close()
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


# --------------------------------------------------------------------------------------
# the client (the test process)
# --------------------------------------------------------------------------------------
_server = {}  # the zygote of this test process's latest run: pid, proc, path, env
_pool = {}  # (test process id, key) -> that zygote's entry, the least recently used first
#: zygotes kept per test process: the suite's usual environment and one other, so that a test
#: file with a variable of its own does not make the next file start the usual one again
POOL_SIZE = 2


def enabled() -> bool:
    return os.environ.get("VISSL_SWAV_PLUGIN_TEST_FRESH") != "1"


#: variables read only while a run runs (the plugin's debug trace folder when the loss's hooks are
#: built, the zygote's own trace when a nested run starts), never at import: a run that sets them
#: gets them in its copy's environment, from the zygote it finds (the tests of the trace check that
#: the run wrote it)
RUN_TIME_ENV = ("PYTEST_CURRENT_TEST", "VISSL_SWAV_PLUGIN_TRACE_DIR", "VISSL_SWAV_PLUGIN_TEST_ZYGOTE_TRACE")


def _key(env):
    return {k: v for k, v in env.items() if k not in RUN_TIME_ENV}


def address(env):
    """The socket path of a zygote started with ``env`` in this test process: started on
    first use of that environment (a variable that a module reads at import must have the
    run's value), and kept while :data:`POOL_SIZE` zygotes are; the least recently used one
    is stopped when a new one would exceed it."""
    key = (os.getpid(), json.dumps(_key(env), sort_keys=True))
    entry = _pool.get(key)
    if entry is not None and entry["proc"].poll() is None:
        return _use(key, entry)
    for old in [k for k in _pool if k[0] != os.getpid() or _pool[k]["proc"].poll() is not None]:
        del _pool[old]  # a forked test process's copies, or zygotes that ended
    while len(_pool) >= POOL_SIZE:
        oldest = _pool.pop(next(iter(_pool)))
        oldest["proc"].kill()
        oldest["proc"].wait()
    folder = tempfile.mkdtemp(prefix="vissl_swav_plugin_zygote_")
    path = os.path.join(folder, "socket")
    log = open(os.path.join(folder, "zygote.log"), "w")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                             f"import zygote; zygote.serve({path!r})"],
                            env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=folder)
    log.close()
    first = proc.stdout.readline()
    if first.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the test zygote did not start: {first}{open(log.name).read()[-3000:]}")
    return _use(key, dict(pid=os.getpid(), proc=proc, path=path, env=_key(env)))


def _use(key, entry):
    """``entry`` becomes the most recently used zygote of the pool, and ``_server``."""
    _pool.pop(key, None)
    _pool[key] = entry
    _server.clear()
    _server.update(entry)
    return entry["path"]


class Run:
    """One launcher run in a forked copy: ``pid`` (its process group), ``wait(timeout)``;
    ``path``: the socket of a zygote already started (default: this test process's zygote of
    ``env``, started if need be)."""

    def __init__(self, argv, cwd, env, out_fd, path=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path or address(env))
        socket.send_fds(self.sock, [json.dumps(dict(argv=list(argv), cwd=str(cwd), env=env)).encode()], [out_fd])
        answer = self.sock.recv(256).decode()
        if not answer.startswith("pid "):
            raise RuntimeError(f"the test zygote refused the run: {answer!r}")
        self.pid = int(answer.split()[1])
        self.returncode = None

    def poll(self):
        if self.returncode is None and select.select([self.sock], [], [], 0)[0]:
            self._read()
        return self.returncode

    def _read(self):
        answer = self.sock.recv(256).decode()
        self.returncode = int(answer.split()[1]) if answer.startswith("exit ") else -9
        self.sock.close()

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self.sock], [], [], timeout)[0]:
                self.kill()
                raise subprocess.TimeoutExpired(self.pid, timeout)
            self._read()
        return self.returncode

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.time() + 60
        while self.returncode is None and time.time() < deadline:
            if select.select([self.sock], [], [], 1.0)[0]:
                self._read()


def run(argv, cwd, env, timeout):
    """Run ``argv`` (a script and its arguments, or ``-m``, a module and its arguments) in a
    copy; returns (returncode, output)."""
    read_fd, write_fd = os.pipe()
    try:
        r = Run(argv, cwd, env, write_fd)
    finally:
        os.close(write_fd)
    chunks, deadline = [], time.time() + timeout
    with os.fdopen(read_fd, "rb") as out:
        while True:
            left = deadline - time.time()
            if left <= 0:
                r.kill()
                raise subprocess.TimeoutExpired(argv, timeout, output=b"".join(chunks))
            if select.select([out], [], [], min(left, 5.0))[0]:
                chunk = os.read(out.fileno(), 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    code = r.wait(max(1.0, deadline - time.time()))
    return code, b"".join(chunks).decode(errors="replace")


def main(argv):
    """``python -S zygote.py SOCKET SCRIPT ARGS...``: run ``SCRIPT ARGS...`` in a copy of the
    zygote listening on ``SOCKET``, with this process's working directory and environment,
    its output (stdout and stderr) on this process's stdout, and exit with the copy's code
    (128 + N for signal N).  A warm stand-in for ``python SCRIPT ARGS...`` that a shell
    command can run: a console script's shim.  Only the standard library is imported here."""
    run = Run(argv[1:], os.getcwd(), dict(os.environ), 1, path=argv[0])

    def stop(signum, frame):
        run.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = run.wait()
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
