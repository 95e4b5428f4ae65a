"""The benchmarks' harness (``benchmarks/benchmarking.py``) against fake timed
functions: the order the candidates run in, what is kept after the warm-up, the medians and their
spread, and the fields of the JSON record.  No wall clock is asserted on: the clocks are fakes."""
import json
import platform
import statistics

import pytest
import torch

from testkit import load_script

bm = load_script("benchmarks/benchmarking.py")

CPUINFO = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 lm\n"


class Calls:
    """Candidates that log their calls and return the call's number."""

    def __init__(self, names):
        self.log = []
        self.fns = {n: (lambda n=n: self._call(n)) for n in names}

    def _call(self, name):
        self.log.append(name)
        return len(self.log)


def test_mirror_alternation_runs_a_b_then_b_a_and_drops_the_warmup():
    c = Calls("ABC")
    out = bm.alternate(c.fns, rounds=3, warmup=1)
    assert "".join(c.log) == "ABC" "CBA" "ABC" "CBA"
    # the first (warm-up) round is dropped: what each call returned in rounds 1..3
    assert out == {"A": [6, 7, 12], "B": [5, 8, 11], "C": [4, 9, 10]}


def test_rotated_alternation_starts_each_round_one_further():
    c = Calls("ABCD")
    bm.alternate(c.fns, rounds=5, schedule="rotate")
    assert "".join(c.log) == "ABCD" "BCDA" "CDAB" "DABC" "ABCD"
    assert bm.round_order("AB", 7, "rotate") == ["B", "A"]
    with pytest.raises(ValueError, match="schedule"):
        bm.round_order("AB", 0, "random")


def test_every_candidate_runs_once_per_round_whatever_the_count():
    for n in range(1, 6):
        names = [f"c{i}" for i in range(n)]
        for schedule in bm.SCHEDULES:
            c = Calls(names)
            out = bm.alternate(c.fns, rounds=4, warmup=2, schedule=schedule)
            assert all(sorted(c.log[r * n:(r + 1) * n]) == names for r in range(6))
            assert all(len(v) == 4 for v in out.values())


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
