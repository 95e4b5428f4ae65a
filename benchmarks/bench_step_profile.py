"""Where the demo's training step spends its time, against what the cores can do.

Builds the demo recipe's pieces from ``pretrain/swav/swav_fashion_mnist_cpu``, read from the
config (today: ``resnet_small_plugin`` ResNet-10 width 16 channels-last fp32, ``swav_plugin_head``
128-256-64 with 100 prototypes, ``swav_plugin_loss`` with ε 0.05, 3 Sinkhorn iterations, τ 0.1,
no queue; ``multicrop_plugin`` 2x28 + 4x16; batch 64 per process), with SGD momentum 0.9, the
prototypes not frozen (the step after the config's freeze) and the colour distortion at its full
strength (after the config's warm-up), and reports, in one run:

* FLOPs per iteration of one process (forward + backward), counted with torch's
  ``FlopCounterMode`` (counts a multiply-add as 2 FLOPs, and counts backward), cross-checked
  with fvcore's ``FlopCountAnalysis`` on the forward (fvcore counts one multiply-add as one
  "flop": its figure x 2 is the forward's FLOPs; the backward is about 2x the forward);
* the machine's fp32 matmul peak on the same threads (``torch.mm`` of ``--mm-size`` squares);
* the step's phases, timed with explicit timers, median over ``--rounds``: data (the real
  ``multicrop_plugin`` on 64 random 28x28 uint8 images made RGB, as ``fashion_mnist_folder``
  delivers them, plus the multi-crop collation; PNG decoding is not included), forward
  (trunk per crop size + head on the concatenation, as VISSL's multi-resolution forward),
  loss without Sinkhorn, Sinkhorn, backward, optimiser step, and -- only when run as a
  script, in two spawned gloo processes of ``--threads`` threads each -- the all-reduce of
  the gradient's size; the achieved GFLOP/s and its fraction of the peak;
* candidate settings timed in alternation with today's (rounds A B .. B A, medians),
  each as the ratio of today's time over the variant's (> 1: the variant is faster):
  ``nchw`` (channels-last off), ``threads2`` (one process, batch 2 x 64, 2 threads against
  two processes of 64 on 1 thread each: approximated by today's 64-batch step on 1 thread,
  which the two processes run side by side; the all-reduce the two processes add is not
  counted, so the ratio favours ``threads2`` by at most the all-reduce's time; the 2-process
  run also times it for real, alternated with the 2 processes' step), ``bf16``
  (CPU autocast to bfloat16, only where the CPU has native bf16: ``avx512_bf16`` or
  ``amx_bf16`` in /proc/cpuinfo; the head in fp32 as the demo config has it, ``fp32_head``;
  its fraction is also given of the bf16 matmul peak), ``compile`` (``torch.compile`` of trunk and head, mode
  default; compile time reported separately; skipped with the reason if it fails),
  ``no-finite-check`` (the loss's non-finite guard, a host read per step, switched off) and
  ``bf16-compile`` (bf16 with ``torch.compile``), also given against the bf16 step (candidate
  code that the plugin does not ship is not kept here: docs/experiments/benchmarks.md says where
  the measured ones are);
* with ``--op-profile STEPS``, the costliest aten ops of today's and the bf16 step (ms per step).

The machine's cores may be shared: run with ``--threads 1`` (the demo's threads per process)
and read the ratios, which alternation makes robust to load, rather than the absolute times.

usage: python benchmarks/bench_step_profile.py [--rounds 10] [--warmup 3] [--threads 1]
          [--mm-size 1024] [--variants nchw,threads2,bf16,compile,no-finite-check,bf16-compile]
          [--op-profile 5] [--no-allreduce] [--json out.json]
"""
import argparse
import functools
import os
import statistics
import time

import numpy as np
import torch

import recipes as br
import benchmarking as bm
from vissl_swav_plugin.utils.cpu_features import cpu_flags, cpu_model


