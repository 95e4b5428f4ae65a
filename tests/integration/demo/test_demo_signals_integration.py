"""SIGTERM or SIGHUP sent to the demo while it trains stops the launcher's processes too, and the
demo exits with 128 + the signal.  The launcher runs in a session of its own, so without this a
`kill` or `timeout` of the demo left the training running with nobody reading its output.  The
launcher here is a stand-in process that prints its pid and sleeps (VISSL is not needed)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit import REPO

HARNESS = r"""
import sys
from pathlib import Path
from vissl_swav_plugin.demo import training
training.LAUNCHER = ["-c", "import os, time; open('child.pid', 'w').write(str(os.getpid())); time.sleep(300)"]
try:
    training.run_training([], Path(sys.argv[1]), 10, 1, 1)
except training.TrainingStopped as e:
    print("stopped", e.signum, e, flush=True)
    sys.exit(128 + e.signum)
"""


def _alive(pid):
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait(predicate, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_demo_stops_the_training_processes(tmp_path, sig):
    pid_file = tmp_path / "child.pid"  # the stand-in writes it in its working directory, the run folder
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path)], cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child = None
    try:
        started = _wait(lambda: proc.poll() is not None or (pid_file.is_file() and pid_file.read_text()), 120)
        assert started and proc.poll() is None, proc.communicate()[0] if proc.poll() is not None else "no start"
        child = int(pid_file.read_text())
        assert _alive(child)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out
        assert f"stopped {int(sig)} stopped by {sig.name}" in out
        assert _wait(lambda: not _alive(child), 15), f"the launcher (pid {child}) outlived the demo"
    finally:
        if proc.poll() is None:
            proc.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
