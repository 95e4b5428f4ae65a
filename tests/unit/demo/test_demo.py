"""The demo package's pieces (vissl_swav_plugin.demo) without running the demo: cheap
imports, the log parsing, the Hydra overrides, the loss-curve reading, the command line.
The demo itself runs in test_real_data_swav.py."""
import json

import pytest

from testkit import compose, load_script


def test_parse_log_line():
    from vissl_swav_plugin.demo.training import parse_log_line

    line = "INFO 2026-01-01 log_hooks.py: 220: Rank: 0; [ep: 3] iter: 120; lr: [0.2989, 0.2989]; loss: 5.0123; eta: 0:01:00"
    assert parse_log_line(line) == dict(iter=120, ep=3, loss=5.0123, lr=0.2989)
    assert parse_log_line("INFO ... Rank: 0; [ep: 3] iter: 120; loss: oops") is None
    assert parse_log_line("some other line") is None


def test_hydra_value():
    from vissl_swav_plugin.demo.training import hydra_value

    assert hydra_value({"dims": [128, 256], "use_bn": True, "eps": 0.5, "act": "relu"}) == \
        "{dims:[128,256],use_bn:True,eps:0.5,act:relu}"


def test_read_loss_curve_prefers_stdout_json(tmp_path):
    from vissl_swav_plugin.demo.training import read_loss_curve

    parsed = [dict(iter=1, ep=0, loss=2.0, lr=0.1), dict(iter=0, ep=0, loss=3.0, lr=0.1)]
    assert read_loss_curve(tmp_path, parsed) == sorted(parsed, key=lambda r: r["iter"])
    rows = [dict(iter=1, ep=0, loss=4.0, lr=[0.2]), dict(iter=0, ep=0, loss=5.0, lr=0.3)]
    (tmp_path / "stdout.json").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    assert read_loss_curve(tmp_path, parsed) == [dict(iter=0, ep=0, loss=5.0, lr=0.3),
                                                 dict(iter=1, ep=0, loss=4.0, lr=0.2)]


def test_random_init_seeds_start_at_the_trainings_own():
    from vissl_swav_plugin.demo.evaluation import random_init_seeds

    assert random_init_seeds(2, 12, 3) == [24, 1024, 2024]