def native_bf16(cpuinfo_text=None) -> bool:
    """Whether the CPU has native bf16 arithmetic (``avx512_bf16`` or ``amx_bf16``): the bf16
    variants run only there."""
    return bool(cpu_flags(cpuinfo_text) & {"avx512_bf16", "amx_bf16"})


PHASES = ("data", "forward", "loss (no Sinkhorn)", "Sinkhorn", "backward", "optimiser", "all-reduce")
ALL_VARIANTS = ("nchw", "threads2", "bf16", "compile", "no-finite-check", "bf16-compile")


@functools.lru_cache(maxsize=None)
def demo_recipe():
    """The demo config's recipe (:func:`recipes.recipe`)."""
    return br.recipe(br.DEMO_CONFIG)


def batch_size():
    """Images per process: the demo config's ``BATCHSIZE_PER_REPLICA``."""
    return demo_recipe().batch


# -- pure functions (unit-tested) ------------------------------------------------------
def conv2d_flops(batch, c_in, c_out, kernel, h_out, w_out, groups=1):
    """FLOPs of a conv2d forward without bias, a multiply-add counted as 2."""
    return 2 * batch * (c_in // groups) * c_out * kernel * kernel * h_out * w_out


def phase_table(phases_ms):
    """``{phase: ms}`` -> ``(rows, total_ms)``, rows ``(phase, ms, share)`` in the given
    order, the shares summing to 1 (phases of 0 ms included)."""
    total = float(sum(phases_ms.values()))
    rows = [(k, float(v), (float(v) / total) if total > 0 else 0.0) for k, v in phases_ms.items()]
    return rows, total


def format_table(rows, total, flops=None):
    """The phase table as text; with ``flops`` (per phase, FLOPs) also each phase's GFLOP/s."""
    lines = [f"  {'phase':20s} {'ms':>9s} {'share':>7s}" + (f" {'GFLOP/s':>8s}" if flops else "")]
    for name, ms, share in rows:
        extra = ""
        if flops:
            f = flops.get(name)
            extra = f" {f / ms / 1e6:8.2f}" if f and ms > 0 else f" {'':>8s}"
        lines.append(f"  {name:20s} {ms:9.2f} {100 * share:6.1f}%" + extra)
    lines.append(f"  {'total':20s} {total:9.2f} {100.0:6.1f}%")
    return "\n".join(lines)


# -- the recipe's pieces ---------------------------------------------------------------
def build_model(channels_last=True, width=None, prototypes=None):
    """Trunk and head of the demo (VISSL's registered classes), seeded; ``width`` and
    ``prototypes`` replace the config's."""
    head = {} if prototypes is None else dict(num_clusters=[prototypes])
    return br.build_trunk_head(demo_recipe(), width=width, channels_last=channels_last, **head)


def build_loss(distributed_sinkhorn=True):
    """The demo's loss, prototypes not frozen; ``distributed_sinkhorn=False`` for one process
    holding the whole batch while a process group of two is up (the codes are the same as two
    processes' together)."""
    return br.build_loss(demo_recipe(), distributed_sinkhorn=distributed_sinkhorn, freeze_prototypes_niters=0)


def build_transform():
    """The demo's ``multicrop_plugin``, its colour distortion at full strength (no warm-up)."""
    import vissl  # noqa: F401
    from vissl.data.ssl_transforms import get_transform

    t = {k: v for k, v in demo_recipe().transform.items() if not k.startswith("color_warmup_")}
    return get_transform([t])


def random_images(n, seed=0):
    """``n`` random 28x28 gray images, made RGB as the demo's ImageFolder loader does."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    return [Image.fromarray(a).convert("RGB") for a in arr]


def make_batch(transform, images):
    """The multi-crop transform and the collation: a list of crop tensors, one per crop slot
    (``multicrop_collator``'s layout: slot j holds crop j of every image)."""
    per_image = [transform({"data": [im], "label": [0], "data_valid": [1], "data_idx": [i]})["data"]
                 for i, im in enumerate(images)]
    return [torch.stack([crops[j] for crops in per_image]) for j in range(len(per_image[0]))]


def forward(model, crops, channels_last=True):
    """VISSL's multi-resolution forward: the trunk once per crop size, the head once."""
    trunk, head = model
    feats, start = [], 0
    sizes = [c.shape[-1] for c in crops]
    while start < len(crops):
        end = start
        while end < len(crops) and sizes[end] == sizes[start]:
            end += 1
        x = torch.cat(crops[start:end])
        feats.append(trunk(x)[0])
        start = end
    return head(torch.cat(feats))


class SinkhornTimer:
    """Wraps ``sinkhorn_knopp`` in the loss module; accumulates its ms."""

    def __init__(self):
        import vissl_swav_plugin.losses.swav_loss as mod

        self.mod, self.inner, self.ms = mod, mod.sinkhorn_knopp, 0.0

        def timed(*a, **k):
            t = time.perf_counter()
            out = self.inner(*a, **k)
            self.ms += (time.perf_counter() - t) * 1e3
            return out

        mod.sinkhorn_knopp = timed

    def restore(self):
        self.mod.sinkhorn_knopp = self.inner


class Step:
    """One training step of one configuration on a fixed batch; ``__call__`` -> ms."""

    def __init__(self, crops, channels_last=True, bf16=False, compiled=False, finite_check=True,
                 threads=1, distributed_sinkhorn=True):
        self.model = build_model(channels_last)
        self.loss = build_loss(distributed_sinkhorn)
        if not finite_check:
            self.loss._check_finite = lambda *a, **k: None
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
        self.crops, self.bf16, self.threads, self.channels_last = crops, bf16, threads, channels_last
        self.compile_s = None
        self.after_backward = None  # e.g. the gradient all-reduce of a 2-process run
        if compiled:
            t = time.perf_counter()
            self.fwd = torch.compile(lambda m, c: forward(m, c))
            self()  # compiles forward and backward for both crop sizes
            self()
            self.compile_s = time.perf_counter() - t
        else:
            self.fwd = forward

    def __call__(self, phases=None):
        prev = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self._step(phases)
        finally:
            torch.set_num_threads(prev)

    def _step(self, phases):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            out = self.fwd(self.model, self.crops)
        t1 = time.perf_counter()
        sk = SinkhornTimer() if phases is not None else None
        try:
            loss = self.loss([o.float() for o in out])
        finally:
            if sk:
                sk.restore()
        t2 = time.perf_counter()
        loss.backward()
        if self.after_backward is not None:
            self.after_backward(self.model)
        t3 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if phases is not None:
            phases["forward"].append((t1 - t0) * 1e3)
            phases["loss (no Sinkhorn)"].append((t2 - t1) * 1e3 - sk.ms)
            phases["Sinkhorn"].append(sk.ms)
            phases["backward"].append((t3 - t2) * 1e3)
            phases["optimiser"].append((t4 - t3) * 1e3)
        return (t4 - t0) * 1e3


def count_flops(model, loss, crops):
    """(forward FLOPs, backward FLOPs) of one step by torch's FlopCounterMode (2 per
    multiply-add), and fvcore's forward count (1 per multiply-add) or None."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = forward(model, crops)
        fwd = counter.get_total_flops()
        loss([o.float() for o in out]).backward()
    total = counter.get_total_flops()
    model.zero_grad(set_to_none=True)
    fv = None
    try:
        from fvcore.nn import FlopCountAnalysis

        class _Fwd(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *c):
                return forward(self.m, list(c))

        a = FlopCountAnalysis(_Fwd(model), tuple(crops))
        a.unsupported_ops_warnings(False)
        a.uncalled_modules_warnings(False)
        fv = a.total()
    except Exception as e:  # noqa: BLE001 (a cross-check only)
        print(f"fvcore cross-check skipped: {type(e).__name__}: {e}")
    return fwd, total - fwd, fv


def matmul_peak_gflops(n=1024, repeats=10, threads=1, dtype=torch.float32):
    """Best-of-``repeats`` ``torch.mm`` GFLOP/s of ``n x n`` squares of ``dtype`` on ``threads``."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        c = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=c)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t)
        return 2.0 * n ** 3 / best / 1e9
    finally:
        torch.set_num_threads(prev)


# -- the all-reduce, in two spawned processes (script only) ------------------------------
def _two_process_worker(rank, port, steps, warmup, threads, q):
    """One of the demo's 2 processes: its own 64-image batch, the step with the gradient
    all-reduced between backward and optimiser (one flat message, as DDP's bucket), the
    Sinkhorn marginals all-reduced as in the demo."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    crops = make_batch(build_transform(), random_images(batch_size(), seed=rank))
    step = Step(crops, threads=threads)
    ar = []

    def all_reduce_grads(model):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        t = time.perf_counter()
        dist.all_reduce(flat)
        ar.append((time.perf_counter() - t) * 1e3)
        flat /= 2
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    step.after_backward = all_reduce_grads
    # rank 0 alone, between the 2-process steps: batch 2 x 64 on 2 x threads threads (rank 1
    # waits in a barrier), the alternative layout timed in alternation with the demo's
    single = Step([torch.cat([c, c]) for c in crops], threads=2 * threads, distributed_sinkhorn=False) \
        if rank == 0 else None
    times, times1 = [], []
    for i in range(warmup + steps):
        dist.barrier()
        ms = step()
        dist.barrier()
        ms1 = single() if single is not None else 0.0
        if i >= warmup:
            times.append(ms)
            times1.append(ms1)
    if rank == 0:
        q.put({"iteration": statistics.median(times), "all-reduce": statistics.median(ar[warmup:]),
               "one_process_2_threads": statistics.median(times1),
               "numel": sum(p.numel() for p in step.model.parameters())})
    dist.barrier()
    dist.destroy_process_group()


def two_process_ms(steps, warmup, threads=1):
    """The demo's layout measured: 2 spawned gloo processes of ``threads`` thread(s), each
    stepping its own batch of 64 side by side; rank 0's median ms per iteration (model step
    incl. the all-reduce) and of the gradient all-reduce alone; alternated with rank 0 alone
    stepping the batch of both (2 x 64) on twice the threads (``one_process_2_threads``)."""
    import torch.multiprocessing as mp

    port = br.free_port()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_two_process_worker, args=(r, port, steps, warmup, threads, q))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a worker failed (exit codes {[p.exitcode for p in procs]})")
    return q.get()


# -- the same step inside VISSL's loop (script only) ----------------------------------------
def _write_image_folder(root, n, classes=10, seed=0):
    """``n`` random 28x28 gray PNGs in ``classes`` class folders (Fashion-MNIST's layout)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        d = os.path.join(root, f"c{i % classes}")
        os.makedirs(d, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(28, 28), dtype=np.uint8)).save(os.path.join(d, f"{i}.png"))


def vissl_loop_ms(steps, warmup, threads, extra_overrides=()):
    """Per-iteration ms of VISSL's own ``standard_train_step`` with the demo config in one
    process (world size 1: no DDP all-reduce partner, Sinkhorn local), fed by VISSL's data
    loader (0 workers, as the demo: PNG decoding, multi-crop and collation in the step) on
    a temporary folder of random PNGs, hooks from VISSL's default hook generator (the
    demo's: progress, collapse detector, loss/lr logging at LOG_FREQUENCY 1, ...).
    Returns ``{"step": ms, "data": ms, "hooks": ms}`` (medians; ``data`` is the loader's
    ``next``, ``hooks`` all ``run_hooks`` calls of the step incl. ``on_step``)."""
    import tempfile

    br.init_process_group()
    torch.set_num_threads(threads)
    n_img = batch_size() * (steps + warmup + 2)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        _write_image_folder(data, n_img)
        ov = [f"config={br.DEMO_CONFIG}", f"config.DATA.TRAIN.DATA_PATHS=[{data}]",
              f"config.DATA.TRAIN.LABEL_PATHS=[{data}]", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
              f"config.CHECKPOINT.DIR={tmp}/ckpt", "config.HOOKS.PRECISE_BN.ENABLED=False",
              "config.OPTIMIZER.num_epochs=2", *extra_overrides]
        cfg = br.compose(ov)
        with br.quiet():
            _, task, step_fn = br.prepare_task(cfg, f"{tmp}/ckpt")
        acc = {"data": 0.0, "hooks": 0.0}
        it = task.data_iterator

        class _Timed:
            def __iter__(self):
                return self

            def __next__(self):
                t = time.perf_counter()
                b = next(it)
                acc["data"] += (time.perf_counter() - t) * 1e3
                return b

            def __len__(self):
                return len(it)

        task.data_iterator = _Timed()
        run_hooks = task.run_hooks

        def timed_hooks(name):
            t = time.perf_counter()
            run_hooks(name)
            acc["hooks"] += (time.perf_counter() - t) * 1e3

        task.run_hooks = timed_hooks
        out = {"step": [], "data": [], "hooks": []}
        with br.quiet():
            for i in range(warmup + steps):
                acc["data"] = acc["hooks"] = 0.0
                t = time.perf_counter()
                task = step_fn(task)
                task.iteration += 1
                task.local_iteration_num += 1
                task.run_hooks("on_step")
                ms = (time.perf_counter() - t) * 1e3
                if i >= warmup:
                    out["step"].append(ms)
                    out["data"].append(acc["data"])
                    out["hooks"].append(acc["hooks"])
    return {k: statistics.median(v) for k, v in out.items()}


def op_profile(step, steps=5, top=10):
    """``{op: ms per step}`` of ``step``'s ``top`` aten ops by self CPU time (torch.profiler over
    ``steps`` steps, after one unprofiled step), and their sum over all ops under ``"total"``."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = sorted((e for e in prof.key_averages() if e.key.startswith("aten::")),
                    key=lambda e: -e.self_cpu_time_total)
    out = {e.key: e.self_cpu_time_total / 1e3 / steps for e in events[:top]}
    out["total"] = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e3 / steps
    return out


# -- main --------------------------------------------------------------------------------
def _ratio_line(name, base_ms, ms, note=""):
    return f"  {name:18s} {ms:9.2f} ms   today / variant: {base_ms / ms:5.2f}x" + (f"   ({note})" if note else "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per process (the demo: 1)")
    ap.add_argument("--mm-size", type=int, default=1024)
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS),
                    help="comma list of " + ", ".join(ALL_VARIANTS) + " (empty: none)")
    ap.add_argument("--no-allreduce", action="store_true",
                    help="skip the 2-process run (the all-reduce and the demo's layout measured)")
    ap.add_argument("--vissl-steps", type=int, default=20,
                    help="also time this many steps of VISSL's own loop on the demo config (0: off)")
    ap.add_argument("--op-profile", type=int, default=0, metavar="STEPS",
                    help="also profile today's and the bf16 step over STEPS steps: ms per step of the "
                         "costliest aten ops (torch.profiler; 0: off)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ALL_VARIANTS]
    if bad:
        raise SystemExit(f"bench_step_profile: unknown variant(s) {bad}; known: {list(ALL_VARIANTS)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    print(f"bench_step_profile: CPU {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
          f"capability {torch.backends.cpu.get_cpu_capability()}, bf16 flags "
          f"{sorted(cpu_flags() & {'avx512_bf16', 'amx_bf16', 'amx_tile'}) or 'none'}, "
          f"{args.threads} thread(s) per process, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")

    batch, crops_text = batch_size(), "+".join(f"{n}x{s}" for n, s in demo_recipe().crops)
    transform = build_transform()
    images = random_images(batch)
    crops = make_batch(transform, images)
    print("crops per slot: " + ", ".join(f"{tuple(c.shape)}" for c in crops))

    # FLOPs
    model, loss = build_model(), build_loss()
    f_fwd, f_bwd, fv = count_flops(model, loss, crops)
    f_step = f_fwd + f_bwd
    print(f"FLOPs per iteration per process (FlopCounterMode, multiply-add = 2): forward {f_fwd / 1e9:.3f} G, "
          f"backward {f_bwd / 1e9:.3f} G, total {f_step / 1e9:.3f} G (x2 processes: {2 * f_step / 1e9:.3f} G/iteration)")
    if fv is not None:
        print(f"  fvcore forward (multiply-add = 1): {fv / 1e9:.3f} G -> x2 = {2 * fv / 1e9:.3f} G "
              f"(FlopCounterMode forward / that: {f_fwd / (2 * fv):.3f})")
    numel = sum(p.numel() for p in model.parameters())

    peak = matmul_peak_gflops(args.mm_size, threads=args.threads)
    peak_all = matmul_peak_gflops(args.mm_size, threads=os.cpu_count() or 1)
    print(f"fp32 matmul peak ({args.mm_size}^2 torch.mm): {peak:.1f} GFLOP/s on {args.threads} thread(s), "
          f"{peak_all:.1f} GFLOP/s on {os.cpu_count()} threads")

    # phases of today's step
    today = Step(crops, threads=args.threads)
    phases = {k: [] for k in PHASES if k != "all-reduce"}
    for r in range(args.warmup + args.rounds):
        t = time.perf_counter()
        make_batch(transform, images)
        data_ms = (time.perf_counter() - t) * 1e3
        tmp = {k: [] for k in phases if k != "data"}
        today(tmp)
        if r >= args.warmup:
            phases["data"].append(data_ms)
            for k, v in tmp.items():
                phases[k].append(v[0])
    med = {k: statistics.median(v) for k, v in phases.items()}
    two = None
    if not args.no_allreduce:
        try:
            two = two_process_ms(args.rounds, args.warmup, threads=args.threads)
            med["all-reduce"] = two["all-reduce"]
        except Exception as e:  # noqa: BLE001
            print(f"2-process measurement skipped: {type(e).__name__}: {e}")
    rows, total = phase_table(med)
    compute_ms = med["forward"] + med["loss (no Sinkhorn)"] + med["Sinkhorn"] + med["backward"] + med["optimiser"]
    print(f"\nphases of one process's step (batch {batch}, crops {crops_text}), median of {args.rounds}; "
          f"all-reduce: {numel} fp32 (the gradient) over 2 gloo processes")
    print(format_table(rows, total, {"forward": f_fwd, "backward": f_bwd}))
    achieved = f_step / (compute_ms / 1e3) / 1e9
    print(f"achieved: {achieved:.2f} GFLOP/s on the compute phases ({compute_ms:.1f} ms), "
          f"{f_step / (total / 1e3) / 1e9:.2f} GFLOP/s on the whole step ({total:.1f} ms = {1e3 / total:.2f} it/s); "
          f"peak {peak:.1f} GFLOP/s per process: {100 * achieved / peak:.1f}% / {100 * f_step / (total / 1e3) / 1e9 / peak:.1f}%")

    if args.vissl_steps > 0:
        try:
            vl = vissl_loop_ms(args.vissl_steps, args.warmup, args.threads)
            rest = vl["step"] - vl["data"] - vl["hooks"]
            print(f"\nVISSL's loop (standard_train_step, demo config, 1 process, {args.vissl_steps} steps, median): "
                  f"{vl['step']:.1f} ms/it = {1e3 / vl['step']:.2f} it/s; data loader (PNG decode + multi-crop + "
                  f"collate) {vl['data']:.1f} ms, hooks {vl['hooks']:.1f} ms, the rest (model, loss, backward, "
                  f"optimiser, VISSL's bookkeeping) {rest:.1f} ms against {compute_ms:.1f} ms of the bare step above")
            med["vissl loop"] = vl
            if "bf16" in variants and native_bf16():
                va = vissl_loop_ms(args.vissl_steps, args.warmup, args.threads,
                                   ["config.MODEL.AMP_PARAMS.USE_AMP=True"])
                print(f"VISSL's loop with MODEL.AMP_PARAMS.USE_AMP=True (bf16 autocast): {va['step']:.1f} ms/it; "
                      f"fp32 / bf16: {vl['step'] / va['step']:.2f}x (sequential runs, not alternated)")
                med["vissl loop bf16"] = va
        except Exception as e:  # noqa: BLE001
            print(f"VISSL loop skipped: {type(e).__name__}: {e}")

    if two is not None:
        it_ms = two["iteration"] + med["data"]
        print(f"2 processes side by side (the demo's layout, {args.threads} thread(s) each, gradient all-reduced): "
              f"{two['iteration']:.1f} ms model step incl. all-reduce + {med['data']:.1f} ms data = {it_ms:.1f} ms/it "
              f"= {1e3 / it_ms:.2f} it/s; {2 * f_step / (it_ms / 1e3) / 1e9:.1f} GFLOP/s of "
              f"{peak_all:.1f} peak on {os.cpu_count()} threads ({100 * 2 * f_step / (it_ms / 1e3) / 1e9 / peak_all:.1f}%)")

    result = bm.record("bench_step_profile", __file__, argv, None, config=br.DEMO_CONFIG)
    result.update({"cpu": cpu_model(), "threads": args.threads, "flops_forward": f_fwd, "flops_backward": f_bwd,
              "fvcore_forward_macs": fv, "matmul_peak_gflops": peak, "matmul_peak_gflops_all_threads": peak_all,
              "two_process": two, "phases_ms": med,
              "achieved_gflops_compute": achieved, "variants": {}})

    # variants, alternated with today's step
    steps = {"today": today}
    skipped = {}
    for v in variants:
        try:
            if v == "nchw":
                steps[v] = Step(crops, channels_last=False, threads=args.threads)
            elif v == "threads2":
                crops2 = [torch.cat([c, c]) for c in crops]
                steps[v] = Step(crops2, threads=2 * args.threads)
            elif v == "bf16":
                if not native_bf16():
                    skipped[v] = "no native bf16 (avx512_bf16 / amx_bf16) on this CPU"
                    continue
                steps[v] = Step(crops, bf16=True, threads=args.threads)
            elif v == "compile":
                torch.set_num_threads(args.threads)
                steps[v] = Step(crops, compiled=True, threads=args.threads)
                print(f"torch.compile: {steps[v].compile_s:.1f} s to compile (2 steps incl.)")
            elif v == "no-finite-check":
                steps[v] = Step(crops, finite_check=False, threads=args.threads)
            elif v == "bf16-compile":
                if not native_bf16():
                    skipped[v] = "no native bf16 (avx512_bf16 / amx_bf16) on this CPU"
                    continue
                torch.set_num_threads(args.threads)
                steps[v] = Step(crops, bf16=True, threads=args.threads, compiled=True)
                print(f"torch.compile under bf16: {steps[v].compile_s:.1f} s to compile (2 steps incl.)")
        except Exception as e:  # noqa: BLE001  (a candidate that fails is reported, not fatal)
            skipped[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    times = bm.alternate(steps, args.rounds, warmup=args.warmup)
    order = list(steps)
    base = statistics.median(times["today"])
    print(f"\ncandidates (median ms of the model step -- forward, loss, backward, optimiser -- over {args.rounds} "
          f"alternating rounds; today: channels-last fp32 eager, batch {batch}, {args.threads} thread(s))")
    print(f"  {'today':18s} {base:9.2f} ms")
    peak_bf16 = None
    if any(k.startswith("bf16") for k in steps):
        peak_bf16 = matmul_peak_gflops(args.mm_size, threads=args.threads, dtype=torch.bfloat16)
        result["matmul_peak_gflops_bf16"] = peak_bf16
        print(f"  (bf16 matmul peak ({args.mm_size}^2 torch.mm): {peak_bf16:.1f} GFLOP/s on {args.threads} thread(s))")
    print(f"  {'':18s} today: {f_step / base / 1e6:.2f} GFLOP/s = {100 * f_step / base / 1e6 / peak:.1f}% of the fp32 peak")
    for name in order[1:]:
        ms = statistics.median(times[name])
        note = ""
        ratio_ms = ms
        if name == "threads2":
            ratio_ms = ms  # one process does both processes' batches: compare with today's time per process
            note = (f"batch 2x{batch} on {2 * args.threads} threads vs 2 processes x {batch} side by side "
                    f"on {args.threads} thread(s) (approximated by today's step; their all-reduce not counted)")
        if name in ("compile", "bf16-compile"):
            note = f"compile {steps[name].compile_s:.1f} s"
        if name.startswith("bf16-") and "bf16" in times:
            bf = statistics.median(times["bf16"])
            note = (note + "; " if note else "") + f"bf16 / variant: {bf / ms:.2f}x"
            result.setdefault("variants_over_bf16", {})[name] = bf / ms
        print(_ratio_line(name, base, ratio_ms, note))
        result["variants"][name] = {"ms": ms, "today_ms": base, "ratio_today_over_variant": base / ms,
                                    "spread": bm.summary(times[name])["spread"]}
        if steps[name].compile_s is not None:
            result["variants"][name]["compile_s"] = steps[name].compile_s
        if name != "threads2":  # the same FLOPs as today's step: the fraction of the peak it reaches
            gflops = f_step / ms / 1e6
            frac = f"{gflops:.2f} GFLOP/s = {100 * gflops / peak:.1f}% of the fp32 peak"
            if name.startswith("bf16"):
                frac += f", {100 * gflops / peak_bf16:.1f}% of the bf16 peak"
                result["variants"][name]["fraction_of_bf16_peak"] = gflops / peak_bf16
            print(f"  {'':18s} {frac}")
            result["variants"][name].update(achieved_gflops=gflops, fraction_of_fp32_peak=gflops / peak)
        if name == "threads2" and two is not None:
            print(f"  {'':18s} measured in the 2-process run, alternated: 2 processes x {batch} side by side "
                  f"{two['iteration']:.1f} ms (incl. all-reduce) vs 1 process x {2 * batch} on {2 * args.threads} "
                  f"threads {two['one_process_2_threads']:.1f} ms: {two['iteration'] / two['one_process_2_threads']:5.2f}x")
            result["variants"][name]["ratio_two_process_over_variant"] = (
                two["iteration"] / two["one_process_2_threads"])
    for name, why in skipped.items():
        print(f"  {name:18s} skipped: {why}")
        result["variants"][name] = {"skipped": why}
    if args.op_profile > 0:
        profiled = {"today": today}
        if native_bf16():
            profiled["bf16"] = steps.get("bf16") or Step(crops, bf16=True, threads=args.threads)
        result["op_profile_ms_per_step"] = {}
        for name, step in profiled.items():
            ops = op_profile(step, args.op_profile)
            result["op_profile_ms_per_step"][name] = ops
            print(f"\nop profile of the {name} step ({args.op_profile} steps, torch.profiler, self CPU ms per step; "
                  f"all ops {ops['total']:.1f} ms):")
            for op, ms in ops.items():
                if op != "total":
                    print(f"  {op:38s} {ms:8.2f}")
            fwd, bwd = ops.get("aten::mkldnn_convolution"), ops.get("aten::convolution_backward")
            if fwd and bwd:
                print(f"  convolution backward / forward: {bwd / fwd:.2f}")
    bm.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
