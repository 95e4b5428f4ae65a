"""The demo's command line (``python tools/demo.py``): options, the run's setup, and
:func:`main`, the whole pipeline -- data, training, evaluation, report -- on one screen.

Each ``*_step`` function runs one step of the pipeline with the run's settings, prints
its progress lines and hands its result to the next; the work itself is done by
:mod:`.data`, :mod:`.training`, :mod:`.evaluation` and :mod:`.report`.
"""
import argparse
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from .common import FASHION_MNIST, REPO, Clock, DemoError, DemoSetup, EvaluationRun, TrainingRun, fmt_secs
from .data import prepare_data
from .evaluation import evaluate
from .report import REPORT_JSON, REPORT_PNG, build_report, figure_meta, make_figure, print_summary, write_json
from .training import (TrainingStopped, collapse_warnings, final_checkpoint, read_loss_curve, run_training,
                       training_overrides)

DESCRIPTION = "`make demo`: SwAV on Fashion-MNIST on a few CPU cores, end to end."

# Settings of the two modes.  Everything not listed comes from the yaml config.
# The training length is a budget of iterations (``iters``): the number of epochs is the
# one that gives about that many iterations on the data (Fashion-MNIST: full 1404 it =
# 18 epochs of 10,000 images, quick 468 it = 12 epochs of 5,000), so a smaller image set
# (``--source``) gets more epochs rather than fewer steps; ``--epochs`` sets it directly.
# The quick mode freezes the prototypes for 30 iterations (100 avoided the Animal-MNIST
# collapse but cost 4 points of 20-NN on Fashion-MNIST in the one seed measured), predicts
# with temperature 0.2 instead of the paper's 0.1 and re-estimates the trunk's BatchNorm
# statistics at the end (HOOKS.PRECISE_BN): at 0.1 the quick run collapsed on Animal-MNIST
# (docs/experiments/collapse.md), at 0.2 it learned there.  The full mode keeps the
# paper's 0.1 and re-estimates the BatchNorm statistics too (docs/demo.md).
MODES = {
    "full": dict(train_per_class=1000, test_per_class=1000, iters=1404, epochs=None, batch=64, queue=0,
                 freeze=100, prototypes=100, temperature=0.1, precise_bn=True, color_strength=None,
                 color_warmup_iters=None, normalize=None),
    "quick": dict(train_per_class=500, test_per_class=100, iters=468, epochs=None, batch=64, queue=0,
                  freeze=30, prototypes=100, temperature=0.2, precise_bn=True, color_strength=None,
                  color_warmup_iters=None, normalize=None),
}


#: training processes of the demo's recipe: its ``batch`` is per process of these two.  On
#: another number of processes (one per GPU, or ``--procs``) without ``--batch``, the batch per
#: process is scaled so that the global batch, and with it the epochs that the iteration budget
#: makes, stays the recipe's 2 x 64 (:func:`batch_per_process`)
RECIPE_PROCS = 2


def batch_per_process(batch, procs):
    """The per-process batch that keeps the recipe's global batch ``RECIPE_PROCS x batch`` on
    ``procs`` processes (rounded down where it does not divide; at least 1).

    Example: ``batch_per_process(64, 1)`` is 128 (one GPU), ``batch_per_process(64, 8)`` is 16."""
    return max(1, RECIPE_PROCS * batch // procs)


def _on_off(value):
    """``on`` / ``off`` -> True / False: the command-line type of ``--precise-bn``."""
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from 'on', 'off')")
    return value == "on"


def _normalize_mode(value):
    """``dataset`` / ``per_image``: the command-line type of ``--normalize``."""
    if value not in ("dataset", "per_image"):
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from 'dataset', 'per_image')")
    return value


#: the MODES keys that are not whole numbers, and their command-line types
MODE_TYPES = {"temperature": float, "precise_bn": _on_off, "color_strength": float, "normalize": _normalize_mode}
#: the metavar of the MODES options with a fixed set of values
MODE_CHOICES = {_on_off: "{on,off}", _normalize_mode: "{dataset,per_image}"}


def epochs_for(mode, iters_per_epoch):
    """The mode's number of epochs: ``mode["epochs"]`` when set, else the one whose
    iterations come closest to the budget ``mode["iters"]`` (at least 1).

    Example: ``epochs_for(dict(epochs=None, iters=468), 39) == 12``.
    """
    if mode.get("epochs"):
        return int(mode["epochs"])
    return max(1, int(round(mode["iters"] / max(1, iters_per_epoch))))


