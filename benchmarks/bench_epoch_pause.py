"""The pause between two epochs: how long a training loop waits for the first batch of each
epoch through VISSL's real ``build_dataloader``, with VISSL's loader (fresh workers every
epoch) and with the plugin's persistent workers (``vissl_swav_plugin/compat/persistent_workers.py``),
in the same run.

The loader is the one VISSL's trainer builds for a shipped config (default
``test/swav_plugin/quick_cpu``: synthetic images, its multi-crop transforms and collator), with
``--workers`` workers started by ``--start-method`` (default: the config's, VISSL's
``forkserver``).  Each epoch is driven as VISSL's trainer drives it (the sampler's ``set_epoch``,
then a new iterator); timed from the iterator's creation to the arrival of the first batch, then
the rest of the epoch is read.  Epoch 0 includes the first start of the workers for both (and
the start of the forkserver process for the first one measured, VISSL's); the pause between
epochs is the median of epochs 1 ... ``--epochs - 1``.  VISSL's loader is measured first, the
plugin's second (``compat.disabled("shim_persistent_workers")`` gives VISSL's).

usage: python benchmarks/bench_epoch_pause.py [--workers 8] [--start-method forkserver]
          [--epochs 3] [--images 64] [--batch 4] [--device cpu] [--config test/swav_plugin/quick_cpu]
          [--json out.json]
       python benchmarks/bench_epoch_pause.py --write-doc docs/experiments/epoch_pause_cpu_2026-11-26.json
prints the wait per epoch of both and the ratio VISSL / plugin of the pause between epochs.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import time

import torch


def _process_group():
    import torch.distributed as dist

    if not dist.is_initialized():  # VISSL's sampler needs a process group (1 process here)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)


def build_loader(args, persistent: bool):
    """VISSL's build_dataset + build_dataloader for ``args.config``, as its trainer calls them;
    ``persistent=False``: with the plugin's patch off (VISSL's own loader)."""
    import vissl  # noqa: F401  (registers the plugin)
    from vissl.data import build_dataloader, build_dataset
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict
    from vissl_swav_plugin import compat

    overrides = [f"config={args.config}", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
                 f"config.DATA.TRAIN.DATA_LIMIT={args.images}",
                 f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                 f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}",
                 f"config.MACHINE.DEVICE={'gpu' if args.device == 'cuda' else 'cpu'}"]
    if args.start_method:
        overrides.append(f"config.MULTI_PROCESSING_METHOD={args.start_method}")
    _, cfg = convert_to_attrdict(compose_hydra_configuration(overrides), dump_config=False)
    dataset = build_dataset(cfg, "TRAIN")

    def build():
        return build_dataloader(dataset=dataset, dataset_config=cfg.DATA.TRAIN,
                                num_dataloader_workers=args.workers, pin_memory=args.device == "cuda",
                                multi_processing_method=cfg.MULTI_PROCESSING_METHOD,
                                device=torch.device(args.device), sampler_seed=cfg.SEED_VALUE, split="train")

    if persistent:
        return build(), cfg
    with compat.disabled("shim_persistent_workers"):
        return build(), cfg


def time_epochs(loader, epochs):
    """Per epoch: (seconds from the iterator's creation to the first batch, seconds of the
    whole epoch, batches)."""
    out = []
    for e in range(epochs):
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(e)
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        n = 1 + sum(1 for _ in it)
        out.append((first, time.perf_counter() - t0, n))
        del it
    return out


def machine(device):
    from vissl_swav_plugin.utils.cpu_features import cpu_model

    m = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "executable": sys.executable,
         "torch": torch.__version__, "device": device}
    if device == "cuda":
        m["card"] = torch.cuda.get_device_name(0)
    return m


DOC = "docs/gpu.md"
BEGIN = "<!-- begin table: bench_epoch_pause --write-doc {record} -->"
END = "<!-- end table: bench_epoch_pause -->"


def render_doc(record) -> str:
    """The Markdown of docs/gpu.md's epoch-pause figures, from a record this script wrote."""
    m, r = record["machine"], record["results"]
    command = record["command"].split(" --json")[0]
    if command.startswith("python "):  # as run in a checkout after make venv
        command = ".venv/bin/python " + command[len("python "):]
    head = (f"Measured on {m['cpu']} ({m['cores']} cores; Python {m['python']}, torch {m['torch']}), "
            f"{record['date'][:10]}, device {record['device']}:\n\n```bash\n{command}\n```\n\n")
    n = record["epochs"]
    rows = [f"| loader ({record['workers']} workers, {record['start_method']}) | "
            + " | ".join(f"epoch {e}" for e in range(n)) + f" | pause between epochs (median of 1-{n - 1}) |",
            "|---|" + "---|" * (n + 1)]
    names = {"vissl": "VISSL (fresh workers every epoch)", "plugin": "plugin (persistent workers)"}
    for kind in ("vissl", "plugin"):
        rows.append(f"| {names[kind]} | " + " | ".join(f"{t:.2f} s" for t in r[kind]["first_batch_s"])
                    + f" | {r[kind]['pause_s']:.2f} s |")
    tail = (f"\n\nThe pause between epochs: {r['vissl']['pause_s']:.2f} s with VISSL's loader, "
            f"{r['plugin']['pause_s']:.2f} s with the plugin's ({record['ratio_pause_vissl_over_plugin']:.1f}x).")
    return head + "\n".join(rows) + tail


