"""benchmarks/recipe_table.py: the table holds every finished run under OUT with the extra
demo arguments it was made with, and a run folder is never reused with other arguments."""

import pytest

from recipe_table_cases import _fake_run, _module  # noqa: F401


def test_table_keeps_earlier_runs_with_their_arguments(tmp_path):
    rt = _module()
    _fake_run(tmp_path, "quick_digits_s0", ["--color-strength", "0.25"], 61.0)
    _fake_run(tmp_path, "quick_fashion_mnist_s1", None, 77.0)  # made before the arguments were recorded
    (tmp_path / "data").mkdir()  # not a run folder
    earlier = rt.finished_runs(tmp_path)
    assert [(r["mode"], r["set"], r["seed"]) for r in earlier] == [("quick", "digits", 0), ("quick", "fashion_mnist", 1)]
    assert earlier[0]["extra"] == ["--color-strength", "0.25"] and earlier[1]["extra"] is None
    assert earlier[0]["collapsed_iters"] == 5 and earlier[0]["min_protos_used"] == 97
    # this invocation's row (here: the same run read again) comes first, the others stay
    now = rt.run_one("quick", "digits", tmp_path, 0, tmp_path, ["--color-strength", "0.25"])
    table = rt.merge([now], earlier)
    assert [(r["set"], r["seed"]) for r in table] == [("digits", 0), ("fashion_mnist", 1)]
    md = rt.markdown(table).splitlines()
    assert md[0].count("|") == md[2].count("|") == md[3].count("|")
    assert "| quick | digits | 0 | --color-strength 0.25 |" in md[2] and "| quick | fashion_mnist | 1 | not recorded |" in md[3]


@pytest.mark.parametrize("asked", [[], ["--color-strength", "0.5"]])
def test_a_run_is_not_reused_with_other_arguments(tmp_path, asked):
    rt = _module()
    run = _fake_run(tmp_path, "quick_digits_s0", ["--color-strength", "0.25"], 61.0)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(rt.TableError, match=r"quick_digits_s0: made with extra arguments \['--color-strength', '0.25'\]"):
        rt.run_one("quick", "digits", tmp_path, 0, tmp_path, asked)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert rt.main(["--out", str(tmp_path), "--modes", "quick", "--sets", f"digits={tmp_path}", "--seeds", "0",
                    *[f"--extra={a}" for a in asked]]) == 2


def test_an_unrecorded_run_is_reused_only_without_extra_arguments(tmp_path):
    rt = _module()
    _fake_run(tmp_path, "quick_digits_s0", None, 61.0)
    assert rt.run_one("quick", "digits", tmp_path, 0, tmp_path, [])["swav"]["knn20"] == 61.0
    with pytest.raises(rt.TableError, match=r"made with extra arguments not recorded"):
        rt.run_one("quick", "digits", tmp_path, 0, tmp_path, ["--temperature", "0.1"])


def test_quality_sums_up_seeds_per_recipe_and_set(tmp_path):
    """quality.md's figures: per recipe / set / extra arguments, SwAV's mean and sample standard
    deviation over the seeds at each k, the baselines' means and the margins (numpy's figures);
    a failed run and a run with other arguments are not mixed in."""
    import numpy as np

    rt = _module()
    for seed in (0, 1, 2):
        _fake_run(tmp_path, f"full_fashion_mnist_s{seed}", [], 80.0)
    _fake_run(tmp_path, "full_digits_s0", ["--color-strength", "0.25"], 70.0)
    rows = rt.finished_runs(tmp_path)
    swav = {"knn20": [83.6, 82.8, 84.1], "knn200": [79.2, 78.8, 79.9], "nn5_euclid": [83.4, 83.6, 84.0]}
    rand = {"knn20": [73.8, 74.6, 73.0], "knn200": [66.7, 66.8, 66.0], "nn5_euclid": [71.8, 72.7, 71.0]}
    raw = {"knn20": 80.08, "knn200": 73.11, "nn5_euclid": 81.68}
    fm = [r for r in rows if r["set"] == "fashion_mnist"]
    for i, r in enumerate(sorted(fm, key=lambda r: r["seed"])):
        r["swav"] = {k: v[i] for k, v in swav.items()}
        r["random_init"] = {k: v[i] for k, v in rand.items()}
        r["raw_pixels"] = dict(raw)
    fm[0]["detector_fired"] = True
    rows.append(dict(mode="full", set="fashion_mnist", seed=3, exit_code=1, extra=[]))
    groups = rt.quality(rows)
    assert [(g["set"], g["extra"]) for g in groups] == [("digits", "--color-strength 0.25"), ("fashion_mnist", "none")]
    digits, g = groups
    assert digits["seeds"] == [0] and digits["knn20"]["sd"] is None and digits["knn20"]["swav"] == 70.0
    assert g["seeds"] == [0, 1, 2] and g["detector_fired"] == 1
    for k in swav:
        assert g[k]["swav"] == pytest.approx(np.mean(swav[k]))
        assert g[k]["sd"] == pytest.approx(np.std(swav[k], ddof=1))
        assert g[k]["over_random"] == pytest.approx(np.mean(swav[k]) - np.mean(rand[k]))
        assert g[k]["over_raw"] == pytest.approx(np.mean(swav[k]) - raw[k])
    md = rt.quality_markdown(groups).splitlines()
    assert len(md) == 2 + 3 * 2 and all(line.count("|") == md[0].count("|") for line in md)
    assert f"| full | fashion_mnist | none | 0,1,2 | 1/3 | 5-NN | {np.mean(swav['nn5_euclid']):.2f} ± " in md[-1]


