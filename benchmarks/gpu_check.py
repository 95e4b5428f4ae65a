"""Every GPU figure of the project in one command: ``make gpu-check`` (or
``python benchmarks/gpu_check.py --out gpu_check``) on a CUDA machine writes
``<out>/gpu_check.json`` and ``<out>/gpu_check.md`` (a table naming the card, driver, torch,
CUDA, Python and date).  ``--dry-run`` runs the same code on the CPU at tiny sizes, fp16 autocast included
(about a minute on 2 cores; ``make test`` runs it, tests/integration/benchmarks/test_gpu_check.py).

Sections (each runs in its own subprocess with its own time limit; one that fails or runs
out of time is recorded as an error in the JSON and the others still run):

``sinkhorn``        Sinkhorn-Knopp on B x K scores (4096 x 3000), the plugin's
                    ``sinkhorn_knopp`` against VISSL 0.1.6's built-in path
                    (as ``benchmarks/bench_sinkhorn.py``), fp32 and under fp16 autocast: ms per
                    call, ratio VISSL / ours, target < 1 ms (ours, fp32) on an H100; the codes
                    under autocast equal the fp32 codes of the same scores within 1e-5.
``train_step``      One ResNet-50 multi-crop training step (2x224 + 6x96, batch 64, fp16 AMP)
                    through VISSL's ``standard_train_step``: the plugin's SwAV against VISSL's
                    built-in SwAV in the same process (as ``benchmarks/bench_train_step.py``):
                    ms/step, ratio ours / VISSL (target <= 1.0), peak CUDA memory of each.
``pretrain``        ``config=pretrain/swav/swav_1gpu_resnet`` (fp16 AMP) for 200 iterations
                    through VISSL's launcher on generated images (VISSL's ``synthetic`` source
                    at 320 px): the loss is finite and falls, the non-finite guard never
                    fired, images/s.
``input_pipeline``  The plugin's input pipeline (JPEG decode, multi-crop, collate; VISSL's
                    loader, workers started by fork) with one worker per core, images/s, against the GPU step's
                    images/s (from ``train_step``): which of the two bounds a run.
``step_variants``   The train_step measurement with LARC on, four tasks stepped in rotation
                    (``benchmarks/step_variants.py``, run as a script): VISSL's built-in SwAV, the
                    plugin's, the plugin's with channels-last and with cudnn.benchmark: ms/step,
                    ratio to VISSL's, first losses (equal: same weights and batch).
``loop_variants``   VISSL's real training loop for ``swav_1gpu_resnet`` on generated JPEGs of
                    ImageNet's sizes, one short run per variant, one setting changed at a time
                    (``benchmarks/loop_variants.py``, run as a script): the batch replayed on the device (no
                    loader), uint8 crops, loader workers, hooks off, synchronous copy, LARC off,
                    log frequency; images/s, ratio to the baseline and to the bare step (timed in
                    the same section), a torch.profiler summary of the baseline and the replay.
``worker_stages``   Where a loader worker's time goes per ``DATA.TRAIN.DEVICE_AUGMENT`` mode, on the
                    card's host (``benchmarks/bench_worker_stages.py``, run as a script; batch 64):
                    ms per image per stage in one worker, bytes per batch, the device side per batch
                    of 64 on CUDA, and that against the ResNet-50 step of ``train_step``.
``flagship``        ``pretrain/swav/swav_8node_resnet`` on one GPU (only NUM_NODES and
                    NUM_PROC_PER_NODE changed) for 100 iterations on generated JPEGs
                    (``benchmarks/loop_variants.py --flagship``): finite,
                    falling loss, the non-finite guard silent, images/s.
``demo``            ``tools/demo.py --device gpu`` on the full Fashion-MNIST training set
                    (60,000 images; 10,000 test images) with the evaluation protocols: its
                    wall time and 20-NN accuracy (target: >= 90% within 15 minutes on one H100).

usage: python benchmarks/gpu_check.py [--out DIR] [--dry-run] [--sections a,b,...]
         [--fashion-mnist DIR] [--limit SECONDS] [--demo-args "OPTIONS"] [--demo-seeds 0,1,2]
Without ``--sections`` a GPU run runs :data:`DEFAULT_SECTIONS` (every section but ``pretrain``
and ``demo``: their limits add up to 535 s, one call of at most 10 minutes); a dry run runs all.
Exit code 0 when every section ran, 1 when one failed (its error is in the JSON).
With ``--sections`` the named sections are (re)measured and the others kept from an
existing ``<out>/gpu_check.json``, so a run split over several calls still makes one table.
"""
import argparse
import datetime
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import recipes as br
import benchmarking as bm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SECTIONS = ("sinkhorn", "train_step", "step_variants", "pretrain", "input_pipeline", "loop_variants",
            "worker_stages", "flagship", "demo")
