"""docs/demo.md's "One process or two" table equals its records: the quick demo with one
process of 128 (docs/experiments/demo_one_process_2026-11-26.json) against the shipped two
processes of 64 (the quick Fashion-MNIST group of demo_protocols_2026-11-26.json); each cell is
formatted here from the JSON and looked up in the text."""
import json

from testkit import REPO

EXP = REPO / "docs" / "experiments"
COLUMNS = ("knn20", "linear", "100", "10", "1")


def _swav(path, extra):
    groups = json.loads((EXP / path).read_text())["groups"]
    return next(g for g in groups if g["mode"] == "quick" and g["set"] == "fashion_mnist"
                and g["extra"] == extra and g["seeds"] == [0, 1, 2])["figures"]["swav"]


def _section():
    text = (REPO / "docs" / "demo.md").read_text()
    start = text.index("### One process or two")
    return text[start:text.index("\n## ", start)]


def test_the_table_rows_are_the_records():
    two, one = _swav("demo_protocols_2026-11-26.json", "none"), _swav("demo_one_process_2026-11-26.json", "--procs 1")
    section = _section()
    rows = {"2 processes x 64 (the shipped recipe)": [f"{two[c][0]:.2f} ± {two[c][1]:.2f}" for c in COLUMNS],
            "1 process x 128": [f"{one[c][0]:.2f} ± {one[c][1]:.2f}" for c in COLUMNS],
            "difference": [f"{one[c][0] - two[c][0]:+.2f}" for c in COLUMNS]}
    for label, cells in rows.items():
        assert f"| {label} | {' | '.join(cells)} |" in section, label
    # what the text says of them
    for c in ("knn20", "100"):
        assert two[c][0] - one[c][0] > max(two[c][1], one[c][1]), c
    for c in ("linear", "10", "1"):
        assert abs(two[c][0] - one[c][0]) <= max(two[c][1], one[c][1]), c
    assert f"drops by {two['100'][0] - one['100'][0]:.2f} and the 20-NN" in " ".join(section.split())


def test_the_speed_figures_are_the_records():
    rec = json.loads((EXP / "demo_one_process_2026-11-26.json").read_text())
    its = rec["progress_it_per_s_at_299"]
    flat = " ".join(_section().split())
    assert f"{its['1']:.2f} and {its['2']:.2f} it/s at iteration 299" in flat
    assert f"(seed 0, {its['0']:.2f}, had unit tests running beside it)" in flat
    two = json.loads((EXP / "demo_bf16_2026-11-26.json").read_text())["speed_ab_alternated_2"]["runs"]
    assert f"against {two['auto1']['progress_it_per_s_at_460']:.2f} and {two['auto2']['progress_it_per_s_at_460']:.2f} it/s" in flat
