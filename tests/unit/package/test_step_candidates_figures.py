"""The figures of docs/experiments/benchmarks.md's section "What a 2x would need" equal their
records: the step benchmark's JSON (step_candidates_2026-11-26.json) and the second round of
alternated demo runs (demo_bf16_2026-11-26.json); the budget's sums are redone here."""
import json
import statistics

from testkit import REPO

EXP = REPO / "docs" / "experiments"


def _section():
    text = (EXP / "benchmarks.md").read_text()
    start = text.index("## What a 2x would need")
    end = text.find("\n## ", start + 1)
    return " ".join(text[start:end if end > 0 else None].split())


def test_the_variant_table_is_the_benchmark_run():
    rec = json.loads((EXP / "step_candidates_2026-11-26.json").read_text())
    v, over = rec["variants"], rec["variants_over_bf16"]
    flat = _section()
    assert rec["command"].split(" --json")[0] in flat.replace(" > ", " ").replace("`", "")
    today = v["bf16"]["today_ms"]
    assert f"| today (fp32, channels-last) | {today:.1f} | 1 |" in flat
    assert (f"| {v['bf16']['ms']:.1f} | {v['bf16']['ratio_today_over_variant']:.2f}x | 1 | "
            f"{100 * v['bf16']['fraction_of_bf16_peak']:.1f}% |") in flat
    for name in ("bf16-compile", "bf16-im2col-wgrad"):
        assert (f"| {v[name]['ms']:.1f} | {v[name]['ratio_today_over_variant']:.2f}x | {over[name]:.2f}x | "
                f"{100 * v[name]['fraction_of_bf16_peak']:.1f}% |") in flat, name
    assert f"({v['bf16-compile']['compile_s']:.1f} s to compile, cold cache)" in flat
    ops = rec["op_profile_ms_per_step"]
    b = ops["bf16"]
    assert (f"convolution backward {b['aten::convolution_backward']:.1f}, batch-norm backward "
            f"{b['aten::native_batch_norm_backward']:.1f}") in flat
    assert f"of {b['total']:.1f}" in flat
    for name, label in (("today", "In fp32"), ("bf16", "in bf16")):
        ratio = ops[name]["aten::convolution_backward"] / ops[name]["aten::mkldnn_convolution"]
        assert f"{ratio:.2f}" in flat and label in flat


def test_the_budget_is_redone_from_the_records():
    rec = json.loads((EXP / "step_candidates_2026-11-26.json").read_text())
    runs = json.loads((EXP / "demo_bf16_2026-11-26.json").read_text())["speed_ab_alternated_2"]["runs"]
    fp32 = statistics.fmean(runs[k]["progress_it_per_s_at_460"] for k in ("off1", "off2"))
    bf16 = statistics.fmean(runs[k]["progress_it_per_s_at_460"] for k in ("auto1", "auto2"))
    it32, it16 = 1e3 / fp32, 1e3 / bf16
    flat = _section()
    assert f"fp32 trained at {fp32:.2f} it/s ({it32:.0f} ms an iteration) and bf16 at {bf16:.2f} it/s ({it16:.0f} ms)" in flat
    assert f"2x needs {it32 / 2:.0f} ms" in flat
    v, ph = rec["variants"], rec["phases_ms"]
    gain_compile = v["bf16"]["ms"] - v["bf16-compile"]["ms"]
    gain_im2col = v["bf16"]["ms"] - v["bf16-im2col-wgrad"]["ms"]
    data = ph["vissl loop bf16"]["data"]
    assert f"the model step is {v['bf16']['ms']:.0f} ms" in flat and f"collation in the training process; VISSL's loop) {data:.0f} ms" in flat
    assert f"all-reduce between the two processes {ph['all-reduce']:.0f} ms" in flat
    best = it16 - gain_compile - gain_im2col - data
    assert f"({gain_compile:.1f} + {gain_im2col:.1f} ms)" in flat
    assert f"about {best:.0f} ms: {it32 / best:.2f}x, still short" in flat
    assert it32 / best < 2
