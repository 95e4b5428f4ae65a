"""The CPU's model name and flags, read from ``/proc/cpuinfo`` (Linux; empty elsewhere): part of
the key under which the demo's ``--amp auto`` caches its timing
(:mod:`vissl_swav_plugin.utils.amp_measure`).  That option times the step rather than reading
the bf16 flags, since native bf16 is not always the faster (docs/experiments/benchmarks.md).
"""
import platform
from typing import Optional, Set

CPUINFO = "/proc/cpuinfo"


def _read(cpuinfo_text: Optional[str]) -> str:
    """``cpuinfo_text``, else the machine's ``/proc/cpuinfo`` ("" where it cannot be read)."""
    if cpuinfo_text is not None:
        return cpuinfo_text
    try:
        with open(CPUINFO) as f:
            return f.read()
    except OSError:
        return ""


def cpu_model(cpuinfo_text: Optional[str] = None) -> str:
    """The CPU's ``model name`` (the first one), else ``platform.processor()`` or "unknown"."""
    for line in _read(cpuinfo_text).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags(cpuinfo_text: Optional[str] = None) -> Set[str]:
    """The CPU's flags (the ``flags`` lines of ``/proc/cpuinfo``); an empty set where that
    file cannot be read (not Linux, a sandbox)."""
    cpuinfo_text = _read(cpuinfo_text)
    flags: Set[str] = set()
    for line in cpuinfo_text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return flags
