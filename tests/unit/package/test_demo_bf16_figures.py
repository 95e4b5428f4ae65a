"""The bf16-autocast figures of docs/demo.md, docs/experiments/benchmarks.md and the README
equal the runs they come from (docs/experiments/demo_bf16_2026-11-26.json, the summaries of
each run's swav_demo_report.json, and docs/experiments/step_profile_bf16_2026-11-26.json):
means, standard deviations, differences and ratios are computed here and looked up in the text."""
import json
import statistics

import pytest

from testkit import REPO

RECORD = REPO / "docs" / "experiments" / "demo_bf16_2026-11-26.json"
STEP = REPO / "docs" / "experiments" / "step_profile_bf16_2026-11-26.json"
COLUMNS = ("knn20_swav", "linear_swav", "shot100_swav", "shot10_swav", "shot1_swav", "loss_last")
ROWS = (("fp32", "| fp32 (`--amp off`), seeds 0-2 |"),
        ("bf16", "| bf16 autocast of the whole model, seeds 0-2 |"),
        ("bf16_fp32_head", "| bf16 autocast, head in fp32 (`auto` on AMX), seeds 0-2 |"))


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def _stats(record, kind, key):
    values = [run[key] for run in record[kind]["runs"].values()]
    return statistics.fmean(values), statistics.stdev(values)


def test_the_table_rows_are_the_runs_mean_and_sd(record):
    text = (REPO / "docs" / "demo.md").read_text()
    for kind, label in ROWS:
        assert sorted(record[kind]["runs"]) == ["0", "1", "2"]
        cells = " | ".join(f"{m:.2f} ± {s:.2f}" for m, s in (_stats(record, kind, k) for k in COLUMNS))
        assert f"{label} {cells} |" in text, (kind, cells)
    for kind, label in (("bf16", "| whole model bf16 − fp32 |"), ("bf16_fp32_head", "| head in fp32 − fp32 |")):
        diffs = " | ".join(f"{_stats(record, kind, k)[0] - _stats(record, 'fp32', k)[0]:+.2f}" for k in COLUMNS)
        assert f"{label} {diffs} |" in text, (kind, diffs)
    # the evaluation runs in fp32: the random-init baseline of a seed is the same in every row
    for kind, _ in ROWS[1:]:
        for seed, run in record[kind]["runs"].items():
            assert run["knn20_random_init"] == record["fp32"]["runs"][seed]["knn20_random_init"]


def test_with_the_head_in_fp32_every_figure_is_within_the_seed_spread(record):
    """What makes bf16 the default on AMX CPUs (docs/demo.md): each mean of the fp32-head runs is
    within one standard deviation (the larger of the two rows') of fp32's; the whole-model bf16
    runs are not, on 20-NN."""
    for k in COLUMNS:
        (m0, s0), (m1, s1) = _stats(record, "fp32", k), _stats(record, "bf16_fp32_head", k)
        assert abs(m1 - m0) <= max(s0, s1) or m1 > m0, k
    (m0, s0), (m1, s1) = _stats(record, "fp32", "knn20_swav"), _stats(record, "bf16", "knn20_swav")
    assert m0 - m1 > max(s0, s1)


def _round(runs, demo, when):
    """Checks one round of alternated runs (off, auto, auto, off) against demo.md's table rows
    labelled with ``when``; returns (it/s ratio, training-time ratio)."""
    assert list(runs) == ["off1", "auto1", "auto2", "off2"]  # the order they ran in
    off, on = [runs[k] for k in ("off1", "off2")], [runs[k] for k in ("auto1", "auto2")]
    for label, pair in ((f"| `off` (fp32), {when} |", off), (f"| `auto` (bf16, head fp32), {when} |", on)):
        its = ", ".join(f"{r['progress_it_per_s_at_460']:.2f}" for r in pair)
        walls = ", ".join(f"{r['train_wall_s']:.0f} s" for r in pair)
        assert f"{label} {its} | {walls} |" in demo, (its, walls)
    it_ratio = statistics.fmean(r["progress_it_per_s_at_460"] for r in on) / statistics.fmean(
        r["progress_it_per_s_at_460"] for r in off)
    wall_ratio = statistics.fmean(r["train_wall_s"] for r in off) / statistics.fmean(r["train_wall_s"] for r in on)
    return it_ratio, wall_ratio


def test_the_speed_figures_are_the_alternated_runs(record):
    demo = (REPO / "docs" / "demo.md").read_text()
    it_ratio, wall_ratio = _round(record["speed_ab_alternated"]["runs"], demo, "Intel Xeon 2-core, 2026-11-26")
    assert f"That is {it_ratio:.2f}x the iterations per second ({wall_ratio:.2f}x in training time)" in demo
    old_off, old_on = (record["speed_ab"]["runs"][k]["progress_it_per_s_at_460"] for k in ("off", "on"))
    assert f"gave {old_off:.2f} vs {old_on:.2f} it/s\n({old_on / old_off:.2f}x)" in demo
    it_ratio2, wall_ratio2 = _round(record["speed_ab_alternated_2"]["runs"], demo,
                                    "second round, Intel Xeon 2-core, 2026-11-26 08:31 UTC")
    assert f"gave {it_ratio2:.2f}x ({wall_ratio2:.2f}x in training time)" in " ".join(demo.split())
    readme = (REPO / "README.md").read_text()
    assert f"trains {it_ratio:.1f} to {it_ratio2:.1f} times as fast" in readme
    bench = (REPO / "docs" / "experiments" / "benchmarks.md").read_text()
    assert f"{it_ratio:.2f}x the demo's iterations per second" in bench
    assert f"{it_ratio2:.2f}x); features within" in bench


def test_the_step_figures_are_the_benchmark_run():
    step = json.loads(STEP.read_text())
    bf16 = step["variants"]["bf16"]
    ratio = bf16["ratio_today_over_variant"]
    demo = (REPO / "docs" / "demo.md").read_text()
    assert f"The bare model step gains more, {ratio:.2f}x" in demo
    bench = (REPO / "docs" / "experiments" / "benchmarks.md").read_text()
    today_gflops = step["flops_forward"] / 1e6 / bf16["today_ms"] + step["flops_backward"] / 1e6 / bf16["today_ms"]
    for figure in (f"{bf16['today_ms']:.1f} vs {bf16['ms']:.1f} ms", f"{ratio:.2f}x",
                   f"{today_gflops:.1f} GFLOP/s ({100 * today_gflops / step['matmul_peak_gflops']:.1f}% of the fp32 peak",
                   f"{bf16['achieved_gflops']:.1f} GFLOP/s ({100 * bf16['fraction_of_fp32_peak']:.1f}% of the fp32 peak, "
                   f"{100 * bf16['fraction_of_bf16_peak']:.1f}% of the bf16 peak",
                   f"{step['matmul_peak_gflops']:.0f} and {step['matmul_peak_gflops_bf16']:.0f} GFLOP/s"):
        assert figure in bench, figure