def main(argv=None):
    """Run the demo; returns the exit code (0; 2 after a ``demo: error: ...`` line; 128 + the
    signal's number when SIGTERM or SIGHUP stopped the training).

    Example: ``main(["--quick", "--out", "/tmp/demo"])``; ``python tools/demo.py --help``
    lists the options.
    """
    _quiet_import_warnings()
    args, mode = parse_args(argv)
    clock = Clock()
    setup = make_setup(args, mode)
    print(f"SwAV demo ({setup.label}): report in {setup.out}", flush=True)
    try:
        data, t_data = data_step(setup)
        amp_step(setup)  # --amp auto on a CPU: after the data (whose errors come first), before the training
        train = training_step(setup, data)
        evaluation = evaluation_step(setup, data, train)
        times, png = report_step(setup, clock, data, train, evaluation, t_data)
    except DemoError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        print(f"demo: {e}: the training processes were stopped; nothing after the training was run",
              file=sys.stderr)
        return 128 + e.signum
    print_summary(evaluation.results, evaluation.protos, len(data["train_y"]), len(data["test_y"]), times,
                  png, setup.out / REPORT_JSON, collapse=train.collapse, train_log=setup.train_log,
                  probes=evaluation.probes)
    return 0


def _quiet_import_warnings():
    # VISSL 0.1.6 / Classy Vision import-time deprecation notices (torch.jit.script, Hydra
    # version_base, ...) would drown the progress display; the training log keeps them
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def build_parser():
    """The demo's ``argparse`` parser (every option of ``tools/demo.py``)."""
    ap = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smaller run (5000 train / 1000 test images, 468 iterations; 2.5 min on a 2-core Intel Xeon, about twice that on a 2-core AMD EPYC); used by the tests")
    ap.add_argument("--out", default=str(REPO / "demo_output"), help="report folder (default demo_output/)")
    ap.add_argument("--data-dir", default=str(REPO / "data"),
                    help="where the Fashion-MNIST ImageFolder is written / reused (default data/)")
    ap.add_argument("--source", default=FASHION_MNIST, help="Fashion-MNIST IDX files")
    ap.add_argument("--seed", type=int, default=0, help="VISSL SEED_VALUE (also the random-init model's seed)")
    ap.add_argument("--procs", type=int, default=None,
                    help="training processes (default: 2 gloo processes on CPU, one per GPU on GPUs)")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                    help="auto = the GPU(s) when CUDA is available (NCCL, fp16 AMP), else CPU (default)")
    ap.add_argument("--random-inits", type=int, default=5,
                    help="random initialisations averaged for the random-init baseline (default 5; the "
                         "first is the training's own starting point)")
    ap.add_argument("--probes", choices=["on", "off"], default="on",
                    help="linear probe (every training label) and low-shot probes (1, 10, 100 labels per "
                         "class) of the same features beside the kNN (default on)")
    ap.add_argument("--probe-draws", type=int, default=5,
                    help="random draws of the labelled images per low-shot size (default 5)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per training process (default: cores / procs)")
    ap.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                    help="autocast: auto = fp16 AMP on a GPU; on a CPU, bf16 autocast (head fp32) when "
                         "the training step timed at start-up runs at least 1.10x as fast in it as in "
                         "fp32, else fp32 (a few seconds, cached per machine; default); on / off: "
                         "autocast (bf16 on CPU) or fp32 everywhere")
    ap.add_argument("--amp-remeasure", action="store_true",
                    help="with --amp auto on a CPU: time the step again even where this machine's "
                         "timing is cached (also VISSL_SWAV_PLUGIN_AMP_REMEASURE=1)")
    for key in MODES["full"]:
        if key == "epochs":
            default = "the number that gives about --iters iterations on the data"
        elif key == "batch":
            default = (f"per process; full {RECIPE_PROCS} x {MODES['full'][key]}, quick {RECIPE_PROCS} x "
                       f"{MODES['quick'][key]} in all, split over the processes")
        elif MODES["full"][key] is None and MODES["quick"][key] is None:
            default = "both modes: the config's value"
        else:
            default = f"full {MODES['full'][key]}, quick {MODES['quick'][key]}"
        ap.add_argument(f"--{key.replace('_', '-')}", type=MODE_TYPES.get(key, int), default=None,
                        metavar=MODE_CHOICES.get(MODE_TYPES.get(key)),
                        help=f"override the mode's {key} ({default})")
    ap.add_argument("--override", action="append", default=[],
                    help="extra VISSL override for training and evaluation, e.g. "
                         "config.OPTIMIZER.weight_decay=1e-5 (repeatable)")
    return ap


