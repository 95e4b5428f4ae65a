"""The demo's recipes on several image sets and seeds: docs/experiments/collapse.md
table (collapse detector, loss, kNN of SwAV vs random init vs raw pixels), measured by running
the shipped ``tools/demo.py`` with nothing changed but ``--source`` and ``--seed``.

Not part of ``make bench`` (one run is minutes of CPU; the table is hours):

    python tools/make_small_sets.py --out data/sets
    python benchmarks/recipe_table.py --out runs/table --modes quick \
        --sets fashion_mnist=/usr/share/datasets/fashion-mnist,animal_mnist=data/sets/animal_mnist,digits=data/sets/digits \
        --seeds 0,1,2

A run whose ``swav_demo_report.json`` already exists is read, not re-run, so the command can be
stopped and started again.  Each run folder records the extra ``tools/demo.py`` arguments it was
made with (``recipe_table_args.json``); asking for that run again with other ``--extra`` arguments
is an error (use another ``--out``).  A run folder from before this record reads as "not
recorded" and is reused only without ``--extra``.  The table goes to OUT/table.md and OUT/table.json and holds
every finished run under OUT, from this invocation and earlier ones, with its extra arguments;
OUT/recipe_table.json records this invocation (machine, date, command line, what it asked for).
A run whose demo exits non-zero is a "failed" row; the other runs still go ahead, and the command
then exits 1, naming each failed run and its log.
OUT/quality.md sums the runs up per recipe and set: SwAV's kNN mean ± standard deviation over the
seeds at 20-NN, 200-NN and 5-NN beside the random-init and raw-pixel means (the tables of docs/experiments/recipe.md).
OUT/protocols.md (and protocols.json) gives every protocol of the demo -- kNN, the linear probe and
low-shot with 100 / 10 / 1 labels per class -- for SwAV, the random inits and the raw pixels, mean ±
standard deviation over the seeds, per recipe and set (the README's headline table and the
small-sets table of docs/demo.md).
"""
import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchmarking as bm

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = re.compile(r"^(quick|full)_(.+)_s(\d+)$")
ARGS_FILE = "recipe_table_args.json"
DETECTOR_LINE = re.compile(r"Collapse detector, epoch (\d+) .*?mean loss ([0-9.]+) .*?prototypes used (\d+)/(\d+)\b"
                           r".*?collapsed iterations (\d+)/(\d+) \(current run (\d+)")


class TableError(Exception):
    """A run folder under OUT that cannot be reused as asked."""


def run_log(out, mode, name, seed):
    """The demo's console output of one run (beside its run folder)."""
    return out / f"{mode}_{name}_s{seed}.log"


