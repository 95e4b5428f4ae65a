"""A warm start for the suite's VISSL launcher runs (tests only; never shipped).

Every run of VISSL's launcher in a fresh interpreter imports torch, torchvision, VISSL,
Classy Vision, Hydra and the plugin (about 4 CPU-seconds on the 2-core CI machine), and so
does each of its spawned training ranks: a 2-process run pays it three times, and the suite
makes over a hundred such runs.  Most of those tests check what a run *does* (its losses,
checkpoints, logs), not how its processes start.  For them ``testkit.run_launcher`` asks this
zygote: one interpreter per test process that has imported all of that once, and forks a
copy for each run.  The copy sets the run's working directory, environment, argv and output,
then runs the launcher script as ``__main__``; its ranks are forked from it too (torch's
``start_processes(start_method="fork")`` in place of ``spawn``).

What a fork cannot show, the tests that exist for it still run in fresh interpreters
(``fresh=True``): registration in spawned ranks
and workers, the launcher's signals, the import order, the console scripts.  Set
``VISSL_SWAV_PLUGIN_TEST_FRESH=1`` to run every launcher fresh (the slow, literal way).
``tests/integration/package/test_zygote_integration.py`` checks that a zygote run and a fresh
run of the same config give the same losses and weights, bit for bit.

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
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
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
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        helpers = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [os.path.dirname(os.path.abspath(script))] + [p for p in sys.path[1:] if p != helpers]
        import runpy

        import torch.multiprocessing

        torch.multiprocessing.spawn = _fork_spawn
        try:
            runpy.run_path(script, run_name="__main__")
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
    finally:
        os._exit(code)


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
_server = {}


def enabled() -> bool:
    return os.environ.get("VISSL_SWAV_PLUGIN_TEST_FRESH") != "1"


def _key(env):
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


def _address(env):
    """The socket path of a zygote started with ``env`` in this test process: started on
    first use, and again when the test process' environment has changed since (a variable
    that a module reads at import must have the run's value)."""
    if _server.get("pid") == os.getpid() and _server["proc"].poll() is None:
        if _server["env"] == _key(env):
            return _server["path"]
        _server["proc"].kill()
        _server["proc"].wait()
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
    _server.update(pid=os.getpid(), proc=proc, path=path, env=_key(env))
    return path


class Run:
    """One launcher run in a forked copy: ``pid`` (its process group), ``wait(timeout)``."""

    def __init__(self, argv, cwd, env, out_fd):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(_address(env))
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
    """Run ``argv`` (a script and its arguments) in a copy; returns (returncode, output)."""
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
