"""The bf16-autocast figures of docs/demo.md, docs/experiments/benchmarks.md and the README
equal the runs they come from (docs/experiments/demo_bf16_2026-11-26.json, the summaries of
each run's swav_demo_report.json): means, standard deviations and differences are computed here
and looked up in the text."""
import json
import statistics

import pytest

from testkit import REPO

RECORD = REPO / "docs" / "experiments" / "demo_bf16_2026-11-26.json"
COLUMNS = ("knn20_swav", "linear_swav", "shot100_swav", "shot10_swav", "shot1_swav", "loss_last")


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def _stats(record, kind, key):
    values = [run[key] for run in record[kind]["runs"].values()]
    return statistics.fmean(values), statistics.stdev(values)


def test_the_table_rows_are_the_runs_mean_and_sd(record):
    text = (REPO / "docs" / "demo.md").read_text()
    for kind, label in (("fp32", "| fp32 (default), seeds 0-2 |"), ("bf16", "| bf16 autocast (`--amp on`), seeds 0-2 |")):
        assert sorted(record[kind]["runs"]) == ["0", "1", "2"]
        cells = " | ".join(f"{m:.2f} ± {s:.2f}" for m, s in (_stats(record, kind, k) for k in COLUMNS))
        assert f"{label} {cells} |" in text, (kind, cells)
    diffs = " | ".join(f"{_stats(record, 'bf16', k)[0] - _stats(record, 'fp32', k)[0]:+.2f}" for k in COLUMNS)
    assert f"| difference | {diffs} |" in text, diffs
    walls = [run["train_wall_s"] for run in record["bf16"]["runs"].values()]
    assert f"trained in {min(walls):.0f}-{max(walls):.0f} s each" in text
    # the evaluation runs in fp32: the random-init baseline of a seed is the same in both
    for seed, run in record["bf16"]["runs"].items():
        assert run["knn20_random_init"] == record["fp32"]["runs"][seed]["knn20_random_init"]


def test_the_speed_figures_are_the_ab_runs(record):
    off, on = record["speed_ab"]["runs"]["off"], record["speed_ab"]["runs"]["on"]
    ratio = on["progress_it_per_s_at_460"] / off["progress_it_per_s_at_460"]
    pair = f"{off['progress_it_per_s_at_460']:.2f} vs {on['progress_it_per_s_at_460']:.2f}"
    walls = f"training {off['train_wall_s']:.0f} vs {on['train_wall_s']:.0f} s"
    demo = (REPO / "docs" / "demo.md").read_text()
    assert f"{pair}\n  it/s ({walls}), a ratio of {ratio:.2f} in it/s" in demo
    bench = (REPO / "docs" / "experiments" / "benchmarks.md").read_text()
    assert f"{pair} it/s ({walls}) | {ratio:.2f}x;" in bench
    readme = (REPO / "README.md").read_text()
    assert f"trains {ratio:.1f} times as fast" in readme
