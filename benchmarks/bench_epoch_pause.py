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
prints the wait per epoch of both and the ratio VISSL / plugin of the pause between epochs.  docs/gpu.md's
table is a cog block written from a ``--json`` record in docs/experiments/ by ``tools/doc_tables.py``.
"""
import argparse
import statistics
import time

import torch

import recipes as br
import benchmarking as bm


def build_loader(args, persistent: bool):
    """VISSL's build_dataset + build_dataloader for ``args.config``, as its trainer calls them;
    ``persistent=False``: with the plugin's patch off (VISSL's own loader)."""
    from vissl_swav_plugin import compat

    overrides = [f"config={args.config}", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
                 f"config.DATA.TRAIN.DATA_LIMIT={args.images}",
                 f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                 f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}",
                 f"config.MACHINE.DEVICE={'gpu' if args.device == 'cuda' else 'cpu'}"]
    if args.start_method:
        overrides.append(f"config.MULTI_PROCESSING_METHOD={args.start_method}")
    cfg = br.compose(overrides)
    if persistent:
        return br.train_loader(cfg, args.workers, args.device, pin_memory=args.device == "cuda"), cfg
    with compat.disabled("shim_persistent_workers"):
        return br.train_loader(cfg, args.workers, args.device, pin_memory=args.device == "cuda"), cfg


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
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the pause is between two epochs)")
    if args.workers < 1:
        p.error("--workers must be at least 1 (without workers there is nothing to start)")
    if args.images // args.batch < 1:
        p.error("--images must hold at least one --batch")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    import logging

    br.init_process_group()  # VISSL's sampler needs a process group (1 process here)
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
    m = dict(bm.machine(), device=args.device)
    print(f"bench_epoch_pause: {args.config}, {args.images} images, batch {args.batch} "
          f"({res['plugin']['batches']} batches/epoch), {args.workers} workers ({method}), {args.epochs} epochs, "
          f"device {args.device}; {m['cpu']}, {m['cores']} cores")
    names = {"vissl": "VISSL (fresh workers every epoch)", "plugin": "plugin (persistent workers)"}
    print(f"{'':>36} wait for each epoch's first batch (s)")
    for k in ("vissl", "plugin"):
        print(f"{names[k]:>36} " + "  ".join(f"{t:7.3f}" for t in res[k]["first_batch_s"]))
    print(f"RATIO pause between epochs VISSL / plugin = {ratio:.1f}x "
          f"({res['vissl']['pause_s']:.3f} s vs {res['plugin']['pause_s']:.3f} s, median of epochs 1-{args.epochs - 1})")
    result = bm.record("bench_epoch_pause", __file__, argv, res, machine_info=m, config=args.config,
                       workers=args.workers, start_method=method, epochs=args.epochs, images=args.images,
                       batch=args.batch, device=args.device, ratio_pause_vissl_over_plugin=ratio)
    bm.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
