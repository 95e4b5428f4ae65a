"""benchmarks/recipe_table.py: the table holds every finished run under OUT with the extra
demo arguments it was made with, and a run folder is never reused with other arguments: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/demo/test_recipe_table.py``.
"""


from recipe_table_cases import _fake_run, _module  # noqa: F401


def test_a_failed_run_makes_the_command_fail_after_the_others(tmp_path, capsys):
    """A demo that exits non-zero (here tools/demo.py's own argparse rejecting an argument) is a
    "failed" row, the remaining runs still go ahead, and the command's exit status is 1, naming the
    run and its log: a queue of runs must not read a failed one as done."""
    rt = _module()
    _fake_run(tmp_path, "quick_digits_s1", ["--no-such-demo-option"], 61.0)  # finished: read after the failure
    rc = rt.main(["--out", str(tmp_path), "--modes", "quick", "--sets", f"digits={tmp_path}", "--seeds", "0,1",
                  "--extra=--no-such-demo-option"])
    err = capsys.readouterr().err
    assert rc == 1
    log = tmp_path / "quick_digits_s0.log"
    assert "unrecognized arguments: --no-such-demo-option" in log.read_text()
    assert f"quick digits seed 0 failed (demo exit 2); see {log}" in err
    assert "seed 1" not in err  # the finished run is not reported as failed
    md = (tmp_path / "table.md").read_text()
    assert "| quick | digits | 0 | --no-such-demo-option | failed (exit 2) |" in md
    assert "| quick | digits | 1 | --no-such-demo-option |" in md and "| 61.0 |" in md
