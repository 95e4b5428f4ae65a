"""Stopping a run: Ctrl-C / SIGTERM of the launcher exits 128 + signal after stopping every
process of the run, and a rank killed with ``kill -9`` leaves no process behind holding the
output pipe (``launcher | tee log`` ends).

End to end with 2 gloo processes, ``MULTI_PROCESSING_METHOD: forkserver`` and one DataLoader
worker per rank (each rank then has a forkserver and a worker: 7 processes).  The time
bounds are for dead processes (a hang), not for speed."""
import os
import signal
import subprocess
import sys
import threading
import time

from testkit import HANG_S, PLUGIN_LAUNCHER, SMALL_TRUNK, STOCK_LAUNCHER, launcher_env

LONG_RUN = [
    "config=test/swav_plugin/quick_cpu",
    *SMALL_TRUNK,
    "config.OPTIMIZER.num_epochs=1000",  # never finishes by itself
    "config.DATA.NUM_DATALOADER_WORKERS=1",
    "config.MULTI_PROCESSING_METHOD=forkserver",
]
STARTED = "Starting phase 0 [train]"
START_BOUND_S = HANG_S  # start-up only: a hang bound, not speed
EXIT_BOUND_S = 120  # the launcher gives its processes 10 s after SIGTERM, then SIGKILLs
GONE_BOUND_S = 15


class PipedRun:
    """A launcher in its own session, its output read through a pipe by a thread (like
    ``| tee``): ``eof`` is set when every holder of the pipe has closed it."""

    def __init__(self, launcher, cwd):
        self.proc = subprocess.Popen([sys.executable, str(launcher), *LONG_RUN,
                                      f"config.CHECKPOINT.DIR={cwd / 'ck'}"], cwd=str(cwd),
                                     env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.text, self.eof = [], threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.text.append(line.decode(errors="replace"))
        self.eof.set()

    @property
    def output(self):
        return "".join(self.text)

    def _until(self, ready, bound, what):
        """Poll ``ready()`` until it is true while the launcher runs; returns its value."""
        deadline = time.monotonic() + bound
        while not (value := ready()):
            assert self.proc.poll() is None, f"run ended before {what}:\n{self.output[-4000:]}"
            assert time.monotonic() < deadline, f"{what} not seen within {bound}s"
            time.sleep(0.2)
        return value

    def wait_for(self, marker, bound):
        self._until(lambda: marker in self.output, bound, f"'{marker}'")

    def wait_for_workers(self, bound):
        """Wait until both ranks' forkservers and DataLoader workers run (4 processes started
        from a forkserver), the processes a signal must reach."""
        self._until(lambda: sum("forkserver" in p for p in _processes_of(self.proc.pid)) >= 4, bound,
                    "both ranks' forkservers and workers")

    def group(self):
        """pids still in the run's process group (zombies excluded)."""
        out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(self.proc.pid)], capture_output=True, text=True)
        return [l.split()[0] for l in out.stdout.splitlines() if l.split() and not l.split()[1].startswith("Z")]

    def wait_group_gone(self, bound):
        deadline = time.monotonic() + bound
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.group()

    def kill_all(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def _processes_of(pid):
    out = subprocess.run(["ps", "-ww", "-o", "pid=,cmd=", "-g", str(pid)], capture_output=True, text=True).stdout
    return out.splitlines()


def test_signal_to_the_launcher_exits_non_zero_and_stops_every_process(tmp_path):
    """A scheduler's SIGTERM to the plugin's launcher only: the launcher stops its ranks,
    forkservers and workers.  (SIGINT, SIGTERM and SIGHUP share one handler in VISSL's
    ``launch_distributed``, which both launchers call; the stock launcher and SIGINT are the
    Ctrl-C test's.)"""
    sig, code = signal.SIGTERM, 143
    run = PipedRun(PLUGIN_LAUNCHER, tmp_path)
    try:
        run.wait_for(STARTED, START_BOUND_S)
        run.wait_for_workers(START_BOUND_S)  # 2 forkservers + 2 workers
        run.proc.send_signal(sig)  # to the launcher only (a scheduler's kill)
        rc = run.proc.wait(timeout=EXIT_BOUND_S)
        left = run.wait_group_gone(GONE_BOUND_S)
        assert run.eof.wait(GONE_BOUND_S), "a process still holds the output pipe"
    finally:
        run.kill_all()
    out = run.output
    assert rc == code, out[-3000:]
    assert not left, f"processes outlived the launcher: {left}"
    assert f"Launcher stopped by {signal.Signals(sig).name}" in out and f"exit code {code}" in out
    assert "All Done!" not in out


def test_ctrl_c_to_the_whole_group_exits_130(tmp_path):
    """A terminal's Ctrl-C reaches every process of the foreground group at once."""
    run = PipedRun(STOCK_LAUNCHER, tmp_path)
    try:
        run.wait_for(STARTED, START_BOUND_S)
        run.wait_for_workers(START_BOUND_S)
        os.killpg(run.proc.pid, signal.SIGINT)
        rc = run.proc.wait(timeout=EXIT_BOUND_S)
        left = run.wait_group_gone(GONE_BOUND_S)
    finally:
        run.kill_all()
    assert rc == 130, run.output[-3000:]
    assert not left and "All Done!" not in run.output


def test_kill_9_of_one_rank_leaves_no_process_holding_the_pipe(tmp_path):
    run = PipedRun(STOCK_LAUNCHER, tmp_path)
    try:
        run.wait_for(STARTED, START_BOUND_S)
        run.wait_for_workers(START_BOUND_S)
        ranks = [l.split()[0] for l in _processes_of(run.proc.pid) if "spawn_main" in l]
        assert len(ranks) == 2, _processes_of(run.proc.pid)
        os.kill(int(ranks[1]), signal.SIGKILL)
        assert run.eof.wait(60), f"output pipe still open 60 s after the kill: {_processes_of(run.proc.pid)}"
        rc = run.proc.wait(timeout=EXIT_BOUND_S)
        left = run.wait_group_gone(GONE_BOUND_S)
    finally:
        run.kill_all()
    assert rc != 0, run.output[-3000:]
    assert "terminated with signal SIGKILL" in run.output
    assert not left, f"processes outlived the launcher: {left}"
