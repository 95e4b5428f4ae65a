"""The benchmarks' harness (``benchmarks/benchmarking.py``) against fake timed
functions: the medians and their spread of alternated candidates, and the fields of the JSON record
(the order the candidates run in and what is kept after the warm-up: test_alternation.py).  No wall clock is asserted on: the clocks are fakes."""
import json
import platform
import statistics

import pytest
import torch

from testkit import load_script

bm = load_script("benchmarks/benchmarking.py")

CPUINFO = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 lm\n"


def test_the_harness_alternates_with_the_packages_loop():
    """``bm.alternate`` (which every benchmark calls) is the package's one alternation loop, the one
    ``--amp auto`` times with (its tests: tests/unit/utils/test_alternation.py)."""
    from vissl_swav_plugin.utils import alternation

    assert (bm.alternate, bm.round_order, bm.SCHEDULES) == (alternation.alternate, alternation.round_order,
                                                             alternation.SCHEDULES)


def test_timed_reads_the_clock_around_the_call_and_syncs_first():
    events = []
    ticks = iter([10.0, 10.25])
    clock = lambda: (events.append("clock"), next(ticks))[1]  # noqa: E731
    run = bm.timed(lambda: events.append("fn"), clock=clock, sync=lambda: events.append("sync"))
    assert run() == pytest.approx(250.0)  # ms
    assert events == ["sync", "clock", "fn", "sync", "clock"]


def test_median_and_spread():
    s = bm.summary([5.0, 1.0, 3.0, 9.0])
    assert s == dict(median=4.0, min=1.0, max=9.0, n=4, spread=2.0)
    assert bm.summary([2.0])["spread"] == 0.0
    assert bm.medians({"a": [3, 1, 2], "b": [4.0, 6.0]}) == {"a": 2, "b": 5.0}
    with pytest.raises(ValueError):
        bm.summary([])


def test_alternated_medians_of_fake_timings():
    """A fake step whose time depends on the candidate and the round: the harness keeps the
    rounds after the warm-up and their medians are those of the kept rounds."""
    fake_ms = {"fast": [50, 1, 2, 3, 4], "slow": [90, 10, 30, 20, 40]}
    calls = {k: iter(v) for k, v in fake_ms.items()}
    out = bm.alternate({k: (lambda k=k: next(calls[k])) for k in fake_ms}, rounds=4, warmup=1)
    assert out == {k: v[1:] for k, v in fake_ms.items()}
    assert bm.medians(out) == {k: statistics.median(v[1:]) for k, v in fake_ms.items()}


def test_machine_names_the_cpu_its_flags_and_the_software():
    m = bm.machine(CPUINFO)
    assert m["cpu"] == "Test CPU 9000"
    assert m["cpu_flags"] == ["avx2", "avx512f", "amx_bf16"]  # the notable ones, in a fixed order
    assert m["python"] == platform.python_version() and m["torch"] == torch.__version__
    assert m["cores"] >= 1 and m["executable"]
    assert ("card" in m) and (m["card"] is None) == (not torch.cuda.is_available())


def test_the_record_holds_machine_date_command_settings_and_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    script = tmp_path / "benchmarks" / "bench_x.py"
    doc = bm.record("bench_x", str(script), ["--rounds", "3", "--name", "a b"], {"ours": {"median": 1.0}},
                    machine_info={"cpu": "c"}, rounds=3)
    assert list(doc) == ["benchmark", "machine", "date", "command", "rounds", "results"]
    assert doc["machine"] == {"cpu": "c"} and doc["rounds"] == 3
    assert doc["command"] == "python benchmarks/bench_x.py --rounds 3 --name 'a b'"
    assert doc["date"][:4].isdigit() and "T" in doc["date"] and doc["date"][-6] in "+-"  # ISO, with its offset
    assert "results" not in bm.record("bench_x", str(script), [], None, machine_info={})
    path = tmp_path / "out.json"
    bm.write_json(str(path), doc)
    assert json.loads(path.read_text()) == doc
    bm.write_json("", doc)  # no file asked for: nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks", "out.json"]


def test_a_script_outside_the_folder_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert bm.command_line(str(tmp_path / "b.py"), []) == f"python {tmp_path / 'b.py'}"