def parse_args(argv=None):
    """``(args, mode)``: the parsed options and the mode's settings (``MODES["quick"]`` or
    ``MODES["full"]``) with the ``--train-per-class`` ... ``--prototypes`` overrides applied.
    Bad values exit with argparse's usage error (exit code 2)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    mode = dict(MODES["quick" if args.quick else "full"])
    for key in mode:
        if getattr(args, key) is not None:
            mode[key] = getattr(args, key)
    if args.procs is not None and args.procs < 1:
        ap.error("--procs must be >= 1")
    from vissl_swav_plugin.utils.amp_measure import remeasure_requested

    try:  # read only when --amp auto times the step: checked now, before the data and the training
        remeasure_requested()
    except ValueError as e:
        ap.error(str(e))
    for key, value in mode.items():
        if value is None or isinstance(value, (bool, str)):
            continue
        if key == "temperature":
            if not value > 0:
                ap.error("--temperature must be > 0")
            continue
        if key == "color_strength":
            from vissl_swav_plugin.transforms.multicrop_config import MAX_COLOR_STRENGTH  # here: it imports torch (the demo's cli stays light)

            if not 0 <= value <= MAX_COLOR_STRENGTH:
                ap.error(f"--color-strength must be in [0, {MAX_COLOR_STRENGTH}]")
            continue
        smallest = 0 if key in ("queue", "freeze", "color_warmup_iters") else 1
        if value < smallest:
            ap.error(f"--{key.replace('_', '-')} must be >= {smallest}")
    if args.random_inits < 1:
        ap.error("--random-inits must be >= 1")
    if args.probe_draws < 1:
        ap.error("--probe-draws must be >= 1")
    return args, mode


def make_setup(args, mode):
    """The run's :class:`DemoSetup`: creates the report folder, empties ``OUT/run``, picks
    the threads per training process and autocast (:func:`pick_amp`; ``--amp auto`` on a CPU
    leaves ``use_amp`` None for :func:`amp_step`)."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    device = pick_device(args.device)
    if args.procs is None:
        args.procs = RECIPE_PROCS if device == "cpu" else cuda_device_count()
    if args.batch is None:  # the recipe's global batch on any number of processes
        mode["batch"] = batch_per_process(mode["batch"], args.procs)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.procs)
    use_amp, amp_reason = pick_amp(args.amp, device)  # auto on a CPU: None until amp_step measures
    return DemoSetup(args=args, mode=mode, label="quick" if args.quick else "full", out=out, run_dir=run_dir,
                     ckpt_dir=ckpt_dir, threads=threads, use_amp=use_amp, device=device, amp_reason=amp_reason)


def pick_amp(choice, device, measurement=None, bf16_label="bf16 autocast, head fp32"):
    """``(use_amp, reason)`` for ``--amp choice`` on ``device``.

    ``on`` / ``off`` as given.  ``auto``: fp16 AMP on a GPU.  On a CPU, whichever of fp32 and
    bf16 autocast ran the training step faster on this machine: ``measurement`` (an
    :class:`vissl_swav_plugin.utils.amp_measure.AmpMeasurement`, :func:`amp_step`) picks bf16
    when its step was at least 1.10x as fast as fp32's (the head stays fp32 with the demo
    config's ``fp32_head``; its features stayed within fp32's spread over 3 seeds of the full
    demo, docs/demo.md); without one, ``use_amp`` is None: still to be measured.  ``bf16_label``
    names the bf16 choice in the reason.

    Example: ``pick_amp("auto", "cpu")`` is ``(None, "auto: to be measured on this CPU ...")``;
    ``pick_amp("off", "cpu")`` is ``(False, "--amp off")``.
    """
    if choice in ("on", "off"):
        return choice == "on", f"--amp {choice}"
    if device == "gpu":
        return True, "auto: fp16 AMP on a GPU"
    if measurement is None:
        return None, "auto: to be measured on this CPU (the training step in fp32 and in bf16 autocast)"
    return measurement.use_bf16, f"auto: {measurement.describe(bf16_label)}"


