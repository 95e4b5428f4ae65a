"""``benchmarks/gpu_check.py --dry-run``: the GPU suite's code path on the CPU at tiny sizes
(`make test` runs it so that the suite cannot rot before a GPU is available).

Checked against independent truths: the machine fields against the test's own interpreter and
torch, every ratio against the two times it is made of, the "bound by" verdict against the two
rates, and a section that runs out of time recorded as an error while the sections not re-run
are kept.

gpu_check's ``main`` runs in the test process; each section is a process of its own, as in a
real run (its time limit stops it)."""
import json
import math
import tempfile

import pytest

from testkit import load_script

SECTIONS = ("sinkhorn", "train_step", "step_variants", "pretrain", "input_pipeline", "loop_variants",
            "worker_stages", "flagship", "demo")
gc = load_script("benchmarks/gpu_check.py")


def _numbers(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from _numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of every section, read by the tests below; its demo section runs two seeds
    at once, with an option of the demo's own (``--probes on``, the dry run's being off)."""
    out, tmp = tmp_path_factory.mktemp("gpu_check"), tmp_path_factory.mktemp("tmpdir")
    with pytest.MonkeyPatch.context() as mp:  # this process's and the sections' temporary folders
        mp.setenv("TMPDIR", str(tmp))
        mp.setattr(tempfile, "tempdir", str(tmp))
        code = gc.main(["--dry-run", "--out", str(out), "--demo-args", "--probes on", "--demo-seeds", "1,2"])
    doc = json.loads((out / "gpu_check.json").read_text())
    assert code == 0, {k: v for k, v in doc["results"].items() if "error" in v}
    # torch.compile's cache (torchinductor_<user>) stays there on purpose, for the next run
    left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], "a section left its temporary files behind"
    return out, doc, (out / "gpu_check.md").read_text()


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
    # --demo-args reached tools/demo.py: each run's own report has the probes' figures
    assert all("linear_swav" in r["summary"] for r in doc["results"]["demo"]["runs"])
    p = doc["results"]["pretrain"]
    assert p["loss_finite"] and not p["nonfinite_guard_fired"] and p["iterations"] > 1
    b = doc["bound"]
    assert b["step_images_per_s"] == pytest.approx(t["ours_images_per_s"])
    assert b["input_images_per_s"] == pytest.approx(doc["results"]["input_pipeline"]["steady_images_per_s"])
    assert b["bound_by"] == ("input pipeline" if b["input_images_per_s"] < b["step_images_per_s"] else "GPU step")


def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_loop_variants_record(dry_run):
    """VISSL's real loop per variant: every variant ran, was refused as not available (the
    uint8 crops while the key does not exist) or was skipped for the budget; a variant that ran
    has a finite positive rate, and its ratios are made of the rates they name."""
    _, doc, md = dry_run
    lv = doc["results"]["loop_variants"]
    names = [v["variant"] for v in lv["variants"]]
    for name in ("baseline", "replay", "uint8_crops", "photometric", "decode", "hooks_off", "sync_copy", "larc_off",
                 "log_every_1", "log_every_100"):
        assert name in names, name
    assert any(n.startswith("workers_") for n in names)
    by = {v["variant"]: v for v in lv["variants"]}
    assert by["baseline"]["status"] == "done" and by["replay"]["status"] == "done"
    assert _positive(lv["bare_step_ms"]) and _positive(lv["bare_step_images_per_s"])
    assert lv["bare_step_images_per_s"] == pytest.approx(lv["batch"] * 1e3 / lv["bare_step_ms"])
    base = by["baseline"]["images_per_s"]
    assert lv["baseline_images_per_s"] == base
    for v in lv["variants"]:
        assert v["status"] in ("done", "not available", "skipped"), (v["variant"], v.get("status"), v.get("error"))
        if v["status"] != "done":
            assert v["reason"]
            continue
        for key in ("images_per_s", "ms_per_iteration", "timed_s", "wall_s", "ratio_to_baseline", "ratio_to_bare_step"):
            assert _positive(v[key]), (v["variant"], key, v[key])
        assert v["timed_iterations"] == v["measure"]
        assert v["images_per_s"] == pytest.approx(v["batch"] * v["timed_iterations"] / v["timed_s"])
        assert v["ratio_to_baseline"] == pytest.approx(v["images_per_s"] / base)
        assert v["ratio_to_bare_step"] == pytest.approx(v["images_per_s"] / lv["bare_step_images_per_s"])
    # each override reached the run it names
    assert by["workers_0"]["workers"] == 0 and by["workers_2"]["workers"] == 2
    for name in ("baseline", "replay"):
        prof = by[name]["profile"]
        assert prof["top_self_cpu"] and all(_positive(r["self_cpu_ms_per_iter"]) for r in prof["top_self_cpu"][:3])
    # the loader's wait is one of the baseline's ops, and absent once the batch is replayed
    ops = lambda name: " ".join(r["op"] for r in by[name]["profile"]["top_self_cpu"])  # noqa: E731
    assert "DataLoader" not in ops("replay")
    assert "## loop_variants: VISSL's training loop" in md and "| replay |" in md


def test_worker_stages_record(dry_run):
    """Every mode's stages add up to its worker time, its rate is made of that time, and the
    device side ran for each mode but off; the table has a row per mode."""
    _, doc, md = dry_run
    ws = doc["results"]["worker_stages"]
    assert set(ws) - {"section_s"} == {"off", "off+jpeg_draft", "normalize", "photometric", "decode"}
    for mode in ("off", "off+jpeg_draft", "normalize", "photometric", "decode"):
        v = ws[mode]
        assert v["worker_ms_per_image"] == pytest.approx(sum(v["ms_per_image"].values()))
        assert v["images_per_s_per_core"] == pytest.approx(1e3 / v["worker_ms_per_image"])
        assert _positive(v["per_batch"]["mb"])
        assert (v["per_batch"]["device_ms_cpu"] > 0) == (mode not in ("off", "off+jpeg_draft")), mode
        assert f"| worker_stages | `{mode}`:" in md
    # decode sends the files: no crop, colour or blur work in its workers
    assert all(ws["decode"]["ms_per_image"][s] == 0 for s in ("crop+resize", "colour", "blur"))


def test_step_variants_record(dry_run):
    _, doc, _ = dry_run
    sv = doc["results"]["step_variants"]
    assert set(sv["variants"]) == {"vissl", "ours", "ours_channels_last", "ours_cudnn_benchmark"}
    ref = sv["variants"]["vissl"]
    for name, v in sv["variants"].items():
        assert _positive(v["ms"]) and _positive(v["images_per_s"]), name
        assert v["ratio_to_vissl"] == pytest.approx(v["ms"] / ref["ms"])
        assert v["losses_finite"], name
    # same weights and batch: equal first losses, to fp16 autocast's precision (unit roundoff
    # 4.9e-4).  Ours against VISSL's: the same layout, so the same sums (2e-3).  Channels-last
    # against ours: the convolutions sum in another order in fp16, seen up to 0.6% apart on the
    # CPU (2026-11-26, over 17 draws of the batch): 1e-2.
    assert sv["variants"]["ours"]["first_loss"] == pytest.approx(ref["first_loss"], rel=2e-3)
    ours = sv["variants"]["ours"]["first_loss"]
    assert sv["variants"]["ours_channels_last"]["first_loss"] == pytest.approx(ours, rel=1e-2)
    # cudnn.benchmark changes no arithmetic on the CPU (same model, same batch)
    assert sv["variants"]["ours_cudnn_benchmark"]["first_loss"] == sv["variants"]["ours"]["first_loss"]
    assert sv["use_larc"] is True


def test_flagship_record(dry_run):
    _, doc, _ = dry_run
    f = doc["results"]["flagship"]
    assert f["config"] == "pretrain/swav/swav_8node_resnet"
    assert f["use_larc"] is True and f["iterations"] > 1 and f["status"] == "done"
    assert f["loss_finite"] and not f["nonfinite_guard_fired"]
    for key in ("loss_first", "loss_last", "images_per_s", "wall_s"):
        assert _positive(f[key]), key


def test_default_gpu_sections_fit_one_call():
    """A GPU run without --sections fits one call of at most 10 minutes: its sections' limits
    add up to at most 9 minutes (the rest: installing the bundle)."""
    assert set(gc.DEFAULT_SECTIONS) <= set(gc.SECTIONS) == set(SECTIONS)
    assert sum(gc.LIMITS[s][0] for s in gc.DEFAULT_SECTIONS) <= 540
    assert {"loop_variants", "flagship", "step_variants"} <= set(gc.DEFAULT_SECTIONS)


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
    """The section's process stopped at the time limit: an error, exit code 1."""
    out, doc, _ = dry_run
    work = _copy_of(doc, tmp_path)
    assert gc.main(["--dry-run", "--out", str(work), "--sections", "sinkhorn", "--limit", "0.01"]) == 1
    new = json.loads((work / "gpu_check.json").read_text())
    assert "ran out of its 0.01 s" in new["results"]["sinkhorn"]["error"]
    for name in SECTIONS[1:]:
        assert new["results"][name] == doc["results"][name]
    assert "| sinkhorn | ERROR |" in (work / "gpu_check.md").read_text()


def _refused(tmp_path, capsys, *extra):
    """gpu_check's ``main`` stopped by its argument parser: exit code 2, the error line."""
    with pytest.raises(SystemExit) as exit_:
        gc.main(["--dry-run", "--out", str(tmp_path), *extra])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_unknown_section_is_named(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--sections", "sinkhorn,trainstep")
    assert "unknown section 'trainstep'" in err and "train_step" in err


def test_bad_demo_seeds_stop_before_any_section(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--demo-seeds", "0,one")
    assert "--demo-seeds takes comma-separated integers, got '0,one'" in err
    assert not (tmp_path / "gpu_check.json").exists()  # no section ran


def test_demo_seeds_run_at_once_and_are_averaged(dry_run):
    _, doc, md = dry_run
    d = doc["results"]["demo"]
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
    assert "(2 seeds at once)" in md and "| demo | seed 1:" in md and "| demo | seed 2:" in md
    assert "mean ± sd over seeds" in md


def test_demo_gets_an_absolute_data_path(tmp_path, monkeypatch):
    """The demo runs in a temporary folder: a relative --fashion-mnist (``make gpu-check``
    passes ``offline_bundle/fashion-mnist``) must reach it as the same folder, absolute."""
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
