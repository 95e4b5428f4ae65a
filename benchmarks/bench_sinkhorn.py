"""Sinkhorn-Knopp: the plugin's ``sinkhorn_knopp`` vs VISSL 0.1.6's built-in path, one run.

Baseline = exactly what ``vissl/losses/swav_loss.py::SwAVCriterion.forward`` does for one
assigned crop (``use_double_precision=False``)::

    a = scores / eps ; M = max(a) ; all_reduce_max(M) ; a -= M ; Q = exp(a).t()
    Q = distributed_sinkhornknopp(Q, num_iter, hard_assignment=False, world_size, ...)

Ours = ``vissl_swav_plugin.utils.sinkhorn.sinkhorn_knopp(scores, eps, num_iter)`` (same iterates,
scaling form: two matrix-vector products per iteration).  Both get the same scores: cosine
similarities of L2-normalised 128-D embeddings and prototypes (values in [-1, 1], as in
SwAV), B x K.  Rounds alternate ours / theirs so that machine load hits both alike;
``--warmup`` rounds first (dropped), then the median over ``--repeats`` rounds
(:mod:`benchmarking`, beside this script).  CPU threads:
``torch.set_num_threads(--threads)`` (default: every core of the machine).

Low precision (``--dtypes``): the scores are given in bf16/fp16 (as under autocast).  VISSL
then runs its whole path in that dtype; ours upcasts to fp32 (its documented behaviour).

GPU (``--device cuda``): timed with CUDA events after ``torch.cuda.synchronize()``.

usage: python benchmarks/bench_sinkhorn.py [--B 4096] [--K 3000] [--iters 3] [--repeats 15]
          [--warmup 3] [--threads N] [--device cpu|cuda] [--dtypes float32,bfloat16,float16]
          [--json out.json]
prints ms per call of both, the speed-up theirs/ours (target >= 2) and the max abs
difference of the codes (sanity: both compute the same thing).
"""
import argparse
import os
import sys

import torch

from recipes import vissl_sinkhorn as vissl_path  # noqa: F401 (gpu_check's name)
import benchmarking as bm


def ours_path(scores, eps, niters):
    from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp

    return sinkhorn_knopp(scores, eps, niters)


def make_scores(B, K, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(B, D, generator=g), dim=1)
    c = torch.nn.functional.normalize(torch.randn(K, D, generator=g), dim=1)
    return (z @ c.t()).to(device=device, dtype=dtype).contiguous()


def bench(dtype, args, device):
    scores = make_scores(args.B, args.K, args.D, dtype, device)
    fns = {
        "ours": lambda: ours_path(scores, args.eps, args.iters),
        "vissl": lambda: vissl_path(scores, args.eps, args.iters),
    }
    run = bm.ms_timer(device)
    times = bm.alternate({k: (lambda fn=fn: run(fn)) for k, fn in fns.items()}, args.repeats, warmup=args.warmup)
    q_ours, q_vissl = fns["ours"]().float(), fns["vissl"]().float()
    finite = bool(torch.isfinite(q_vissl).all())
    diff = float((q_ours - q_vissl).abs().max()) if finite else float("nan")
    return bm.medians(times), times, diff, finite


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=4096)
    p.add_argument("--K", type=int, default=3000)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)

    import vissl  # noqa: F401  (registers the plugin, applies compat shims)

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_sinkhorn: --device cuda but no CUDA device is visible")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"bench_sinkhorn: B={args.B} K={args.K} iters={args.iters} eps={args.eps} device={name} "
          f"torch={torch.__version__} warmup={args.warmup} repeats={args.repeats} (median)")
    print(f"{'scores dtype':>13} {'ours ms':>9} {'VISSL ms':>9} {'speed-up':>9} {'max|dq|':>9}")
    results, figures = {}, {}
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname.strip())
        med, times, diff, finite = bench(dtype, args, device)
        ratio = med["vissl"] / med["ours"]
        results[dname] = ratio
        figures[dname] = dict(ours_ms=bm.summary(times["ours"]), vissl_ms=bm.summary(times["vissl"]),
                              ratio_vissl_over_ours=ratio, max_abs_diff=diff if finite else None,
                              vissl_codes_finite=finite)
        note = "" if finite else "  (VISSL's codes are NaN/inf in this dtype)"
        print(f"{dname:>13} {med['ours']:9.2f} {med['vissl']:9.2f} {ratio:8.2f}x {diff:9.2e}{note}")
    r32 = results.get("float32")
    if r32 is not None:
        print(f"RATIO float32 speed-up (VISSL / ours) = {r32:.2f}x  (target >= 2x: "
              f"{'met' if r32 >= 2 else 'NOT met'})")
    bm.write_json(args.json, bm.record("bench_sinkhorn", __file__, argv, figures, B=args.B, K=args.K, D=args.D,
                                       iters=args.iters, eps=args.eps, repeats=args.repeats, warmup=args.warmup,
                                       threads=args.threads, device=args.device))
    return results


if __name__ == "__main__":
    main()
