"""``--amp auto`` on a CPU: time the training step in fp32 and in bf16 autocast, keep the
faster one, and remember the answer per machine.

Whether bf16 autocast trains faster than fp32 on a CPU cannot be read off its flags: with
AMX tiles (``amx_bf16``) the demo's step was 1.58x faster on a 2-core Intel Xeon, with
AVX512-BF16 alone it was slower on another Xeon (359 vs 312 ms) and faster on an AMD EPYC
Zen 5 (1.25-1.38x the iterations per second; docs/demo.md).  So the choice is measured:

* :func:`time_alternating` runs a few warm-up steps of each variant, then rounds in
  alternated order (A B, B A, A B, ...: :func:`~vissl_swav_plugin.utils.alternation.alternate`) until a small time budget is spent, and returns the
  per-step seconds of each; the medians are robust to a neighbour's load that comes and goes.
  With ``give_up`` it stops as soon as a warm-up step of a variant takes that many times the
  first variant's (:data:`GIVE_UP`: bf16 twice fp32's), the step itself stopped at that moment
  where it can (:class:`StepTooSlow`): on a CPU without bf16 units a bf16 step took 10 times
  fp32's (2-core AMD EPYC without AVX-512, 2026-11-27), and timing whole rounds of it cost
  20-40 s for a choice that its first step already made.
* :func:`decide` turns the two medians into an :class:`AmpMeasurement`: bf16 only when it is
  at least :data:`MIN_SPEEDUP` times as fast as fp32.
* :func:`measure_or_reuse` keys the measurement by the machine and the recipe's shape
  (:func:`machine_key`) and keeps it in a small JSON file (:func:`cache_path`), so a later
  run on the same machine and shape reuses it; a missing entry, a changed key, a corrupt
  file (with a warning) or ``remeasure`` measure again.

The step itself (the model, the data shapes, the threads) is the caller's: this module
knows nothing of VISSL (``vissl_swav_plugin.demo.training.step_timer`` builds the
demo's).
"""
import contextlib
import datetime
import hashlib
import json
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from vissl_swav_plugin.utils.alternation import alternate
from vissl_swav_plugin.utils.cpu_features import cpu_flags, cpu_model

#: bf16 autocast is picked only when its step is at least this many times as fast as fp32's.
#: The rest of an iteration (data loading, hooks, the gradient all-reduce) does not get
#: faster: on the 2-core Intel Xeon with AMX a 1.58x faster step gave 1.2-1.4x the
#: iterations per second, so a 1.10x step is about 1.05x in iterations per second, the
#: smallest gain worth leaving fp32's numerics for; and repeated alternated measurements of
#: the same step on a shared 2-core machine differ by a few percent, so a smaller margin
#: could pick bf16 for a gain that is only noise.
MIN_SPEEDUP = 1.10
#: the timing of a variant (bf16) stops once one of its warm-up steps takes this many times
#: the first variant's (fp32's) step of the same round: it can no longer be picked (it would
#: need to be :data:`MIN_SPEEDUP` times as fast), and a few more steps of it would only cost
#: time (seconds each on a CPU without bf16 units).  The first warm-up steps already count:
#: both variants' first steps carry their one-off costs (fp32's more, as it runs first), and a
#: bf16 step at twice fp32's is far from the margin.
GIVE_UP = 2.0
#: the cache file's folder: this variable when set, else ``$XDG_CACHE_HOME/vissl_swav_plugin``,
#: else ``~/.cache/vissl_swav_plugin``
CACHE_DIR_ENV = "VISSL_SWAV_PLUGIN_CACHE_DIR"
#: set to 1 to measure again even where the cache has an entry (as ``--amp-remeasure``)
REMEASURE_ENV = "VISSL_SWAV_PLUGIN_AMP_REMEASURE"
CACHE_FILE = "amp_auto.json"
#: bumped when the file's layout or the measurement's meaning changes (old entries are then ignored)
CACHE_VERSION = 1
#: entries kept in the file (the most recent ones; one per machine and recipe shape)
MAX_ENTRIES = 32


