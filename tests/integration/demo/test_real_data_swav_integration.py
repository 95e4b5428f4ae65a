"""SwAV on real images: `tools/demo.py --quick` for 6 of its 12 epochs (VISSL's launcher, 2 gloo
processes, our loss / head / multi-crop / small trunk, Fashion-MNIST) must give features
whose kNN accuracy beats the *same* network at its random initialisation: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).
The demo's runs that stop on bad data (before its launcher) and the evaluation tool on a demo's
checkpoint run their ``main`` in the test process.

The in-process tests are in ``tests/unit/demo/test_real_data_swav.py``.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from testkit import REPO, load_script, run_script, vissl_run_state

FMNIST = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = [FMNIST / f"{s}-{k}-ubyte.gz" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]
needs_fmnist = pytest.mark.skipif(
    not all(p.is_file() for p in FMNIST_FILES),
    reason=f"Fashion-MNIST not installed in {FMNIST} (Debian package dataset-fashion-mnist; "
           "`make test` installs it through tools/install_env.sh)",
)

# Margin (percentage points of 20-NN top-1) by which SwAV must beat the random-init baseline
# (the mean over 5 initialisations of the same network, the first being the training's own
# start) in the quick run (5000 train / 1000 test images, 12 epochs = 468 iterations,
# 2 processes x 64), measured with `tools/demo.py --quick --seed S` on the 2-core machine.
# With the ResNet-10 channels-last recipe (2026-11-24):
#   seed 0: SwAV 78.3% vs random init 72.8% (5 inits: 70.6-75.0) -> +5.5 (before the colour warm-up of
#   the yaml; with it the quick run has only been run by this test)
# With the ResNet-18 of before (2026-11-22): seeds 0 / 1 / 2 gave +5.8 / +6.2 / +3.2.
# A single random init is a noisy baseline (68-79% over 15 inits), hence the mean.  The test
# (seed 0) asks for 2 points.
MIN_GAIN_KNN20 = 2.0
# The test runs the quick mode for 6 of its 12 epochs (234 iterations; half the training time).
# Measured with `tools/demo.py --quick --epochs 6 --seed S` on the 2-core Intel Xeon
# (2026-11-26), gains over the random init (5 inits) for seeds 0 / 1 / 2:
#   20-NN +2.9 / +4.1 / +3.8; linear +7.4 / +4.4 / +6.8; low-shot (1, 10, 100 per class)
#   +15.4 / +11.7 / +11.0, +7.8 / +11.1 / +10.0, +6.1 / +6.1 / +6.6.
EPOCHS = 6
# The baseline is the mean of the first 3 random inits (the training's own start and two
# others; the demo's default is 5).  The same three runs' first 3 inits give the gains
# (seeds 0 / 1 / 2): 20-NN +4.0 / +4.0 / +3.5; linear +8.2 / +4.6 / +6.7; low-shot +16.2 / +12.6
# / +10.9, +8.5 / +11.0 / +9.3, +7.0 / +6.5 / +6.3.  Four epochs are too few: seed 1 gave
# 20-NN -1.2 (`--quick --epochs 4 --random-inits 3 --seed 1`, 2026-11-27).
RANDOM_INITS = 3
# The same for the linear probe (every training label) and for each low-shot size (1, 10, 100
# labels per class, mean of 5 draws), logistic regression on the frozen features; measured
# with `tools/demo.py --quick --seed 0` on the 2-core Intel Xeon (2026-11-25), see
# docs/demo.md: the margins there are several times these.
MIN_GAIN_LINEAR = 3.0
MIN_GAIN_LOW_SHOT = 3.0


@needs_fmnist
def test_swav_quick_run_beats_random_init(tmp_path):
    out = tmp_path / "demo"
    proc = run_script(
        [str(REPO / "tools" / "demo.py"), "--quick", "--epochs", str(EPOCHS), "--random-inits", str(RANDOM_INITS),
         "--seed", "0",
         "--out", str(out), "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "Report:" in proc.stdout and str(out / "swav_demo_report.png") in proc.stdout
    report = json.loads((out / "swav_demo_report.json").read_text())
    knn = report["knn"]
    # the run really trained SwAV with our components, through 2 gloo processes
    log = (out / "run" / "train_log.txt").read_text()
    assert "SwAVPluginLoss" in log and "world_size: 2" in log
    assert report["host"]["train_procs"] == 2
    # the collapse detector watched every epoch (one line each, rank 0) and stayed quiet
    detector_lines = [line for line in log.splitlines() if "Collapse detector, epoch " in line]
    assert len(detector_lines) == report["config"]["mode"]["epochs"], detector_lines[-3:]
    assert "COLLAPSE DETECTED" not in log and "CollapseError" not in log, "the collapse detector fired"
    assert report["summary"]["collapse_detected"] is False and report["collapse_detector"]["warnings"] == []
    assert "collapse detector fired" not in proc.stdout
    assert report["figure_title"].startswith("SwAV (vissl-swav-plugin) on Fashion-MNIST, ")
    # the recipe's colour warm-up ran in the training processes: each epoch's strength is the
    # ramp's value at the epoch's first iteration (linear) or the warm-up strength, until the
    # first epoch that starts at or after color_warmup_iters, then the configured one (past the
    # 6 epochs' 234 iterations for the recipe's 200 iterations of linear ramp: the switch is
    # tested in tests/integration/hooks/test_color_warmup_integration.py)
    mc = next(t for t in report["config"]["transforms"] if t["name"] == "multicrop_plugin")
    epochs = report["config"]["mode"]["epochs"]
    per_epoch = report["times_s"]["train_iterations"] // epochs
    def per_group(v):  # a transform key's value, one entry per crop group
        return list(v) if isinstance(v, list) else [v] * len(mc["num_crops"])

    strength, weak = per_group(mc["color_strength"]), per_group(mc["color_warmup_strength"])
    for epoch in range(epochs):
        start = epoch * per_epoch
        if start >= mc["color_warmup_iters"]:
            expect = strength
        elif mc.get("color_warmup_schedule") == "linear":
            expect = [a + (b - a) * (start / mc["color_warmup_iters"]) for a, b in zip(weak, strength)]
        else:
            expect = weak
        assert f"epoch {epoch} ({per_epoch} it/epoch): {expect}" in log, [
            line for line in log.splitlines() if "colour-distortion" in line]
    curve = [r["loss"] for r in report["loss_curve"]]
    assert len(curve) == report["times_s"]["train_iterations"] > 200
    assert all(np.isfinite(curve))
    assert np.mean(curve[-20:]) < np.mean(curve[:20]) - 0.3, "the SwAV loss did not go down"
    # same memory bank / test images for every method, the sizes of the quick mode
    mode = report["config"]["mode"]
    assert report["data"]["train_images"] == 10 * mode["train_per_class"]
    assert report["data"]["test_images"] == 10 * mode["test_per_class"]
    assert len(knn["random_init"]["per_init"]) == RANDOM_INITS
    assert knn["random_init"]["knn20"] == pytest.approx(np.mean([r["knn20"] for r in knn["random_init"]["per_init"]]),
                                                        abs=0.01)
    gain = knn["swav"]["knn20"] - knn["random_init"]["knn20"]
    assert gain >= MIN_GAIN_KNN20, (
        f"SwAV 20-NN {knn['swav']['knn20']:.1f}% vs random init {knn['random_init']['knn20']:.1f}%: "
        f"gain {gain:+.1f} < {MIN_GAIN_KNN20}"
    )
    assert (out / "swav_demo_report.png").stat().st_size > 50_000
    # the paper's protocols on the same features: a linear probe with every training label and
    # learning from few labels (mean of the draws) must beat the random-init network too
    probes = report["probes"]
    assert set(probes) == {"swav", "random_init", "raw_pixels"}
    lin_gain = probes["swav"]["linear"]["top1"] - probes["random_init"]["linear"]["top1"]
    assert lin_gain >= MIN_GAIN_LINEAR, (probes["swav"]["linear"], probes["random_init"]["linear"])
    for k, v in probes["swav"]["low_shot"].items():
        assert len(v["per_draw"]) == 5
        assert v["mean"] - probes["random_init"]["low_shot"][k]["mean"] >= MIN_GAIN_LOW_SHOT, (k, v)
    assert report["summary"]["linear_swav"] == probes["swav"]["linear"]["top1"]
    assert "logistic regression on frozen features" in proc.stdout


def _write_test_folder(folder, per_class):
    """The demo's test images (the first ``per_class`` of each class of the t10k files) as an
    ImageFolder, written by the data tool the demo itself uses."""
    from vissl_swav_plugin.tools import fashion_mnist

    summary = fashion_mnist.prepare(folder, source=FMNIST, splits=("val",), limit_per_class=per_class,
                                    formats=("folder",), verbose=False, force=True)
    return summary["splits"]["val"]["dir"]


def _demo_stopped(tmp_path, capsys, source):
    """``python tools/demo.py --quick --source SOURCE`` in this process (it stops at its data
    step, before its launcher): its exit code and output (stdout and stderr)."""
    capsys.readouterr()
    with vissl_run_state(tmp_path):
        code = load_script("tools/demo.py").main(["--quick", "--out", str(tmp_path / "o"),
                                                  "--data-dir", str(tmp_path / "data"), "--source", str(source)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_demo_names_a_missing_dataset_file(tmp_path, capsys):
    code, out = _demo_stopped(tmp_path, capsys, tmp_path / "nowhere")
    assert code == 2, out[-3000:]
    assert f"{tmp_path / 'nowhere'}/train-images-idx3-ubyte.gz" in out
    assert "dataset-fashion-mnist" in out and "Traceback" not in out


def test_demo_names_a_corrupt_dataset_file(tmp_path, capsys):
    src = tmp_path / "fm"
    src.mkdir()
    for p in FMNIST_FILES:
        (src / p.name).write_bytes(b"\x1f\x8b not really gzip")
    code, out = _demo_stopped(tmp_path, capsys, src)
    assert code == 2, out[-3000:]
    assert str(src / "train-images-idx3-ubyte.gz") in out and "Traceback" not in out


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory):
    """A small demo run forced to collapse (temperature 100: uniform predictions, the loss at
    ln K from the first iteration, as in test_collapse.py) with the detector's patience at 3
    iterations; the tests below read its console, log and report."""
    if not all(p.is_file() for p in FMNIST_FILES):
        pytest.skip(f"Fashion-MNIST not installed in {FMNIST}")
    tmp_path = tmp_path_factory.mktemp("collapsed")
    out = tmp_path / "demo"
    proc = run_script(
        [str(REPO / "tools" / "demo.py"), "--quick", "--seed", "0", "--out", str(out),
         "--data-dir", str(tmp_path / "data"), "--train-per-class", "13", "--test-per-class", "5", "--epochs", "6",
         "--random-inits", "1", "--temperature", "100",
         "--override", "config.HOOKS.COLLAPSE_DETECTOR.PATIENCE_ITERS=3"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    return dict(root=tmp_path, out=out, console=proc.stdout)


def test_demo_shows_a_collapse_on_the_console_in_the_report_and_the_figure(collapsed):
    """The detector's warning, which VISSL's log holds, is shown while training runs, repeated
    after the summary, and recorded in the JSON report and the figure's title; the demo still
    exits 0 (ON_COLLAPSE=warn, the config's), with the figures of the collapsed run."""
    out, console = collapsed["out"], collapsed["console"]
    log = (out / "run" / "train_log.txt").read_text()
    fired = [ln for ln in log.splitlines() if "COLLAPSE DETECTED" in ln]
    assert fired, "the forced collapse did not fire the detector: " + log[-3000:]
    first = fired[0][fired[0].index("COLLAPSE DETECTED"):].rstrip()
    # shown during training (before the evaluation step) and again at the very end
    assert console.index(f"WARNING: {first}") < console.index("[3/4] evaluation")
    assert "the collapse detector fired during training" in console[console.index("Report:"):]
    report = json.loads((out / "swav_demo_report.json").read_text())
    assert report["summary"]["collapse_detected"] is True
    assert report["collapse_detector"]["fired"] is True
    warnings = report["collapse_detector"]["warnings"]
    assert len(warnings) == len(fired) and warnings[0].splitlines()[0] == first
    assert "Config keys to change" in warnings[0]  # the whole message, not only its first line
    assert report["figure_title"].startswith("COLLAPSED (the collapse detector fired): SwAV (vissl-swav-plugin) "
                                             "on Fashion-MNIST, ")


def test_eval_tool_on_a_demo_checkpoint_gives_the_demos_numbers(collapsed, monkeypatch, capsys):
    """swav-plugin-eval (``--demo-report``) on a demo's checkpoint and images gives the numbers
    of the demo's report, every method and protocol, with the report's own evaluation settings
    (this run's one random init; the small collapsed run: the equality does not depend on how
    well the network trained).  The tool's ``main`` runs in this process, on one thread as the
    demo's evaluation (``OMP_NUM_THREADS=1``, which the demo's process had)."""
    from vissl_swav_plugin.tools import feature_eval

    tmp_path, out = collapsed["root"], collapsed["out"]
    report = json.loads((out / "swav_demo_report.json").read_text())
    knn, probes, mode = report["knn"], report["probes"], report["config"]["mode"]
    test_dir = _write_test_folder(tmp_path / "fm_test", mode["test_per_class"])
    eval_json = tmp_path / "eval.json"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with vissl_run_state(tmp_path):
        code = feature_eval.main(["--demo-report", str(out / "swav_demo_report.json"), "--train",
                                  str(report["data"]["folder"]), "--test", str(test_dir), "--output-json", str(eval_json)])
    assert code == 0, capsys.readouterr().err[-4000:]
    tool = json.loads(eval_json.read_text())
    for key in ("swav", "random_init", "raw_pixels"):
        for m in ("knn20", "knn200", "nn5_euclid"):
            assert tool["knn"][key][m] == pytest.approx(knn[key][m], abs=1e-6), (key, m)
        assert tool["probes"][key]["linear"]["top1"] == probes[key]["linear"]["top1"], key
        for k in probes[key]["low_shot"]:
            assert tool["probes"][key]["low_shot"][k]["mean"] == probes[key]["low_shot"][k]["mean"], (key, k)


