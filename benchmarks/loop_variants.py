"""Where a real training run's time goes: VISSL's own training loop, timed per variant.

``benchmarks/gpu_check.py`` runs it as its sections ``loop_variants`` and ``flagship``
(``--flagship``); no ``bench_`` file, so ``make bench`` leaves it out.

usage: python benchmarks/loop_variants.py [--dry-run] [--flagship] [--limit SECONDS] [--json out.json]
``--limit``: the run's whole time limit (the variants share it; default 225 s, the dry run 1800);
``--dry-run``: the CPU, the small trunk on 40-60 px JPEGs (checks the code, measures nothing).

Each variant is one short run of VISSL's real training loop, in this process:
``SelfSupervisionTrainer(cfg, ...).train()`` with the hooks of ``default_hook_generator``
(VISSL's and the plugin's) plus one timing hook, on a config composed by Hydra from
``config=pretrain/swav/swav_1gpu_resnet`` and the variant's overrides, over generated JPEGs
of ImageNet's sizes listed in a ``disk_filelist`` (so one epoch is long enough and no epoch
boundary falls inside the run).  The timing hook (``on_step``) synchronises the device twice:
after ``warmup`` iterations (at least two per loader worker plus a few, so that the batches the
workers prefetched during start-up are used up) and after ``measure`` more; images/s is
``batch * measure`` over the time between.  Then it raises :class:`Done`, which ends the run
(no checkpoint is written).  Each variant has its own time limit (``SIGALRM``); a variant cut
short by it reports the rate of the iterations it timed, flagged ``cut_short``.

``replay`` runs the same loop with the train step ``gpu_check_replay_step``
(``TRAINER.TRAIN_STEP_NAME``): it takes the loader's first batch, keeps it on the device and
feeds it to ``standard_train_step`` at every iteration -- the loop and hooks without the
loader.  After its timed window it also times the bare step (``standard_train_step`` called
directly, the device synchronised before and after each call, median): the figure of the
``train_step`` section, with this config's model and batch.

A variant can profile a few iterations after its timed window (``torch.profiler``, CPU and
CUDA activities): the ops with the largest self CPU and self CUDA times, ms per iteration.
"""
import argparse
import gc
import math
import os
import signal
import statistics
import tempfile
import time

import numpy as np

import recipes as br
from recipes import compose
import benchmarking as bm

