#!/usr/bin/env python
"""The documentation's generated tables (a tool of the checkout: not in the wheel).

Every measured table of README.md and docs/ is a cog block (https://cog.readthedocs.io, the
``cogapp`` package): a comment line that calls :func:`emit` with a table's name and its arguments,
the generated text, and cog's end line.  A table that only picks a record's fields is data: one of
``figures:`` in ``docs/doc_tables.yaml``, ``str.format`` templates over the benchmarks' ``--json``
records under ``docs/experiments/`` (:func:`figures`).  A renderer here computes over a record
(means over seeds, differences, ratios) or reads a shipped config, the registered compat patches or
``requirements-host.txt``; what a page writes by hand beside its cells (a config's purpose, what a
compat patch fixes) is data in ``docs/doc_tables.yaml`` too.  No renderer reads a page.

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
import string
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = "docs/doc_tables.yaml"
CONFIGS = REPO / "configs" / "config"
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


@functools.lru_cache(None)
def record(path):
    """A JSON record (path relative to the repository)."""
    return json.loads((REPO / path).read_text())


@functools.lru_cache(None)
def data():
    """``docs/doc_tables.yaml``: the ``figures`` tables and the hand-written columns."""
    import yaml

    return yaml.safe_load((REPO / DATA).read_text())


# ------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------
def row(*cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def grid(header, rows):
    """A Markdown table: its header and a row per sequence of cells."""
    return "\n".join([row(*header), "|" + "---|" * len(header)] + [row(*r) for r in rows])


def pm(mean, sd=None):
    """``81.93 ± 0.56`` (``80.08`` without a spread): benchmarks/recipe_table.py's cell format."""
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


def diff(a, b):
    """``a``'s mean minus ``b``'s (``(mean, sd)`` pairs), in bold where larger than the larger sd."""
    d = a[0] - b[0]
    return f"**{d:+.2f}**" if abs(d) > max(a[1] or 0, b[1] or 0) else f"{d:+.2f}"


BOLD = "Bold: a difference larger than the larger sd over seeds of the two rows."


def over_seeds(runs, keys):
    """``{key: (mean, sd)}`` over the runs (one dict of figures per seed)."""
    return {k: (statistics.fmean(r[k] for r in runs), statistics.stdev(r[k] for r in runs)) for k in keys}


def seeds_of(runs):
    seeds = sorted(int(s) for s in runs)
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def command(rec):
    """A record's command without its ``--json`` output, as run in a checkout after make venv."""
    cmd = rec["command"].split(" --json")[0]
    return ".venv/bin/python " + cmd[len("python "):] if cmd.startswith("python ") else cmd


# ------------------------------------------------------------------------------------------
# the tables that pick a record's fields: docs/doc_tables.yaml's figures
# ------------------------------------------------------------------------------------------
class Cells(string.Formatter):
    """``str.format``, where a list's items each take the field's format, joined by commas."""

    def format_field(self, value, spec):
        return ", ".join(format(v, spec) for v in value) if isinstance(value, list) else format(value, spec)


@table
def figures(name, *paths):
    """``figures: name`` of docs/doc_tables.yaml over the records ``paths``: an optional ``intro``,
    a ``header`` and ``rows``, each one a ``str.format`` template (:class:`Cells`) that names the
    first record's keys (``{results[plugin][pause_s]:.2f}``; ``{command}`` as :func:`command`
    writes it) and every record by position (``{1[machine][date]}``).  With ``each: KEY.KEY``
    the rows repeat for every item of the first record's mapping or list there, naming the item's
    keys too and ``{key}``, its key or index."""
    spec, recs = data()["figures"][name], [record(p) for p in paths]
    named = {**recs[0], "command": command(recs[0])} if "command" in recs[0] else recs[0]
    items = [("", {})]
    if "each" in spec:
        over = functools.reduce(lambda d, k: d[k], spec["each"].split("."), recs[0])
        items = over.items() if isinstance(over, dict) else enumerate(over)

    def fill(cells, **item):
        return [Cells().vformat(cell, recs, {**named, **item}) for cell in cells]

    intro = fill([spec["intro"]])[0] + "\n\n" if "intro" in spec else ""
    return intro + grid(fill(spec["header"]), [fill(r, **v, key=k) for k, v in items for r in spec["rows"]])