@dataclass
class AmpMeasurement:
    """One timing of the training step in fp32 and in bf16 autocast, and the choice it makes.

    Attributes:
        fp32_ms, bf16_ms: median milliseconds per step.
        rounds: alternated rounds timed (each times both variants once).
        seconds: wall time of the whole measurement (building the step, warm-up, rounds).
        min_speedup: the margin the choice used (:data:`MIN_SPEEDUP`).
        key: what the measurement is valid for (:func:`machine_key`).
        measured_at: when (UTC, ISO 8601).
        loadavg: the 1-minute load average when it started.
        given_up: the variant whose timing stopped after a warm-up step took :data:`GIVE_UP`
            times the other's ("bf16"; "" when both were timed in full); its figure is then
            the time until it was stopped, a lower bound.
        cached: True when this run reused a cached entry instead of measuring.
        cache_file: the cache file ("" when it could not be written).
        note: anything that went wrong with the cache (empty otherwise).
    """

    fp32_ms: float
    bf16_ms: float
    rounds: int
    seconds: float
    min_speedup: float = MIN_SPEEDUP
    key: dict = field(default_factory=dict)
    measured_at: str = ""
    loadavg: float = 0.0
    given_up: str = ""
    cached: bool = False
    cache_file: str = ""
    note: str = ""

    @property
    def speedup(self) -> float:
        """fp32's time over bf16's (> 1: bf16 is faster)."""
        return self.fp32_ms / self.bf16_ms if self.bf16_ms > 0 else 0.0

    @property
    def use_bf16(self) -> bool:
        """Whether bf16 autocast is picked: at least :attr:`min_speedup` times as fast."""
        return self.speedup >= self.min_speedup

    def describe(self, bf16_label: str = "bf16 autocast") -> str:
        """The console line's text, e.g. ``bf16 autocast (bf16 128 ms vs fp32 208 ms per step,
        1.63x >= 1.10x; measured on this CPU in 4.1 s, 6 alternated rounds; cached in ...)``;
        ``bf16_label`` names the bf16 choice (the demo: ``bf16 autocast, head fp32``)."""
        if self.use_bf16:
            what = bf16_label
            figures = (f"bf16 {self.bf16_ms:.0f} ms vs fp32 {self.fp32_ms:.0f} ms per step, "
                       f"{self.speedup:.2f}x >= {self.min_speedup:.2f}x")
        elif self.given_up == "bf16":
            what = "kept fp32"
            figures = (f"fp32 {self.fp32_ms:.0f} ms vs bf16 over {self.bf16_ms:.0f} ms per step, "
                       f"bf16 under {self.speedup:.2f}x: its timing stopped there")
        else:
            what = "kept fp32"
            figures = (f"fp32 {self.fp32_ms:.0f} ms vs bf16 {self.bf16_ms:.0f} ms per step, "
                       f"bf16 {self.speedup:.2f}x < {self.min_speedup:.2f}x")
        if self.cached:
            where = f"measured {self.measured_at[:16].replace('T', ' ')} UTC, reused from {self.cache_file}"
        else:
            rounds = "after the first warm-up steps" if self.given_up else f"{self.rounds} alternated rounds"
            where = f"measured on this CPU in {self.seconds:.1f} s, {rounds}; " + (
                f"cached in {self.cache_file}" if self.cache_file else "not cached")
        note = f"; {self.note}" if self.note else ""
        return f"{what} ({figures}; {where}{note})"

    def record(self) -> dict:
        """The JSON-able record (the demo report's ``host.amp_measurement``)."""
        out = asdict(self)
        out.update(speedup=round(self.speedup, 3), use_bf16=self.use_bf16)
        return out


