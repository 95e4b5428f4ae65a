"""``vissl_swav_plugin.utils.cpu_features``: the CPU's model and flags, read from
/proc/cpuinfo's text as the kernel writes it (one block per logical CPU)."""
import platform

from vissl_swav_plugin.utils import cpu_features


def _cpuinfo(flags, model="Intel(R) Xeon(R) Processor", cpus=2):
    return "".join(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n" for i in range(cpus))


def test_flags_are_the_flags_lines_of_every_cpu():
    assert cpu_features.cpu_flags(_cpuinfo("fpu avx512f avx512_bf16")) == {"fpu", "avx512f", "avx512_bf16"}
    assert cpu_features.cpu_flags("processor\t: 0\nflags\t\t: fpu\n\nprocessor\t: 1\nflags\t\t: sse2\n") == {"fpu", "sse2"}


def test_cpu_model_is_the_model_name_line(monkeypatch):
    assert cpu_features.cpu_model(_cpuinfo("fpu", model="AMD EPYC 7B13")) == "AMD EPYC 7B13"
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")  # (the real one runs `uname -p`)
    assert cpu_features.cpu_model("processor\t: 0\n") == "x86_64"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_features.cpu_model("processor\t: 0\n") == "unknown"


def test_an_unreadable_cpuinfo_is_no_flags_and_no_model(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_features, "CPUINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_features.cpu_flags() == set()
    assert cpu_features.cpu_model() == "unknown"
