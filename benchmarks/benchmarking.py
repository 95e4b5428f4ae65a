"""The benchmarks' harness (``benchmarks/*.py``): candidates run in alternation, medians and their
spread, and the JSON record every benchmark writes (the machine, the date, the command line, the
results).  Free of VISSL; what builds a shipped recipe's model and VISSL tasks is
:mod:`recipes` (beside it; neither is in the wheel).

Alternation (:func:`alternate`, :func:`round_order`, :data:`SCHEDULES`) is the package's
(:mod:`vissl_swav_plugin.utils.alternation`, which ``--amp auto`` times with too), named here
as the benchmarks call it (``bm.alternate``).  Figures are medians over the kept rounds, with the
spread beside them.
"""
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence

from vissl_swav_plugin.utils.alternation import SCHEDULES, alternate, round_order  # noqa: F401  (bm.alternate, ...)
from vissl_swav_plugin.utils.cpu_features import cpu_flags, cpu_model

#: the CPU flags a record names (vector and matrix units the timings depend on), where present
NOTABLE_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                 "amx_int8", "asimd", "sve")


def timed(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter,
          sync: Optional[Callable[[], None]] = None) -> Callable[[], float]:
    """A callable that runs ``fn`` and returns its milliseconds by ``clock`` (``sync``, e.g.
    ``torch.cuda.synchronize``, called before starting and before stopping the clock)."""
    def run():
        if sync is not None:
            sync()
        t0 = clock()
        fn()
        if sync is not None:
            sync()
        return (clock() - t0) * 1e3

    return run


def ms_timer(device) -> Callable[[Callable[[], Any]], float]:
    """``run(fn) -> ms`` for ``device``: CUDA events after a synchronisation on a CUDA device,
    ``time.perf_counter`` elsewhere."""
    import torch

    if getattr(device, "type", device) == "cuda":
        def run(fn):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        return run
    return lambda fn: timed(fn)()


def summary(values: Iterable[float]) -> Dict[str, float]:
    """``median``, ``min``, ``max``, ``n`` of ``values`` and ``spread``, ``(max - min) / median``
    (0 for a zero median)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("summary of no values")
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    return dict(median=med, min=lo, max=hi, n=len(vals), spread=(hi - lo) / med if med else 0.0)


def medians(samples: Mapping[str, Iterable[float]]) -> Dict[str, float]:
    """``{name: median of its values}``."""
    return {k: statistics.median(list(v)) for k, v in samples.items()}


def machine(cpuinfo_text: Optional[str] = None) -> Dict[str, Any]:
    """The machine a figure was measured on: the CPU model, its notable flags
    (:data:`NOTABLE_FLAGS`), logical cores, Python and its executable, torch and its CUDA, and the
    GPU (``card``, ``gpu_memory_gib``) where torch sees one (``card`` None otherwise)."""
    flags = cpu_flags(cpuinfo_text)
    info: Dict[str, Any] = dict(cpu=cpu_model(cpuinfo_text), cpu_flags=[f for f in NOTABLE_FLAGS if f in flags],
                                cores=os.cpu_count(), python=platform.python_version(), executable=sys.executable,
                                card=None)
    try:
        import torch
    except ImportError:  # pragma: no cover - every environment of the project has torch
        return info
    info.update(torch=torch.__version__, cuda=torch.version.cuda)
    if torch.cuda.is_available():
        info["card"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def proc_status_kb(field: str) -> int:
    """A ``/proc/self/status`` memory figure of this process in kB (``VmRSS``, ``VmHWM``: the
    resident set now and its high-water mark); -1 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def now() -> str:
    """This moment as an ISO date and time with the local offset, to the second."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def command_line(script: str, argv: Optional[Sequence[str]] = None) -> str:
    """``python <script> <argv>`` as one would type it: ``script`` relative to the current folder
    when it lies below it, ``argv`` (default ``sys.argv[1:]``) quoted as a shell would need."""
    argv = sys.argv[1:] if argv is None else list(argv)
    path = os.path.abspath(script)
    rel = os.path.relpath(path)
    return "python " + shlex.join([path if rel.startswith("..") else rel, *argv])


def record(benchmark: str, script: str, argv: Optional[Sequence[str]], results: Any = None,
           machine_info: Optional[Dict[str, Any]] = None, **fields: Any) -> Dict[str, Any]:
    """A benchmark's JSON record: ``benchmark``, ``machine`` (:func:`machine` unless given),
    ``date`` (:func:`now`), ``command`` (:func:`command_line` of ``script`` and ``argv``), then
    ``fields`` (the settings), then ``results`` (left out when None: a benchmark that files its
    figures under keys of their own adds them to the record)."""
    doc = dict(benchmark=benchmark, machine=machine() if machine_info is None else machine_info, date=now(),
               command=command_line(script, argv))
    doc.update(fields)
    if results is not None:
        doc["results"] = results
    return doc


def write_json(path: str, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` (indented JSON); nothing when ``path`` is empty."""
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