def _probes(base):
    """A report's ``probes`` section: linear top-1 ``base`` and low-shot means below it."""
    return {key: {"linear": {"top1": base + off}, "low_shot": {k: {"mean": base + off - d, "per_draw": []}
                                                              for k, d in (("100", 3.0), ("10", 11.0), ("1", 30.0))}}
            for key, off in (("swav", 0.0), ("random_init", -8.0), ("raw_pixels", -2.0))}


def test_protocols_sum_up_every_protocol_per_feature_set(tmp_path):
    """protocols.md / .json: per recipe / set / extra arguments and feature set, the mean and
    sample standard deviation over the seeds of kNN, the linear probe and each low-shot size
    (numpy's figures); no spread where a figure is the same on every seed (the raw pixels' kNN);
    kNN only for runs made with --probes off; a failed run is not mixed in."""
    import json

    import numpy as np

    rt = _module()
    linear = [84.8, 85.0, 84.6]
    for seed, lin in enumerate(linear):
        run = _fake_run(tmp_path, f"full_fashion_mnist_s{seed}", [], 80.0 + seed)
        report = json.loads((run / "swav_demo_report.json").read_text())
        report["probes"] = _probes(lin)
        (run / "swav_demo_report.json").write_text(json.dumps(report))
    _fake_run(tmp_path, "quick_digits_s0", ["--probes", "off"], 70.0)
    rows = rt.finished_runs(tmp_path) + [dict(mode="full", set="fashion_mnist", seed=3, exit_code=1, extra=[])]
    fm, digits = rt.protocols(rows)  # the order of the run folders
    assert digits["set"] == "digits" and sorted(digits["figures"]["swav"]) == ["knn20", "knn200", "nn5_euclid"]
    assert fm["seeds"] == [0, 1, 2]
    sw = fm["figures"]["swav"]
    assert sw["knn20"] == pytest.approx([np.mean([80.0, 81.0, 82.0]), np.std([80.0, 81.0, 82.0], ddof=1)])
    assert sw["knn200"] == [60.0, None]  # the same on every seed
    for col, d in (("linear", 0.0), ("100", 3.0), ("10", 11.0), ("1", 30.0)):
        values = np.array(linear) - d
        assert sw[col] == pytest.approx([values.mean(), values.std(ddof=1)])
        assert fm["figures"]["random_init"][col][0] == pytest.approx(values.mean() - 8.0)
        assert fm["figures"]["raw_pixels"][col][0] == pytest.approx(values.mean() - 2.0)
    md = rt.protocols_markdown([fm, digits]).splitlines()
    assert len(md) == 2 + 3 * 2 and all(line.count("|") == md[0].count("|") for line in md)
    assert md[5] == "| quick | digits | --probes off | 0 | SwAV | 70.00 | 60.00 | 70.00 | - | - | - | - |"
    assert md[2].startswith("| full | fashion_mnist | none | 0,1,2 | SwAV | 81.00 ± 1.00 | 60.00 | 70.00 | "
                            f"{np.mean(linear):.2f} ± {np.std(linear, ddof=1):.2f} |")
    rt.write_tables(tmp_path, rows)
    assert json.loads((tmp_path / "protocols.json").read_text()) == json.loads(json.dumps([fm, digits]))
    assert (tmp_path / "protocols.md").read_text().splitlines() == md
