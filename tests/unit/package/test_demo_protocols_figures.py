"""The protocol tables -- the README's headline table and docs/demo.md's table of recipes and
sets -- equal the runs they come from: docs/experiments/demo_protocols_2026-11-26.json holds
benchmarks/recipe_table.py's per-group figures of those runs, and each table row is formatted
here from it (recipe_table's own cell format) and looked up in the text."""
import importlib.util
import json

import pytest

from testkit import REPO

RECORD = REPO / "docs" / "experiments" / "demo_protocols_2026-11-26.json"
README_LABELS = (("swav", "SwAV (res5avg, 128-d)"), ("random_init", "random init (same trunk, mean of 5)"),
                 ("raw_pixels", "raw pixels (784-d)"))


@pytest.fixture(scope="module")
def rt():
    spec = importlib.util.spec_from_file_location("recipe_table", REPO / "benchmarks" / "recipe_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def groups():
    return json.loads(RECORD.read_text())["groups"]


def _cells(rt, figures):
    return " | ".join(rt.cell_text(figures[col]) if col in figures else "-" for col, _ in rt.PROTOCOL_COLUMNS)


def test_the_readme_headline_table_is_the_full_recipe_on_fashion_mnist(rt, groups):
    (g,) = [g for g in groups if (g["mode"], g["set"]) == ("full", "fashion_mnist")]
    assert g["seeds"] == [0, 1, 2] and g["detector_fired"] == 0
    readme = (REPO / "README.md").read_text()
    for key, label in README_LABELS:
        row = f"| {label} | {_cells(rt, g['figures'][key])} |"
        assert row in readme, row


def test_every_recorded_group_is_in_the_table_of_demo_md(rt, groups):
    """docs/demo.md's table "on three small image sets" holds every group of the record, three
    feature sets each, in recipe_table's row format (without the extra-arguments column)."""
    text = (REPO / "docs" / "demo.md").read_text()
    for g in groups:
        for key, label in rt.FEATURES:
            row = f"| {g['mode']} | {g['set']} | {label} | {_cells(rt, g['figures'][key])} |"
            assert row in text, row
