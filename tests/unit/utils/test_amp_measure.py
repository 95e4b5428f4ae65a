"""``vissl_swav_plugin.utils.amp_measure``: ``--amp auto`` on a CPU picks bf16 autocast from a
timing of the step, kept per machine in a JSON cache.  The timer is injected, so the tests
decide which precision is faster; nothing here asserts on the real machine's speed."""
import json
import warnings

import pytest

from vissl_swav_plugin.utils import amp_measure
from vissl_swav_plugin.utils.amp_measure import MIN_SPEEDUP, decide, machine_key, measure_or_reuse

SHAPE = dict(batch=64, crops="2x28+4x16", trunk="resnet_small_plugin", threads=1)


class FakeTimer:
    """A timer that returns fixed per-step seconds and counts its calls."""

    def __init__(self, fp32_s, bf16_s, rounds=5):
        self.fp32_s, self.bf16_s, self.rounds, self.calls = fp32_s, bf16_s, rounds, 0

    def __call__(self):
        self.calls += 1
        return {"fp32": [self.fp32_s] * self.rounds, "bf16": [self.bf16_s] * self.rounds}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(amp_measure.REMEASURE_ENV, raising=False)
    return tmp_path / "cache" / "amp_auto.json"


@pytest.mark.parametrize("fp32_s,bf16_s,picked", [
    (0.208, 0.128, True),     # 1.63x: bf16
    (0.200, 0.180, True),     # 1.11x: just over the margin
    (0.200, 0.190, False),    # 1.05x: within the margin, fp32 kept
    (0.312, 0.359, False),    # bf16 slower (AVX512-BF16 alone on a Xeon)
])
def test_the_choice_follows_the_measured_times(cache, fp32_s, bf16_s, picked):
    m = measure_or_reuse(machine_key(SHAPE), FakeTimer(fp32_s, bf16_s), path=cache)
    assert m.use_bf16 is picked
    assert m.fp32_ms == pytest.approx(1000 * fp32_s) and m.bf16_ms == pytest.approx(1000 * bf16_s)
    assert m.speedup == pytest.approx(fp32_s / bf16_s)
    assert not m.cached and m.cache_file == str(cache)


def test_the_margin_is_inclusive_and_uses_medians():
    assert decide([0.11], [0.1]).use_bf16 and not decide([0.1099], [0.1]).use_bf16
    m = decide([0.2, 9.0, 0.2, 0.2], [0.1, 0.1, 5.0])  # one slow outlier each: the medians ignore it
    assert (m.fp32_ms, m.bf16_ms, m.rounds) == (pytest.approx(200), pytest.approx(100), 3)
    assert MIN_SPEEDUP == 1.10
    with pytest.raises(ValueError):
        decide([], [0.1])


def test_the_line_says_what_was_measured(cache):
    m = measure_or_reuse(machine_key(SHAPE), FakeTimer(0.2, 0.125), path=cache)
    line = m.describe("bf16 autocast, head fp32")
    assert line.startswith("bf16 autocast, head fp32 (bf16 125 ms vs fp32 200 ms per step, 1.60x >= 1.10x; "
                           "measured on this CPU in ")
    assert f"5 alternated rounds; cached in {cache})" in line
    kept = measure_or_reuse(machine_key(dict(SHAPE, batch=32)), FakeTimer(0.2, 0.19), path=cache)
    assert kept.describe().startswith("kept fp32 (fp32 200 ms vs bf16 190 ms per step, bf16 1.05x < 1.10x; ")
    rec = kept.record()
    assert json.loads(json.dumps(rec)) == rec
    assert (rec["use_bf16"], rec["speedup"], rec["fp32_ms"], rec["key"]["shape"]["batch"]) == (False, 1.053, 200.0, 32)


def test_the_cache_is_written_and_reused_without_timing_again(cache):
    key = machine_key(SHAPE)
    timer = FakeTimer(0.208, 0.128)
    first = measure_or_reuse(key, timer, path=cache)
    doc = json.loads(cache.read_text())
    assert doc["version"] == amp_measure.CACHE_VERSION and len(doc["entries"]) == 1
    (entry,) = doc["entries"].values()
    assert entry["key"] == json.loads(json.dumps(key)) and entry["fp32_ms"] == pytest.approx(208)

    again = measure_or_reuse(key, timer, path=cache)
    assert timer.calls == 1
    assert again.cached and again.use_bf16 and again.bf16_ms == pytest.approx(first.bf16_ms)
    line = again.describe()
    assert "bf16 128 ms vs fp32 208 ms per step" in line and f"reused from {cache}" in line
    assert first.measured_at[:10] in line


