"""``benchmarks/gpu_check.py --dry-run``: the GPU suite's code path on the CPU at tiny sizes
(`make test` runs it so that the suite cannot rot before a GPU is available).

Checked against independent truths: the machine fields against the subprocess' own
interpreter and torch, every ratio against the two times it is made of, the "bound by"
verdict against the two rates, and a section that runs out of time recorded as an error
while the sections not re-run are kept."""
import json
import subprocess
import sys

import pytest

from testkit import REPO, launcher_env

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
SECTIONS = ("sinkhorn", "train_step", "pretrain", "input_pipeline", "demo")


def _run(out, *extra, timeout=3000):  # a bound for a hang, not a speed requirement
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *extra],
                          cwd=str(REPO), env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


def _numbers(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from _numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = _run(out, "--demo-args", "--seed 3")
    assert proc.returncode == 0, proc.stdout[-5000:]
    return out, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_dry_run_measures_every_section(dry_run):
    _, doc, _ = dry_run
    assert doc["dry_run"] is True
    for name in SECTIONS:
        res = doc["results"][name]
        assert "error" not in res, (name, res.get("error"), res.get("output_tail"))
        assert list(_numbers(res)), name
    s, t = doc["results"]["sinkhorn"], doc["results"]["train_step"]
    for lab in ("fp32", "fp16_autocast"):
        assert s[lab]["ratio_vissl_over_ours"] == pytest.approx(s[lab]["vissl_ms"] / s[lab]["ours_ms"])
    assert s["fp16_autocast"]["scores_dtype"] == "float16"
    assert t["ratio_ours_over_vissl"] == pytest.approx(t["ours_ms"] / t["vissl_ms"])
    # same weights and batch: the two SwAV implementations' first losses agree, to fp16's
    # precision (the step runs under fp16 autocast, as on the GPU; VISSL's loss stays in fp16)
    assert t["amp"] == "float16"
    assert t["first_loss"]["ours"] == pytest.approx(t["first_loss"]["vissl"], rel=2e-3)
    assert doc["results"]["demo"]["seed"] == 3  # --demo-args reached tools/demo.py (its own report)
    p = doc["results"]["pretrain"]
    assert p["loss_finite"] and not p["nonfinite_guard_fired"] and p["iterations"] > 1
    b = doc["bound"]
    assert b["step_images_per_s"] == pytest.approx(t["ours_images_per_s"])
    assert b["input_images_per_s"] == pytest.approx(doc["results"]["input_pipeline"]["steady_images_per_s"])
    assert b["bound_by"] == ("input pipeline" if b["input_images_per_s"] < b["step_images_per_s"] else "GPU step")


def test_markdown_names_the_machine(dry_run):
    _, doc, md = dry_run
    import platform

    import torch

    assert f"| Python | {platform.python_version()} |" in md
    assert f"| torch | {torch.__version__} " in md
    assert "| card | none (CPU) |" in md and "dry run" in md
    assert f"| date | {doc['machine']['date']} |" in md
    for name in SECTIONS:
        assert f"| {name} |" in md


def _copy_of(doc, tmp_path):
    """An output folder holding the dry run's results (the sections a later call keeps)."""
    work = tmp_path / "o"
    work.mkdir()
    (work / "gpu_check.json").write_text(json.dumps(doc))
    return work


def test_a_failing_section_is_recorded_and_the_others_kept(dry_run, tmp_path):
    out, doc, _ = dry_run
    work = _copy_of(doc, tmp_path)
    proc = _run(work, "--sections", "sinkhorn", "--limit", "0.01", timeout=1800)
    assert proc.returncode == 1, proc.stdout[-3000:]
    new = json.loads((work / "gpu_check.json").read_text())
    assert "ran out of its 0.01 s" in new["results"]["sinkhorn"]["error"]
    for name in SECTIONS[1:]:
        assert new["results"][name] == doc["results"][name]
    assert "| sinkhorn | ERROR |" in (work / "gpu_check.md").read_text()


def test_unknown_section_is_named(tmp_path):
    proc = _run(tmp_path, "--sections", "sinkhorn,trainstep", timeout=1800)
    assert proc.returncode == 2
    assert "unknown section 'trainstep'" in proc.stdout and "train_step" in proc.stdout


def test_bad_demo_seeds_stop_before_any_section(tmp_path):
    proc = _run(tmp_path, "--demo-seeds", "0,one", timeout=1800)
    assert proc.returncode == 2
    assert "--demo-seeds takes comma-separated integers, got '0,one'" in proc.stdout
    assert not (tmp_path / "gpu_check.json").exists()  # no section ran


def test_demo_seeds_run_at_once_and_are_averaged(dry_run, tmp_path):
    _, doc, _ = dry_run
    work = _copy_of(doc, tmp_path)
    proc = _run(work, "--sections", "demo", "--demo-seeds", "1,2", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:]
    d = json.loads((work / "gpu_check.json").read_text())["results"]["demo"]
    assert d["concurrent_runs"] == 2
    # each seed reached its own run (the seed each demo wrote into its own report)
    assert sorted(r["seed"] for r in d["runs"]) == [1, 2] == sorted(d["seeds"])
    import statistics

    for key in ("knn20_swav", "knn20_random_init"):
        values = [r["summary"][key] for r in d["runs"]]
        assert d["over_seeds"][key]["mean"] == pytest.approx(statistics.fmean(values))
        assert d["over_seeds"][key]["sd"] == pytest.approx(statistics.stdev(values))
    assert d["wall_s"] == pytest.approx(max(r["wall_s"] for r in d["runs"]))
    assert "--threads" in d["options"]  # the cores are shared between the runs
    md = (work / "gpu_check.md").read_text()
    assert "(2 seeds at once)" in md and "| demo | seed 1:" in md and "| demo | seed 2:" in md
    assert "mean ± sd over seeds" in md


def test_demo_gets_an_absolute_data_path(tmp_path, monkeypatch):
    """The demo runs in a temporary folder: a relative --fashion-mnist (``make gpu-check``
    passes ``offline_bundle/fashion-mnist``) must reach it as the same folder, absolute."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_module", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    (tmp_path / "bundle" / "fm").mkdir(parents=True)
    for name in gc.FM_FILES:
        (tmp_path / "bundle" / "fm" / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gc, "_device", lambda dry: None)
    seen = []

    class Stop(Exception):
        pass

    def fake_popen(cmd, **kw):
        seen.append(cmd)
        raise Stop

    monkeypatch.setattr(gc.subprocess, "Popen", fake_popen)
    with pytest.raises(Stop):
        gc.section_demo(False, "bundle/fm")
    source = seen[0][seen[0].index("--source") + 1]
    assert source == str(tmp_path / "bundle" / "fm")