def amp_step(setup, timer=None, cache=None):
    """``--amp auto`` on a CPU: time the training step in fp32 and in bf16 autocast (or reuse
    this machine's cached timing, :func:`vissl_swav_plugin.utils.amp_measure.measure_or_reuse`),
    set ``setup.use_amp``, ``amp_reason`` and ``amp_measurement`` and print what was measured.
    Nothing to do when ``use_amp`` is already chosen (``--amp on|off``, a GPU).  ``timer`` and
    ``cache`` (the cache file) replace the real ones (tests); a step that cannot be timed
    keeps fp32 and says why."""
    if setup.use_amp is not None:
        return setup
    from vissl_swav_plugin.utils.amp_measure import machine_key, measure_or_reuse

    from .training import fp32_head, step_config, step_shape, step_timer

    args = setup.args
    config = step_config(setup.mode, args.procs, args.seed, args.override)  # a DemoError here is the user's
    timer = timer or step_timer(config, setup.threads)

    def announced_timer():  # called only when nothing usable is cached
        print("  amp auto: timing the training step in fp32 and in bf16 autocast on this CPU (a few seconds, "
              "then cached for this machine)", flush=True)
        return timer()

    try:
        key = machine_key(step_shape(config, setup.threads))
        m = measure_or_reuse(key, announced_timer, path=cache, remeasure=bool(getattr(args, "amp_remeasure", False)))
    except Exception as e:  # noqa: BLE001  (the choice of precision must not stop the demo)
        setup.use_amp = False
        setup.amp_reason = f"auto: kept fp32; the step could not be timed ({type(e).__name__}: {e})"
        print(f"  amp {setup.amp_reason}", flush=True)
        return setup
    label = "bf16 autocast, head fp32" if fp32_head(config) else "bf16 autocast"
    setup.use_amp, setup.amp_reason = pick_amp("auto", setup.device, m, label)
    setup.amp_measurement = m.record()
    hint = "; --amp-remeasure to time it again" if m.cached else ""
    print(f"  amp {setup.amp_reason}{hint}", flush=True)
    return setup


def amp_label(setup):
    """How the training's autocast is described in the demo's output, with why it was chosen
    (after a measurement, its ratio: the whole line was printed by :func:`amp_step`)."""
    if setup.device == "gpu":
        return f"fp16 AMP {'on' if setup.use_amp else 'off'} on the GPU ({setup.amp_reason})"
    m = setup.amp_measurement
    if m:
        return (f"bf16 autocast {'on' if setup.use_amp else 'off'} (auto: bf16 step {m['speedup']:.2f}x "
                f"fp32's, {'>=' if m['use_bf16'] else '<'} {m['min_speedup']:.2f}x)")
    return f"bf16 autocast {'on' if setup.use_amp else 'off'} ({setup.amp_reason})"