def decide(fp32_s: List[float], bf16_s: List[float], seconds: float = 0.0, key: Optional[dict] = None,
           min_speedup: float = MIN_SPEEDUP, given_up: str = "") -> AmpMeasurement:
    """The :class:`AmpMeasurement` of per-step seconds ``fp32_s`` and ``bf16_s`` (medians);
    ``given_up``: the variant whose timing stopped early (:func:`time_alternating`).

    Example: ``decide([0.2] * 3, [0.1] * 3).use_bf16`` is True (2x), ``decide([0.2] * 3,
    [0.19] * 3).use_bf16`` False (1.05x < 1.10x)."""
    if not fp32_s or not bf16_s:
        raise ValueError("decide: no timings")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return AmpMeasurement(fp32_ms=1000 * statistics.median(fp32_s), bf16_ms=1000 * statistics.median(bf16_s),
                          rounds=min(len(fp32_s), len(bf16_s)), seconds=float(seconds), min_speedup=min_speedup,
                          key=dict(key or {}), loadavg=round(load, 2), given_up=str(given_up or ""),
                          measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


class StepTooSlow(Exception):
    """Raised by a step that stopped itself at the ``deadline`` :func:`time_alternating` gave it."""


class Timings(dict):
    """:func:`time_alternating`'s result: ``{name: [seconds per call, ...]}``.

    Attributes:
        given_up: the step whose timing stopped after a warm-up call took ``give_up`` times
            the first step's ("" when every step was timed in full).
    """

    given_up = ""


def time_alternating(steps: Dict[str, Callable[..., None]], warmup: int = 2, min_rounds: int = 3,
                     max_rounds: int = 12, budget_s: float = 3.0,
                     clock: Callable[[], float] = time.perf_counter, give_up: Optional[float] = None) -> Timings:
    """Seconds per call of each of ``steps`` (name -> a function running one step), timed in
    alternation: ``warmup`` untimed calls of each, then rounds in the order A B, B A, A B ...
    until ``max_rounds`` or, after ``min_rounds``, until ``budget_s`` seconds of rounds.

    ``give_up`` (a ratio, e.g. :data:`GIVE_UP`): the first of ``steps`` is the baseline; a later
    step whose warm-up call takes at least ``give_up`` times the baseline's call of the same
    round ends the timing there, and the result holds that round's calls
    (:attr:`Timings.given_up` names the step).  Those later steps are called with the keyword
    argument ``deadline``, the ``clock`` time at which they reach that ratio; a step may stop
    itself then by raising :class:`StepTooSlow` (its time counts until then).  Without
    ``give_up`` every step is called without arguments and timed in full.

    Example: with ``give_up=2.0`` and steps of 0.4 s (fp32) and 4 s (bf16, which stops itself
    at its deadline), the timing ends 1.2 s after it began, with ``{"fp32": [0.4], "bf16":
    [0.8]}`` and ``given_up == "bf16"``."""
    names = list(steps)
    for _ in range(warmup):
        if give_up is None:
            for name in names:
                steps[name]()
            continue
        t = clock()
        steps[names[0]]()
        base = clock() - t
        for name in names[1:]:
            t = clock()
            try:
                steps[name](deadline=t + give_up * base)
            except StepTooSlow:
                pass
            took = clock() - t
            if took >= give_up * base:
                out = Timings({names[0]: [base], name: [took]})
                out.given_up = name
                return out
    start = clock()

    def timed(step):
        def run():
            t = clock()
            step()
            return clock() - t
        return run

    return Timings(alternate({name: timed(steps[name]) for name in names}, max_rounds,
                             stop=lambda kept: kept >= min_rounds and clock() - start >= budget_s))


def machine_key(shape: dict, cpuinfo_text: Optional[str] = None) -> dict:
    """What a measurement holds for: the CPU's model, a digest of its flags, its logical CPUs,
    torch's version (its kernels) and the step's ``shape`` (the caller's: batch, crops, model,
    threads)."""
    import torch

    flags = sorted(cpu_flags(cpuinfo_text))
    return dict(cpu=cpu_model(cpuinfo_text), flags=hashlib.sha1(" ".join(flags).encode()).hexdigest()[:12],
                bf16_flags=[f for f in flags if "bf16" in f or f.startswith("amx")], cpus=os.cpu_count(),
                torch=torch.__version__, shape=shape)


def key_id(key: dict) -> str:
    """A short digest of ``key`` (the cache's entry name)."""
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path() -> Path:
    """The cache file (see :data:`CACHE_DIR_ENV`)."""
    folder = os.environ.get(CACHE_DIR_ENV)
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "vissl_swav_plugin")
    return Path(folder) / CACHE_FILE


def _read_cache(path: Path):
    """``(entries, problem)``: the file's entries (``{}`` when absent or unusable) and what was
    wrong with it ("" when nothing)."""
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # nothing cached yet (a write then says why it fails)
        return {}, ""
    except OSError as e:
        return {}, f"cache {path} unreadable ({e.strerror or e})"
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("entries", {}), dict):
            raise ValueError("not an object with 'entries'")
    except ValueError as e:
        return {}, f"cache {path} is corrupt ({e}), measured again"
    if doc.get("version") != CACHE_VERSION:
        return {}, ""
    return doc.get("entries", {}), ""