# a GPU run without --sections: these, whose limits add up to 535 s (8.9 min), so that one
# command of at most 10 minutes measures them all; pretrain (300 s), worker_stages (90 s) and demo
# (900 s) are named with --sections.  The dry run runs every section.
DEFAULT_SECTIONS = ("sinkhorn", "train_step", "step_variants", "input_pipeline", "loop_variants", "flagship")
# wall-clock limit of each section's subprocess, seconds (GPU run / dry run).  The dry run
# checks the code path, not the time: on a loaded CI machine its sections take many times
# their idle 5-20 s, so its limit is only a bound for a hang
LIMITS = {"sinkhorn": (40, 1800), "train_step": (60, 1800), "step_variants": (75, 1800), "pretrain": (300, 1800),
          "input_pipeline": (60, 1800), "loop_variants": (225, 1800), "worker_stages": (90, 1800),
          "flagship": (75, 1800), "demo": (900, 1800)}
# the sections measured by another benchmark, run as a script: (script, its options); each writes
# its record with --json, the section's figures under "results"
SCRIPT_SECTIONS = {"step_variants": ("step_variants.py", []), "loop_variants": ("loop_variants.py", []),
                   "worker_stages": ("bench_worker_stages.py", ["--images", "128", "--batch", "64", "--rounds", "2"]),
                   "flagship": ("loop_variants.py", ["--flagship"])}
FASHION_MNIST = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
FM_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


# --------------------------------------------------------------------------- helpers

def _device(dry):
    import torch

    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible (use --dry-run on a CPU machine)")
    return torch.device("cuda")


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def machine_info():
    """Card, driver, torch, CUDA, Python, CPU, date of this run."""
    info = bm.machine()
    info.update(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                cpu_cores=info["cores"], driver=None)
    if info["card"]:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


# --------------------------------------------------------------------------- sections

def section_sinkhorn(dry):
    import torch

    import vissl  # noqa: F401  (registers the plugin, applies the compat patches)

    from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp

    device = _device(dry)
    B, K, repeats, warmup = (64, 20, 3, 1) if dry else (4096, 3000, 25, 5)
    eps, niters = 0.05, 3
    run = bm.ms_timer(device)
    # fp16 autocast: the scores come out of the autocast matmul (fp16), as in training
    amp_dtype = torch.float16

    def scores_for(autocast):
        g = torch.Generator().manual_seed(0)
        z = torch.nn.functional.normalize(torch.randn(B, 128, generator=g), dim=1).to(device)
        c = torch.nn.functional.normalize(torch.randn(K, 128, generator=g), dim=1).to(device)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=autocast):
            return z @ c.t()

    res = dict(B=B, K=K, iters=niters, eps=eps, repeats=repeats, device=device.type)
    for label, autocast in (("fp32", False), ("fp16_autocast", True)):
        scores = scores_for(autocast)
        fns = {"ours": lambda s=scores: sinkhorn_knopp(s, eps, niters),
               "vissl": lambda s=scores: br.vissl_sinkhorn(s, eps, niters)}
        with torch.autocast(device.type, dtype=amp_dtype, enabled=autocast):
            times = bm.alternate({k: (lambda fn=fn: run(fn)) for k, fn in fns.items()}, repeats, warmup=warmup)
            q = {k: fn().float() for k, fn in fns.items()}
        # the reference: the same scores in fp32, ours, no autocast
        ref = sinkhorn_knopp(scores.float(), eps, niters).float()
        med = bm.medians(times)
        vissl_finite = bool(torch.isfinite(q["vissl"]).all())
        res[label] = dict(
            scores_dtype=str(scores.dtype).replace("torch.", ""), ours_ms=med["ours"], vissl_ms=med["vissl"],
            ratio_vissl_over_ours=med["vissl"] / med["ours"],
            ours_max_abs_diff_to_fp32=float((q["ours"] - ref).abs().max()),
            vissl_codes_finite=vissl_finite,
            vissl_max_abs_diff_to_fp32=float((q["vissl"] - ref).abs().max()) if vissl_finite else None)
    res["target_ours_fp32_below_1ms"] = res["fp32"]["ours_ms"] < 1.0
    res["codes_within_1e-5_under_autocast"] = res["fp16_autocast"]["ours_max_abs_diff_to_fp32"] <= 1e-5
    return res


