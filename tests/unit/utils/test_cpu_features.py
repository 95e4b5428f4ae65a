"""``vissl_swav_plugin.utils.cpu_features``: the CPU's model and bf16 flags, read from
/proc/cpuinfo's text as the kernel writes it (one block per logical CPU)."""
import platform

import pytest

from vissl_swav_plugin.utils import cpu_features


def _cpuinfo(flags, model="Intel(R) Xeon(R) Processor", cpus=2):
    return "".join(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n" for i in range(cpus))


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx512f avx512_bf16", True), ("fpu amx_tile amx_bf16", True), ("fpu avx2 avx512f", False),
    ("", False)])
def test_native_bf16_reads_the_flags_line(flags, expected):
    assert cpu_features.native_bf16(_cpuinfo(flags)) is expected


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx512_bf16 amx_tile amx_bf16", True), ("fpu avx512f avx512_bf16", False), ("", False)])
def test_amx_is_told_apart_from_avx512_bf16(flags, expected):
    assert cpu_features.bf16_matrix_units(_cpuinfo(flags)) is expected


def test_cpu_model_is_the_model_name_line(monkeypatch):
    assert cpu_features.cpu_model(_cpuinfo("fpu", model="AMD EPYC 7B13")) == "AMD EPYC 7B13"
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")  # (the real one runs `uname -p`)
    assert cpu_features.cpu_model("processor\t: 0\n") == "x86_64"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_features.cpu_model("processor\t: 0\n") == "unknown"


def test_an_unreadable_cpuinfo_is_no_flags_and_no_model(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_features, "CPUINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_features.cpu_flags() == set() and not cpu_features.bf16_matrix_units()
    assert cpu_features.cpu_model() == "unknown"