@pytest.mark.parametrize("change", [
    dict(shape=dict(SHAPE, batch=128)),            # the recipe's shape (another --batch or --procs)
    dict(shape=dict(SHAPE, threads=2)),            # the training's threads
    dict(cpu="AMD EPYC 9B45"),                      # another CPU (the file may sit on a shared home)
    dict(torch="9.9.9"),                            # other kernels
])
def test_a_changed_key_measures_again(cache, change):
    key = machine_key(SHAPE)
    timer = FakeTimer(0.2, 0.1)
    measure_or_reuse(key, timer, path=cache)
    measure_or_reuse(dict(key, **change), timer, path=cache)
    assert timer.calls == 2
    assert len(json.loads(cache.read_text())["entries"]) == 2  # both kept
    measure_or_reuse(key, timer, path=cache)
    assert timer.calls == 2


def test_the_key_names_the_cpu_its_flags_and_torch():
    info = "processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu avx512f avx512_bf16\n"
    key = machine_key(SHAPE, info)
    assert key["cpu"] == "AMD EPYC 9B45" and key["bf16_flags"] == ["avx512_bf16"] and key["shape"] == SHAPE
    other = machine_key(SHAPE, info.replace("avx512_bf16", "avx512_bf16 amx_bf16 amx_tile"))
    assert other["flags"] != key["flags"]
    assert amp_measure.key_id(key) != amp_measure.key_id(other)


def test_remeasure_by_argument_or_environment(cache, monkeypatch):
    key = machine_key(SHAPE)
    timer = FakeTimer(0.2, 0.1)
    measure_or_reuse(key, timer, path=cache)
    measure_or_reuse(key, timer, path=cache, remeasure=True)
    assert timer.calls == 2
    monkeypatch.setenv(amp_measure.REMEASURE_ENV, "1")
    timer.bf16_s = 0.3  # the machine changed its mind: the new measurement replaces the old one
    assert not measure_or_reuse(key, timer, path=cache).use_bf16
    monkeypatch.delenv(amp_measure.REMEASURE_ENV)
    reused = measure_or_reuse(key, timer, path=cache)
    assert timer.calls == 3 and reused.cached and not reused.use_bf16


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"version": 1, "entries": [1]}'])
def test_a_corrupt_cache_is_measured_over_with_a_warning(cache, text):
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    timer = FakeTimer(0.2, 0.1)
    with pytest.warns(RuntimeWarning, match="corrupt"):
        m = measure_or_reuse(machine_key(SHAPE), timer, path=cache)
    assert timer.calls == 1 and m.use_bf16 and "corrupt" in m.note and "corrupt" in m.describe()
    assert len(json.loads(cache.read_text())["entries"]) == 1  # rewritten whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measure_or_reuse(machine_key(SHAPE), timer, path=cache).cached


def test_a_malformed_entry_or_an_old_version_is_measured_again(cache):
    key = machine_key(SHAPE)
    timer = FakeTimer(0.2, 0.1)
    measure_or_reuse(key, timer, path=cache)
    doc = json.loads(cache.read_text())
    (kid,) = doc["entries"]
    doc["entries"][kid]["bf16_ms"] = "fast"
    cache.write_text(json.dumps(doc))
    measure_or_reuse(key, timer, path=cache)
    assert timer.calls == 2
    cache.write_text(json.dumps(dict(json.loads(cache.read_text()), version=0)))
    measure_or_reuse(key, timer, path=cache)
    assert timer.calls == 3


