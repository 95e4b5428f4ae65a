"""The quick demo's GPU figures in docs/gpu.md, docs/demo.md and the README equal the record
they come from, docs/experiments/gpu/demo_h100_2026-11-26.json (two calls of the lent H100):
each number is formatted here from the JSON and looked up in the text."""
import json

import pytest

from testkit import REPO

RECORD = REPO / "docs" / "experiments" / "gpu" / "demo_h100_2026-11-26.json"
PROTOCOLS = REPO / "docs" / "experiments" / "demo_protocols_2026-11-26.json"


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


@pytest.fixture(scope="module")
def section():
    text = (REPO / "docs" / "gpu.md").read_text()
    start = text.index("## The demo on one H100")
    return text[start:text.index("\n## ", start + 1)]


def test_the_section_names_the_machine_and_the_command(record, section):
    m = record["machine"]
    for text in (m["card"], f"driver {m['driver']}", f"CUDA {m['cuda']}", f"torch {m['torch']}",
                 f"Python {m['python']}", "16 cores of an Intel Xeon", m["date"], RECORD.name):
        assert text in section, text
    cmd = record["demo_quick"]["command"].replace("python3 tools/demo.py ", "")
    assert " ".join(section.split()).replace("\\ ", "").count(cmd.split(" --source")[0]) == 1


def test_worker_start_figures(record, section):
    d = record["demo_quick"]
    before = d["forkserver_workers"]["seconds_from_data_iterator_to_phase_start"]
    after = d["fork_workers"]["seconds_from_data_iterator_to_phase_start"]
    flat = " ".join(section.split())
    assert f"waited {before[0]:.1f} s and {before[1]:.1f} s" in flat
    assert f"({d['fork_workers']['in_epoch_it_per_s']:.1f} it/s)" in flat
    assert f"waits fell to {min(after):.2f}-{max(after):.2f} s" in flat
    t = d["fork_workers"]["times_s"]
    assert (f"took {t['total']:.0f} s: data {t['data']:.1f} s, training {t['train_launcher']:.1f} s "
            f"({d['fork_workers']['train_iterations']} iterations") in flat
    assert f"evaluation {t['evaluation']:.1f} s, report {t['report']:.1f} s" in flat
    assert "8 s each" in flat
    imports = [float(x.split("torch ")[1].split(" s")[0]) + float(x.split("plugin ")[1].split(" s")[0])
               for x in d["fresh_interpreter_imports"]]
    assert all(round(v) == 8 for v in imports)
    demo = " ".join((REPO / "docs" / "demo.md").read_text().split())
    assert f"{t['total']:.0f} s in all" in demo and f"training {t['train_launcher']:.1f} s" in demo
    # the README gives the default now: batch 128 on one GPU
    second = record["demo_quick_batch128"]
    t2 = second["times_s"]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert second["batch"] == "1x128"
    assert f"batch 128, fp16 autocast): {t2['total']:.1f} s in all, training {t2['train_launcher']:.1f} s" in readme


def _cells(summary, knn, key):
    return [knn[key]["knn20"], summary[f"linear_{key}"], summary[f"shot100_{key}"], summary[f"shot10_{key}"],
            summary[f"shot1_{key}"]]


def test_figure_table(record, section):
    first, second = record["demo_quick"]["fork_workers"], record["demo_quick_batch128"]
    assert second["batch"] == "1x128" and second["epochs"] == 12
    rows = {"SwAV, batch 64 (6 epochs)": _cells(first["summary"], first["knn"], "swav"),
            "SwAV, batch 128 (12 epochs, the default now)": _cells(second["summary"], second["knn"], "swav"),
            "random init": _cells(first["summary"], first["knn"], "random_init"),
            "raw pixels": _cells(first["summary"], first["knn"], "raw_pixels")}
    for key in ("random_init", "raw_pixels"):  # the baselines do not depend on the training's batch
        assert _cells(first["summary"], first["knn"], key) == _cells(second["summary"], second["knn"], key)
    for label, cells in rows.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| {label} |"))
        assert [c.strip() for c in row.strip("|").split("|")[1:]] == [f"{v:.2f}" for v in cells], label
    s = first["summary"]
    assert first["knn"]["swav"]["knn20"] == s["knn20_swav"] and first["knn"]["random_init"]["knn20"] == s["knn20_random_init"]
    flat = " ".join(section.split())
    t = second["times_s"]
    assert (f"({second['knn']['swav']['knn20']:.1f}% 20-NN; {t['total']:.0f} s in all, training "
            f"{t['train_launcher']:.1f} s)") in flat
    cpu = next(g for g in json.loads(PROTOCOLS.read_text())["groups"]
               if g["mode"] == "quick" and g["set"] == "fashion_mnist")["figures"]["swav"]
    assert f"20-NN {cpu['knn20'][0]:.2f} and linear {cpu['linear'][0]:.2f}" in flat
    one = json.loads((REPO / "docs" / "experiments" / "demo_one_process_2026-11-26.json").read_text())
    one = one["groups"][0]["figures"]["swav"]
    assert f"one process of 128 on the CPU gave {one['knn20'][0]:.2f} and {one['linear'][0]:.2f}" in flat


def test_fp32_head_figures(record, section):
    h = record["fp32_head_under_cuda_fp16_autocast"]
    assert h["ok"] and h["device"] == record["machine"]["card"]
    flat = " ".join(section.split())
    assert f"(largest difference {h['on_equal_fp32_head_maxdiff']:.1f})" in flat
    assert f"up to {h['off_scores_maxdiff_vs_fp32']:.1e}".replace("e-04", "e-4") in flat