# ------------------------------------------------------------------------------------------
# the CPU benchmarks (docs/launching.md, docs/demo.md, docs/gpu.md)
# ------------------------------------------------------------------------------------------
DEMO_COLUMNS = {"knn20": "20-NN", "linear_swav": "linear, all labels", "shot100_swav": "100 / class",
                "shot10_swav": "10 / class", "shot1_swav": "1 / class"}


@table
def demo_device_augment(path, mode):
    """The quick demo with ``DEVICE_AUGMENT=mode`` (record key ``mode``), per seed and over seeds,
    against ``off``'s; a record with ``equals_photometric`` says per seed whether the run's
    losses and figures were ``photometric``'s."""
    rec = record(path)
    runs, off, same = rec[mode], rec["reference_off"]["mean_sd"], rec.get("equals_photometric")
    stats, extra = over_seeds(runs.values(), DEMO_COLUMNS), ["losses and figures equal to `photometric`'s"] * bool(same)
    rows = [[f"seed {s}", *(f"{runs[s][k]:.2f}" for k in DEMO_COLUMNS), *(("yes" if same[s] else "no",) if same else ())]
            for s in sorted(runs, key=int)]
    rows += [[f"{seeds_of(runs)} (mean ± sd)", *(pm(*stats[k]) for k in DEMO_COLUMNS)] + [""] * len(extra),
             ["minus `off`'s mean (the table above)", *(diff(stats[k], off[k]) for k in DEMO_COLUMNS)] + [""] * len(extra)]
    m = rec["machine"]
    return (f"Measured on {m['cpu']} ({m['cores']} cores; Python {m['python']}, torch {m['torch']}), {rec['date']}:\n\n"
            f"```bash\n{command(rec).replace('SEED', '0')}\n```\n\n" + grid([f"quick demo, fp32, `{mode}`", *DEMO_COLUMNS.values(), *extra], rows) + "\n\n" + BOLD)


# ------------------------------------------------------------------------------------------
# bf16 autocast and the demo's protocols (docs/demo.md, README.md, docs/gpu.md)
# ------------------------------------------------------------------------------------------
BF16_COLUMNS = {"knn20_swav": "20-NN", "linear_swav": "linear, all labels", "shot100_swav": "100 labels / class",
                "shot10_swav": "10 / class", "shot1_swav": "1 / class", "loss_last": "last loss"}
BF16_ROWS = {"fp32": "fp32 (`--amp off`)", "bf16": "bf16 autocast of the whole model",
             "bf16_fp32_head": "bf16 autocast, head in fp32 (`auto` on AMX)"}


@table
def demo_bf16_quality(path):
    """The full demo over seeds in fp32, bf16 and bf16 with the head in fp32; their differences."""
    rec = record(path)
    s = {kind: over_seeds(rec[kind]["runs"].values(), BF16_COLUMNS) for kind in BF16_ROWS}
    rows = [[f"{label}, {seeds_of(rec[kind]['runs'])}", *(pm(*s[kind][k]) for k in BF16_COLUMNS)]
            for kind, label in BF16_ROWS.items()]
    rows += [[label, *(diff(s[kind][k], s["fp32"][k]) for k in BF16_COLUMNS)]
             for kind, label in (("bf16", "whole model bf16 − fp32"), ("bf16_fp32_head", "head in fp32 − fp32"))]
    same = all(run["knn20_random_init"] == rec["fp32"]["runs"][seed]["knn20_random_init"]
               for kind in BF16_ROWS for seed, run in rec[kind]["runs"].items())
    return grid(["`make demo`", *BF16_COLUMNS.values()], rows) + f"\n\n{BOLD} " + (
        "Each seed's random-init 20-NN is the same in every row." if same
        else "The random-init 20-NN of a seed differs between the rows.")


ROUNDS = ("speed_ab_alternated", "speed_ab_alternated_2")


def its(runs, *names):
    """The mean it/s (progress line at iteration 460) of the named runs."""
    return statistics.fmean(runs[n]["progress_it_per_s_at_460"] for n in names)


def speed_ratios(path, key):
    """``(it/s ratio, training time ratio)`` bf16 (head fp32) / fp32 of a round of alternated runs."""
    runs = record(path)[key]["runs"]
    wall = statistics.fmean(runs[n]["train_wall_s"] for n in ("off1", "off2")) / statistics.fmean(
        runs[n]["train_wall_s"] for n in ("auto1", "auto2"))
    return its(runs, "auto1", "auto2") / its(runs, "off1", "off2"), wall


