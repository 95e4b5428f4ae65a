"""What the CPU is and offers for bf16, read from ``/proc/cpuinfo`` (Linux; empty elsewhere).

Native bf16 is not the same as faster bf16: on a 2-core Intel Xeon with AVX512-BF16 but no AMX
the demo's bf16 autocast step was slower than fp32 (359 vs 312 ms), on one with AMX tiles
(``amx_bf16``) it was 1.37x-1.60x faster (docs/experiments/benchmarks.md), and on a 2-core AMD
EPYC (Zen 5) with AVX512-BF16 but no AMX it trained 1.25-1.38x faster (docs/demo.md).  So the
demo's ``--amp auto`` times the step instead of reading these flags
(:mod:`vissl_swav_plugin.utils.amp_measure`); the model name and the flags are part of the key
under which that timing is cached.
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


def native_bf16(cpuinfo_text: Optional[str] = None) -> bool:
    """Whether the CPU has native bf16 arithmetic (``avx512_bf16`` or ``amx_bf16``)."""
    return bool(cpu_flags(cpuinfo_text) & {"avx512_bf16", "amx_bf16"})


def bf16_matrix_units(cpuinfo_text: Optional[str] = None) -> bool:
    """Whether the CPU has AMX bf16 tile units (``amx_bf16``), where oneDNN's bf16
    convolutions and matmuls outrun fp32."""
    return "amx_bf16" in cpu_flags(cpuinfo_text)