def cuda_device_count():
    """Number of visible CUDA devices (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_device(choice):
    """``"gpu"`` for ``--device gpu`` or (``auto``) when CUDA is available, else ``"cpu"``."""
    if choice == "gpu" and cuda_device_count() == 0:
        raise DemoError("--device gpu: no CUDA device is visible")
    return "gpu" if choice == "gpu" or (choice == "auto" and cuda_device_count() > 0) else "cpu"


def data_step(setup):
    """[1/4] The Fashion-MNIST subsets (:func:`.data.prepare_data`); returns ``(data, seconds)``."""
    mode = setup.mode
    print("[1/4] data: Fashion-MNIST subset as a VISSL disk_folder", flush=True)
    t = time.time()
    data = prepare_data(setup.args.source, setup.args.data_dir, mode["train_per_class"], mode["test_per_class"])
    t_data = time.time() - t
    print(f"  {len(data['train_y'])} training images ({mode['train_per_class']} per class) in {data['folder']}; "
          f"{len(data['test_y'])} test images ({mode['test_per_class']} per class) [{t_data:.1f}s]", flush=True)
    return data, t_data


def training_step(setup, data):
    """[2/4] SwAV pre-training through VISSL's launcher (:mod:`.training`); returns the
    :class:`TrainingRun` (overrides, loss curve, wall time, final checkpoint)."""
    amp_step(setup)  # --amp auto on a CPU, when main's call has not settled it yet
    args, mode = setup.args, setup.mode
    n_train = len(data["train_y"])
    per_rank = (n_train // args.procs) // mode["batch"]
    if per_rank < 1:
        raise DemoError(f"{n_train} images are too few for {args.procs} x {mode['batch']} per batch")
    mode["epochs"] = epochs_for(mode, per_rank)
    overrides = training_overrides(mode, data["folder"], setup.ckpt_dir, setup.use_amp, args.procs, args.seed,
                                   args.override, device=setup.device)
    print(f"[2/4] SwAV pre-training through VISSL's launcher: {args.procs} {'gloo' if setup.device == 'cpu' else 'NCCL'} process(es) x "
          f"{setup.threads} thread(s), {mode['epochs']} epochs x {per_rank} it, batch "
          f"{args.procs}x{mode['batch']}, {amp_label(setup)} "
          f"(log: {setup.train_log})", flush=True)
    parsed, t_train = run_training(overrides, setup.run_dir, per_rank * mode["epochs"], mode["epochs"],
                                   setup.threads)
    ckpt = final_checkpoint(setup.ckpt_dir)
    curve = read_loss_curve(setup.ckpt_dir, parsed)
    if not curve:
        raise DemoError(f"no loss values found in {setup.ckpt_dir / 'stdout.json'} nor in the log")
    print(f"  done in {fmt_secs(t_train)}: loss {curve[0]['loss']:.3f} -> {curve[-1]['loss']:.3f}, "
          f"checkpoint {ckpt.name}", flush=True)
    collapse = collapse_warnings(setup.train_log.read_text())
    return TrainingRun(overrides=overrides, curve=curve, wall_s=t_train, checkpoint=ckpt, collapse=collapse)


def evaluation_step(setup, data, train):
    """[3/4] kNN of SwAV / random-init / raw-pixel features (:func:`.evaluation.evaluate`);
    returns the :class:`EvaluationRun`."""
    what = "kNN, linear and low-shot probes" if setup.args.probes == "on" else "kNN"
    print(f"[3/4] evaluation: res5avg features of the VISSL model (checkpoint loaded in-process), {what}",
          flush=True)
    t = time.time()
    probes = probe_settings(setup) if setup.args.probes == "on" else None
    config, results, protos, timings, probe_results = evaluate(
        train.overrides, train.checkpoint, data, setup.args.seed, setup.args.random_inits, probes=probes)
    return EvaluationRun(config=config, results=results, protos=protos, timings=timings, wall_s=time.time() - t,
                         probes=probe_results)


def probe_settings(setup):
    """The linear / low-shot probes' settings (:func:`vissl_swav_plugin.utils.probes.probe_report`):
    1, 10 and 100 labels per class, ``--probe-draws`` draws each, ``C`` chosen on 10% of the
    training images, seeded with ``--seed``."""
    return dict(shots=(1, 10, 100), draws=setup.args.probe_draws, val_fraction=0.1, seed=setup.args.seed)


def report_step(setup, clock, data, train, evaluation, t_data):
    """[4/4] OUT/swav_demo_report.png and .json (:mod:`.report`); returns ``(times, png)``,
    ``times`` the wall seconds of the steps and the total (:func:`.report.build_report`)."""
    print("[4/4] report", flush=True)
    t = time.time()
    before_figure = clock.elapsed()
    png = setup.out / REPORT_PNG
    meta = figure_meta(setup, evaluation.config, evaluation.results, len(data["train_y"]), len(data["test_y"]),
                       train.wall_s, collapsed=bool(train.collapse))
    make_figure(png, train.curve, evaluation.results, evaluation.protos["swav"], data["test_x"], meta,
                probes=evaluation.probes)
    times = dict(data=t_data, train=train.wall_s, evaluation=evaluation.wall_s, report=time.time() - t)
    times.update(total=clock.elapsed(), before_figure=before_figure)
    report = build_report(setup, clock, data, train, evaluation, times, png)
    report["figure_title"] = meta["title"]
    write_json(setup.out / REPORT_JSON, report)
    return times, png