@table
def demo_bf16_speed(path, step_path):
    """The quick demo's it/s and training time, fp32 and bf16 alternated, two rounds; the ratios."""
    rec, step = record(path), record(step_path)
    first, second = (rec[k] for k in ROUNDS)
    whens = (f"{rec['machine']}, {first['date']}", f"{rec['machine']}, {second['date']} {second['time_utc']} UTC")
    rows = [(f"`{amp}` ({what}), {'second round, ' * i}{when}",
             ", ".join(f"{rnd['runs'][n]['progress_it_per_s_at_460']:.2f}" for n in pair),
             ", ".join(f"{rnd['runs'][n]['train_wall_s']:.0f} s" for n in pair))
            for i, (rnd, when) in enumerate(zip((first, second), whens))
            for amp, what, pair in (("off", "fp32", ("off1", "off2")), ("auto", "bf16, head fp32", ("auto1", "auto2")))]
    bf16 = step["variants"]["bf16"]
    figs = [(f"`auto` over `off`, {which} round: it/s (training time)", "{:.2f}x ({:.2f}x)".format(*speed_ratios(path, k)),
             when) for which, k, when in zip(("first", "second"), ROUNDS, whens)]
    figs.append((f"the bare model step, fp32 vs bf16 (`{command(step)}`, alternated rounds; "
                 "[experiments/benchmarks.md](experiments/benchmarks.md))",
                 f"{bf16['today_ms']:.1f} vs {bf16['ms']:.1f} ms, {bf16['ratio_today_over_variant']:.2f}x",
                 f"{step['machine']}, {step['date']}"))
    return (grid(("`--amp`", f"it/s (progress line, iteration 460 of {first['runs']['off1']['iterations']})", "training"),
                 rows) + "\n\n" + grid(("figure", "measured", "machine, date"), figs))


PROTOCOL_COLUMNS = {"knn20": "20-NN", "knn200": "200-NN", "nn5_euclid": "5-NN", "linear": "linear, all labels",
                    "100": "100 labels / class", "10": "10 / class", "1": "1 / class"}
SHORT_COLUMNS = {"knn20": "20-NN", "linear": "linear", "100": "100 / class", "10": "10 / class", "1": "1 / class"}
FEATURES = {"swav": "SwAV", "random_init": "random init (mean of the inits)", "raw_pixels": "raw pixels"}
ORDER = ("full", "quick", "fashion_mnist", "animal_mnist", "digits")


def group(path, mode, name, extra="none"):
    """The figures of a protocols record's group with that mode, set and extra arguments."""
    (g,) = [g for g in record(path)["groups"] if (g["mode"], g["set"], g["extra"]) == (mode, name, extra)]
    return g["figures"]


def cells(figures, columns=PROTOCOL_COLUMNS):
    return [pm(*figures[c]) if c in figures else "-" for c in columns]


@table
def demo_protocols(path):
    """Every protocol, both recipes, three sets: means and sds over seeds; SwAV's differences."""
    groups = sorted(record(path)["groups"], key=lambda g: (ORDER.index(g["mode"]), ORDER.index(g["set"])))
    seeds = sorted({tuple(g["seeds"]) for g in groups})
    runs = [("seeds, in every group", "; ".join(", ".join(map(str, s)) for s in seeds)),
            ("runs in which the collapse detector fired",
             f"{sum(g['detector_fired'] for g in groups)} of {sum(len(g['seeds']) for g in groups)}")]
    gains = [(g["mode"], g["set"], label.split(" (")[0],
              *(f"{g['figures']['swav'][c][0] - g['figures'][key][c][0]:+.2f}" for c in PROTOCOL_COLUMNS))
             for g in groups for key, label in list(FEATURES.items())[1:]]
    return "\n\n".join([
        grid(("recipe", "set", "features", *PROTOCOL_COLUMNS.values()),
             [(g["mode"], g["set"], label, *cells(g["figures"][key])) for g in groups for key, label in FEATURES.items()]),
        grid(("the runs", ""), runs), "SwAV's mean minus each baseline's, in points:",
        grid(("recipe", "set", "SwAV minus", *PROTOCOL_COLUMNS.values()), gains)])