def section_train_step(dry):
    import torch

    device = _device(dry)
    p = br.gpu_pair(dry, device.type)  # swav_1gpu_resnet's recipe, read from the config
    steps, warmup = (2, 1) if dry else (20, 5)
    torch.set_num_threads(1 if dry else max(1, os.cpu_count() or 1))
    import vissl  # noqa: F401

    cuda = device.type == "cuda"
    br.init_process_group("nccl" if cuda else "gloo")  # DDP on CUDA tensors: NCCL
    with tempfile.TemporaryDirectory() as tmp:
        a, b, batch = br.build_pair(p, tmp)
        with br.quiet():
            times = bm.alternate({"vissl": a.step, "ours": b.step}, steps, warmup=warmup)
            mem = {}
            for r in (a, b):  # peak memory of each variant's steps, measured one after the other
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                for _ in range(2):
                    r.step()
                if cuda:
                    peak = torch.cuda.max_memory_allocated()
                    mem[r.variant] = dict(peak_mb=peak / 2**20, step_transient_mb=(peak - before) / 2**20)
                else:
                    mem[r.variant] = dict(peak_mb=bm.proc_status_kb("VmHWM") / 1024, step_transient_mb=None)
    med = bm.medians(times)
    losses = {"vissl": a.step_losses, "ours": b.step_losses}
    return dict(
        trunk=p.trunk, batch=p.batch, crops=p.crops, K=p.K, amp=p.amp, steps=steps, warmup=warmup,
        ours_ms=med["ours"], vissl_ms=med["vissl"], ratio_ours_over_vissl=med["ours"] / med["vissl"],
        ours_images_per_s=p.batch * 1e3 / med["ours"], vissl_images_per_s=p.batch * 1e3 / med["vissl"],
        first_loss=dict(ours=losses["ours"][0], vissl=losses["vissl"][0]),
        losses_finite=dict(ours=all(map(_finite, losses["ours"])), vissl=all(map(_finite, losses["vissl"]))),
        memory=mem, memory_kind="cuda max_memory_allocated" if cuda else "CPU peak RSS (process)",
        target_ratio_at_most_1=med["ours"] / med["vissl"] <= 1.0)


def _finite(x):
    return x == x and abs(x) != float("inf")


