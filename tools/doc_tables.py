#!/usr/bin/env python
"""The documentation's generated tables (a tool of the checkout: not in the wheel).

Every measured table of README.md and docs/ is a cog block (https://cog.readthedocs.io, the
``cogapp`` package): a comment line that calls :func:`emit` with a table's name and the records
it reads, the generated text, and cog's end line.  A renderer here turns records (the benchmarks'
``--json`` files under ``docs/experiments/``), a shipped config, the registered compat patches or
``requirements-host.txt`` into Markdown; what a page writes by hand beside generated cells (a
config's purpose, the keys its table shows, what a compat patch fixes) is data in
``docs/doc_tables.yaml``.  No renderer reads a page.

    python tools/doc_tables.py            # cog -r over every page that holds a block
    python tools/doc_tables.py --check    # write nothing; show the difference, exit 1 if any

A new measurement: write its record into ``docs/experiments/`` and change the record's path in
the block's line.  Exit status: 0, 1 (``--check``: a page differs), 2 (a block failed).
"""
import argparse
import functools
import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = "docs/doc_tables.yaml"
TABLES = {}


def table(fn):
    """Register ``fn(*args) -> text`` as the table of its name."""
    TABLES[fn.__name__] = fn
    return fn


def emit(name, *args):
    """A block's body: the table ``name`` of ``args`` (record paths, a config name)."""
    import cog

    cog.outl(TABLES[name](*args).rstrip("\n"))


def pages():
    """README.md and every page under docs/ that holds a cog block."""
    return [p for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))] if "[[[cog" in p.read_text()]


# ------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------
@functools.lru_cache(None)
def record(path):
    """A JSON record (path relative to the repository)."""
    return json.loads((REPO / path).read_text())


@functools.lru_cache(None)
def data():
    """The hand-written columns of the generated tables (``docs/doc_tables.yaml``)."""
    import yaml

    return yaml.safe_load((REPO / DATA).read_text())


def mean_sd(values):
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values)


def pm(mean, sd=None):
    """``81.93 ± 0.56`` (``80.08`` without a spread): benchmarks/recipe_table.py's cell format."""
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