def _from_entry(entry: dict, key: dict) -> Optional[AmpMeasurement]:
    """The cached entry as a measurement, or None when it does not fit ``key`` or is malformed."""
    try:
        m = AmpMeasurement(fp32_ms=float(entry["fp32_ms"]), bf16_ms=float(entry["bf16_ms"]),
                           rounds=int(entry["rounds"]), seconds=float(entry["seconds"]),
                           min_speedup=float(entry.get("min_speedup", MIN_SPEEDUP)), key=entry["key"],
                           measured_at=str(entry.get("measured_at", "")), loadavg=float(entry.get("loadavg", 0.0)),
                           given_up=str(entry.get("given_up", "") or ""))
    except (KeyError, TypeError, ValueError):
        return None
    if m.key != key or not (m.fp32_ms > 0 and m.bf16_ms > 0):
        return None
    m.min_speedup = MIN_SPEEDUP  # the margin of today's code decides, not the one of the run that measured
    return m


def _write_cache(path: Path, entries: dict) -> None:
    """Write ``entries`` atomically (a temporary file in the same folder, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = sorted(entries.items(), key=lambda kv: str(kv[1].get("measured_at", "")))[-MAX_ENTRIES:]
    fd, tmp = tempfile.mkstemp(prefix=".amp_auto.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dict(version=CACHE_VERSION, entries=dict(keep)), f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: the values of :data:`REMEASURE_ENV` (case ignored; unset or empty: no)
REMEASURE_YES = ("1", "true", "yes", "on")
REMEASURE_NO = ("0", "false", "no", "off")


def remeasure_requested() -> bool:
    """Whether :data:`REMEASURE_ENV` asks for a new measurement (``1``, ``true``, ``yes``,
    ``on``; ``0``, ``false``, ``no``, ``off`` or unset: no).

    Raises:
        ValueError: any other value, naming the variable and its values (the demo checks it
            when it starts: :func:`vissl_swav_plugin.demo.cli.parse_args`)."""
    value = os.environ.get(REMEASURE_ENV, "").strip().lower()
    if value and value not in REMEASURE_YES + REMEASURE_NO:
        raise ValueError(f"{REMEASURE_ENV}={os.environ[REMEASURE_ENV]!r}: use one of "
                         f"{', '.join(REMEASURE_YES + REMEASURE_NO)} (or leave it unset)")
    return value in REMEASURE_YES


def measure_or_reuse(key: dict, timer: Callable[[], Dict[str, List[float]]], path: Optional[Path] = None,
                     remeasure: bool = False) -> AmpMeasurement:
    """The measurement for ``key``: the cached one when the cache at ``path`` (default
    :func:`cache_path`) has an entry for exactly this key and neither ``remeasure`` nor
    :data:`REMEASURE_ENV` asks for a new one; else ``timer()`` -- which returns
    ``{"fp32": [seconds, ...], "bf16": [seconds, ...]}`` -- is called once, decided on
    (:func:`decide`) and stored.

    A corrupt cache file is measured over and rewritten, with a warning; one that cannot be
    written leaves the measurement uncached (warning too): the run goes on either way."""
    path = Path(path) if path is not None else cache_path()
    entries, problem = _read_cache(path)
    if problem:
        warnings.warn(f"amp auto: {problem}", RuntimeWarning, stacklevel=2)
    kid = key_id(key)
    if not (remeasure or remeasure_requested()) and kid in entries:
        cached = _from_entry(entries[kid], key)
        if cached is not None:
            cached.cached, cached.cache_file = True, str(path)
            return cached
    t0 = time.perf_counter()
    times = timer()
    m = decide(times["fp32"], times["bf16"], seconds=time.perf_counter() - t0, key=key,
               given_up=getattr(times, "given_up", ""))
    m.note = problem
    entry = {k: v for k, v in asdict(m).items() if k not in ("cached", "cache_file", "note")}
    try:
        _write_cache(path, dict(entries, **{kid: entry}))
        m.cache_file = str(path)
    except OSError as e:
        warnings.warn(f"amp auto: could not write the cache {path} ({e.strerror or e}); the measurement "
                      f"is repeated next time", RuntimeWarning, stacklevel=2)
        m.note = "; ".join(x for x in (problem, f"cache not writable: {path}") if x)
    return m