def test_an_unwritable_cache_warns_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv(amp_measure.REMEASURE_ENV, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache's folder should be
    with pytest.warns(RuntimeWarning, match="could not write"):
        m = measure_or_reuse(machine_key(SHAPE), FakeTimer(0.2, 0.1), path=blocker / "amp_auto.json")
    assert m.use_bf16 and m.cache_file == "" and "not cached" in m.describe()


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(amp_measure.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert amp_measure.cache_path() == tmp_path / "xdg" / "vissl_swav_plugin" / "amp_auto.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert amp_measure.cache_path() == tmp_path / "home" / ".cache" / "vissl_swav_plugin" / "amp_auto.json"
    monkeypatch.setenv(amp_measure.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert amp_measure.cache_path() == tmp_path / "mine" / "amp_auto.json"


def test_time_alternating_alternates_and_stops_on_its_budget():
    calls, now = [], [0.0]

    def clock():
        return now[0]

    def step(name, cost):
        def run():
            calls.append(name)
            now[0] += cost
        return run

    times = amp_measure.time_alternating({"fp32": step("A", 0.2), "bf16": step("B", 0.1)}, warmup=1,
                                         min_rounds=3, max_rounds=10, budget_s=1.0, clock=clock)
    assert calls[:2] == ["A", "B"]                      # warm-up, untimed
    assert calls[2:8] == ["A", "B", "B", "A", "A", "B"]  # alternated rounds
    assert len(times["fp32"]) == len(times["bf16"]) == 4  # 0.3 s per round: over 1.0 s after the 4th
    assert times["fp32"] == pytest.approx([0.2] * 4) and times["bf16"] == pytest.approx([0.1] * 4)
    fixed = amp_measure.time_alternating({"a": step("a", 0.0), "b": step("b", 0.0)}, warmup=0,
                                         min_rounds=2, max_rounds=5, budget_s=1.0, clock=clock)
    assert len(fixed["a"]) == 5  # budget never spent: max_rounds


class FakeSteps:
    """Steps on a fake clock: ``fp32`` costs ``fp32_s``; ``bf16`` costs ``bf16_s`` and, given a
    deadline, stops itself there (``StepTooSlow``) unless ``obeys`` is False."""

    def __init__(self, fp32_s, bf16_s, obeys=True):
        self.now, self.calls, self.fp32_s, self.bf16_s, self.obeys = 0.0, [], fp32_s, bf16_s, obeys

    def clock(self):
        return self.now

    def fp32(self):
        self.calls.append("fp32")
        self.now += self.fp32_s

    def bf16(self, deadline=None):
        self.calls.append("bf16")
        if deadline is not None and self.obeys and self.now + self.bf16_s > deadline:
            self.now = deadline
            raise amp_measure.StepTooSlow()
        self.now += self.bf16_s

    def time(self, **kw):
        return amp_measure.time_alternating({"fp32": self.fp32, "bf16": self.bf16}, clock=self.clock, **kw)


def test_a_bf16_step_twice_fp32_s_ends_the_timing_at_its_deadline():
    """On a CPU without bf16 units (a bf16 step 10x fp32's): one fp32 step, then the bf16 step
    stopped at twice fp32's time; nothing more is run."""
    steps = FakeSteps(0.4, 4.0)
    times = steps.time(warmup=2, min_rounds=3, max_rounds=12, budget_s=3.0, give_up=amp_measure.GIVE_UP)
    assert amp_measure.GIVE_UP == 2.0
    assert steps.calls == ["fp32", "bf16"] and steps.now == pytest.approx(0.4 + 0.8)
    assert times == {"fp32": [pytest.approx(0.4)], "bf16": [pytest.approx(0.8)]} and times.given_up == "bf16"


def test_a_step_that_cannot_stop_itself_is_given_up_after_it():
    steps = FakeSteps(0.4, 1.0, obeys=False)
    times = steps.time(warmup=2, give_up=2.0)
    assert steps.calls == ["fp32", "bf16"] and times.given_up == "bf16" and times["bf16"] == [pytest.approx(1.0)]


@pytest.mark.parametrize("bf16_s", [0.79, 0.2])
def test_bf16_under_twice_fp32_s_or_faster_is_timed_in_full(bf16_s):
    """Only a clearly slower bf16 is given up: 1.98x fp32's, or faster (AMX), gets every round."""
    steps = FakeSteps(0.4, bf16_s)
    full = FakeSteps(0.4, bf16_s)
    times = steps.time(warmup=2, min_rounds=3, max_rounds=5, budget_s=100.0, give_up=2.0)
    reference = full.time(warmup=2, min_rounds=3, max_rounds=5, budget_s=100.0)
    assert times.given_up == "" and steps.calls == full.calls and len(times["bf16"]) == 5
    assert times == reference


def test_a_given_up_measurement_keeps_fp32_says_so_and_is_cached(cache):
    def timer():
        out = amp_measure.Timings(fp32=[0.4], bf16=[0.8])
        out.given_up = "bf16"
        return out

    key = machine_key(SHAPE)
    m = measure_or_reuse(key, timer, path=cache)
    assert not m.use_bf16 and m.given_up == "bf16" and m.rounds == 1
    line = m.describe()
    assert line.startswith("kept fp32 (fp32 400 ms vs bf16 over 800 ms per step, bf16 under 0.50x: its timing "
                           "stopped there; measured on this CPU in ")
    assert "after the first warm-up steps; cached in" in line
    again = measure_or_reuse(key, FakeTimer(0.2, 0.1), path=cache)
    assert again.cached and again.given_up == "bf16" and not again.use_bf16
    assert again.record()["given_up"] == "bf16"


@pytest.mark.parametrize("value,asked", [("", False), ("0", False), ("off", False), ("No", False), ("1", True),
                                         ("TRUE", True), (" yes ", True), ("on", True)])
def test_the_remeasure_variable_s_values(monkeypatch, value, asked):
    monkeypatch.setenv(amp_measure.REMEASURE_ENV, value)
    assert amp_measure.remeasure_requested() is asked


@pytest.mark.parametrize("value", ["2", "y", "please"])
def test_any_other_remeasure_value_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(amp_measure.REMEASURE_ENV, value)
    with pytest.raises(ValueError, match=rf"VISSL_SWAV_PLUGIN_AMP_REMEASURE='{value}': use one of 1, true, yes, on, "
                                         r"0, false, no, off \(or leave it unset\)"):
        amp_measure.remeasure_requested()