def row(*cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def head(*cells):
    return row(*cells) + "\n|" + "---|" * len(cells)


def sci(x):
    """``5.4e-4`` (``0`` for zero)."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}" if x else "0"


def secs(values):
    """``36.7 s, 39.8 s`` (up to 2 values) or ``88.7-138.8 s (4 runs)``."""
    values = list(values)
    if len(values) <= 2:
        return ", ".join(f"{v:.1f} s" for v in values)
    return f"{min(values):.1f}-{max(values):.1f} s ({len(values)} runs)"


def seeds_of(runs):
    seeds = sorted(int(s) for s in runs)
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def measured_on(rec):
    """``Measured on CPU (N cores; Python X, torch Y), DATE`` of a record."""
    m = rec["machine"]
    return f"Measured on {m['cpu']} ({m['cores']} cores; Python {m['python']}, torch {m['torch']}), {rec['date'][:10]}"


def command(rec, fence=False):
    """A record's command without its ``--json`` output, as run in a checkout after make venv."""
    cmd = rec["command"].split(" --json")[0]
    cmd = ".venv/bin/python " + cmd[len("python "):] if cmd.startswith("python ") else cmd
    return f"```bash\n{cmd}\n```" if fence else cmd


def diff(d, sd):
    """A difference of means, in bold where it is larger than ``sd`` (the larger sd of the two rows)."""
    return f"**{d:+.2f}**" if abs(d) > sd else f"{d:+.2f}"


BOLD = "Bold: a difference larger than the larger sd over seeds of the two rows."


def figures(rows, header=("figure", "measured", "machine, date")):
    """A table of figures, one ``(label, value, ...)`` row each."""
    return "\n".join([head(*header)] + [row(*r) for r in rows])


# ------------------------------------------------------------------------------------------
# the CPU benchmarks (docs/gpu.md, docs/launching.md, docs/demo.md)
# ------------------------------------------------------------------------------------------
@table
def epoch_pause(path):
    """benchmarks/bench_epoch_pause.py's record: the wait for each epoch's first batch."""
    rec = record(path)
    r, n = rec["results"], rec["epochs"]
    names = {"vissl": "VISSL (fresh workers every epoch)", "plugin": "plugin (persistent workers)"}
    lines = [f"{measured_on(rec)}, device {rec['device']}:", "", command(rec, True), "",
             head(f"loader ({rec['workers']} workers, {rec['start_method']})", *(f"epoch {e}" for e in range(n)),
                  f"pause between epochs (median of 1-{n - 1})")]
    lines += [row(label, *(f"{t:.2f} s" for t in r[k]["first_batch_s"]), f"{r[k]['pause_s']:.2f} s")
              for k, label in names.items()]
    lines.append(row("VISSL's over the plugin's", *[""] * n, f"{rec['ratio_pause_vissl_over_plugin']:.1f}x"))
    return "\n".join(lines)


@table
def cpu_threads(path):
    """The quick CPU run with ``OMP_NUM_THREADS`` unset and 1, before and after the plugin's
    share of the cores."""
    rec = record(path)
    m, t = rec["machine"], rec["threads"]
    loads = [r["load"] for r in t["runs"]]
    lines = [f"Measured on the {m['name']}, {rec['date']}, torch {m['torch'].split('+')[0]}, nothing else running "
             f"(load average {min(loads):.1f}-{max(loads):.1f} before the runs, mostly the previous run's), "
             f"alternated runs of `{t['command']}` ({t['processes']} gloo processes, {t['iterations']} iterations):",
             "", head("code", "`OMP_NUM_THREADS`", "the command, start to end", "iterations 0 to 15")]
    labels = {"after": "each process its share of the cores (today)",
              "before": "before: each process a thread per core"}
    for code, label in labels.items():
        for omp in ("unset", "1"):
            runs = [r for r in t["runs"] if (r["code"], r["omp"]) == (code, omp)]
            if runs:
                lines.append(row(label, omp, secs(r["wall_s"] for r in runs), secs(r["train_s"] for r in runs)))
    return "\n".join(lines)


@table
def amp_no_bf16_units(path):
    """``--amp auto``'s cost on a CPU without bf16 units, before and after its early stop."""
    lines = [head("code", "fp32 / bf16 per step", "pick", "timing", "`amp_step` in all")]
    labels = {"before": "every round timed (before)", "after": "stopped at twice fp32's (today)"}
    for code, label in labels.items():
        runs = [r for r in record(path)["amp_auto"]["runs"] if r["code"] == code]
        if code == "before":
            fp32, bf16 = ([v for r in runs for v in r[k]] for k in ("fp32_ms", "bf16_ms"))
            steps = f"{min(fp32)}-{max(fp32)} / {min(bf16)}-{max(bf16)} ms, {len(runs[0]['fp32_ms'])} rounds each"
        else:
            steps = "; ".join(f"{r['fp32_ms'][0]} / over {r['bf16_ms'][0]} ms" for r in runs) + " (the first steps)"
        lines.append(row(label, steps, ", ".join(sorted({"bf16" if r["use_bf16"] else "fp32" for r in runs})),
                         ", ".join(f"{r['timing_s']:.1f} s" for r in runs),
                         ", ".join(f"{r['amp_step_s']:.1f} s" for r in runs)))
    return "\n".join(lines)


def times_less(ratio):
    return f"{ratio:.2f}x less" if ratio < 2 else f"{ratio:.1f}x less"


@table
def device_augment(path):
    """benchmarks/bench_device_augment.py's record: bytes and time per batch of each mode."""
    rec = record(path)
    r = rec["results"]
    off = r["off"]
    spread = max(max(v["worker_ms_all_rounds"]) / min(v["worker_ms_all_rounds"]) for v in r.values())
    lines = [f"{measured_on(rec)}, {rec['rounds']} rounds (a mode's worker times differed by up to "
             f"{spread:.1f}x between rounds):", "", command(rec, True), "",
             head("mode", f"MB per batch of {rec['batch']}", "worker ms per batch",
                  f"device side on the CPU ({rec['cpu_threads_device_side']} thread), ms per batch")]
    for mode, v in r.items():
        mb, ms = f"{v['mb_per_batch']:.1f}", f"{v['worker_ms_per_batch']:.0f}"
        if mode != "off":
            mb += f" ({off['mb_per_batch'] / v['mb_per_batch']:.1f}x fewer)"
            ms += f" ({times_less(off['worker_ms_per_batch'] / v['worker_ms_per_batch'])})"
        lines.append(row(f"`{mode}`", mb, ms, f"{v['device_ms_per_batch_cpu']:.0f}" if v["device_ms_per_batch_cpu"]
                         else "—"))
    return "\n".join(lines)


STAGES = ("read+decode", "draw", "crop+resize", "colour", "blur", "to tensor", "other", "collate")


@table
def worker_stages(path):
    """benchmarks/bench_worker_stages.py's record: ms per image per stage in one worker, for each
    variant, and the per-batch figures of the main process."""
    rec = record(path)
    r = rec["results"]
    off, threads = r["off"]["worker_ms_per_image"], rec["cpu_threads_device_side"]
    size = f"scaled to {rec['long_side']} px on the longer side" if rec.get("long_side") else "of ImageNet's sizes"

    def cells(fn):
        return [fn(r[n], n) for n in r]

    def device(v, _):
        return f"{v['per_batch']['device_ms_cpu']:.0f}" if v["per_batch"]["device_ms_cpu"] else "—"

    lines = [f"{measured_on(rec)}, {rec['images']} generated JPEGs {size} ({rec['jpeg_kb']:.0f} kB on average), "
             f"{rec['rounds']} rounds (medians):", "", command(rec, True), "",
             head("ms per image in one worker", *(f"`{n}`" for n in r))]
    lines += [row(stage, *cells(lambda v, _, s=stage: f"{v['ms_per_image'][s]:.2f}")) for stage in STAGES]
    lines += [row("**worker, in all**", *cells(lambda v, _: f"**{v['worker_ms_per_image']:.2f}**")),
              row("images/s per core", *cells(lambda v, n: f"{v['images_per_s_per_core']:.0f}" + (
                  "" if n == "off" else f" ({off / v['worker_ms_per_image']:.1f}x)"))),
              row(f"MB per batch of {rec['batch']}", *cells(lambda v, _: f"{v['per_batch']['mb']:.1f}")),
              row(f"device side on the CPU ({threads} thread{'s' * (threads > 1)}), ms per batch", *cells(device))]
    if any("device_ms_cuda" in v["per_batch"] for v in r.values()):
        lines += [row(f"device side on {rec['machine']['card']}, ms per batch",
                      *cells(lambda v, _: f"{v['per_batch'].get('device_ms_cuda', 0):.1f}")),
                  row("pinning the batch (main process), ms per batch",
                      *cells(lambda v, _: f"{v['per_batch'].get('pin_ms', 0):.1f}"))]
    return "\n".join(lines)


DEMO_COLUMNS = {"knn20": "20-NN", "linear_swav": "linear, all labels", "shot100_swav": "100 / class",
                "shot10_swav": "10 / class", "shot1_swav": "1 / class"}


@table
def demo_device_augment(path, mode):
    """The quick demo with ``DEVICE_AUGMENT=mode`` (record key ``mode``), per seed and over seeds,
    against ``off``'s; a record with ``equals_photometric`` says per seed whether the run's
    losses and figures were ``photometric``'s."""
    rec = record(path)
    runs, off, same = rec[mode], rec["reference_off"]["mean_sd"], rec.get("equals_photometric")
    stats = {k: mean_sd(run[k] for run in runs.values()) for k in DEMO_COLUMNS}
    extra = ("losses and figures equal to `photometric`'s",) if same else ()
    return "\n".join([
        f"{measured_on(rec)[:-10]}{rec['date']}:", "", command(rec, True).replace("SEED", "0"), "",
        head(f"quick demo, fp32, `{mode}`", *DEMO_COLUMNS.values(), *extra),
        *(row(f"seed {s}", *(f"{runs[s][k]:.2f}" for k in DEMO_COLUMNS), *(("yes" if same[s] else "no",) if same else ()))
          for s in sorted(runs, key=int)),
        row(f"{seeds_of(runs)} (mean ± sd)", *(pm(*stats[k]) for k in DEMO_COLUMNS), *("" for _ in extra)),
        row("minus `off`'s mean (the table above)",
            *(diff(stats[k][0] - off[k][0], max(stats[k][1], off[k][1])) for k in DEMO_COLUMNS), *("" for _ in extra)),
        "", BOLD])


# ------------------------------------------------------------------------------------------
# bf16 autocast and the demo's protocols (docs/demo.md, docs/experiments/benchmarks.md, README.md)
# ------------------------------------------------------------------------------------------
BF16_COLUMNS = {"knn20_swav": "20-NN", "linear_swav": "linear, all labels", "shot100_swav": "100 labels / class",
                "shot10_swav": "10 / class", "shot1_swav": "1 / class", "loss_last": "last loss"}
BF16_ROWS = {"fp32": "fp32 (`--amp off`)", "bf16": "bf16 autocast of the whole model",
             "bf16_fp32_head": "bf16 autocast, head in fp32 (`auto` on AMX)"}
BF16_DIFFS = {"bf16": "whole model bf16 − fp32", "bf16_fp32_head": "head in fp32 − fp32"}


@table
def demo_bf16_quality(path):
    """The full demo over seeds in fp32, bf16 and bf16 with the head in fp32; their differences."""
    rec = record(path)

    def stats(kind, key):
        return mean_sd(run[key] for run in rec[kind]["runs"].values())

    lines = [head("`make demo`", *BF16_COLUMNS.values())]
    lines += [row(f"{label}, {seeds_of(rec[kind]['runs'])}", *(pm(*stats(kind, k)) for k in BF16_COLUMNS))
              for kind, label in BF16_ROWS.items()]
    lines += [row(label, *(diff(stats(kind, k)[0] - stats("fp32", k)[0], max(stats(kind, k)[1], stats("fp32", k)[1]))
                           for k in BF16_COLUMNS)) for kind, label in BF16_DIFFS.items()]
    same = all(run["knn20_random_init"] == rec["fp32"]["runs"][seed]["knn20_random_init"]
               for kind in BF16_ROWS for seed, run in rec[kind]["runs"].items())
    return "\n".join(lines) + f"\n\n{BOLD} " + ("Each seed's random-init 20-NN is the same in every row." if same
                                                else "The random-init 20-NN of a seed differs between the rows.")


def its(runs, *names, at=460):
    """The mean it/s (progress line at iteration ``at``) of the named runs."""
    return statistics.fmean(runs[n][f"progress_it_per_s_at_{at}"] for n in names)


def speed_ratios(path, key):
    """``(it/s ratio, training time ratio)`` bf16 (head fp32) / fp32 of a round of alternated runs."""
    runs = record(path)[key]["runs"]
    wall = statistics.fmean(runs[n]["train_wall_s"] for n in ("off1", "off2")) / statistics.fmean(
        runs[n]["train_wall_s"] for n in ("auto1", "auto2"))
    return its(runs, "auto1", "auto2") / its(runs, "off1", "off2"), wall


ROUNDS = ("speed_ab_alternated", "speed_ab_alternated_2")


@table
def demo_bf16_speed(path, step_path):
    """The quick demo's it/s and training time, fp32 and bf16 alternated, two rounds; the ratios."""
    rec, step = record(path), record(step_path)
    first, second = (rec[k] for k in ROUNDS)
    lines = [head("`--amp`", f"it/s (progress line, iteration 460 of {first['runs']['off1']['iterations']})",
                  "training")]
    whens = (f"{rec['machine']}, {first['date']}", f"second round, {rec['machine']}, {second['date']} "
             f"{second['time_utc']} UTC")
    for rnd, when in zip((first, second), whens):
        for label, pair in ((f"`off` (fp32), {when}", ("off1", "off2")),
                            (f"`auto` (bf16, head fp32), {when}", ("auto1", "auto2"))):
            runs = [rnd["runs"][n] for n in pair]
            lines.append(row(label, ", ".join(f"{r['progress_it_per_s_at_460']:.2f}" for r in runs),
                             ", ".join(f"{r['train_wall_s']:.0f} s" for r in runs)))
    bf16, old = step["variants"]["bf16"], rec["speed_ab"]["runs"]
    o, n = old["off"]["progress_it_per_s_at_460"], old["on"]["progress_it_per_s_at_460"]
    rows = [(f"`auto` over `off`, {('first', 'second')[i]} round: it/s (training time)",
             "{:.2f}x ({:.2f}x)".format(*speed_ratios(path, k)), whens[i].replace("second round, ", ""))
            for i, k in enumerate(ROUNDS)]
    rows += [(f"the bare model step, fp32 vs bf16 (`{command(step)}`, alternated rounds; "
              "[experiments/benchmarks.md](experiments/benchmarks.md))",
              f"{bf16['today_ms']:.1f} vs {bf16['ms']:.1f} ms, {bf16['ratio_today_over_variant']:.2f}x",
              f"{step['machine']}, {step['date']}"),
             ("an earlier single pair of runs (`--amp off`, then `--amp on`): it/s", f"{o:.2f} vs {n:.2f} ({n / o:.2f}x)",
              rec["speed_ab"]["date"])]
    return "\n".join(lines) + "\n\n" + figures(rows)


PROTOCOL_COLUMNS = {"knn20": "20-NN", "knn200": "200-NN", "nn5_euclid": "5-NN", "linear": "linear, all labels",
                    "100": "100 labels / class", "10": "10 / class", "1": "1 / class"}
FEATURES = {"swav": "SwAV", "random_init": "random init (mean of the inits)", "raw_pixels": "raw pixels"}
ORDER = ("full", "quick", "fashion_mnist", "animal_mnist", "digits")


def group(path, mode, name, extra="none"):
    """The group of a protocols record with that mode, set and extra arguments."""
    (g,) = [g for g in record(path)["groups"] if (g["mode"], g["set"], g["extra"]) == (mode, name, extra)]
    return g


def cells(figures, columns=PROTOCOL_COLUMNS):
    return [pm(*figures[c]) if c in figures else "-" for c in columns]


@table
def demo_protocols(path):
    """Every protocol, both recipes, three sets: means and sds over seeds; SwAV's differences."""
    groups = sorted(record(path)["groups"], key=lambda g: (ORDER.index(g["mode"]), ORDER.index(g["set"])))
    lines = [head("recipe", "set", "features", *PROTOCOL_COLUMNS.values())]
    lines += [row(g["mode"], g["set"], label, *cells(g["figures"][key])) for g in groups
              for key, label in FEATURES.items()]
    seeds = sorted({tuple(g["seeds"]) for g in groups})
    lines += ["", figures([("seeds, in every group", "; ".join(", ".join(map(str, s)) for s in seeds)),
                           ("runs in which the collapse detector fired", f"{sum(g['detector_fired'] for g in groups)} "
                            f"of {sum(len(g['seeds']) for g in groups)}")], ("the runs", "")),
              "", "SwAV's mean minus each baseline's, in points:", "",
              head("recipe", "set", "SwAV minus", *PROTOCOL_COLUMNS.values())]
    lines += [row(g["mode"], g["set"], label.split(" (")[0],
                  *(f"{g['figures']['swav'][c][0] - g['figures'][key][c][0]:+.2f}" for c in PROTOCOL_COLUMNS))
              for g in groups for key, label in list(FEATURES.items())[1:]]
    return "\n".join(lines)


@table
def readme_protocols(path):
    """The README's headline table: the full recipe on Fashion-MNIST."""
    f = group(path, "full", "fashion_mnist", "--amp on")["figures"]
    labels = {"swav": "SwAV (res5avg, 128-d)", "random_init": "random init (same trunk, mean of 5)",
              "raw_pixels": "raw pixels (784-d)"}
    return "\n".join([head("features", *PROTOCOL_COLUMNS.values())]
                     + [row(label, *cells(f[key])) for key, label in labels.items()])


ONE_PROCESS_COLUMNS = {"knn20": "20-NN", "linear": "linear", "100": "100 / class", "10": "10 / class",
                       "1": "1 / class"}


@table
def demo_one_process(path, protocols, bf16):
    """The quick demo with one process of 128 against two of 64: features and speed."""
    rec, fast = record(path), record(bf16)["speed_ab_alternated_2"]
    two = group(protocols, "quick", "fashion_mnist")["figures"]["swav"]
    one = group(path, "quick", "fashion_mnist", "--procs 1")["figures"]["swav"]
    speed, runs = rec["progress_it_per_s_at_299"], fast["runs"]
    seeds = sorted(speed, key=int)
    return "\n".join([
        head("SwAV features, quick demo", *ONE_PROCESS_COLUMNS.values()),
        row("2 processes x 64 (the shipped recipe)", *cells(two, ONE_PROCESS_COLUMNS)),
        row("1 process x 128", *cells(one, ONE_PROCESS_COLUMNS)),
        row("difference", *(diff(one[c][0] - two[c][0], max(one[c][1], two[c][1])) for c in ONE_PROCESS_COLUMNS)),
        "", BOLD, "", figures([
            (f"one process: it/s at iteration 299, seeds {', '.join(seeds)}", ", ".join(f"{speed[s]:.2f}" for s in seeds),
             f"{rec['machine']}; {rec['date']}"),
            ("two processes: it/s at iteration 460, the second round of alternated runs above (`--amp auto`)",
             f"{runs['auto1']['progress_it_per_s_at_460']:.2f}, {runs['auto2']['progress_it_per_s_at_460']:.2f}",
             f"{record(bf16)['machine']}, {fast['date']}")], ("speed", "it/s", "machine, date"))])


# ------------------------------------------------------------------------------------------
# the GPU records (docs/gpu.md, README.md)
# ------------------------------------------------------------------------------------------
def dtype(name):
    return name.replace("torch.", "")


def yes(flag):
    return "yes" if flag else "no"


@table
def gpu_check(path):
    """benchmarks/gpu_check.py's record: the machine and the measured sections."""
    rec = record(path)
    m, r = rec["machine"], rec["results"]
    assert not rec["dry_run"], f"{path}: a dry run, not GPU figures"
    s, t, p = r["sinkhorn"], r["train_step"], r["pretrain"]
    f32, f16 = s["fp32"], s["fp16_autocast"]
    return "\n".join([
        f"Measured on one {m['card']} ({m['gpu_memory_gib']} GiB, driver {m['driver']}, CUDA {m['cuda']}, torch "
        f"{m['torch']}, Python {m['python']}, {m['cpu_cores']} cores of an {m['cpu']}), {m['date']}:", "",
        head("figure (section)", "target", f"measured ({m['card'].replace('NVIDIA ', '')})"),
        row(f"Sinkhorn-Knopp B={s['B']} x K={s['K']}, ours vs VISSL's built-in, fp32 and under fp16 autocast: ms and "
            "ratio (`sinkhorn`)", "ours < 1 ms on an H100; codes under autocast equal the fp32 codes within 1e-5",
            f"ours {f32['ours_ms']:.3f} ms (fp32) and {f16['ours_ms']:.3f} ms (fp16 autocast), VISSL's "
            f"{f32['vissl_ms']:.3f} / {f16['vissl_ms']:.3f} ms: {f32['ratio_vissl_over_ours']:.2f}x / "
            f"{f16['ratio_vissl_over_ours']:.2f}x faster; our codes under autocast differ from the fp32 codes by "
            f"{sci(f16['ours_max_abs_diff_to_fp32'])}, VISSL's by up to {sci(f16['vissl_max_abs_diff_to_fp32'])}"),
        row(f"ResNet-50 multi-crop training step, {t['crops'].replace(',', ' + ')}, batch {t['batch']}, "
            f"{t['amp']} AMP: ours vs VISSL's built-in SwAV, same run; peak memory (`train_step`)",
            "ratio ours / VISSL <= 1.0",
            f"{t['ours_ms']:.1f} vs {t['vissl_ms']:.1f} ms/step ({t['ours_images_per_s']:.0f} images/s): ratio "
            f"{t['ratio_ours_over_vissl']:.3f}; peak memory {t['memory']['ours']['peak_mb']:.0f} vs "
            f"{t['memory']['vissl']['peak_mb']:.0f} MB; first losses {t['first_loss']['ours']:.5f} vs "
            f"{t['first_loss']['vissl']:.5f}"),
        row(f"{p['iterations']} iterations of `{p['config']}`, {p['amp']} AMP, {p['data']} images (`pretrain`)",
            "finite loss, falling, non-finite guard silent",
            f"loss {p['loss_first']:.3f} -> {p['loss_last']:.3f} (mean of the first fifth "
            f"{p['loss_mean_first_fifth']:.3f}, of the last {p['loss_mean_last_fifth']:.3f}); finite "
            f"{yes(p['loss_finite'])}, falling {yes(p['loss_falling'])}, the guard fired "
            f"{yes(p['nonfinite_guard_fired'])}; {p['images_per_s']:.0f} images/s through VISSL's loader, "
            f"{100 * p['images_per_s'] / t['ours_images_per_s']:.0f}% of the bare step's "
            f"{t['ours_images_per_s']:.0f} images/s")])


@table
def gpu_demo(path):
    """The quick demo on one GPU: the machine, the command, the loader workers' waits."""
    rec = record(path)
    m, d = rec["machine"], rec["demo_quick"]
    before, after = d["forkserver_workers"], d["fork_workers"]
    t, waits = after["times_s"], after["seconds_from_data_iterator_to_phase_start"]
    totals = ", ".join(f"{sum(map(float, re.findall(r'([0-9.]+) s', x))):.1f} s" for x in d["fresh_interpreter_imports"])
    return "\n".join([
        f"Measured on one {m['card']} (driver {m['driver']}, CUDA {m['cuda']}, torch {m['torch']}, Python "
        f"{m['python']}, CPU {m['cpu']}), {m['date']}, after installing the offline bundle; record `{path}`:", "",
        "```bash", d["command"], "```", "",
        head("loader workers", "from the data iterator's creation to each epoch's start", "in an epoch", "the run"),
        row(before["what"], ", ".join(f"{x:.1f} s" for x in before["seconds_from_data_iterator_to_phase_start"]),
            "—", before["note"]),
        row(after["what"], f"{min(waits):.2f}-{max(waits):.2f} s", f"{after['in_epoch_it_per_s']:.1f} it/s",
            f"the whole quick demo {t['total']:.1f} s: data {t['data']:.1f} s, training {t['train_launcher']:.1f} s "
            f"({after['train_iterations']} iterations, launcher and start-up included), evaluation "
            f"{t['evaluation']:.1f} s, report {t['report']:.1f} s"),
        "", figures([("a fresh interpreter: importing torch, VISSL and the plugin",
                      f"{totals} ({'; '.join(d['fresh_interpreter_imports'])})", f"{m['card']}, {m['date']}")],
                    ("figure", "time", "machine, date"))])


@table
def gpu_demo_figures(path, protocols, one_process):
    """The quick demo's figures on one GPU (two batches), beside the CPU's over seeds."""
    rec = record(path)
    first, second = rec["demo_quick"]["fork_workers"], rec["demo_quick_batch128"]

    def gpu_cells(run, key):
        s = run["summary"]
        return [f"{v:.2f}" for v in [run["knn"][key]["knn20"]] + [s[f"{p}_{key}"] for p in
                                                                   ("linear", "shot100", "shot10", "shot1")]]

    for key in ("random_init", "raw_pixels"):
        assert gpu_cells(first, key) == gpu_cells(second, key), f"{path}: the {key} baseline differs between runs"
    two = group(protocols, "quick", "fashion_mnist")["figures"]["swav"]
    one = group(one_process, "quick", "fashion_mnist", "--procs 1")["figures"]["swav"]
    card, batch = rec["machine"]["card"], second["batch"].split("x")[-1]
    t1, t2 = first["times_s"], second["times_s"]
    return "\n".join([
        head("features (quick mode)", *ONE_PROCESS_COLUMNS.values()),
        row(f"SwAV, {card}, seed 0, batch 64 (6 epochs)", *gpu_cells(first, "swav")),
        row(f"SwAV, {card}, seed 0, batch {batch} ({second['epochs']} epochs, the default now)",
            *gpu_cells(second, "swav")),
        row("random init, seed 0", *gpu_cells(first, "random_init")), row("raw pixels", *gpu_cells(first, "raw_pixels")),
        row("SwAV, 2-core CPU, 2 processes x 64, seeds 0-2", *cells(two, ONE_PROCESS_COLUMNS)),
        row("SwAV, 2-core CPU, 1 process x 128, seeds 0-2", *cells(one, ONE_PROCESS_COLUMNS)), "",
        figures([(f"batch {b}", f"{x['total']:.1f} s", f"{x['train_launcher']:.1f} s", f"{card}, {rec['machine']['date']}")
                 for b, x in ((batch, t2), (64, t1))], ("the quick demo, seed 0", "in all", "training", "machine, date"))])


@table
def gpu_fp32_head(path):
    """The fp32 head under real CUDA fp16 autocast."""
    h = record(path)["fp32_head_under_cuda_fp16_autocast"]
    assert h["ok"], f"{path}: the fp32-head check did not pass"
    on = " and ".join(sorted(set(dtype(x) for x in h["on_dtypes"])))
    return f"**fp16 autocast and the fp32 head** ({h['device']}, torch {h['torch']}), under real CUDA fp16 autocast:\n\n" + \
        figures([("`swav_plugin_head` with `fp32_head: True`: its outputs; largest difference from the fp32 head's on "
                  "the same features", f"{on}; {h['on_equal_fp32_head_maxdiff']:.1f}"),
                 ("without the option: the prototype scores; largest difference from the fp32 scores",
                  f"{dtype(h['off_dtypes'][-1])}; {sci(h['off_scores_maxdiff_vs_fp32'])}"),
                 ("a ResNet-10 + head step with a gradient scaler: trunk features, scores, gradients",
                  f"{dtype(h['trunk_feature_dtype'])}, {dtype(h['scores_dtype'])}, "
                  f"{'finite' if h['grads_finite'] else 'non-finite'}")], ("check", "result"))


@table
def readme_gpu(gpu_check_path, demo_path):
    """The README's GPU figures: a row per GPU."""
    g, h = record(gpu_check_path), record(demo_path)
    m, r = g["machine"], g["results"]
    s, t, p = r["sinkhorn"]["fp32"], r["train_step"], r["pretrain"]
    b = h["demo_quick_batch128"]
    return figures([
        (f"{m['card']} (torch {m['torch']}), {m['date']}", f"{t['ours_ms']:.1f} ms, {t['vissl_ms']:.1f} ms",
         f"{s['ours_ms']:.2f} ms; {s['ratio_vissl_over_ours']:.1f}x",
         f"{p['images_per_s']:.0f}; {100 * p['images_per_s'] / t['ours_images_per_s']:.0f}%", "—"),
        (f"{h['machine']['card']}, {h['machine']['date']}", "—", "—", "—",
         f"{b['times_s']['total']:.1f} s, {b['times_s']['train_launcher']:.1f} s")],
        ("GPU, date", "the ResNet-50 multi-crop step: ours, VISSL's built-in SwAV",
         f"Sinkhorn ({r['sinkhorn']['B']} x {r['sinkhorn']['K']}): ours; VISSL's over ours",
         f"`{p['config'].split('/')[-1]}` training: images/s; share of the bare step",
         f"the quick demo (batch {b['batch'].split('x')[-1]}, fp16 autocast): in all, training"))


def patches_by_module():
    """``{module file: [patch, ...]}`` of every registered compat patch, in the engine's order."""
    import vissl  # noqa: F401  (the start-up hook registers the plugin)
    import vissl_swav_plugin
    from vissl_swav_plugin.compat import engine

    vissl_swav_plugin.register_all()
    out = {}
    for name in engine.names():
        module = engine._REGISTRY[name][2].__module__
        out.setdefault(module.split(".")[-1] + ".py" if module.startswith("vissl_swav_plugin.compat.") else module,
                       []).append(name)
    return out


@table
def compat_count():
    """How many compat patches there are, and where they live."""
    by_module = patches_by_module()
    outside = [m.replace(".", "/") + ".py" for m in by_module if not m.endswith(".py")]
    where = (", every one in `vissl_swav_plugin/compat/`." if not outside else
             "; " + ", ".join(f"`{m}`" for m in outside) + " lie outside `vissl_swav_plugin/compat/`.")
    return f"There are {sum(map(len, by_module.values()))} patches, listed below by module" + where


@table
def compat_patches():
    """A row per compat module (the order and the third column: docs/doc_tables.yaml's ``compat``;
    a module it lacks comes last, with an empty third column) with its registered patches."""
    by_module, fixes = patches_by_module(), data()["compat"]
    files = [p.name for p in sorted((REPO / "vissl_swav_plugin" / "compat").glob("*.py"))
             if p.name not in ("__init__.py", "engine.py")]
    order = [m for m in fixes if m in by_module or m in files]
    order += [m for m in [*by_module, *files] if m not in order]
    lines = [head("module", "patches", "what breaks in VISSL 0.1.6, and the fix")]
    for m in order:
        fix = fixes.get(m, {})
        patches = ", ".join(f"`{n}`" for n in by_module[m]) if m in by_module else fix.get("patches", "none")
        lines.append(row(f"`{m}`", patches, fix.get("fix", "")))
    return "\n".join(lines)


@table
def host_requirements():
    """The version ranges of requirements-host.txt."""
    pinned, free = [], []
    for line in (REPO / "requirements-host.txt").read_text().split("\n"):
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*(.*)$", line.split("#")[0].strip())
        if m:
            (pinned if m.group(2) else free).append((m.group(1), m.group(2).replace(" ", "")))
    return ("`requirements-host.txt` pins " + ", ".join(f"`{n}{spec}`" for n, spec in pinned)
            + "; it leaves " + ", ".join(n for n, _ in free) + " to pip.")


@table
def collapse_message(config):
    """The collapse detector's message for ``config`` with uniform predictions at iterations 130
    to 229 (epoch 5, lr 0.2807)."""
    import math

    from omegaconf import OmegaConf

    from vissl_swav_plugin.hooks.collapse_report import collapse_message as message
    from vissl_swav_plugin.hooks.collapse_report import run_context

    cfg = OmegaConf.create(config_yaml(config))
    k = cfg.MODEL.HEAD.PARAMS[-1][1]["num_clusters"][0]
    heads = [dict(K=k, ln_k=math.log(k), sample_entropy=math.log(k), mean_entropy=math.log(k), used=k)]
    text = message("uniform", cfg.LOSS.name, math.log(k), heads, dict(cfg.HOOKS.COLLAPSE_DETECTOR), run_context(cfg),
                   iterations=(130, 229), streak=100, epoch=5, lr=0.2807, epoch_used=[k])
    return "```text\n" + text.rstrip("\n") + "\n```"


# ------------------------------------------------------------------------------------------
# the configs (docs/configs.md)
# ------------------------------------------------------------------------------------------
CONFIGS = REPO / "configs" / "config"


def shipped_configs(root=CONFIGS):
    """Every config under configs/config, as ``config=`` names."""
    from vissl_swav_plugin.config.yaml_files import shipped_config_names

    return shipped_config_names(root=root)


def config_yaml(name, root=CONFIGS):
    """A shipped config's ``config`` block as Python values."""
    import yaml

    return yaml.safe_load((Path(root) / f"{name}.yaml").read_text())["config"]


def yaml_text(node):
    """A YAML node as the file writes it (plain scalars verbatim; sequences and mappings in flow style)."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        return node.value if node.value != "" else '""'
    if isinstance(node, yaml.SequenceNode):
        return "[" + ", ".join(yaml_text(x) for x in node.value) + "]"
    return "{" + ", ".join(f"{yaml_text(k)}: {yaml_text(v)}" for k, v in node.value) + "}"


@functools.lru_cache(None)
def _compose(text):
    import yaml

    return yaml.compose(text)


def config_value(name, key, root=CONFIGS):
    """The text of ``key`` (``A.B.0.c``) in the shipped config ``name``; KeyError if it lacks it."""
    import yaml

    node = _compose((Path(root) / f"{name}.yaml").read_text())
    for part in ["config", *key.split(".")]:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == part), None)
        else:
            node = node.value[int(part)] if part.isdigit() and int(part) < len(node.value) else None
        if node is None:
            raise KeyError(f"{key} is not in configs/config/{name}.yaml")
    return yaml_text(node)


@table
def config(name, root=CONFIGS):
    """``| key | value |`` of the keys docs/doc_tables.yaml lists for ``name``, values from the YAML."""
    keys = data()["configs"][name]["keys"]
    return "\n".join([head("key", "value")] + [row(f"`{k}`", f"`{config_value(name, k, root)}`") for k in keys])


@table
def configs(root=CONFIGS):
    """One row per shipped config: purpose, hardware and time from docs/doc_tables.yaml (in its
    order), batch and epochs from the YAML; a config it lacks comes last with empty columns."""
    written = data()["configs"]
    lines = [head("config", "purpose", "hardware", "batch", "epochs", "expected time")]
    for name in [n for n in written if n in shipped_configs(root)] + [n for n in shipped_configs(root)
                                                                      if n not in written]:
        cfg, w = config_yaml(name, root), written.get(name, {})
        per, dist = cfg["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"], cfg["DISTRIBUTED"]
        procs = dist["NUM_NODES"] * dist["NUM_PROC_PER_NODE"]
        lines.append(row(f"`{name}`", w.get("purpose", ""), w.get("hardware", ""), f"{per} × {procs} = {per * procs}",
                         cfg.get("OPTIMIZER", {}).get("num_epochs", "—"), w.get("time", "")))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------
def build_parser():
    """The command line of ``tools/doc_tables.py``."""
    p = argparse.ArgumentParser(prog="tools/doc_tables.py", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing: show how the pages differ from what cog generates, exit 1 if they do")
    return p


def cog_args(check, files):
    """cog's command line over ``files``: ``-r`` rewrites, ``--check --diff`` only compares."""
    mode = ["--check", "--diff", "--check-fail-msg=run `.venv/bin/python tools/doc_tables.py`"] if check else ["-r"]
    return ["cog", "--verbosity=1", "-I", str(REPO / "tools"), *mode, *map(str, files)]


def main(argv=None):
    """Rewrite (or ``--check``) every cog block of README.md and docs/."""
    from cogapp import Cog

    args = build_parser().parse_args(argv)
    status = Cog().main(cog_args(args.check, pages()))
    return {0: 0, 5: 1}.get(status, 2)


if __name__ == "__main__":
    sys.exit(main())