@table
def readme_protocols(path):
    """The README's headline table: the full recipe on Fashion-MNIST."""
    f = group(path, "full", "fashion_mnist", "--amp on")
    labels = {"swav": "SwAV (res5avg, 128-d)", "random_init": "random init (same trunk, mean of 5)",
              "raw_pixels": "raw pixels (784-d)"}
    return grid(("features", *PROTOCOL_COLUMNS.values()), [(label, *cells(f[k])) for k, label in labels.items()])


@table
def demo_one_process(path, protocols, bf16):
    """The quick demo with one process of 128 against two of 64: features and speed."""
    rec, fast = record(path), record(bf16)["speed_ab_alternated_2"]
    two, one = group(protocols, "quick", "fashion_mnist")["swav"], group(path, "quick", "fashion_mnist", "--procs 1")["swav"]
    speed, runs = rec["progress_it_per_s_at_299"], fast["runs"]
    seeds = sorted(speed, key=int)
    return "\n\n".join([
        grid(("SwAV features, quick demo", *SHORT_COLUMNS.values()),
             [("2 processes x 64 (the shipped recipe)", *cells(two, SHORT_COLUMNS)),
              ("1 process x 128", *cells(one, SHORT_COLUMNS)), ("difference", *(diff(one[c], two[c]) for c in SHORT_COLUMNS))]),
        BOLD, grid(("speed", "it/s", "machine, date"), [
            (f"one process: it/s at iteration 299, seeds {', '.join(seeds)}", ", ".join(f"{speed[s]:.2f}" for s in seeds),
             f"{rec['machine']}; {rec['date']}"),
            ("two processes: it/s at iteration 460, the second round of alternated runs above (`--amp auto`)",
             f"{runs['auto1']['progress_it_per_s_at_460']:.2f}, {runs['auto2']['progress_it_per_s_at_460']:.2f}",
             f"{record(bf16)['machine']}, {fast['date']}")])])


# ------------------------------------------------------------------------------------------
# the code's own tables (docs/compat.md, docs/monitoring.md, docs/configs.md)
# ------------------------------------------------------------------------------------------
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
    return grid(("module", "patches", "what breaks in VISSL 0.1.6, and the fix"), [
        (f"`{m}`", ", ".join(f"`{n}`" for n in by_module[m]) if m in by_module else fixes.get(m, {}).get("patches", "none"),
         fixes.get(m, {}).get("fix", "")) for m in order])


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
    return grid(("key", "value"), [(f"`{k}`", f"`{config_value(name, k, root)}`") for k in data()["configs"][name]["keys"]])


@table
def configs(root=CONFIGS):
    """One row per shipped config: purpose, hardware and time from docs/doc_tables.yaml (in its
    order), batch and epochs from the YAML; a config it lacks comes last with empty columns."""
    written, shipped = data()["configs"], shipped_configs(root)
    rows = []
    for name in [n for n in written if n in shipped] + [n for n in shipped if n not in written]:
        cfg, w = config_yaml(name, root), written.get(name, {})
        per, dist = cfg["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"], cfg["DISTRIBUTED"]
        procs = dist["NUM_NODES"] * dist["NUM_PROC_PER_NODE"]
        rows.append((f"`{name}`", w.get("purpose", ""), w.get("hardware", ""), f"{per} × {procs} = {per * procs}",
                     cfg.get("OPTIMIZER", {}).get("num_epochs", "—"), w.get("time", "")))
    return grid(("config", "purpose", "hardware", "batch", "epochs", "expected time"), rows)


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------
def build_parser():
    """The command line of ``tools/doc_tables.py``."""
    p = argparse.ArgumentParser(prog="tools/doc_tables.py", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing: show how the pages differ from what cog generates, exit 1 if they do")
    return p


def main(argv=None):
    """Rewrite (cog ``-r``) or compare (``--check --diff``) every cog block of README.md and docs/."""
    from cogapp import Cog

    check = build_parser().parse_args(argv).check
    mode = ["--check", "--diff", "--check-fail-msg=run `.venv/bin/python tools/doc_tables.py`"] if check else ["-r"]
    status = Cog().main(["cog", "--verbosity=1", "-I", str(REPO / "tools"), *mode, *map(str, pages())])
    return {0: 0, 5: 1}.get(status, 2)


if __name__ == "__main__":
    sys.exit(main())