def test_mode_overrides_and_bad_values():
    from vissl_swav_plugin.demo.cli import MODES, parse_args

    args, mode = parse_args(["--quick", "--epochs", "3"])
    assert mode == dict(MODES["quick"], epochs=3) and args.procs is None
    with pytest.raises(SystemExit):
        parse_args(["--procs", "0"])
    for bad in (["--iters", "0"], ["--batch", "0"], ["--epochs", "0"], ["--train-per-class", "0"],
                ["--freeze", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert parse_args(["--freeze", "0", "--queue", "0"])[1]["freeze"] == 0


def test_mode_recipe_reaches_the_config(tmp_path):
    """The full mode trains the yaml's own recipe (temperature, precise BN, colour distortion
    as composed without the demo's overrides); the quick mode its own (temperature 0.2,
    precise BN on, the yaml's colour distortion); the command line overrides both (on the yaml's
    transforms or on a user's own list), an ``--override`` wins over the mode, and bad values are
    argparse errors."""
    from vissl_swav_plugin.demo.cli import parse_args
    from vissl_swav_plugin.demo.common import DemoError
    from vissl_swav_plugin.demo.training import CONFIG, training_overrides

    yaml_cfg = compose([f"config={CONFIG}"])

    def recipe(cfg):
        return (cfg.LOSS.swav_plugin_loss.temperature, cfg.HOOKS.PRECISE_BN.ENABLED,
                cfg.DATA.TRAIN.TRANSFORMS[0]["color_strength"])

    def composed(argv, user=()):
        mode = parse_args(argv)[1]
        mode["epochs"] = 2
        cfg = compose(training_overrides(mode, tmp_path, tmp_path, False, 2, 0, user))
        assert cfg.DATA.TRAIN.TRANSFORMS[0]["name"] == "multicrop_plugin"
        return recipe(cfg)

    assert composed([]) == recipe(yaml_cfg)
    assert composed(["--quick"]) == (0.2, True, recipe(yaml_cfg)[2])
    assert composed(["--quick", "--temperature", "0.15", "--precise-bn", "off", "--color-strength", "0.3"]) == (
        0.15, False, 0.3)
    assert composed(["--precise-bn", "on"])[1] is True
    # the mode's number of prototypes goes into the config's own head entry, its other keys kept
    for argv, k in (([], 100), (["--quick", "--prototypes", "37"], 37)):
        mode = dict(parse_args(argv)[1], epochs=2)
        (name, params), = compose(training_overrides(mode, tmp_path, tmp_path, False, 2, 0)).MODEL.HEAD.PARAMS
        assert name == "swav_plugin_head" and list(params["num_clusters"]) == [k]
        assert {key: params[key] for key in params if key != "num_clusters"} == {
            key: value for key, value in yaml_cfg.MODEL.HEAD.PARAMS[0][1].items() if key != "num_clusters"}
    assert composed(["--quick"], ["config.DATA.TRAIN.TRANSFORMS.0.color_strength=0.7"])[2] == 0.7
    # the modes leave the colour distortion to the config: a user's own transforms are not touched ...
    mode = dict(parse_args(["--quick"])[1], epochs=2)
    other = ["config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:2,num_crops:[2],size_crops:[28],"
             "crop_scales:[[0.3,1.0]],color_strength:0.9}]", "config.LOSS.swav_plugin_loss.num_crops=2"]
    assert not any("color_strength" in o for o in training_overrides(mode, tmp_path, tmp_path, False, 2, 0, other)[:-2])
    # ... and --color-strength without a multicrop_plugin entry to act on is an error, not ignored
    mode["color_strength"] = 0.3
    with pytest.raises(DemoError, match="--color-strength needs a multicrop_plugin entry"):
        training_overrides(mode, tmp_path, tmp_path, False, 2, 0, ["config.DATA.TRAIN.TRANSFORMS=[]"])
    mode["color_strength"], mode["normalize"] = None, "per_image"
    with pytest.raises(DemoError, match="--normalize needs a multicrop_plugin entry"):
        training_overrides(mode, tmp_path, tmp_path, False, 2, 0, ["config.DATA.TRAIN.TRANSFORMS=[]"])
    # --normalize per_image: every multicrop entry standardises per crop, its mean/std (which
    # could not act then) removed; --normalize dataset keeps the yaml's
    per_image = compose(training_overrides(dict(parse_args(["--normalize", "per_image"])[1], epochs=2),
                                           tmp_path, tmp_path, False, 2, 0))
    mc = dict(per_image.DATA.TRAIN.TRANSFORMS[0])
    assert mc["normalize"] == "per_image" and "mean" not in mc and "std" not in mc
    assert {k: v for k, v in mc.items() if k != "normalize"} == {
        k: v for k, v in yaml_cfg.DATA.TRAIN.TRANSFORMS[0].items() if k not in ("mean", "std")}
    back = compose(training_overrides(dict(parse_args(["--normalize", "dataset"])[1], epochs=2), tmp_path, tmp_path,
                                      False, 2, 0))
    assert dict(back.DATA.TRAIN.TRANSFORMS[0]) == dict(yaml_cfg.DATA.TRAIN.TRANSFORMS[0], normalize="dataset")
    # --color-warmup-iters: 0 turns the yaml's warm-up off (its strength removed, it could not act);
    # N sets the length; on a transform without a warm-up strength it is an error, not ignored
    def warm(argv, user=()):
        cfg = compose(training_overrides(dict(parse_args(argv)[1], epochs=2), tmp_path, tmp_path, False, 2, 0, user))
        t = cfg.DATA.TRAIN.TRANSFORMS[0]
        return t.get("color_warmup_iters"), t.get("color_warmup_strength"), t.get("color_warmup_schedule")

    y = yaml_cfg.DATA.TRAIN.TRANSFORMS[0]
    assert warm([]) == (y["color_warmup_iters"], y["color_warmup_strength"], y.get("color_warmup_schedule"))
    assert warm(["--color-warmup-iters", "0"]) == (0, None, None)  # a schedule without a warm-up cannot act
    assert warm(["--color-warmup-iters", "50"]) == (50, y["color_warmup_strength"], y.get("color_warmup_schedule"))
    mode = dict(parse_args(["--color-warmup-iters", "50"])[1], epochs=2)
    with pytest.raises(DemoError, match=r"--color-warmup-iters 50 needs a color_warmup_strength"):
        training_overrides(mode, tmp_path, tmp_path, False, 2, 0, other)
    # the command line's per-entry options act on a user's own transform list (--color-strength
    # was lost under it before); without them the user's entries stay as given
    two = ["config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:2,num_crops:[2],size_crops:[28],"
           "crop_scales:[[0.3,1.0]],color_strength:0.9},{name:multicrop_plugin,total_num_crops:2,num_crops:[2],"
           "size_crops:[28],crop_scales:[[0.3,1.0]],color_warmup_iters:300,color_warmup_strength:0.1}]",
           "config.LOSS.swav_plugin_loss.num_crops=2"]

    def entries(argv, user):
        cfg = compose(training_overrides(dict(parse_args(argv)[1], epochs=2), tmp_path, tmp_path, False, 2, 0, user))
        return [(t.get("color_strength"), t.get("color_warmup_iters")) for t in cfg.DATA.TRAIN.TRANSFORMS]

    assert entries(["--quick"], two) == [(0.9, None), (None, 300)]      # the user's transforms as given
    assert entries(["--quick", "--color-strength", "0.3"], two) == [(0.3, None), (0.3, 300)]
    for bad in (["--temperature", "0"], ["--temperature", "-0.1"], ["--temperature", "x"], ["--precise-bn", "yes"],
                ["--color-strength", "-0.1"], ["--color-strength", "2.6"], ["--color-strength", "x"],
                ["--normalize", "per_crop"], ["--color-warmup-iters", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_training_length_is_an_iteration_budget():
    """The mode's ``iters`` budget gives the epochs: the closest whole number of epochs for
    any data size (so a small image set trains as many steps, not fewer), Fashion-MNIST's
    full run trains the config's own epochs (18) and the quick run 12, and ``--epochs`` wins."""
    from vissl_swav_plugin.demo.cli import MODES, epochs_for, parse_args
    from vissl_swav_plugin.demo.common import CONFIG

    yaml_epochs = compose([f"config={CONFIG}"]).OPTIMIZER.num_epochs
    assert epochs_for(MODES["full"], (10_000 // 2) // 64) == yaml_epochs == 18
    assert epochs_for(MODES["quick"], (5_000 // 2) // 64) == 12
    for name in ("full", "quick"):
        budget = MODES[name]["iters"]
        for per_epoch in range(1, 3 * budget):
            epochs = epochs_for(MODES[name], per_epoch)
            assert epochs >= 1
            if per_epoch <= 2 * budget:
                assert abs(epochs * per_epoch - budget) <= per_epoch / 2, (name, per_epoch, epochs)
    assert epochs_for(parse_args(["--quick", "--epochs", "3"])[1], 39) == 3
    assert epochs_for(parse_args(["--iters", "100"])[1], 10) == 10


def test_device_choice_cpu_defaults_and_gpu_overrides(tmp_path, monkeypatch):
    """Without CUDA the demo runs 2 gloo processes on CPU; ``--device gpu`` names the problem;
    on a GPU the launcher gets NCCL, the GPU device and fp16 AMP (composed by VISSL here)."""
    import torch

    from vissl_swav_plugin.demo import cli
    from vissl_swav_plugin.demo.common import DemoError
    from vissl_swav_plugin.demo.training import training_overrides

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path), "--amp", "off"])
    setup = cli.make_setup(args, mode)
    assert setup.device == "cpu" and args.procs == 2 and not setup.use_amp
    with pytest.raises(DemoError, match="no CUDA device"):
        cli.pick_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path)])
    setup = cli.make_setup(args, mode)
    assert setup.device == "gpu" and args.procs == 1 and setup.use_amp
    assert mode["batch"] == 2 * cli.MODES["quick"]["batch"]  # one GPU trains the recipe's global batch
    with pytest.raises(DemoError, match="number of epochs"):
        training_overrides(mode, tmp_path, tmp_path, True, 1, 0, device="gpu")  # not chosen yet
    mode["epochs"] = cli.epochs_for(mode, 39)
    cfg = compose(training_overrides(mode, tmp_path, tmp_path, True, 1, 0, device="gpu"))
    assert cfg.MACHINE.DEVICE == "gpu" and cfg.DISTRIBUTED.BACKEND == "nccl"
    assert cfg.MODEL.AMP_PARAMS.USE_AMP and cfg.MODEL.AMP_PARAMS.AMP_DTYPE == "float16"
    # loader workers started by fork on a GPU (forkserver re-imports torch and VISSL in every
    # worker at every epoch); the CPU demo keeps the config's start method
    assert cfg.MULTI_PROCESSING_METHOD == "fork" and cfg.DATA.NUM_DATALOADER_WORKERS == 8
    cpu = compose(training_overrides(mode, tmp_path, tmp_path, True, 1, 0, device="cpu"))
    assert cpu.MULTI_PROCESSING_METHOD == "forkserver"


def test_figure_names_the_image_set(tmp_path):
    """The figure's title names the set: Fashion-MNIST for the default --source (however it is
    spelled), the folder's name for any other."""
    from types import SimpleNamespace

    from vissl_swav_plugin.demo.cli import parse_args
    from vissl_swav_plugin.demo.report import _set_name

    default = parse_args([])[0]
    assert _set_name(SimpleNamespace(args=default)) == "Fashion-MNIST"
    assert _set_name(SimpleNamespace(args=SimpleNamespace(source=default.source + "/"))) == "Fashion-MNIST"
    assert _set_name(SimpleNamespace(args=SimpleNamespace(source=str(tmp_path / "animal_mnist")))) == "animal_mnist"


def test_collapse_warnings_are_the_detectors_own_message():
    """The demo finds the detector's warnings in a training log by the detector's own headline,
    each with its indented lines, among VISSL's other log lines; a quiet log gives none."""
    import math

    from vissl_swav_plugin.hooks import collapse_report
    from vissl_swav_plugin.demo.training import COLLAPSE_HEADLINE, collapse_warnings

    assert COLLAPSE_HEADLINE == collapse_report.COLLAPSE_HEADLINE
    lk = math.log(100)
    heads = [dict(K=100, ln_k=lk, sample_entropy=lk, mean_entropy=lk, used=100)]
    settings = dict(ON_COLLAPSE="warn", PATIENCE_ITERS=100, LOSS_TOL=0.02, ENTROPY_TOL=0.05,
                    MIN_PROTOTYPES_USED_FRAC=0.02)
    msgs = [collapse_report.collapse_message("uniform", "swav_plugin_loss", lk, heads, settings, {}, (a, a + 99), 100,
                                             e, 0.3, [100]) for a, e in ((1, 2), (400, 7))]
    info = "INFO 2026-11-25 03:01:09,317 progress.py: 112: progress: epoch 3/18 | iter 200/1404 | loss 4.6048"
    log = "\n".join([info, "WARNING 2026-11-25 03:01:13,610 collapse.py: 325: " + msgs[0], info,
                     "WARNING 2026-11-25 03:05:00,000 collapse.py: 325: " + msgs[1], info])
    assert collapse_warnings(log) == msgs
    assert collapse_warnings(info + "\n" + info) == []


@pytest.mark.parametrize("device,choice,expected,reason", [
    ("cpu", "on", True, "--amp on"), ("cpu", "off", False, "--amp off"),   # as given, never measured
    ("gpu", "auto", True, "auto: fp16 AMP on a GPU"), ("gpu", "off", False, "--amp off"),
    ("cpu", "auto", None, "auto: to be measured on this CPU"),             # amp_step measures
])
def test_pick_amp_leaves_auto_on_a_cpu_to_the_measurement(device, choice, expected, reason):
    from vissl_swav_plugin.demo.cli import pick_amp

    use_amp, why = pick_amp(choice, device)
    assert use_amp is expected and why.startswith(reason)


@pytest.mark.parametrize("fp32_s,bf16_s,picked", [(0.208, 0.128, True), (0.2, 0.19, False), (0.31, 0.36, False)])
def test_amp_auto_on_a_cpu_follows_the_timed_step_and_says_what_was_measured(tmp_path, monkeypatch, capsys,
                                                                             fp32_s, bf16_s, picked):
    """--amp auto on a CPU: bf16 autocast only when the step timed at start-up ran at least 1.10x
    as fast in it (here the timer is the test's); the console line gives the figures, the report's
    host section the measurement; a second run on the same machine reuses it without timing."""
    import platform

    import torch

    from vissl_swav_plugin.demo import cli
    from vissl_swav_plugin.demo.report import _host
    from vissl_swav_plugin.demo.common import Clock
    from vissl_swav_plugin.utils import amp_measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(amp_measure.REMEASURE_ENV, raising=False)
    calls = []

    def timer():
        calls.append(1)
        return {"fp32": [fp32_s] * 4, "bf16": [bf16_s] * 4}

    cache = tmp_path / "cache.json"
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o")])
    setup = cli.make_setup(args, mode)
    assert setup.use_amp is None
    cli.amp_step(setup, timer=timer, cache=cache)
    out = capsys.readouterr().out
    assert setup.use_amp is picked and calls == [1]
    fast, slow = (("bf16", bf16_s), ("fp32", fp32_s)) if picked else (("fp32", fp32_s), ("bf16", bf16_s))
    figures = f"{fast[0]} {1000 * fast[1]:.0f} ms vs {slow[0]} {1000 * slow[1]:.0f} ms per step"
    head = "amp auto: bf16 autocast, head fp32 (" if picked else "amp auto: kept fp32 ("
    assert f"  {head}{figures}" in out and f"cached in {cache}" in out
    assert "amp auto: timing the training step in fp32 and in bf16 autocast" in out
    assert cli.amp_label(setup).startswith(f"bf16 autocast {'on' if picked else 'off'} (auto: bf16 step "
                                           f"{fp32_s / bf16_s:.2f}x fp32's")
    monkeypatch.setattr(platform, "platform", lambda: "Linux-test")  # the real one runs `uname -p`
    host = _host(setup, Clock())
    assert host["bf16_autocast"] is picked and host["amp_choice"] == setup.amp_reason
    assert host["amp_measurement"]["fp32_ms"] == pytest.approx(1000 * fp32_s)
    assert host["amp_measurement"]["key"]["shape"]["batch"] == 64
    assert host["amp_measurement"]["key"]["shape"]["crops"] == "2x28+4x16"

    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o")])
    again = cli.amp_step(cli.make_setup(args, mode), timer=timer, cache=cache)
    assert calls == [1] and again.use_amp is picked and again.amp_measurement["cached"]
    out = capsys.readouterr().out
    assert "reused from" in out and "--amp-remeasure" in out and "timing the training step" not in out
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o"), "--amp-remeasure"])
    cli.amp_step(cli.make_setup(args, mode), timer=timer, cache=cache)
    assert calls == [1, 1]
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o"), "--batch", "32"])  # another shape
    cli.amp_step(cli.make_setup(args, mode), timer=timer, cache=cache)
    assert calls == [1, 1, 1]


def test_amp_on_off_and_the_gpu_are_not_measured(tmp_path, monkeypatch):
    import torch

    from vissl_swav_plugin.demo import cli

    def timer():
        raise AssertionError("timed although the choice was given")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for choice in ("on", "off"):
        args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o"), "--amp", choice])
        setup = cli.amp_step(cli.make_setup(args, mode), timer=timer, cache=tmp_path / "c.json")
        assert setup.use_amp is (choice == "on") and setup.amp_measurement is None
        assert cli.amp_label(setup) == f"bf16 autocast {choice} (--amp {choice})"
    assert not (tmp_path / "c.json").exists()


def test_a_step_that_cannot_be_timed_keeps_fp32_and_says_why(tmp_path, monkeypatch, capsys):
    import torch

    from vissl_swav_plugin.demo import cli

    def timer():
        raise RuntimeError("no oneDNN")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o")])
    setup = cli.amp_step(cli.make_setup(args, mode), timer=timer, cache=tmp_path / "c.json")
    assert setup.use_amp is False
    assert "auto: kept fp32; the step could not be timed (RuntimeError: no oneDNN)" in capsys.readouterr().out


def test_the_real_step_timing_runs_at_a_tiny_size():
    """The demo's own step (VISSL's model and loss from the demo config, batch 4, 2 + 4 crops) in
    fp32 and bf16 autocast, two rounds: two positive medians and a valid pick (which one is the
    machine's business)."""
    from vissl_swav_plugin.demo import cli
    from vissl_swav_plugin.demo.training import fp32_head, step_config, step_shape, step_timer
    from vissl_swav_plugin.utils.amp_measure import decide

    args, mode = cli.parse_args(["--quick", "--batch", "4"])
    config = step_config(mode, 2, 0)
    shape = step_shape(config, 1)
    assert (shape["batch"], shape["crops"], shape["threads"]) == (4, "2x28+4x16", 1) and fp32_head(config)
    times = step_timer(config, 1, warmup=1, min_rounds=2, max_rounds=2, budget_s=0.0, give_up=float("inf"))()
    assert len(times["fp32"]) == len(times["bf16"]) == 2 and times.given_up == ""
    m = decide(times["fp32"], times["bf16"])
    assert m.fp32_ms > 0 and m.bf16_ms > 0 and m.use_bf16 in (True, False)


def test_the_real_bf16_step_stops_itself_at_its_deadline(monkeypatch):
    """With a deadline already passed (``give_up`` near 0), the demo's bf16 step raises
    ``StepTooSlow`` from inside its forward instead of running to its end, and the timing ends
    there; the fp32 step, never given a deadline, ran whole."""
    from vissl_swav_plugin.demo import cli
    from vissl_swav_plugin.demo.training import step_config, step_timer
    from vissl_swav_plugin.utils import amp_measure

    seen = []
    real = amp_measure.time_alternating

    def spy(steps, **kw):
        def bf16(**deadline):
            try:
                steps["bf16"](**deadline)
            except amp_measure.StepTooSlow:
                seen.append("stopped")
                raise
            seen.append("ran to its end")
        return real({"fp32": steps["fp32"], "bf16": bf16}, **kw)

    monkeypatch.setattr(amp_measure, "time_alternating", spy)
    args, mode = cli.parse_args(["--quick", "--batch", "4"])
    times = step_timer(step_config(mode, 2, 0), 1, warmup=2, give_up=1e-12)()
    assert seen == ["stopped"] and times.given_up == "bf16"
    assert len(times["fp32"]) == len(times["bf16"]) == 1


@pytest.mark.parametrize("value", ["2", "maybe"])
def test_a_bad_remeasure_variable_stops_the_demo_at_its_start(monkeypatch, capsys, value):
    from vissl_swav_plugin.demo import cli

    monkeypatch.setenv("VISSL_SWAV_PLUGIN_AMP_REMEASURE", value)
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--quick"])
    assert stop.value.code == 2
    assert f"VISSL_SWAV_PLUGIN_AMP_REMEASURE='{value}': use one of 1, true, yes, on, 0, false, no, off" in capsys.readouterr().err


@pytest.mark.parametrize("procs, given, want", [(None, None, 64), (1, None, 128), (2, None, 64), (4, None, 32),
                                                (3, None, 42), (200, None, 1), (1, 64, 64), (3, 10, 10)])
def test_the_batch_per_process_keeps_the_recipes_global_batch(tmp_path, procs, given, want):
    """Without --batch, the recipe's global batch (2 processes x 64) is split over the processes
    (one per GPU, or --procs; rounded down, at least 1), so that the iteration budget makes the
    recipe's epochs; an explicit --batch is per process and kept."""
    from vissl_swav_plugin.demo import cli

    argv = ["--quick", "--device", "cpu", "--out", str(tmp_path)]
    argv += ["--procs", str(procs)] if procs else []
    argv += ["--batch", str(given)] if given else []
    args, mode = cli.parse_args(argv)
    cli.make_setup(args, mode)
    assert mode["batch"] == want
    if given is None:
        assert args.procs * want <= cli.RECIPE_PROCS * cli.MODES["quick"]["batch"] < args.procs * (want + 1) or want == 1


def test_tools_demo_help_lists_every_option(capsys):
    """``python tools/demo.py --help``: the checkout's script, through the demo's parser."""
    with pytest.raises(SystemExit) as exit_:
        load_script("tools/demo.py").main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--quick", "--out", "--data-dir", "--source", "--seed", "--procs", "--random-inits", "--threads",
                "--amp", "--amp-remeasure", "--train-per-class", "--test-per-class", "--epochs", "--batch", "--queue", "--freeze",
                "--prototypes", "--temperature", "--precise-bn", "--color-strength", "--color-warmup-iters",
                "--normalize", "--override",
                "--device"):
        assert opt in out, opt
