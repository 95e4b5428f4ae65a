"""One SwAV training step through VISSL's own ``standard_train_step``: the plugin's SwAV
(``swav_plugin_head`` + ``swav_plugin_loss`` + its hooks) vs VISSL 0.1.6's built-in SwAV
(``swav_head`` + ``swav_loss`` + ``SwAVUpdateQueueScoresHook`` / ``NormalizePrototypesHook``),
one process, one run.

Both tasks are built by VISSL (``SelfSupervisionTrainer`` -> ``SelfSupervisionTask.prepare``
-> DDP wrapper, hooks from ``default_hook_generator``) from configs that differ only in
the loss and head names; the same trunk, batch, crops, prototypes and optimizer.  The
second model gets the first model's weights (the head parameter names coincide), and both
are fed the same collated multi-crop batch (taken once from VISSL's own data loader, then
replayed), so forward, loss, backward, optimizer step and hooks do identical work.  Steps
alternate between the two tasks (A B B A ...); the figure is the median per step after
``--warmup`` steps (which also fill the plugin's queue when ``--queue`` > 0).

The loss share is the loss forward + backward (Sinkhorn assignments included; VISSL scores
its queue in an ``on_forward`` hook, counted in) timed alone on the task's own model
output for the same batch, divided by the step time; ``loss fwd ms`` is the forward
inside the timed steps.  The first step's loss of both tasks is printed: same weights and
batch, so it must agree (without a queue; VISSL starts its queue with random entries).

Peak memory (``--memory``): each variant is run alone in a fresh subprocess.  CPU: the
resident-set high-water mark (VmHWM) is reset through ``/proc/self/clear_refs`` after the
first step; reported are the RSS before the measured steps, the peak RSS during them and
the difference (the step's transient memory).  CUDA: ``torch.cuda.max_memory_allocated``.

Threads (``--threads``, default: every core): on a machine shared with other jobs use
``--threads 1``; on this 2-core host under load, 2 OpenMP threads made steps 10-40x slower
(barrier spinning when the cores are taken), for both variants alike but with huge noise.

usage: python benchmarks/bench_train_step.py [--trunk resnet50|small] [--batch 8]
          [--crops 2x64,6x32] [--K 3000] [--dims 2048,2048,128] [--queue 0] [--steps 20]
          [--warmup 3] [--threads N] [--memory] [--json out.json]
prints ms/step of both, the ratio ours/VISSL (target <= 1.02), the loss share and memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import recipes as br
import benchmarking as bm


def loss_fwd_bwd_ms(runner, batch, repeats):
    """Median time of the loss forward + backward alone, on this task's own model output
    for the benchmark batch (the loss's share of a step includes its backward)."""
    from vissl.trainer.train_steps.standard_train_step import construct_sample_for_model

    task = runner.task
    sample = construct_sample_for_model(batch, task)
    with torch.no_grad():
        out = task.model(sample["input"])
    out = out[0] if len(out) == 1 else out
    runner.loss_ms.clear()
    times = []
    for _ in range(repeats):
        leaves = [o.detach().clone().requires_grad_(True) for o in out]
        t0 = time.perf_counter()
        task.run_hooks("on_forward")  # VISSL scores its queue here; ours attaches prototypes
        loss = task.loss(leaves, sample["target"])
        loss.backward()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def memory_child(args, variant):
    """Run one variant alone; print JSON with its memory figures.  CPU: the process's
    resident-set high-water mark (VmHWM) is reset (``/proc/self/clear_refs``) after the
    first step, so ``peak`` is the largest RSS during the measured steps and ``peak - rss``
    the step's transient memory (activations, gradients, loss and Sinkhorn buffers)."""
    br.init_process_group()
    with tempfile.TemporaryDirectory() as tmp, br.quiet():
        r = br.pair_runner(variant, args, tmp)
        r.use_batch(r.first_batch())
        r.step()  # first step allocates optimizer state, grads, queue
        rss_before = bm.proc_status_kb("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            reset = True
        except OSError:
            reset = False
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.mem_steps):
            r.step()
        out = {"rss_before_mb": rss_before / 1024, "peak_mb": bm.proc_status_kb("VmHWM") / 1024,
               "hwm_reset": reset}
        if torch.cuda.is_available():
            out["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    out["step_transient_mb"] = out["peak_mb"] - out["rss_before_mb"]
    print("MEMORY_JSON " + json.dumps(out))


def measure_memory(args, argv):
    res = {}
    for variant in ("vissl", "ours"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--memory-child", variant],
                              capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEMORY_JSON ")]
        if proc.returncode or not line:
            raise RuntimeError(f"memory child {variant} failed:\n{proc.stderr[-3000:]}")
        res[variant] = json.loads(line[0].split(" ", 1)[1])
    return res


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trunk", default="resnet50", choices=["resnet50", "small"])
    p.add_argument("--width", type=int, default=16, help="resnet_small_plugin WIDTH (--trunk small)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--crops", default="2x64,6x32", help="NUMxSIZE,... e.g. 2x224,6x96")
    p.add_argument("--K", type=int, default=3000)
    p.add_argument("--dims", default="2048,2048,128")
    p.add_argument("--queue", type=int, default=0, help="queue length (both losses)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--memory", action="store_true", help="also measure peak memory (subprocesses)")
    p.add_argument("--mem-steps", type=int, default=3)
    p.add_argument("--memory-child", choices=["vissl", "ours"], help=argparse.SUPPRESS)
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import vissl  # noqa: F401  (registers the plugin)

    if args.memory_child:
        return memory_child(args, args.memory_child)
    br.init_process_group()
    if args.queue:
        args.warmup = max(args.warmup, -(-args.queue // args.batch) + 1)
    with tempfile.TemporaryDirectory() as tmp:
        a, b, batch = br.build_pair(args, tmp)
        with br.quiet():
            times = bm.alternate({"vissl": a.step, "ours": b.step}, args.steps, warmup=args.warmup)
        w = args.warmup
        loss = {"vissl": statistics.median(a.loss_ms[w:]), "ours": statistics.median(b.loss_ms[w:])}
        qhook = statistics.median(a.qhook_ms[w:]) if a.qhook_ms[w:] else 0.0
        with br.quiet():
            fb = {"vissl": loss_fwd_bwd_ms(a, batch, args.steps), "ours": loss_fwd_bwd_ms(b, batch, args.steps)}
        # same weights, same batch: the first step's losses must agree (sanity check)
        first = {"vissl": a.step_losses[0], "ours": b.step_losses[0]}
    med = bm.medians(times)
    ratio = med["ours"] / med["vissl"]
    dims = args.dims if args.trunk == "resnet50" else f"{8 * args.width}," + args.dims.split(",", 1)[1]
    print(f"bench_train_step: trunk={args.trunk} batch={args.batch} images x crops={args.crops} "
          f"K={args.K} head dims={dims} queue={args.queue} CPU threads={torch.get_num_threads()} "
          f"steps={args.steps} (median, after {args.warmup} warmup) torch={torch.__version__}")
    print(f"{'':>6} {'ms/step':>9} {'loss fwd ms':>11} {'loss fwd+bwd ms':>15} {'share of step':>13} "
          f"{'queue hook ms':>13} {'1st loss':>10}")
    for k in ("vissl", "ours"):
        qh = f"{qhook:13.2f}" if k == "vissl" and args.queue else f"{'-' if not args.queue else '(in loss)':>13}"
        print(f"{k:>6} {med[k]:9.1f} {loss[k]:11.2f} {fb[k]:15.2f} {100 * fb[k] / med[k]:12.1f}% {qh} "
              f"{first[k]:10.5f}")
    print(f"RATIO train step ours / VISSL = {ratio:.3f}  (target <= 1.02: {'met' if ratio <= 1.02 else 'NOT met'})")
    if args.memory:
        mem = measure_memory(args, [a for a in argv if a != "--memory"])
        for k in ("vissl", "ours"):
            m = mem[k]
            print(f"MEMORY {k:>5}: RSS before the steps {m['rss_before_mb']:.0f} MB, peak RSS during "
                  f"{args.mem_steps} steps {m['peak_mb']:.0f} MB (transient {m['step_transient_mb']:.0f} MB)"
                  + (f", cuda max allocated {m['cuda_max_allocated_mb']:.0f} MB" if "cuda_max_allocated_mb" in m else "")
                  + ("" if m["hwm_reset"] else " [VmHWM not resettable: peak since start]"))
    results = {k: dict(step_ms=bm.summary(times[k]), loss_fwd_ms=loss[k], loss_fwd_bwd_ms=fb[k], first_loss=first[k])
               for k in ("vissl", "ours")}
    bm.write_json(args.json, bm.record(
        "bench_train_step", __file__, argv, results, trunk=args.trunk, width=args.width, batch=args.batch,
        crops=args.crops, K=args.K, dims=dims, queue=args.queue, steps=args.steps, warmup=args.warmup,
        threads=torch.get_num_threads(), ratio_ours_over_vissl=ratio, memory=mem if args.memory else None))
    return ratio


if __name__ == "__main__":
    main()
