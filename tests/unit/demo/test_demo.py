"""The demo package's pieces (vissl_swav_plugin.demo) without running the demo: cheap
imports, the log parsing, the Hydra overrides, the loss-curve reading, the command line.
The demo itself runs in test_real_data_swav.py."""
import json

import pytest

from testkit import compose


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


@pytest.mark.parametrize("flags,device,choice,expected,amx", [
    ("fpu avx512f avx512_bf16 amx_tile amx_bf16", "cpu", "auto", True, True),   # AMX: faster (1.2x)
    ("fpu avx512f avx512_bf16", "cpu", "auto", False, False),                  # AVX512-BF16 alone: slower
    ("fpu avx2", "cpu", "auto", False, False),
    ("", "cpu", "auto", False, False),                                          # /proc/cpuinfo unreadable
    ("fpu avx2", "cpu", "on", True, None), ("fpu amx_bf16", "cpu", "off", False, None),  # as given
    ("fpu avx2", "gpu", "auto", True, None),                                    # fp16 AMP on a GPU
])
def test_amp_auto_is_bf16_only_on_amx_cpus_and_says_why(flags, device, choice, expected, amx):
    from vissl_swav_plugin.demo.cli import pick_amp

    text = f"processor\t: 0\nflags\t\t: {flags}\nprocessor\t: 1\nflags\t\t: {flags}\n"
    use_amp, reason = pick_amp(choice, device, text)
    assert use_amp is expected
    assert reason.startswith("auto: " if choice == "auto" else f"--amp {choice}")
    if amx is not None:  # auto on CPU: the reason says whether the CPU has AMX
        assert ("has AMX bf16 units (amx_bf16)" in reason) is amx and ("no AMX" in reason) is (not amx)
        assert ("fp32 on CPU" in reason) is (not amx)


def test_the_demo_says_which_autocast_it_picked_and_why(tmp_path, monkeypatch):
    """make_setup reads the machine's /proc/cpuinfo: on CPU the default is bf16 autocast where
    the CPU has AMX and fp32 elsewhere (docs/demo.md), and the console line and the report's
    host section say which and why."""
    import torch

    from vissl_swav_plugin.demo import cli
    from vissl_swav_plugin.utils import cpu_features

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags, amx in (("fpu avx512f amx_tile amx_bf16", True), ("fpu avx512f avx512_bf16", False)):
        info = tmp_path / f"cpuinfo_{amx}"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(cpu_features, "CPUINFO", str(info))
        args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o")])
        setup = cli.make_setup(args, mode)
        assert setup.use_amp is amx
        label = cli.amp_label(setup)
        if amx:
            assert label.startswith("bf16 autocast on (auto: this CPU has AMX bf16 units (amx_bf16)")
        else:
            assert label.startswith("bf16 autocast off (auto: fp32 on CPU; this CPU has no AMX")
        for choice in ("on", "off"):
            args, mode = cli.parse_args(["--quick", "--out", str(tmp_path / "o"), "--amp", choice])
            setup = cli.make_setup(args, mode)
            assert setup.use_amp is (choice == "on")
            assert cli.amp_label(setup) == f"bf16 autocast {choice} (--amp {choice})"


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