#: the variants stop starting this many seconds before ``--limit`` (imports, image writing and the
#: last variant's clean-up)
MARGIN_S = 25
#: ``--limit``'s default, seconds (GPU run / dry run)
LIMITS = {"loop_variants": (225, 1800), "flagship": (75, 1800)}
FLAGSHIP = "pretrain/swav/swav_8node_resnet"
ONE_PROCESS = ["config.DISTRIBUTED.NUM_NODES=1", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1"]

# --------------------------------------------------------------------------- images


def _one_image(args):
    """One photographic-like RGB JPEG: smooth colour gradients, low-frequency texture,
    a few filled shapes, and grain, at JPEG quality 90."""
    path, w, h, seed = args
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a = rng.uniform(0, 2 * math.pi)
        ramp = (np.cos(a) * xx + np.sin(a) * yy) / max(w, h)
        img[..., c] = rng.uniform(40, 200) + rng.uniform(-80, 80) * ramp
    small = rng.normal(0, 30, (max(2, h // 24), max(2, w // 24), 3)).astype(np.float32)
    tex = np.asarray(Image.fromarray(np.clip(small + 128, 0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC),
                     np.float32) - 128
    img += tex
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w * 3 // 4)), int(rng.integers(0, h * 3 // 4))
        x1, y1 = x0 + int(rng.integers(w // 16 + 1, w // 2 + 2)), y0 + int(rng.integers(h // 16 + 1, h // 2 + 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    pil = pil.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 2.0))))
    arr = np.asarray(pil, np.float32) + rng.normal(0, 10, (h, w, 3))
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(path, quality=90)
    return path


def write_jpegs(root, n, tiny=False, seed=0, procs=None):
    """``n`` JPEGs of ImageNet's sizes (shorter side 300-500 px, longer side 400-500 px,
    landscape and portrait) in ``root``; ``tiny``: 40-60 px (the dry run).  Returns the paths
    and the mean file size in kB."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n):
        if tiny:
            w, h = int(rng.integers(40, 61)), int(rng.integers(40, 61))
        else:
            long_side = int(rng.integers(400, 501))
            short = int(long_side * rng.uniform(0.6, 1.0))
            w, h = (long_side, short) if rng.random() < 0.7 else (short, long_side)
        jobs.append((os.path.join(root, f"img_{i:05d}.jpg"), w, h, seed * 100003 + i))
    procs = procs or max(1, min(16, os.cpu_count() or 1))
    if procs > 1 and n > 8:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(procs) as pool:
            paths = pool.map(_one_image, jobs, chunksize=max(1, n // (4 * procs)))
    else:
        paths = [_one_image(j) for j in jobs]
    kb = statistics.fmean(os.path.getsize(p) for p in paths) / 1024
    return paths, kb


def write_filelist(paths, length, out):
    """A ``disk_filelist`` (.npy of paths) of ``length`` entries cycling over ``paths``, and
    beside it its labels (``out`` with ``_labels``: zeros; SwAV uses the sample index)."""
    arr = np.array([paths[i % len(paths)] for i in range(length)])
    np.save(out, arr)
    labels = out.replace(".npy", "_labels.npy")
    np.save(labels, np.zeros(length, dtype=np.int64))
    return out, labels


# --------------------------------------------------------------------------- the loop


class Done(Exception):
    """Raised by :class:`LoopTimer` to end a run once it has its figures."""


class VariantTimeout(Exception):
    """Raised by the ``SIGALRM`` handler when a variant runs past its limit."""


def _register_replay_step():
    from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, get_train_step, register_train_step

    if "gpu_check_replay_step" in TRAIN_STEP_REGISTRY:
        return

    @register_train_step("gpu_check_replay_step")
    def gpu_check_replay_step(task):
        if not isinstance(task.data_iterator, br.Replay):
            import torch
            from classy_vision.generic.util import recursive_copy_to_gpu

            batch = next(task.data_iterator)
            if task.device.type == "cuda":
                batch = recursive_copy_to_gpu(batch, non_blocking=False)
                torch.cuda.synchronize()
            task.data_iterator = br.Replay(batch, len(task.data_iterator))
        return get_train_step("standard_train_step")(task)


def _sync(cuda):
    if cuda:
        import torch

        torch.cuda.synchronize()


def _hook_base():
    from classy_vision.hooks.classy_hook import ClassyHook

    return ClassyHook


_Hook = _hook_base()


class LoopTimer(_Hook):
    """``on_step``: synchronise and time the window [warmup, warmup + measure); then
    optionally profile ``profile_iters`` iterations and time ``bare_steps`` direct calls of
    the train step; then raise :class:`Done`.  ``keep_losses``: the loss tensor of every
    step (detached; read at the end, so no host synchronisation per step)."""

    on_start = on_phase_start = on_forward = on_loss_and_meter = on_backward = _Hook._noop
    on_update = on_phase_end = on_end = on_exception = _Hook._noop

    def __init__(self, warmup, measure, cuda, profile_iters=0, bare_steps=0, keep_losses=False):
        super().__init__()
        self.warmup, self.measure, self.cuda = warmup, measure, cuda
        self.profile_iters, self.bare_steps, self.keep_losses = profile_iters, bare_steps, keep_losses
        self.n, self.t0, self.t1, self.t_last, self.t_mid = 0, None, None, None, None
        self.losses, self.bare_ms, self.profile = [], [], None
        self._prof = None
        self.start_wall = time.perf_counter()
        self.first_step_s = None

    def timed_iterations(self):
        """Iterations timed so far and their seconds (for a run cut short)."""
        if self.t0 is None:
            return 0, 0.0
        if self.t1 is not None:
            return self.measure, self.t1 - self.t0
        return self.n - self.warmup, (self.t_last or self.t0) - self.t0

    def on_step(self, task):
        self.n += 1
        if self.n == 1:
            self.first_step_s = time.perf_counter() - self.start_wall
        if self.keep_losses and getattr(task, "last_batch", None) is not None:
            self.losses.append(task.last_batch.loss.detach())
        end = self.warmup + self.measure
        if self.n == self.warmup:
            _sync(self.cuda)
            self.t0 = time.perf_counter()
        elif self.warmup < self.n < end:
            self.t_last = time.perf_counter()
            if self.n == self.warmup + self.measure // 2:
                self.t_mid = self.t_last
        elif self.n == end:
            _sync(self.cuda)
            self.t1 = time.perf_counter()
            if self.profile_iters:
                try:  # a profiler that cannot start costs the profile, not the variant's figures
                    self._prof = _start_profiler(self.cuda)
                except Exception as e:
                    self.profile = dict(error=f"{type(e).__name__}: {e}"[:300])
            if self._prof is None:
                self._finish(task)
        elif self._prof is not None and self.n == end + self.profile_iters:
            _sync(self.cuda)
            try:
                self._prof.__exit__(None, None, None)
                self.profile = summarize_profile(self._prof, self.profile_iters, self.cuda)
            except Exception as e:
                self.profile = dict(error=f"{type(e).__name__}: {e}"[:300])
            self._prof = None
            self._finish(task)

    def _finish(self, task):
        if self.bare_steps:
            from vissl.trainer.train_steps import get_train_step

            step = get_train_step("standard_train_step")
            for _ in range(self.bare_steps):
                _sync(self.cuda)
                t = time.perf_counter()
                step(task)
                _sync(self.cuda)
                self.bare_ms.append((time.perf_counter() - t) * 1e3)
        raise Done


def _start_profiler(cuda):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=acts, record_shapes=False)
    prof.__enter__()
    return prof


def summarize_profile(prof, iters, cuda, top=12):
    """The ``top`` ops by self CPU time and (CUDA) by self device time, ms per iteration."""
    events = prof.key_averages()

    def dev(e):
        for name in ("self_device_time_total", "self_cuda_time_total"):
            v = getattr(e, name, None)
            if v is not None:
                return v
        return 0.0

    rows_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    out = dict(iterations=iters, top_self_cpu=[
        dict(op=e.key, self_cpu_ms_per_iter=e.self_cpu_time_total / 1e3 / iters, calls_per_iter=e.count / iters)
        for e in rows_cpu])
    out["self_cpu_ms_per_iter_total"] = sum(e.self_cpu_time_total for e in events) / 1e3 / iters
    if cuda:
        rows_dev = sorted(events, key=dev, reverse=True)[:top]
        out["top_self_cuda"] = [dict(op=e.key, self_cuda_ms_per_iter=dev(e) / 1e3 / iters,
                                     calls_per_iter=e.count / iters) for e in rows_dev if dev(e) > 0]
        out["self_cuda_ms_per_iter_total"] = sum(dev(e) for e in events) / 1e3 / iters
    return out


def _shutdown_loaders(task):
    """Stop the loader workers of ``task`` now (persistent workers outlive their iterator)."""
    seen = set()
    objs = list((getattr(task, "dataloaders", None) or {}).values()) + [getattr(task, "data_iterator", None)]
    for obj in objs:
        for _ in range(4):
            if obj is None or id(obj) in seen:
                break
            seen.add(id(obj))
            for it in (getattr(obj, "_iterator", None), getattr(obj, "_iter", None), obj):
                stop = getattr(it, "_shutdown_workers", None)
                if callable(stop):
                    try:
                        stop()
                    except Exception:
                        pass
            obj = getattr(obj, "dataloader", None)


def _drop_handlers(name):
    """Remove the handlers VISSL's ``setup_logging(name)`` added: it removes its old ones only
    in part (it edits the list it iterates), so without this every variant would log once more
    per earlier variant, and the logging variants would time that."""
    import logging

    for logger in {logging.getLogger(name), logging.getLogger()}:
        for h in list(logger.handlers):
            logger.removeHandler(h)


def run_loop(cfg, ckpt, warmup, measure, limit_s, cuda, profile_iters=0, bare_steps=0, keep_losses=False,
             log=True):
    """One short run of VISSL's training loop for ``cfg``; its figures (images/s and what
    :class:`LoopTimer` gathered).  ``limit_s``: the run's own time limit."""
    import torch
    from vissl.hooks import default_hook_generator
    from vissl.trainer.trainer_main import SelfSupervisionTrainer
    from vissl.utils.logger import setup_logging, shutdown_logging
    from vissl.utils.misc import set_seeds, setup_multiprocessing_method

    from vissl_swav_plugin.config.registries import run_launch_checks

    _register_replay_step()
    os.makedirs(ckpt, exist_ok=True)
    if log:
        _drop_handlers(__name__)
        setup_logging(__name__, output_dir=ckpt, rank=0)
    setup_multiprocessing_method(cfg.MULTI_PROCESSING_METHOD)
    set_seeds(cfg, 0)
    batch = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    timer = LoopTimer(warmup, measure, cuda, profile_iters, bare_steps, keep_losses)
    hooks = default_hook_generator(cfg) + [timer]
    status, error, trainer = "done", None, None

    def on_alarm(signum, frame):
        raise VariantTimeout

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(math.ceil(limit_s))))
    t_start = time.perf_counter()
    try:
        run_launch_checks(cfg)
        trainer = SelfSupervisionTrainer(cfg, dist_run_id="unused", checkpoint_path=None, checkpoint_folder=ckpt,
                                         hooks=hooks)
        trainer.train()
        status = "loop ended before the timed window closed"
    except Done:
        pass
    except VariantTimeout:
        status = "cut_short"
    except Exception as e:  # recorded with the variant; the other variants still run
        status, error = "error", f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        wall = time.perf_counter() - t_start
        if trainer is not None:
            try:
                _shutdown_loaders(trainer.task)
            except Exception:
                pass
        if log:
            shutdown_logging()
            _drop_handlers(__name__)
    losses = []
    if keep_losses:
        try:
            losses = [float(x) for x in timer.losses]
        except Exception:
            losses = []
    del trainer, hooks
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    n, secs = timer.timed_iterations()
    half = None
    if timer.t1 is not None and timer.t_mid is not None and timer.measure >= 4:
        h = timer.measure // 2
        r1 = h / (timer.t_mid - timer.t0) if timer.t_mid > timer.t0 else None
        r2 = (timer.measure - h) / (timer.t1 - timer.t_mid) if timer.t1 > timer.t_mid else None
        half = r1 / r2 if r1 and r2 else None
    res = dict(status=status, batch=batch, warmup=warmup, measure=measure, timed_iterations=n,
               timed_s=secs, wall_s=wall, first_step_s=timer.first_step_s, iterations_run=timer.n,
               images_per_s=(batch * n / secs) if n > 0 and secs > 0 else None,
               ms_per_iteration=(secs * 1e3 / n) if n > 0 and secs > 0 else None,
               first_half_over_second_half=half)
    if status == "done" and not n:
        res["status"] = "no timed iterations"
    if error:
        res["error"] = error
    if timer.profile:
        res["profile"] = timer.profile
    if timer.bare_ms:
        ms = statistics.median(timer.bare_ms)
        res.update(bare_step_ms=ms, bare_step_images_per_s=batch * 1e3 / ms, bare_steps=len(timer.bare_ms))
    if keep_losses:
        res["losses"] = losses
    return res


def init_process_group(cuda):
    """One-process group (NCCL on the GPU, gloo on the CPU), as VISSL's launcher makes."""
    br.init_process_group("nccl" if cuda else "gloo")


# --------------------------------------------------------------------------- variants

#: the dry run's model and crops (CPU, tiny), as gpu_check's ``pretrain`` dry run
DRY_OVERRIDES = [
    "config.MACHINE.DEVICE=cpu", "config.DISTRIBUTED.BACKEND=gloo",
    "config.MODEL.TRUNK.NAME=resnet_small_plugin", "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
    "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[20]}]]",
    "config.LOSS.swav_plugin_loss.num_prototypes=[20]", "config.LOSS.swav_plugin_loss.embedding_dim=16",
    "config.DATA.TRAIN.TRANSFORMS=[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],"
    "size_crops:[32,16],crop_scales:[[0.14,1.0],[0.05,0.14]]}]",
]

HOOKS_OFF = [
    "config.HOOKS.PROGRESS.ENABLED=False", "config.HOOKS.COLLAPSE_DETECTOR.ENABLED=False",
    "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False", "config.HOOKS.PERF_STATS.ROLLING_BTIME_FREQ=-1",
    "config.HOOKS.LOG_GPU_STATS=False", "config.HOOKS.MEMORY_SUMMARY.PRINT_MEMORY_SUMMARY=False",
    "config.HOOKS.CHECK_NAN=False",
]


def variants(dry, cores):
    """``(name, overrides, what it changes, options)`` in priority order (a variant the
    section's budget no longer allows is recorded as skipped).  The baseline is
    ``swav_1gpu_resnet`` as it is (10 workers, fp32 crops, every hook, LARC, LOG_FREQUENCY 10,
    pinned memory and VISSL's asynchronous copy)."""
    worker_counts = (2, 0) if dry else tuple(max(1, min(n, cores - 2)) for n in (14, 8))
    rows = [
        ("baseline", [], "swav_1gpu_resnet as configured", dict(profile=True)),
        ("replay", ["config.TRAINER.TRAIN_STEP_NAME=gpu_check_replay_step"],
         "no loader: the first batch kept on the device, fed to every step (plus the bare step)",
         dict(profile=True, bare=True)),
        ("uint8_crops", ["+config.DATA.TRAIN.DEVICE_AUGMENT=normalize"],
         "crops sent as uint8, normalised on the device",
         dict(optional=True, alternatives=[["config.DATA.TRAIN.DEVICE_AUGMENT=normalize"]])),
        ("photometric", ["config.DATA.TRAIN.DEVICE_AUGMENT=photometric"],
         "uint8 crops after crop, resize and flip; colour jitter, grayscale, blur and normalisation on the device", {}),
        ("decode", ["config.DATA.TRAIN.DEVICE_AUGMENT=decode"],
         "JPEG bytes and the crops' parameters sent; decode (nvJPEG), crops and the rest on the device", {}),
    ]
    for n in dict.fromkeys(worker_counts):
        rows.append((f"workers_{n}", [f"config.DATA.NUM_DATALOADER_WORKERS={n}"], "loader workers", {}))
    return rows + [
        ("hooks_off", HOOKS_OFF, "plugin monitors and VISSL's perf / GPU-stats / memory / NaN hooks off", {}),
        ("sync_copy", ["config.DATA.PIN_MEMORY=False", "config.DATA.ENABLE_ASYNC_GPU_COPY=False"],
         "no pinned memory, synchronous copy to the device", {}),
        ("larc_off", ["config.OPTIMIZER.use_larc=False"], "plain SGD, no LARC", {}),
        ("log_every_1", ["config.LOG_FREQUENCY=1"], "VISSL's loss / lr / eta log every iteration", {}),
        ("log_every_100", ["config.LOG_FREQUENCY=100"], "VISSL's loss / lr / eta log every 100 iterations", {}),
    ] + ([] if dry else [  # the slowest variant last: the budget may cut it
        (f"workers_{max(1, min(4, cores - 2))}", [f"config.DATA.NUM_DATALOADER_WORKERS={max(1, min(4, cores - 2))}"],
         "loader workers", {})])


def base_overrides(dry, filelist, ckpt, workers, batch):
    ov = [
        "config=pretrain/swav/swav_1gpu_resnet",
        "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]", "config.DATA.TRAIN.DATASET_NAMES=[gpu_check_jpegs]",
        f"config.DATA.TRAIN.DATA_PATHS=[{filelist[0]}]", "config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{filelist[1]}]", f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}",
        f"config.CHECKPOINT.DIR={ckpt}", "config.CHECKPOINT.AUTO_RESUME=False",
        # workers started by fork: forkserver workers import torch and VISSL afresh, seconds per
        # variant; the steady rate, which is what is timed, does not depend on it
        "config.MULTI_PROCESSING_METHOD=fork",
    ]
    if workers is not None:
        ov.append(f"config.DATA.NUM_DATALOADER_WORKERS={workers}")
    if dry:  # one worker (the config's 10 would crowd a 2-core machine); bf16 autocast, as fp16
        # convolutions on the CPU take ~0.4 s a step even for this tiny model
        ov += DRY_OVERRIDES + ["config.LOSS.swav_plugin_loss.queue.queue_length=0",
                               "config.DATA.NUM_DATALOADER_WORKERS=1", "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16"]
    return ov


def warmup_for(workers, dry):
    """Iterations before the timed window: the batches the workers prefetch during start-up
    (2 per worker) used up.  While that backlog lasts the loop runs at the step's speed and the
    workers keep adding to it, so a backlog of 2W batches lasts 2W / (1 - r) iterations, r the
    loader's rate over the step's: 3W + 4 covers r up to 1/3 (the H200's 218 against 793 images/s
    gives r = 0.27); ``first_half_over_second_half`` in the record shows whether the window was
    steady.  The time this costs is small: those iterations run at the step's speed."""
    return max(1, 2 * workers) if dry else max(8, 3 * workers + 4)


def run_variants(dry, tmp, budget_s, measure=None, say=print):
    """Every variant of :func:`variants` within ``budget_s`` seconds; the section's record."""
    import torch

    cuda = not dry
    cores = os.cpu_count() or 2
    batch = 4 if dry else br.recipe(br.PAPER_CONFIG).batch
    measure = measure or (4 if dry else 25)
    per_variant = 60 if dry else 35
    t_section = time.perf_counter()
    t0 = time.perf_counter()
    n_img = 16 if dry else 640
    paths, kb = write_jpegs(os.path.join(tmp, "jpegs"), n_img, tiny=dry)
    say(f"loop_variants: {n_img} JPEGs ({kb:.0f} kB each on average) in {time.perf_counter() - t0:.1f} s")
    filelist = write_filelist(paths, batch * (60 if dry else 400), os.path.join(tmp, "filelist.npy"))
    init_process_group(cuda)
    torch.backends.cudnn.benchmark = False
    base_cfg_workers, amp = None, None
    rows = []
    for i, (name, extra, what, opts) in enumerate(variants(dry, cores)):
        left = budget_s - (time.perf_counter() - t_section)
        row = dict(variant=name, overrides=extra, changes=what)
        if left < (5 if dry else 12):
            row.update(status="skipped", reason=f"the section's budget ({budget_s:.0f} s) was spent")
            rows.append(row)
            say(f"loop_variants: {name} skipped (budget spent)")
            continue
        ckpt = os.path.join(tmp, f"ckpt_{i}")
        cfg, msgs = None, []
        for attempt in [extra] + list(opts.get("alternatives", [])):  # e.g. a key with or without +
            try:
                cfg = compose(base_overrides(dry, filelist, ckpt, None, batch) + attempt)
                row["overrides"] = attempt
                break
            except Exception as e:
                msgs.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        if cfg is None:
            row.update(status="not available" if opts.get("optional") else "error", reason=" / ".join(msgs))
            rows.append(row)
            say(f"loop_variants: {name} {row['status']}: {row['reason']}")
            continue
        workers = cfg.DATA.NUM_DATALOADER_WORKERS
        if name == "baseline":
            base_cfg_workers = workers
            amp = f"{cfg.MODEL.AMP_PARAMS.get('AMP_DTYPE', 'float16')}" if cfg.MODEL.AMP_PARAMS.USE_AMP else "off"
        limit = min(per_variant, left)
        warm = warmup_for(workers, dry) if name != "replay" else (1 if dry else 8)
        prof_iters = (2 if dry else 4) if opts.get("profile") else 0
        res = run_loop(cfg, ckpt, warm, measure, limit, cuda, profile_iters=prof_iters,
                       bare_steps=(2 if dry else 15) if opts.get("bare") else 0)
        row.update(res, workers=workers, limit_s=limit, train_step=cfg.TRAINER.TRAIN_STEP_NAME)
        rows.append(row)
        say(f"loop_variants: {name}: {row['status']}, {_fmt(row.get('images_per_s'))} images/s "
            f"({row['timed_iterations']} timed iterations, {row['wall_s']:.1f} s)")
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)
    by = {r["variant"]: r for r in rows}
    base = by.get("baseline", {}).get("images_per_s")
    bare = by.get("replay", {}).get("bare_step_images_per_s")
    for r in rows:
        ips = r.get("images_per_s")
        r["ratio_to_baseline"] = ips / base if ips and base else None
        r["ratio_to_bare_step"] = ips / bare if ips and bare else None
    return dict(config="pretrain/swav/swav_1gpu_resnet", batch=batch, baseline_workers=base_cfg_workers,
                images=dict(count=n_img, mean_kb=kb,
                            sizes="40-60 px" if dry else "400-500 px long side, 0.6-1.0 aspect"),
                measure_iterations=measure, bare_step_ms=by.get("replay", {}).get("bare_step_ms"),
                bare_step_images_per_s=bare, baseline_images_per_s=base, budget_s=budget_s,
                start_method="fork", variants=rows, amp=amp)


def _fmt(x):
    return "-" if x is None else f"{x:.1f}"


# --------------------------------------------------------------------------- flagship


def flagship(dry, tmp, iterations=None, limit_s=None, say=print):
    """``pretrain/swav/swav_8node_resnet`` on one process (``DISTRIBUTED.NUM_NODES=1``,
    ``NUM_PROC_PER_NODE=1``; batch 64 per GPU as configured, which fits one card; fp16 AMP,
    LARC, the queue and the schedule as the config has them), ``iterations`` iterations of
    VISSL's loop on generated JPEGs: the losses, images/s, the non-finite guard."""
    cuda = not dry
    batch = 4 if dry else br.recipe(FLAGSHIP, ONE_PROCESS).batch  # the config's batch per GPU
    iterations = iterations or (6 if dry else 100)
    paths, kb = write_jpegs(os.path.join(tmp, "jpegs"), 16 if dry else 512, tiny=dry)
    filelist = write_filelist(paths, batch * (iterations + 20), os.path.join(tmp, "filelist.npy"))
    init_process_group(cuda)
    ckpt = os.path.join(tmp, "ckpt")
    ov = [
        f"config={FLAGSHIP}", *ONE_PROCESS,
        "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]", "config.DATA.TRAIN.DATASET_NAMES=[gpu_check_jpegs]",
        f"config.DATA.TRAIN.DATA_PATHS=[{filelist[0]}]", "config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{filelist[1]}]", f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}",
        f"config.CHECKPOINT.DIR={ckpt}", "config.CHECKPOINT.AUTO_RESUME=False",
        "config.MULTI_PROCESSING_METHOD=fork",
    ]
    if dry:  # SyncBN needs CUDA tensors
        ov += DRY_OVERRIDES + ["config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
                               "config.DATA.NUM_DATALOADER_WORKERS=1"]
    cfg = compose(ov)
    workers = cfg.DATA.NUM_DATALOADER_WORKERS
    warm = warmup_for(workers, dry)
    measure = iterations - warm
    res = run_loop(cfg, ckpt, warm, measure, limit_s or (120 if dry else 70), cuda, keep_losses=True)
    dumps = [n for n in os.listdir(ckpt) if n.startswith("nonfinite_")] if os.path.isdir(ckpt) else []
    err = res.get("error", "")
    guard = bool(dumps) or "NonFinite" in err
    losses = res.pop("losses", [])
    if res["status"] == "error" and not guard:
        raise RuntimeError(f"flagship run failed: {err}")
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    n = max(1, len(losses) // 5)
    first = statistics.fmean(losses[:n]) if losses else None
    last = statistics.fmean(losses[-n:]) if losses else None
    say(f"flagship: {len(losses)} iterations, loss {first} -> {last}, {_fmt(res.get('images_per_s'))} images/s")
    return dict(config="pretrain/swav/swav_8node_resnet", overrides="DISTRIBUTED.NUM_NODES=1, NUM_PROC_PER_NODE=1",
                batch=batch, workers=workers, amp=str(cfg.MODEL.AMP_PARAMS.get("AMP_DTYPE", "float16")),
                use_larc=bool(cfg.OPTIMIZER.use_larc), sync_bn=bool(cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN),
                queue_length=int(cfg.LOSS.swav_plugin_loss.queue.queue_length),
                iterations=len(losses), images=dict(count=len(paths), mean_kb=kb),
                loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
                loss_mean_first_fifth=first, loss_mean_last_fifth=last, loss_finite=finite,
                loss_falling=bool(finite and last < first), nonfinite_guard_fired=guard,
                images_per_s=res.get("images_per_s"), status=res["status"], wall_s=res["wall_s"],
                timed_iterations=res["timed_iterations"], start_method="fork")


# --------------------------------------------------------------------------- command line


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the code, measures nothing")
    p.add_argument("--flagship", action="store_true",
                   help="run pretrain/swav/swav_8node_resnet on one device instead of the variants")
    p.add_argument("--limit", type=float, default=None, help="the run's time limit, seconds")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device is visible (use --dry-run on a CPU machine)")
    torch.set_num_threads(1 if args.dry_run else max(1, os.cpu_count() or 1))
    import vissl  # noqa: F401  (registers the plugin)

    name = "flagship" if args.flagship else "loop_variants"
    limit = args.limit or LIMITS[name][1 if args.dry_run else 0]
    say = lambda m: print(m, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        if args.flagship:  # the loop's own limit leaves time for imports and images
            res = flagship(args.dry_run, tmp, limit_s=max(20.0, limit - 20), say=say)
        else:
            budget = limit if args.dry_run else max(30.0, limit - MARGIN_S)
            res = run_variants(args.dry_run, tmp, budget, say=say)
    bm.write_json(args.json, bm.record(name, __file__, argv, res, dry_run=args.dry_run, limit_s=limit))
    return res


if __name__ == "__main__":
    main()
