"""Step 4 of the demo: the report, OUT/swav_demo_report.png and OUT/swav_demo_report.json.

The figure has four panels: (1) the training loss (and learning rate) per iteration,
(2) kNN top-1 of the SwAV features, the random-init features and the raw pixels, (3) the
linear and low-shot probes of the same features (top-1 against labels per class), (4) the
test images of the most-used prototypes.  The JSON holds every figure of the run (times,
accuracies, prototypes, loss curve, the config).  :func:`print_summary` prints the final
lines of the command.  matplotlib is imported by :func:`make_figure` only.
"""
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from .common import CONFIG, FASHION_MNIST, fmt_secs

REPORT_PNG = "swav_demo_report.png"
REPORT_JSON = "swav_demo_report.json"
# the raw-pixel 5-NN top-1 of the Fashion-MNIST benchmark (60k train / 10k test)
RAW_PIXEL_5NN_FULL = 85.5
KNN_PROTOCOLS = dict(
    knn20="weighted cosine kNN, k=20, T=0.07 (Wu et al. 2018; VISSL's kNN)",
    knn200="weighted cosine kNN, k=200, T=0.07",
    nn5_euclid="plain 5-NN, Euclidean distance, majority vote (raw pixels: the benchmark's 85.5% on 60k/10k)",
    features="trunk res5avg (global average pool of res5), eval-mode BN, fp32, full 28x28 image",
    random_init="the same VISSL model built from the same config, no training; mean over "
                "--random-inits initialisations (per_init), the first with torch seed "
                "(SEED_VALUE + 0) * num_epochs, as VISSL seeds rank 0 (the training's start)",
    raw_pixels_full_dataset_5nn=RAW_PIXEL_5NN_FULL,
)


def describe_model(config):
    """The trunk in words, e.g. ``"ResNet-18 (width 16)"``."""
    trunk = config.MODEL.TRUNK
    if trunk.NAME == "resnet_small_plugin":
        p = dict(trunk.get("RESNET_SMALL_PLUGIN", {}) or {})
        return f"ResNet-{p.get('DEPTH', 18)} (width {p.get('WIDTH', 64)})"
    return str(trunk.NAME)


def describe_crops(config):
    """The training crops in words, e.g. ``"multi-crop 2x28+4x16"`` or ``"single crop"``."""
    for t in config.DATA.TRAIN.TRANSFORMS:
        if t["name"] in ("multicrop_plugin", "ImgPilToMultiCrop"):
            return "multi-crop " + "+".join(f"{n}x{s}" for n, s in zip(t["num_crops"], t["size_crops"]))
    return "single crop"


def gains(results):
    """``(gain, vs_px)``: SwAV's 20-NN minus the random-init 20-NN, and minus the raw-pixel 5-NN."""
    return (results["swav"]["knn20"] - results["random_init"]["knn20"],
            results["swav"]["knn20"] - results["raw_pixels"]["nn5_euclid"])


def figure_meta(setup, config, results, n_train, n_test, train_wall_s, collapsed=False):
    """The figure's ``title`` and ``subtitle`` (the run's settings and its headline numbers),
    with the image counts ``n_train`` / ``n_test`` for the panels; ``collapsed``: the collapse
    detector fired during training, which the title says first."""
    mode = setup.mode
    gain, vs_px = gains(results)
    return dict(
        n_train=n_train, n_test=n_test,
        title=("COLLAPSED (the collapse detector fired): " if collapsed else "")
        + f"SwAV (vissl-swav-plugin) on {_set_name(setup)}, {os.cpu_count()} CPU cores, "
          f"{fmt_secs(train_wall_s)} of training",
        subtitle=(f"{n_train} unlabelled training images, {mode['epochs']} epochs, {describe_model(config)} "
                  f"({results['swav']['feature_dim']}-d res5avg), {describe_crops(config)}, "
                  f"{mode['prototypes']} prototypes, batch {setup.args.procs}x{mode['batch']}, "
                  f"{'queue ' + str(mode['queue']) if mode['queue'] else 'no queue'}  |  "
                  f"20-NN: SwAV {results['swav']['knn20']:.1f}% vs random init "
                  f"{results['random_init']['knn20']:.1f}% ({gain:+.1f}) vs raw-pixel 5-NN "
                  f"{results['raw_pixels']['nn5_euclid']:.1f}% ({vs_px:+.1f})"),
    )


def _set_name(setup):
    """The image set's name in the figure: Fashion-MNIST, or the ``--source`` folder's name."""
    source = Path(setup.args.source).resolve()
    return "Fashion-MNIST" if source == Path(FASHION_MNIST).resolve() else source.name


