"""Helpers of test_reliability.py and test_bad_inputs.py (a plain module: tests/ is no package)."""
import hashlib
import os
import signal
import uuid
from pathlib import Path

from testkit import HANG_S, start_launcher


class Run:
    def __init__(self, returncode, stdout):
        self.returncode, self.stdout = returncode, stdout


def run_failing_launcher(overrides, cwd, env=None, timeout=HANG_S):
    """VISSL's stock launcher in its own session, output to a file; afterwards every
    process left in that session is killed.  When one rank fails, torch's start_processes
    SIGTERMs the other, and that rank's forkserver and DataLoader worker then keep each other
    alive forever (the worker watches its parent, the forkserver; the forkserver waits for the
    worker): a caller reading the output through a pipe would wait for them forever."""
    log = Path(cwd) / f"launcher_{uuid.uuid4().hex[:8]}.log"
    with open(log, "w") as f:
        proc = start_launcher(overrides, cwd, f, env=env)
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return Run(rc, log.read_text())


def snapshot(folder):
    """name -> sha1 of every file (symlinks by target), to show nothing was lost."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = "->" + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out