def run_one(mode, name, source, seed, out, extra):
    """Run the demo once (unless its report exists); returns the row of the table.

    Raises:
        TableError: the run folder exists and was made with other extra arguments.
    """
    run_out = out / f"{mode}_{name}_s{seed}"
    report_path = run_out / "swav_demo_report.json"
    args_path = run_out / ARGS_FILE
    if report_path.is_file() or args_path.is_file():
        made_with = json.loads(args_path.read_text()) if args_path.is_file() else None  # None: not recorded
        if made_with != list(extra) and not (made_with is None and not extra):
            was = "not recorded (a run from before the record)" if made_with is None else made_with
            raise TableError(f"{run_out}: made with extra arguments {was}, asked for {list(extra)}; "
                             "use another --out (nothing was changed)")
    if not report_path.is_file():
        cmd = [sys.executable, str(REPO / "tools" / "demo.py"), "--seed", str(seed), "--source", str(source),
               "--out", str(run_out), "--data-dir", str(out / "data" / name), *extra]
        if mode == "quick":
            cmd.insert(2, "--quick")
        run_out.mkdir(parents=True, exist_ok=True)
        args_path.write_text(json.dumps(list(extra)) + "\n")
        t = time.time()
        with open(run_log(out, mode, name, seed), "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"{mode} {name} seed {seed}: exit {rc} in {time.time() - t:.0f}s", flush=True)
        if rc != 0:
            return dict(mode=mode, set=name, seed=seed, exit_code=rc, extra=list(extra))
    return summarize(mode, name, seed, run_out)


def finished_runs(out):
    """The rows of every finished run under ``out`` (folders ``{mode}_{set}_s{seed}`` with a
    report), sorted by mode, set and seed."""
    rows = []
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        m = RUN_DIR.match(d.name)
        if m and (d / "swav_demo_report.json").is_file():
            rows.append(summarize(m.group(1), m.group(2), int(m.group(3)), d))
    return rows


def merge(rows, earlier):
    """``rows`` (this invocation's, in order) followed by the ``earlier`` rows of other runs."""
    key = lambda r: (r["mode"], r["set"], r["seed"])  # noqa: E731
    mine = {key(r) for r in rows}
    return rows + [r for r in earlier if key(r) not in mine]


def summarize(mode, name, seed, run_out):
    """The table's row of one finished run: the detector's per-epoch figures and the kNN."""
    report = json.loads((run_out / "swav_demo_report.json").read_text())
    log = (run_out / "run" / "train_log.txt").read_text()
    epochs = [m.groups() for m in DETECTOR_LINE.finditer(log)]
    k = int(epochs[0][3]) if epochs else 0
    curve = [r["loss"] for r in report["loss_curve"]]
    knn = report["knn"]
    tail = curve[-max(1, len(curve) // 20):]
    return dict(
        mode=mode, set=name, seed=seed, exit_code=0, iterations=len(curve), epochs=report["config"]["mode"]["epochs"],
        detector_fired="COLLAPSE DETECTED" in log,
        collapsed_iters=sum(int(e[4]) for e in epochs), longest_run=max((int(e[6]) for e in epochs), default=0),
        min_protos_used=min((int(e[2]) for e in epochs), default=0), num_prototypes=k,
        final_loss_over_lnK=round(sum(tail) / len(tail) / math.log(k), 3) if k else None,
        swav=knn["swav"], random_init=knn["random_init"], raw_pixels=knn["raw_pixels"],
        probes=probe_figures(report),
        train_s=report["times_s"]["train_launcher"], it_per_s=report["times_s"].get("train_it_per_s"),
        extra=json.loads((run_out / ARGS_FILE).read_text()) if (run_out / ARGS_FILE).is_file() else None,
    )


SHOTS = ("100", "10", "1")
FEATURES = (("swav", "SwAV"), ("random_init", "random init (mean of the inits)"), ("raw_pixels", "raw pixels"))


def probe_figures(report):
    """``{features: {"linear": top-1, "100": mean of the draws, "10": ..., "1": ...}}`` of a
    report's linear and low-shot probes, or None for a run made with ``--probes off``."""
    probes = report.get("probes")
    if not probes:
        return None
    return {key: dict(linear=probes[key]["linear"]["top1"],
                      **{k: probes[key]["low_shot"][k]["mean"] for k in SHOTS})
            for key, _ in FEATURES}


def markdown(rows):
    """The rows as a Markdown table."""
    head = ("| recipe | set | seed | extra arguments | it | detector | collapsed it (max run at an epoch end) | fewest prototypes used in an epoch "
            "| final loss / ln K | 20-NN SwAV | random init | raw pixels | 5-NN SwAV | raw pixels |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("exit_code"):
            lines.append(f"| {r['mode']} | {r['set']} | {r['seed']} | {_extra(r)} | failed (exit {r['exit_code']}) |"
                         + " |" * 9)
            continue
        lines.append(
            f"| {r['mode']} | {r['set']} | {r['seed']} | {_extra(r)} | {r['iterations']} | "
            f"{'FIRED' if r['detector_fired'] else 'quiet'} | {r['collapsed_iters']} ({r['longest_run']}) | "
            f"{r['min_protos_used']}/{r['num_prototypes']} | {r['final_loss_over_lnK']} | "
            f"{r['swav']['knn20']:.1f} | {r['random_init']['knn20']:.1f} | {r['raw_pixels']['knn20']:.1f} | "
            f"{r['swav']['nn5_euclid']:.1f} | {r['raw_pixels']['nn5_euclid']:.1f} |")
    return "\n".join(lines) + "\n"


KNN_KEYS = (("knn20", "20-NN"), ("knn200", "200-NN"), ("nn5_euclid", "5-NN"))


def _groups(rows):
    """``[(group, runs)]``: the finished rows by recipe, set and extra arguments, in the order the
    groups first appear; ``group`` holds those keys, the seeds and how many runs the detector fired in."""
    groups = {}
    for r in rows:
        if r.get("exit_code"):
            continue
        groups.setdefault((r["mode"], r["set"], _extra(r)), []).append(r)
    return [(dict(mode=mode, set=name, extra=extra, seeds=sorted(r["seed"] for r in runs),
                  detector_fired=sum(bool(r["detector_fired"]) for r in runs)), runs)
            for (mode, name, extra), runs in groups.items()]


def quality(rows):
    """Per recipe, set and extra arguments, over the finished runs' seeds: SwAV's kNN mean and
    sample standard deviation at each k, the random-init and raw-pixel means, and SwAV's
    mean margins over both (the recipe goals: +2 over raw pixels at every k, +8 over random
    init).  Returns a list of dicts, one per group, in the order the groups first appear."""
    out = []
    for g, runs in _groups(rows):
        for key, _ in KNN_KEYS:
            swav = [r["swav"][key] for r in runs]
            mean = statistics.mean(swav)
            rand = statistics.mean(r["random_init"][key] for r in runs)
            raw = statistics.mean(r["raw_pixels"][key] for r in runs)
            g[key] = dict(swav=mean, sd=statistics.stdev(swav) if len(swav) > 1 else None,
                          random_init=rand, raw_pixels=raw, over_random=mean - rand, over_raw=mean - raw)
        out.append(g)
    return out


def quality_markdown(groups):
    """:func:`quality`'s groups as a Markdown table: one row per group and k."""
    head = ("| recipe | set | extra arguments | seeds | detector fired | k | SwAV (mean ± sd) | random init | raw pixels "
            "| SwAV − random init | SwAV − raw pixels |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for g in groups:
        for key, label in KNN_KEYS:
            q = g[key]
            sd = "" if q["sd"] is None else f" ± {q['sd']:.2f}"
            lines.append(f"| {g['mode']} | {g['set']} | {g['extra']} | {','.join(map(str, g['seeds']))} | "
                         f"{g['detector_fired']}/{len(g['seeds'])} | {label} | {q['swav']:.2f}{sd} | "
                         f"{q['random_init']:.2f} | {q['raw_pixels']:.2f} | {q['over_random']:+.2f} | {q['over_raw']:+.2f} |")
    return "\n".join(lines) + "\n"


PROTOCOL_COLUMNS = KNN_KEYS + (("linear", "linear, all labels"), ("100", "100 labels / class"), ("10", "10 / class"),
                               ("1", "1 / class"))


def protocols(rows):
    """Per recipe, set and extra arguments, over the finished runs' seeds: every protocol of the
    demo (kNN at 20 / 200 / 5, the linear probe, low-shot with 100 / 10 / 1 labels per class) for
    each feature set (SwAV, random init, raw pixels), as ``[mean, sample sd]`` (sd None for one
    seed or for a figure equal on every seed).  A group whose runs lack the probes (``--probes
    off``) gets kNN columns only.  Returns a list of dicts, one per group, in the order the groups
    first appear."""
    out = []
    for g, runs in _groups(rows):
        g["figures"] = {}
        with_probes = all(r.get("probes") for r in runs)
        for key, _ in FEATURES:
            cells = {}
            for col, _ in PROTOCOL_COLUMNS:
                if col in dict(KNN_KEYS):
                    values = [r[key][col] for r in runs]
                elif with_probes:
                    values = [r["probes"][key][col] for r in runs]
                else:
                    continue
                same = len(set(values)) == 1
                cells[col] = [statistics.mean(values), None if same or len(values) < 2 else statistics.stdev(values)]
            g["figures"][key] = cells
        out.append(g)
    return out


def protocols_markdown(groups):
    """:func:`protocols`' groups as Markdown: one table row per group and feature set."""
    head = "| recipe | set | extra arguments | seeds | features | " + " | ".join(h for _, h in PROTOCOL_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for g in groups:
        for key, label in FEATURES:
            cells = g["figures"][key]
            text = [cell_text(cells[col]) if col in cells else "-" for col, _ in PROTOCOL_COLUMNS]
            lines.append(f"| {g['mode']} | {g['set']} | {g['extra']} | {','.join(map(str, g['seeds']))} | {label} | "
                         + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def cell_text(cell):
    """``[mean, sd]`` as ``81.93 ± 0.56`` (``80.08`` without a spread)."""
    mean, sd = cell
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


def write_tables(out, table):
    """OUT/table.json, OUT/table.md (one row per run), OUT/quality.md (kNN per recipe and set) and
    OUT/protocols.md / protocols.json (every protocol per recipe, set and feature set)."""
    (out / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / "table.md").write_text(markdown(table))
    (out / "quality.md").write_text(quality_markdown(quality(table)))
    groups = protocols(table)
    (out / "protocols.json").write_text(json.dumps(groups, indent=1) + "\n")
    (out / "protocols.md").write_text(protocols_markdown(groups))


def _extra(row):
    """The row's extra demo arguments: ``none``, or ``not recorded`` (a run made before they were)."""
    if row.get("extra") is None:
        return "not recorded"
    return " ".join(row["extra"]) or "none"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="quick,full")
    ap.add_argument("--sets", default="fashion_mnist=/usr/share/datasets/fashion-mnist",
                    help="name=IDX folder, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--extra", action="append", default=[], help="extra tools/demo.py argument (repeatable)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sets = [s.split("=", 1) for s in args.sets.split(",")]
    bm.write_json(str(out / "recipe_table.json"), bm.record(
        "recipe_table", __file__, argv, None, modes=args.modes.split(","), sets=dict(sets),
        seeds=[int(s) for s in args.seeds.split(",")], extra=args.extra))
    rows = []
    try:
        for mode in args.modes.split(","):
            for name, source in sets:
                for seed in (int(s) for s in args.seeds.split(",")):
                    rows.append(run_one(mode, name, Path(source).resolve(), seed, out, args.extra))
                    write_tables(out, merge(rows, finished_runs(out)))
    except TableError as e:
        print(f"recipe_table: error: {e}", file=sys.stderr)
        return 2
    table = merge(rows, finished_runs(out))  # the files were written after the last run
    print(markdown(table))
    print(quality_markdown(quality(table)))
    print(protocols_markdown(protocols(table)))
    failed = [r for r in rows if r.get("exit_code", 0) != 0]
    for r in failed:  # the table says "failed"; the exit status says it too, for scripts and queues
        print(f"recipe_table: error: {r['mode']} {r['set']} seed {r['seed']} failed (demo exit {r['exit_code']}); "
              f"see {run_log(out, r['mode'], r['set'], r['seed'])}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
