"""What the CPU offers for bf16, read from ``/proc/cpuinfo`` (Linux; empty elsewhere).

Native bf16 is not the same as faster bf16: on a 2-core Intel Xeon with AVX512-BF16 but no AMX
the demo's bf16 autocast step was slower than fp32 (359 vs 312 ms), while on one with AMX tiles
(``amx_bf16``) it was 1.37x-1.60x faster (docs/experiments/benchmarks.md).  So the demo's
``--amp auto`` asks :func:`bf16_matrix_units`, never :func:`native_bf16`.
"""
from typing import Optional, Set

CPUINFO = "/proc/cpuinfo"


def cpu_flags(cpuinfo_text: Optional[str] = None) -> Set[str]:
    """The CPU's flags (the ``flags`` lines of ``/proc/cpuinfo``); an empty set where that
    file cannot be read (not Linux, a sandbox)."""
    if cpuinfo_text is None:
        try:
            with open(CPUINFO) as f:
                cpuinfo_text = f.read()
        except OSError:
            return set()
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