def section_pretrain(dry):
    device = _device(dry)  # noqa: F841  (checks CUDA on the real run)
    iters, batch = (6, 4) if dry else (200, br.recipe(br.PAPER_CONFIG).batch)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        ov = [
            "config=pretrain/swav/swav_1gpu_resnet",
            "config.DATA.TRAIN.DATA_SOURCES=[synthetic]", "config.DATA.TRAIN.DATASET_NAMES=[synthetic]",
            f"config.DATA.TRAIN.DATA_LIMIT={iters * batch}", f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}",
            "config.OPTIMIZER.num_epochs=1", f"config.CHECKPOINT.DIR={ckpt}", "config.CHECKPOINT.AUTO_RESUME=False",
            "config.LOG_FREQUENCY=1", "config.HOOKS.PROGRESS.FREQUENCY=10",
        ]
        if dry:
            ov += [
                "config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE=40", "config.DATA.NUM_DATALOADER_WORKERS=0",
                "config.MACHINE.DEVICE=cpu", "config.DISTRIBUTED.BACKEND=gloo",
                "config.MODEL.TRUNK.NAME=resnet_small_plugin", "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
                "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[20]}]]",
                "config.LOSS.swav_plugin_loss.num_prototypes=[20]", "config.LOSS.swav_plugin_loss.embedding_dim=16",
                "config.LOSS.swav_plugin_loss.freeze_prototypes_niters=2",
                "config.LOSS.swav_plugin_loss.queue.queue_length=0",
                "config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],"
                "size_crops:[32,16],crop_scales:[[0.14,1.0],[0.05,0.14]]}]",
                "config.HOOKS.COLLAPSE_DETECTOR.ENABLED=False",
            ]
        else:
            ov += ["config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE=320",
                   f"config.DATA.NUM_DATALOADER_WORKERS={min(10, max(1, (os.cpu_count() or 2) - 2))}"]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "run_distributed_engines.py"), *ov],
                              cwd=tmp, env=_env({"OMP_NUM_THREADS": "1"} if dry else None),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - t0
        rows = []
        path = os.path.join(ckpt, "stdout.json")
        if os.path.isfile(path):
            with open(path) as f:
                for line in f:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue
        dumps = [n for n in os.listdir(ckpt) if n.startswith("nonfinite_")] if os.path.isdir(ckpt) else []
        guard = bool(dumps) or "NonFiniteLossError" in proc.stdout
        if proc.returncode != 0:
            raise RuntimeError(f"launcher exited {proc.returncode}; non-finite guard fired: {guard}\n"
                               + proc.stdout[-4000:])
    by_iter = {}
    for r in rows:
        if "iter" in r and "loss" in r:
            by_iter[int(r["iter"])] = r
    losses = [float(by_iter[i]["loss"]) for i in sorted(by_iter)]
    if not losses:
        raise RuntimeError("no loss in the run's stdout.json")
    n = max(1, len(losses) // 5)
    first, last = statistics.mean(losses[:n]), statistics.mean(losses[-n:])
    btimes = [float(by_iter[i]["btime(ms)"]) for i in sorted(by_iter) if "btime(ms)" in by_iter[i]]
    steady = btimes[len(btimes) // 2:] if btimes else []
    return dict(
        config="pretrain/swav/swav_1gpu_resnet", iterations=len(losses), batch=batch,
        amp="float16", data="synthetic " + ("40 px" if dry else "320 px"),
        loss_first=losses[0], loss_last=losses[-1], loss_mean_first_fifth=first, loss_mean_last_fifth=last,
        loss_finite=all(map(_finite, losses)), loss_falling=last < first, nonfinite_guard_fired=guard,
        wall_s=wall, images_per_s=(batch * 1e3 / statistics.median(steady)) if steady else None,
        images_per_s_from="median batch time (btime) over the second half of the run")


def _write_jpegs(root, n, size, seed=0):
    """``n`` smooth random RGB JPEGs of ``size`` (w, h) px in two class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        d = os.path.join(root, f"class{i % 2}")
        os.makedirs(d, exist_ok=True)
        small = (255 * rng.random((size[1] // 16, size[0] // 16, 3))).astype(np.uint8)
        Image.fromarray(small).resize(size, Image.BICUBIC).save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
    return root


def section_input_pipeline(dry):
    import vissl  # noqa: F401

    br.init_process_group()  # VISSL's sampler needs a process group (1 process here)
    workers = 1 if dry else max(1, os.cpu_count() or 1)
    paper = br.recipe(br.PAPER_CONFIG)  # swav_1gpu_resnet's batch and transform, read from the config
    batch = 4 if dry else paper.batch
    recipe_name = "2x32+4x16" if dry else "2x224+6x96"
    size = (48, 40) if dry else (500, 375)  # ImageNet's typical image size
    # the steady rate is timed from batch 2 x workers on (the prefetched ones consumed): 8
    # batches more than that on the GPU machine (2 in the dry run)
    n = batch * (2 * workers + (2 if dry else 8))
    # workers started by fork, as the demo on a GPU does: forkserver workers import torch and
    # VISSL afresh at every epoch, about 70 s for 8 of them on the lent H100 machine
    # (docs/gpu.md), which ran this section past its limit twice
    start_method = "fork"
    transform = br.with_crops(paper.transform, [(2, 32), (4, 16)] if dry else None)  # the dry run: small crops
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = _write_jpegs(os.path.join(tmp, "images"), n, size)
        print(f"input_pipeline: {n} JPEGs written in {time.perf_counter() - t0:.0f} s", flush=True)
        loader = br.folder_loader(folder, [transform], batch, workers, start_method)
        rates = []
        for r in range(1 if dry else 2):
            t0 = time.perf_counter()
            rates.append(br.loader_rates(loader, r, skip=2 * workers))
            print(f"input_pipeline: epoch {r} in {time.perf_counter() - t0:.0f} s: {rates[-1]}", flush=True)
    return dict(recipe=recipe_name, images=n, image_size=f"{size[0]}x{size[1]} JPEG", workers=workers,
                start_method=start_method,
                batch=batch, cpu_cores=os.cpu_count(), epoch_images_per_s=statistics.median(r[0] for r in rates),
                steady_images_per_s=statistics.median(r[1] for r in rates))


def _write_fake_fashion_mnist(root, n_train, n_test, seed=0):
    """IDX files in Fashion-MNIST's format: 28x28 class-dependent blobs + noise (dry run)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = np.arange(n, dtype=np.uint8) % 10
        x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(y):
            x[i, 2 * c:2 * c + 8, 4:24] = 200
        with gzip.open(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
            f.write((2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big")
                    + (28).to_bytes(4, "big") + x.tobytes())
        with gzip.open(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
            f.write((2049).to_bytes(4, "big") + n.to_bytes(4, "big") + y.tobytes())
    return root


def _opt_value(opts, name, default=None):
    """The last value given to option ``name`` in ``opts`` (argparse's rule), else ``default``."""
    value = default
    for i, o in enumerate(opts):
        if o == name and i + 1 < len(opts):
            value = opts[i + 1]
        elif o.startswith(name + "="):
            value = o.split("=", 1)[1]
    return value


def _mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(mean=statistics.fmean(values), sd=statistics.stdev(values) if len(values) > 1 else 0.0,
                n=len(values))


def parse_seeds(text):
    """``--demo-seeds``' integers (``"0,1,2"`` -> ``[0, 1, 2]``); ``[]`` when empty.

    Raises:
        ValueError: an item is not an integer.
    """
    return [int(x) for x in text.split(",") if x.strip()]


def section_demo(dry, fashion_mnist=FASHION_MNIST, demo_args="", demo_seeds=""):
    """``tools/demo.py`` on the GPU; with ``demo_seeds`` ("0,1,2") one run per seed, all at once
    on the one card (each with its own data and report folder and cores / runs torch threads)."""
    _device(dry)
    seeds = parse_seeds(demo_seeds) or [None]
    with tempfile.TemporaryDirectory() as tmp:
        if dry:
            source = _write_fake_fashion_mnist(os.path.join(tmp, "fm"), 200, 50)
            opts = ["--quick", "--device", "cpu", "--procs", "1", "--train-per-class", "8",
                    "--test-per-class", "4", "--epochs", "1", "--batch", "8", "--prototypes", "10",
                    "--freeze", "1", "--random-inits", "1", "--probes", "off", "--precise-bn", "off"]
        else:
            missing = [f for f in FM_FILES if not os.path.isfile(os.path.join(fashion_mnist, f))]
            if missing:
                raise RuntimeError(f"Fashion-MNIST not found: {os.path.join(fashion_mnist, missing[0])} (bring the "
                                   "offline bundle's fashion-mnist/ folder and pass --fashion-mnist)")
            source = os.path.abspath(fashion_mnist)  # the demo runs in a temporary folder
            opts = ["--device", "gpu", "--train-per-class", "6000", "--test-per-class", "1000"]
        opts += shlex.split(demo_args)
        if len(seeds) > 1 and _opt_value(opts, "--threads") is None:
            opts += ["--threads", str(max(1, (os.cpu_count() or 1) // len(seeds)))]
        procs, t0 = [], time.perf_counter()
        for i, seed in enumerate(seeds):
            run_opts = opts + ([] if seed is None else ["--seed", str(seed)])
            out = os.path.join(tmp, f"demo_output_{i}")
            log = open(os.path.join(tmp, f"demo_{i}.log"), "w+")
            procs.append((run_opts, out, log, subprocess.Popen(
                [sys.executable, os.path.join(REPO, "tools", "demo.py"), *run_opts, "--source", source,
                 "--out", out, "--data-dir", os.path.join(tmp, f"data_{i}")],
                cwd=tmp, env=_env(), stdout=log, stderr=subprocess.STDOUT, text=True)))
        runs = []
        for run_opts, out, log, proc in procs:
            rc = proc.wait()
            wall = time.perf_counter() - t0
            log.seek(0)
            text = log.read()
            log.close()
            if rc != 0:
                for *_, other in procs:
                    if other.poll() is None:
                        other.kill()
                        other.wait()
                raise RuntimeError(f"tools/demo.py {' '.join(run_opts)} exited {rc}\n" + text[-4000:])
            with open(os.path.join(out, "swav_demo_report.json")) as f:
                report = json.load(f)
            summ = report.get("summary", {})
            runs.append(dict(seed=report.get("config", {}).get("seed"), wall_s=wall, summary=summ))
    first = runs[0]["summary"]
    wall = max(r["wall_s"] for r in runs)
    train_images = int(_opt_value(opts, "--train-per-class", 0)) * 10
    keys = sorted({k for r in runs for k, v in r["summary"].items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return dict(options=" ".join(opts), seeds=[r["seed"] for r in runs], concurrent_runs=len(runs),
                wall_s=wall, wall_min=wall / 60, knn20_swav=first.get("knn20_swav"),
                knn20_random_init=first.get("knn20_random_init"), seed=runs[0]["seed"], train_images=train_images,
                summary=first, runs=runs,
                over_seeds={k: _mean_sd([r["summary"].get(k) for r in runs]) for k in keys},
                target_knn20_at_least_90_within_15_min=(
                    first.get("knn20_swav") is not None and first["knn20_swav"] >= 90 and wall <= 900))


RUNNERS = {"sinkhorn": section_sinkhorn, "train_step": section_train_step, "pretrain": section_pretrain,
           "input_pipeline": section_input_pipeline, "demo": section_demo}


# --------------------------------------------------------------------------- parent

def run_section(name, dry, fashion_mnist, limit=None, demo_args="", demo_seeds=""):
    """Run one section in a subprocess with its time limit (``limit`` seconds, default
    :data:`LIMITS`); its result dict, or ``{"error": ...}`` (with the end of its output)
    when it failed or ran out of time."""
    limit = limit or LIMITS[name][1 if dry else 0]
    with tempfile.TemporaryDirectory() as tmp:
        res_path = os.path.join(tmp, "result.json")
        if name in SCRIPT_SECTIONS:  # another benchmark's record: the figures under "results"
            script, opts = SCRIPT_SECTIONS[name]
            cmd = [sys.executable, os.path.join(HERE, script), *opts, "--json", res_path,
                   *([f"--limit={limit}"] if script == "loop_variants.py" else [])]
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--child-out", res_path,
                   "--fashion-mnist", fashion_mnist, "--demo-args=" + demo_args, "--demo-seeds=" + demo_seeds]
        cmd += ["--dry-run"] if dry else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=limit)
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return dict(error=f"ran out of its {limit} s", output_tail=out[-3000:],
                        section_s=time.perf_counter() - t0)
        if rc == 0 and os.path.isfile(res_path):
            with open(res_path) as f:
                res = json.load(f)
            if name in SCRIPT_SECTIONS:
                res = res["results"]
        else:
            res = dict(error=f"exited {rc}", output_tail=out[-3000:])
    res["section_s"] = time.perf_counter() - t0
    return res


def summarize(results):
    """Cross-section figures: which of input pipeline and GPU step bounds a run."""
    ts, ip = results.get("train_step", {}), results.get("input_pipeline", {})
    if "ours_images_per_s" in ts and "steady_images_per_s" in ip:
        gpu, cpu = ts["ours_images_per_s"], ip["steady_images_per_s"]
        return dict(step_images_per_s=gpu, input_images_per_s=cpu,
                    bound_by="input pipeline" if cpu < gpu else "GPU step",
                    input_over_step=cpu / gpu)
    return dict(error="needs train_step and input_pipeline")


def _f(x, fmt="{:.2f}"):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def markdown(doc):
    m, r = doc["machine"], doc["results"]
    kind = "CPU dry run: tiny sizes, not GPU figures" if doc["dry_run"] else "GPU run"
    lines = [f"# gpu_check ({kind})", "",
             "| machine | |", "|---|---|",
             f"| card | {m.get('card') or 'none (CPU)'} |", f"| driver | {m.get('driver') or '-'} |",
             f"| torch | {m['torch']} (CUDA {m.get('cuda') or '-'}) |", f"| Python | {m['python']} |",
             f"| CPU | {m['cpu']}, {m['cpu_cores']} cores |", f"| date | {m['date']} |", "",
             "| section | figure | value | target |", "|---|---|---|---|"]

    def row(sec, fig, val, tgt=""):
        lines.append(f"| {sec} | {fig} | {val} | {tgt} |")

    def run_rows(sec, s, what):
        """The rows of a training run's section (``pretrain``, ``flagship``): losses, checks, speed."""
        row(sec, f"{what}: loss first -> last",
            f"{_f(s['loss_first'], '{:.3f}')} -> {_f(s['loss_last'], '{:.3f}')}", "finite, falling")
        row(sec, "finite / falling / non-finite guard fired",
            f"{_f(s['loss_finite'])} / {_f(s['loss_falling'])} / {_f(s['nonfinite_guard_fired'])}", "yes / yes / no")
        row(sec, "images/s", _f(s["images_per_s"], "{:.0f}"))

    for name in SECTIONS:
        s = r.get(name)
        if s is None:
            row(name, "not run", "-")
            continue
        if "error" in s:
            row(name, "ERROR", s["error"].splitlines()[0][:120])
            continue
        if name == "sinkhorn":
            for lab in ("fp32", "fp16_autocast"):
                d = s[lab]
                row(name, f"B={s['B']} K={s['K']} {lab}: ours / VISSL ms", f"{_f(d['ours_ms'], '{:.3f}')} / "
                    f"{_f(d['vissl_ms'], '{:.3f}')} (VISSL/ours {_f(d['ratio_vissl_over_ours'])}x)",
                    "ours < 1 ms (H100, fp32)" if lab == "fp32" else "")
            row(name, "max abs diff of our codes under autocast vs fp32",
                _f(s["fp16_autocast"]["ours_max_abs_diff_to_fp32"], "{:.1e}"), "<= 1e-5")
            row(name, "VISSL's codes under autocast finite / max abs diff vs fp32",
                f"{_f(s['fp16_autocast']['vissl_codes_finite'])} / "
                f"{_f(s['fp16_autocast']['vissl_max_abs_diff_to_fp32'], '{:.1e}')}")
        elif name == "train_step":
            row(name, f"{s['trunk']} {s['crops']} batch {s['batch']} AMP {s['amp']}: ours / VISSL ms/step",
                f"{_f(s['ours_ms'], '{:.1f}')} / {_f(s['vissl_ms'], '{:.1f}')}")
            row(name, "ratio ours / VISSL", _f(s["ratio_ours_over_vissl"], "{:.3f}"), "<= 1.0")
            row(name, f"peak memory MB ours / VISSL ({s['memory_kind']})",
                f"{_f(s['memory']['ours']['peak_mb'], '{:.0f}')} / {_f(s['memory']['vissl']['peak_mb'], '{:.0f}')}")
        elif name == "pretrain":
            run_rows(name, s, f"{s['config']}, {s['iterations']} it, AMP {s['amp']}, {s['data']}")
        elif name == "input_pipeline":
            row(name, f"{s['recipe']}, {s['image_size']}, {s['workers']} workers: images/s",
                _f(s["steady_images_per_s"], "{:.0f}"))
        elif name == "step_variants":
            for k, v in s["variants"].items():
                row(name, f"{s['trunk']} {s['crops']} batch {s['batch']} AMP {s['amp']} LARC: {k} ms/step "
                    "(ratio to VISSL's; first loss)",
                    f"{_f(v['ms'], '{:.1f}')} ({_f(v['ratio_to_vissl'], '{:.3f}')}; {_f(v['first_loss'], '{:.5f}')})",
                    "<= 1.0" if k == "ours" else "")
        elif name == "loop_variants":
            row(name, f"{s['config']}, batch {s['batch']}, {s['images']['count']} JPEGs "
                f"({s['images']['sizes']}): baseline / bare step images/s",
                f"{_f(s['baseline_images_per_s'], '{:.0f}')} / {_f(s['bare_step_images_per_s'], '{:.0f}')}",
                "table below")
        elif name == "worker_stages":
            step_ms = (r.get("train_step") or {}).get("ours_ms")
            for mode, v in s.items():
                if not isinstance(v, dict) or "worker_ms_per_image" not in v:
                    continue
                b = v["per_batch"]
                dev_ms = b.get("device_ms_cuda", b.get("device_ms_cpu"))
                row(name, f"`{mode}`: worker ms per image (images/s per core); MB per batch; device side ms "
                    "per batch (its share of the step)",
                    f"{_f(v['worker_ms_per_image'])} ({_f(v['images_per_s_per_core'], '{:.0f}')}); {_f(b.get('mb'), '{:.1f}')}; "
                    f"{_f(dev_ms, '{:.1f}')}" + (f" ({dev_ms / step_ms:.2f} of {step_ms:.1f} ms)" if step_ms and dev_ms else ""),
                    "decode: <= 1/10 of off's worker time" if mode == "decode" else "")
        elif name == "flagship":
            run_rows(name, s, f"{s['config']} ({s['overrides']}), batch {s['batch']}, {s['iterations']} it")
        elif name == "demo":
            row(name, f"tools/demo.py {s['options']}: wall time"
                + (f" ({s['concurrent_runs']} seeds at once)" if s.get("concurrent_runs", 1) > 1 else ""),
                f"{_f(s['wall_min'], '{:.1f}')} min", "<= 15 min (H100)")
            for run in s.get("runs") or [s]:
                sm = run.get("summary", {})
                row(name, f"seed {run.get('seed')}: 20-NN SwAV / random init; linear SwAV / raw pixels; "
                    "10 labels/class SwAV / raw pixels (%)",
                    f"{_f(sm.get('knn20_swav'), '{:.1f}')} / {_f(sm.get('knn20_random_init'), '{:.1f}')}; "
                    f"{_f(sm.get('linear_swav'), '{:.1f}')} / {_f(sm.get('linear_raw_pixels'), '{:.1f}')}; "
                    f"{_f(sm.get('shot10_swav'), '{:.1f}')} / {_f(sm.get('shot10_raw_pixels'), '{:.1f}')}",
                    ">= 90 (20-NN)")
            if len(s.get("runs") or []) > 1:
                ov = s["over_seeds"]
                row(name, "mean ± sd over seeds: 20-NN SwAV; linear SwAV; 10 labels/class SwAV (%)",
                    "; ".join(f"{ov[k]['mean']:.2f} ± {ov[k]['sd']:.2f}" if ov.get(k) else "-"
                              for k in ("knn20_swav", "linear_swav", "shot10_swav")))
    b = doc.get("bound", {})
    if "bound_by" in b:
        row("bound", "input images/s vs GPU step images/s (ours)",
            f"{b['input_images_per_s']:.0f} vs {b['step_images_per_s']:.0f}: bound by {b['bound_by']}")
    else:
        row("bound", "input pipeline vs GPU step", "-")
    lv = r.get("loop_variants")
    if lv and "error" not in lv:
        lines += ["", f"## loop_variants: VISSL's training loop, images/s per variant (bare step "
                  f"{_f(lv.get('bare_step_ms'), '{:.1f}')} ms)", "",
                  "| variant | changes | status | workers | images/s | ratio to baseline | ratio to bare step |",
                  "|---|---|---|---|---|---|---|"]
        for v in lv["variants"]:
            status = v.get("status", "-") + (f": {v['reason'][:80]}" if v.get("reason") else "")
            lines.append(f"| {v['variant']} | {v['changes']} | {status} | {_f(v.get('workers'), '{}')} | "
                         f"{_f(v.get('images_per_s'), '{:.0f}')} | {_f(v.get('ratio_to_baseline'), '{:.2f}')} | "
                         f"{_f(v.get('ratio_to_bare_step'), '{:.2f}')} |")
        for v in lv["variants"]:
            prof = v.get("profile")
            if not prof:
                continue
            lines += ["", f"### profile of `{v['variant']}` ({prof['iterations']} iterations, ms per iteration)", "",
                      "| top self CPU op | ms | top self CUDA op | ms |", "|---|---|---|---|"]
            cpu, dev = prof.get("top_self_cpu", [])[:8], prof.get("top_self_cuda", [])[:8]
            for i in range(max(len(cpu), len(dev))):
                c = cpu[i] if i < len(cpu) else {}
                d = dev[i] if i < len(dev) else {}
                lines.append(f"| {c.get('op', '')[:60]} | {_f(c.get('self_cpu_ms_per_iter'))} | "
                             f"{d.get('op', '')[:60]} | {_f(d.get('self_cuda_ms_per_iter'))} |")
    return "\n".join(lines) + "\n"


def write(out, doc):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown(doc))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "gpu_check"), help="output folder (default gpu_check/)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the code, measures nothing")
    p.add_argument("--sections", default=None,
                   help="comma-separated subset of " + ",".join(SECTIONS) + " (default: on a GPU "
                        + ",".join(DEFAULT_SECTIONS) + "; in a dry run all of them)")
    p.add_argument("--fashion-mnist", default=FASHION_MNIST, help="folder of the four Fashion-MNIST .gz files")
    p.add_argument("--demo-args", default="", help="extra options of tools/demo.py, e.g. '--epochs 5'")
    p.add_argument("--demo-seeds", default="",
                   help="comma-separated seeds: one demo per seed, run at the same time on the card "
                        "(default: one run, the demo's seed); the table gets mean and sd over them")
    p.add_argument("--limit", type=float, default=None,
                   help="time limit of each section, seconds (default: per section, see LIMITS)")
    p.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        fn = RUNNERS[args.child]
        if args.child == "demo":
            res = fn(args.dry_run, args.fashion_mnist, args.demo_args, args.demo_seeds)
        else:
            res = fn(args.dry_run)
        with open(args.child_out, "w") as f:
            json.dump(res, f)
        return 0
    try:
        parse_seeds(args.demo_seeds)
    except ValueError:
        p.error(f"--demo-seeds takes comma-separated integers, got {args.demo_seeds!r}")
    sections = args.sections if args.sections is not None else ",".join(SECTIONS if args.dry_run else DEFAULT_SECTIONS)
    names = [s.strip() for s in sections.split(",") if s.strip()]
    bad = [s for s in names if s not in SECTIONS]
    if bad:
        p.error(f"unknown section {bad[0]!r}; choose from {', '.join(SECTIONS)}")
    doc = dict(dry_run=args.dry_run, machine=machine_info(), results={})
    old_path = os.path.join(args.out, "gpu_check.json")
    if os.path.isfile(old_path):  # keep the sections not re-run (same kind of run only)
        with open(old_path) as f:
            old = json.load(f)
        if old.get("dry_run") == args.dry_run:
            doc["results"] = {k: v for k, v in old.get("results", {}).items() if k not in names}
    if not args.dry_run and doc["machine"]["card"] is None:
        p.error("no CUDA device is visible; on a CPU machine use --dry-run")
    for name in names:
        print(f"gpu_check: {name} ...", flush=True)
        doc["results"][name] = run_section(name, args.dry_run, args.fashion_mnist, args.limit, args.demo_args,
                                            args.demo_seeds)
        doc["bound"] = summarize(doc["results"])
        write(args.out, doc)
        err = doc["results"][name].get("error")
        print(f"gpu_check: {name} {'ERROR: ' + err if err else 'done'} "
              f"({doc['results'][name]['section_s']:.0f} s)", flush=True)
    doc["bound"] = summarize(doc["results"])
    write(args.out, doc)
    print(open(os.path.join(args.out, "gpu_check.md")).read())
    errors = [k for k, v in doc["results"].items() if "error" in v]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