def write_doc(record_path, doc_path=DOC) -> None:
    """Replace the text between the markers of ``record_path``'s table in ``doc_path``."""
    import re
    from pathlib import Path

    begin = BEGIN.format(record=record_path)
    text = Path(doc_path).read_text()
    pattern = re.escape(begin) + r"\n(?:.*?\n)?" + re.escape(END)
    if not re.search(pattern, text, flags=re.S):
        raise SystemExit(f"{doc_path}: no block between '{begin}' and '{END}'")
    body = render_doc(json.loads(Path(record_path).read_text()))
    Path(doc_path).write_text(re.sub(pattern, lambda _: f"{begin}\n{body}\n{END}", text, flags=re.S))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--start-method", choices=["fork", "forkserver", "spawn"], default=None,
                   help="how the loader workers start (default: the config's, VISSL's forkserver)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader (at least 2)")
    p.add_argument("--images", type=int, default=64, help="synthetic images per epoch (DATA_LIMIT)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--config", default="test/swav_plugin/quick_cpu")
    p.add_argument("--json", default="", help="also write the figures to this file")
    p.add_argument("--write-doc", metavar="RECORD", default="",
                   help=f"measure nothing: rewrite {DOC}'s table of this record (a --json file)")
    args = p.parse_args(argv)
    if args.write_doc:
        return write_doc(args.write_doc)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the pause is between two epochs)")
    if args.workers < 1:
        p.error("--workers must be at least 1 (without workers there is nothing to start)")
    if args.images // args.batch < 1:
        p.error("--images must hold at least one --batch")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    import logging

    _process_group()
    logging.getLogger().setLevel(logging.WARNING)
    res = {}
    for kind, persistent in (("vissl", False), ("plugin", True)):
        loader, cfg = build_loader(args, persistent)
        assert getattr(loader, "persistent_workers", getattr(getattr(loader, "dataloader", None), "persistent_workers", None)) \
            is persistent, kind
        times = time_epochs(loader, args.epochs)
        res[kind] = {"first_batch_s": [t[0] for t in times], "epoch_s": [t[1] for t in times],
                     "batches": times[0][2], "pause_s": statistics.median(t[0] for t in times[1:])}
        del loader
    method = args.start_method or cfg.MULTI_PROCESSING_METHOD
    ratio = res["vissl"]["pause_s"] / max(res["plugin"]["pause_s"], 1e-9)
    m = machine(args.device)
    print(f"bench_epoch_pause: {args.config}, {args.images} images, batch {args.batch} "
          f"({res['plugin']['batches']} batches/epoch), {args.workers} workers ({method}), {args.epochs} epochs, "
          f"device {args.device}; {m['cpu']}, {m['cores']} cores")
    names = {"vissl": "VISSL (fresh workers every epoch)", "plugin": "plugin (persistent workers)"}
    print(f"{'':>36} wait for each epoch's first batch (s)")
    for k in ("vissl", "plugin"):
        print(f"{names[k]:>36} " + "  ".join(f"{t:7.3f}" for t in res[k]["first_batch_s"]))
    print(f"RATIO pause between epochs VISSL / plugin = {ratio:.1f}x "
          f"({res['vissl']['pause_s']:.3f} s vs {res['plugin']['pause_s']:.3f} s, median of epochs 1-{args.epochs - 1})")
    result = {"benchmark": "bench_epoch_pause", "machine": m,
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": "python " + shlex.join(sys.argv if argv is None else ["benchmarks/bench_epoch_pause.py", *argv]),
              "config": args.config, "workers": args.workers, "start_method": method, "epochs": args.epochs,
              "images": args.images, "batch": args.batch, "device": args.device,
              "results": res, "ratio_pause_vissl_over_plugin": ratio}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
