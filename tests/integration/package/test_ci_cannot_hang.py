"""`make test` cannot hang: a test process that dies, or a test stuck in native code, ends the
run by itself with a non-zero exit, naming the test.

Each case plants a small suite in a temporary folder and runs the Makefile's own `test` recipe
on it (`make -o lint test TEST_PATHS=...`: the same pytest command, options and pytest.ini, two
pytest-xdist workers).  The bound on `subprocess.run` is a hang detector, not a speed
requirement: without `--max-worker-restart=0` the crash run waits forever for the dead worker's
files (pytest-xdist 3.8), and without `timeout_method = thread` the hang run waits forever for a
SIGALRM that the stuck test blocks.
"""
import subprocess
import sys
import textwrap

import pytest

from testkit import REPO

BOUND_S = 300

# a few ordinary files beside the planted one, so the other worker has work before and after
_FILLER = "import time\n\ndef test_{name}_one():\n    time.sleep(0.2)\n\ndef test_{name}_two():\n    time.sleep(0.2)\n"


def _plant(folder, name, body):
    (folder / f"test_{name}.py").write_text(textwrap.dedent(body))
    for other in ("alpha", "beta", "gamma", "delta"):
        (folder / f"test_{other}.py").write_text(_FILLER.format(name=other))


def _make_test(folder, *pytest_args):
    cmd = ["make", "--no-print-directory", "-o", "lint", "test", f"VPY={sys.executable}", f"TEST_PATHS={folder}",
           "PYTEST_ARGS=" + " ".join(pytest_args)]
    try:
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-3000:]
        pytest.fail(f"make test on a planted suite still ran after {BOUND_S} s (a hang):\n{out}")


def test_a_test_that_kills_its_process_fails_the_run_naming_it(tmp_path):
    _plant(tmp_path, "dies", """
        import os
        import signal

        def test_dies():
            os.kill(os.getpid(), signal.SIGABRT)
        """)
    run = _make_test(tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "crashed while running" in out and "test_dies.py::test_dies" in out, out
    assert "replacing crashed worker" not in out, out  # no restart: the run stops


def test_a_test_stuck_in_native_code_prints_its_stacks_and_fails_the_run_naming_it(tmp_path):
    # SIGALRM blocked: pytest-timeout's signal method could never interrupt this test
    _plant(tmp_path, "hangs", """
        import signal
        import time

        def test_hangs():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        """)
    run = _make_test(tmp_path, "--timeout=8", "-o", "faulthandler_timeout=2")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    # faulthandler's dump (every thread, the planted line among them) reaches the terminal from a
    # worker; pytest-timeout's own dump goes through pytest's capture, lost with the worker
    assert "Timeout (0:00:02)!" in out and out.count("most recent call first") >= 2, out
    assert 'test_hangs.py", line 7 in test_hangs' in out, out
    assert "test_hangs.py::test_hangs" in out and "crashed while running" in out, out