def make_figure(path, curve, results, protos, test_x, meta, probes=None):
    """Draw the report figure to ``path`` (PNG): three panels, four with ``probes``.

    Args:
        path: the PNG to write.
        curve: the loss curve, ``[dict(iter, ep, loss, lr), ...]``.
        results: the kNN results of ``swav``, ``random_init`` and ``raw_pixels``.
        protos: :func:`~vissl_swav_plugin.demo.evaluation.prototype_summary` of SwAV.
        test_x: the uint8 test images the prototype rows index.
        meta: :func:`figure_meta`'s dict.
        probes: the linear / low-shot probes per method (``EvaluationRun.probes``); empty
            or None: no probe panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    rows = 3 if probes else 2
    fig = plt.figure(figsize=(17, 9.5 + 4.2 * (rows - 2)), dpi=110)
    top = 0.88 if rows == 2 else 0.91
    gs = GridSpec(rows, 2, width_ratios=[1.0, 1.05], height_ratios=[1] * rows, wspace=0.18, hspace=0.42,
                  left=0.05, right=0.985, top=top, bottom=0.05)
    fig.suptitle(meta["title"], fontsize=15, fontweight="bold")
    fig.text(0.5, top + (0.045 if rows == 2 else 0.03), meta["subtitle"], ha="center", fontsize=10.5,
             color="#333333")
    _plot_loss(fig.add_subplot(gs[0, 0]), curve)
    _plot_knn(fig.add_subplot(gs[1, 0]), results, meta)
    if probes:
        meta = dict(meta, probes=True)
        _plot_probes(fig.add_subplot(gs[2, 0]), probes, meta)
    _plot_prototypes(fig.add_subplot(gs[:, 1]), protos, test_x, meta)
    fig.savefig(path)
    plt.close(fig)


def _plot_loss(ax, curve):
    """(1) the loss per iteration, its moving average, epoch boundaries, the learning rate."""
    import numpy as np

    it = np.array([r["iter"] for r in curve])
    loss = np.array([r["loss"] for r in curve])
    ax.plot(it, loss, color="#9ecae1", lw=0.8, label="per iteration (rank 0)")
    if len(loss) >= 10:
        w = max(5, len(loss) // 40)
        smooth = np.convolve(loss, np.ones(w) / w, mode="valid")
        ax.plot(it[w - 1:], smooth, color="#08519c", lw=2.0, label=f"moving average ({w} it)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("SwAV loss (swapped prediction)")
    ax.set_title("(1) Training loss", loc="left", fontweight="bold")
    ax.grid(alpha=0.3)
    ep_iters = sorted({r["iter"] for r in curve if r["iter"] > 0 and
                       any(q["iter"] == r["iter"] - 1 and q["ep"] != r["ep"] for q in curve)})
    for x in ep_iters:
        ax.axvline(x, color="#bbbbbb", lw=0.6, ls=":")
    ax2 = ax.twinx()
    ax2.plot(it, [r["lr"] for r in curve], color="#e6550d", lw=1.0, alpha=0.7, label="learning rate")
    ax2.set_ylabel("learning rate", color="#e6550d")
    ax2.tick_params(axis="y", colors="#e6550d")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8.5)


def _plot_knn(ax, results, meta):
    """(2) kNN top-1 bars (with the random inits' min-max) and the benchmark's raw-pixel line."""
    import numpy as np

    methods = [("swav", "SwAV features (res5avg)", "#2171b5"),
               ("random_init", "random-init features (same trunk; mean, min-max of "
                               f"{len(results['random_init'].get('per_init', [])) or 1} inits)", "#9e9ac8"),
               ("raw_pixels", "raw pixels (784-d)", "#969696")]
    metrics = [("knn20", "20-NN\n(weighted cosine)"), ("knn200", "200-NN\n(weighted cosine)"),
               ("nn5_euclid", "5-NN\n(Euclidean, majority)")]
    x = np.arange(len(metrics))
    width = 0.26
    allv = []
    for j, (key, label, color) in enumerate(methods):
        vals = [results[key][m] for m, _ in metrics]
        allv += vals
        spread = results[key].get("range")
        yerr = None
        if spread:
            # clipped at 0: the shown value is rounded, the range's ends are not (one init: both
            # ends are the value, and a rounding apart)
            yerr = np.clip(np.array([[v - spread[m][0], spread[m][1] - v] for v, (m, _) in zip(vals, metrics)]).T,
                           0.0, None)
            allv += [spread[m][0] for m, _ in metrics]
        bars = ax.bar(x + (j - 1) * width, vals, width, label=label, color=color, yerr=yerr, capsize=3,
                      error_kw=dict(lw=0.9, ecolor="#444444"))
        for i, (b, v) in enumerate(zip(bars, vals)):
            top = v if yerr is None else v + yerr[1][i]
            ax.text(b.get_x() + b.get_width() / 2, top + 0.3, f"{v:.1f}", ha="center", va="bottom", fontsize=8.5)
    lo = max(0.0, np.floor(min(allv) / 5.0) * 5.0 - 12.0)  # room for the legend under the bars
    ax.set_ylim(lo, min(100.0, max(allv) + 6.0))
    ax.set_xticks(x, [lbl for _, lbl in metrics])
    ax.set_ylabel("top-1 accuracy on the test images (%)")
    ax.set_title(f"(2) kNN classification: {meta['n_train']} train (memory bank) / {meta['n_test']} test images",
                 loc="left", fontweight="bold")
    ax.axhline(RAW_PIXEL_5NN_FULL, color="#636363", lw=0.8, ls="--")
    ax.text(len(metrics) - 0.5, RAW_PIXEL_5NN_FULL + 0.2,
            f"raw-pixel 5-NN, full 60k/10k: {RAW_PIXEL_5NN_FULL}%", ha="right", va="bottom", fontsize=8,
            color="#636363")
    ax.legend(loc="lower left", fontsize=8.5, framealpha=0.95)
    ax.grid(axis="y", alpha=0.3)


def _plot_prototypes(ax, protos, test_x, meta):
    """(3) the most-used prototypes' highest-scoring test images, one row each."""
    import numpy as np

    rows = protos["rows"]
    per_row = max((len(r["images"]) for r in rows), default=1)
    pad = 2
    h = w = test_x.shape[1]
    canvas = np.full((len(rows) * (h + pad) + pad, per_row * (w + pad) + pad), 255, dtype=np.uint8)
    for i, r in enumerate(rows):
        for j, idx in enumerate(r["images"]):
            y0, x0 = pad + i * (h + pad), pad + j * (w + pad)
            canvas[y0:y0 + h, x0:x0 + w] = 255 - test_x[idx]  # dark garments on white
    ax.imshow(canvas, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([pad + i * (h + pad) + h / 2 for i in range(len(rows))],
                  [f"proto {r['prototype']}\n{r['size']} imgs\n{r['majority_pct']:.0f}% {r['majority_class']}"
                   for r in rows], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(f"({4 if meta.get('probes') else 3}) The {len(rows)} most used of {protos['num_prototypes']} prototypes: their "
                 f"top-{per_row} test images\n(each test image assigned to its best prototype; "
                 f"majority-class purity over all {meta['n_test']}: {protos['purity_pct']:.1f}%)",
                 loc="left", fontweight="bold", fontsize=10.5)


PROBE_METHODS = (("swav", "SwAV features (res5avg)", "#2171b5"),
                 ("random_init", "random-init features (mean of the inits)", "#9e9ac8"),
                 ("raw_pixels", "raw pixels (784-d)", "#969696"))


def _plot_probes(ax, probes, meta):
    """(3) linear / low-shot top-1 against labels per class (log axis), one line per method;
    the low-shot points carry the spread (std) over the draws, the rightmost point is the
    linear probe with every training label."""
    import numpy as np

    shots = sorted(int(k) for k in probes["swav"]["low_shot"])
    full = meta["n_train"] // 10  # where the linear probe (every training label) is drawn
    for key, label, color in PROBE_METHODS:
        r = probes[key]
        ys = [r["low_shot"][str(k)]["mean"] for k in shots] + [r["linear"]["top1"]]
        err = [r["low_shot"][str(k)]["std"] for k in shots] + [0.0]
        xs = shots + [full]
        ax.errorbar(xs, ys, yerr=err, marker="o", color=color, label=label, capsize=3, lw=1.8)
        for x, y in zip(xs, ys):
            ax.text(x * 1.08, y - 0.5, f"{y:.1f}", ha="left", va="top", fontsize=8, color=color)
    ax.set_xscale("log")
    ax.set_xticks(shots + [full], [str(k) for k in shots] + ["all"])
    ax.minorticks_off()
    allv = [v for k, _, _ in PROBE_METHODS for v in
            [probes[k]["linear"]["top1"]] + [probes[k]["low_shot"][str(s)]["mean"] for s in shots]]
    ax.set_ylim(max(0.0, np.floor(min(allv) / 5.0) * 5.0 - 5.0), min(100.0, max(allv) + 7.0))
    ax.set_xlabel("labelled training images per class (logistic regression on the frozen features, "
                  "C chosen on 10% of the training images)")
    ax.set_ylabel("top-1 accuracy on the test images (%)")
    draws = probes["swav"]["protocol"]["draws"]
    ax.set_title(f"(3) Linear and low-shot probes (mean, std of {draws} draws)", loc="left", fontweight="bold")
    ax.legend(loc="lower right", fontsize=8.5, framealpha=0.95)
    ax.grid(alpha=0.3)


def build_report(setup, clock, data, train, evaluation, times, png):
    """The JSON report of a demo run, as a dict.

    Args:
        setup: the run's :class:`~vissl_swav_plugin.demo.common.DemoSetup`.
        clock: the run's :class:`~vissl_swav_plugin.demo.common.Clock` (CPU time, load).
        data: :func:`~vissl_swav_plugin.demo.data.prepare_data`'s dict.
        train: the :class:`~vissl_swav_plugin.demo.common.TrainingRun`.
        evaluation: the :class:`~vissl_swav_plugin.demo.common.EvaluationRun`.
        times: wall seconds: ``data``, ``train`` (the launcher), ``evaluation``, ``report``,
            ``total`` and ``before_figure`` (the total before the figure was drawn).
        png: the figure's path.

    Returns:
        ``dict(mode, created, summary, collapse_detector, knn, knn_protocols, probes, prototypes,
        times_s, host, data, config, loss_curve, checkpoint, files)`` (the demo adds
        ``figure_title``); ``probes`` is ``{}`` with ``--probes off``.
    """
    results, curve = evaluation.results, train.curve
    return dict(
        mode=setup.label,
        created=datetime.datetime.now().isoformat(timespec="seconds"),
        summary=_summary(results, curve, times["total"], times["train"], train.collapse, evaluation.probes),
        collapse_detector=dict(fired=bool(train.collapse), warnings=list(train.collapse)),
        knn={k: {m: (round(v, 2) if isinstance(v, float) else v) for m, v in r.items()}
             for k, r in results.items()},
        knn_protocols=dict(KNN_PROTOCOLS),
        probes=evaluation.probes,
        prototypes={k: {kk: vv for kk, vv in v.items()} for k, v in evaluation.protos.items()},
        times_s=dict(
            total=round(times["total"], 1), data=round(times["data"], 1), train_launcher=round(times["train"], 1),
            evaluation=round(times["evaluation"], 1), report=round(times["report"], 1),
            evaluation_detail=evaluation.timings, before_figure=round(times["before_figure"], 1),
            cpu_total=round(clock.cpu_used(), 1),
            train_iterations=len(curve), train_it_per_s=round(len(curve) / times["train"], 3),
        ),
        host=_host(setup, clock),
        data=dict(source=str(Path(setup.args.source).resolve()), folder=str(data["folder"]),
                  train_images=len(data["train_y"]), test_images=len(data["test_y"]),
                  train_per_class=setup.mode["train_per_class"], test_per_class=setup.mode["test_per_class"],
                  subset_rule="first N images of each class, in file order (train and t10k files)"),
        config=_config_section(setup, train.overrides, evaluation.config),
        loss_curve=[dict(iter=r["iter"], ep=r["ep"], loss=r["loss"], lr=r["lr"]) for r in curve],
        checkpoint=str(train.checkpoint),
        files=dict(png=str(png), json=str(setup.out / REPORT_JSON), train_log=str(setup.train_log)),
    )


def _summary(results, curve, total, train_wall_s, collapse, probes=None):
    """The report's headline numbers; ``collapse_detected``: the collapse detector warned
    during training (its messages are the report's ``collapse_detector.warnings``); with
    ``probes`` the linear and low-shot top-1 of each method (``linear_<method>``,
    ``shot<k>_<method>``)."""
    gain, vs_px = gains(results)
    extra = {}
    for key in ("swav", "random_init", "raw_pixels") if probes else ():
        extra[f"linear_{key}"] = probes[key]["linear"]["top1"]
        for k, v in probes[key]["low_shot"].items():
            extra[f"shot{k}_{key}"] = v["mean"]
    return dict(extra,
        collapse_detected=bool(collapse),
        knn20_swav=round(results["swav"]["knn20"], 2),
        knn20_random_init=round(results["random_init"]["knn20"], 2),
        knn20_random_init_range=results["random_init"]["range"]["knn20"],
        nn5_raw_pixels=round(results["raw_pixels"]["nn5_euclid"], 2),
        knn20_gain_over_random_init=round(gain, 2),
        knn20_swav_minus_raw_pixel_5nn=round(vs_px, 2),
        swav_beats_raw_pixels=bool(vs_px > 0),
        loss_first=curve[0]["loss"], loss_last=curve[-1]["loss"],
        total_wall_s=round(total, 1), train_wall_s=round(train_wall_s, 1),
    )


def _host(setup, clock):
    """The machine and the training's process / thread / precision settings."""
    return dict(cpu_count=os.cpu_count(), train_procs=setup.args.procs, threads_per_proc=setup.threads,
                bf16_autocast=setup.use_amp, amp_choice=setup.amp_reason,
                amp_measurement=setup.amp_measurement, loadavg_start=[round(v, 2) for v in clock.load_start],
                loadavg_end=[round(v, 2) for v in os.getloadavg()], python=platform.python_version(),
                torch=__import__("torch").__version__, platform=platform.platform())


def _config_section(setup, overrides, config):
    """The VISSL config the run used: overrides, trunk, head, transforms, loss, optimizer."""
    return dict(
        vissl_config=CONFIG, overrides=overrides, mode=setup.mode, seed=setup.args.seed,
        trunk=dict(config.MODEL.TRUNK.NAME and {"name": config.MODEL.TRUNK.NAME,
                                               **dict(config.MODEL.TRUNK.get("RESNET_SMALL_PLUGIN", {}))}),
        head=[list(p) for p in config.MODEL.HEAD.PARAMS],
        transforms=[dict(t) for t in config.DATA.TRAIN.TRANSFORMS],
        loss={k: (dict(v) if hasattr(v, "items") else v) for k, v in config.LOSS.swav_plugin_loss.items()},
        optimizer=json.loads(json.dumps(config.OPTIMIZER, default=str)),
    )


def write_json(path, report):
    """Write ``report`` as indented JSON (values JSON cannot hold as strings)."""
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")


def print_summary(results, protos, n_train, n_test, times, png, json_path, collapse, train_log, probes=None):
    """The command's closing lines: kNN top-1 per method, the linear and low-shot probes
    (``probes``), prototype use, times, the files, and last, when the collapse detector warned
    during training (``collapse``), that warning's first line and where its whole message is."""
    print(f"\nkNN top-1 on {n_test} test images (memory bank: the {n_train} training images):")
    for key, name in (("swav", "SwAV"), ("random_init", "random init"), ("raw_pixels", "raw pixels")):
        r = results[key]
        line = f"  {name:12s} 20-NN {r['knn20']:6.2f}%   200-NN {r['knn200']:6.2f}%   5-NN {r['nn5_euclid']:6.2f}%"
        if "range" in r:
            line += (f"   (mean of {len(r['per_init'])} initialisations; 20-NN "
                     f"{r['range']['knn20'][0]:.2f}-{r['range']['knn20'][1]:.2f}%)")
        print(line)
    if probes:
        shots = sorted(probes["swav"]["low_shot"], key=int, reverse=True)
        head = "".join(f"   {k:>3s}/class" for k in shots)
        print(f"\nlogistic regression on frozen features, top-1 on {n_test} test images "
              f"(labels per class; C chosen on 10% of the training images):\n  {'':12s}   all labels{head}")
        for key, name in (("swav", "SwAV"), ("random_init", "random init"), ("raw_pixels", "raw pixels")):
            r = probes[key]
            print(f"  {name:12s}   {r['linear']['top1']:9.2f}%" + "".join(
                f"   {r['low_shot'][k]['mean']:8.2f}%" for k in shots))
    print(f"prototypes: {protos['swav']['prototypes_used']}/{protos['swav']['num_prototypes']} used on the test "
          f"images, purity {protos['swav']['purity_pct']:.1f}% (random init {protos['random_init']['purity_pct']:.1f}%)")
    print(f"time: total {fmt_secs(times['total'])} (data {times['data']:.0f}s, training {times['train']:.0f}s, "
          f"evaluation {times['evaluation']:.0f}s, report {times['report']:.0f}s)")
    print(f"\nReport: {png}\n        {json_path}", flush=True)
    if collapse:
        print(f"\nWARNING: the collapse detector fired during training ({len(collapse)} warning(s)); the SwAV "
              f"figures above come from a collapsed run.\n  {collapse[0].splitlines()[0]}\n  The whole message "
              f"(causes, config keys to change): {train_log}; docs/troubleshooting.md.",
              file=sys.stderr, flush=True)
