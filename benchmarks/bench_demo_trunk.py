"""The demo's training step on CPU: the trunk + SwAV head forward, backward and SGD step for
one process's batch of the demo's crops, for the trunk settings the demo recipe chose
between, in one run.

Variants (``resnet_small_plugin`` width 16 and the ``swav_plugin_head`` of
``pretrain/swav/swav_fashion_mnist_cpu``, 128-256-64 with 100 prototypes, read from the config
with its batch and crops):

* ``r18-nchw-bf16``: the recipe before (ResNet-18, NCHW, bf16 autocast) -- the baseline;
* ``r18-cl-fp32``:   ResNet-18, ``CHANNELS_LAST: True``, fp32;
* ``r10-cl-bf16``:   ResNet-10, channels-last, bf16 autocast;
* ``r10-cl-fp32``:   ResNet-10, channels-last, fp32 -- the recipe now.

Each step feeds the crops as VISSL's multi-resolution forward does: the crops of one size
concatenated into one batch (``2 x batch`` at 28 px, ``4 x batch`` at 16 px).
``--widths 24,32`` adds the recipe's ResNet-10 (channels-last, fp32) at those widths
(``r10-cl-fp32-w24`` ...: res5avg of 8 x width dims), to price a wider trunk.  Steps
alternate between the variants in rounds (A B C D, then D C B A, ...); the figure is each
variant's median ms/step after ``--warmup`` rounds, the first ratio the baseline's median
over the variant's (> 1: faster than the recipe before), the second the variant's over the
recipe's (``r10-cl-fp32``; > 1: slower than the recipe now).  Threads: ``--threads``
(default 1, the demo's threads per training process on the 2-core machine).

usage: python benchmarks/bench_demo_trunk.py [--batch 64] [--crops 2x28,4x16] [--rounds 8]
          [--warmup 2] [--threads 1] [--widths 24,32] [--json out.json]
"""
import argparse
import functools
import sys
import time

import torch

import recipes as br
import benchmarking as bm

VARIANTS = {  # name: (DEPTH, CHANNELS_LAST, bf16 autocast, WIDTH)
    "r18-nchw-bf16": (18, False, True, 16),
    "r18-cl-fp32": (18, True, False, 16),
    "r10-cl-bf16": (10, True, True, 16),
    "r10-cl-fp32": (10, True, False, 16),
}
BASELINE = "r18-nchw-bf16"
RECIPE = "r10-cl-fp32"  # the demo's trunk now


@functools.lru_cache(maxsize=None)
def demo_recipe():
    """The demo config's recipe (:func:`recipes.recipe`)."""
    return br.recipe(br.DEMO_CONFIG)


class Step:
    """One variant's model, optimizer and a fixed batch of crops."""

    def __init__(self, name, crops, batch, variants=VARIANTS):
        depth, channels_last, self.bf16, width = variants[name]
        self.model = br.build_trunk_head(demo_recipe(), depth=depth, width=width, channels_last=channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        self.inputs = [torch.randn(n * batch, 3, s, s, generator=g) for n, s in crops]

    def __call__(self):
        t = time.perf_counter()
        trunk, head = self.model
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = 0.0
            for x in self.inputs:
                z, scores = head(trunk(x)[0])
                loss = loss + torch.logsumexp(scores.float() / 0.1, dim=1).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t) * 1000.0


def parse_crops(text):
    """``"2x28,4x16"`` -> ``[(2, 28), (4, 16)]``."""
    try:
        return [tuple(int(v) for v in part.split("x")) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"bench_demo_trunk: --crops must look like 2x28,4x16, got {text!r}") from None


def parse_widths(text):
    """``"24,32"`` -> ``[24, 32]`` (``""`` -> ``[]``)."""
    try:
        widths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        widths = None
    if widths is None or any(w < 1 for w in widths):
        raise SystemExit(f"bench_demo_trunk: --widths must look like 24,32, got {text!r}")
    return widths


def with_widths(widths):
    """:data:`VARIANTS` and the recipe's ResNet-10 (channels-last, fp32) at each of ``widths``."""
    variants = dict(VARIANTS)
    for w in widths:
        variants[f"r10-cl-fp32-w{w}"] = (10, True, False, w)
    return variants


def main(argv=None):
    r = demo_recipe()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=r.batch, help=f"images per process (default {r.batch}, the demo's)")
    ap.add_argument("--crops", default=r.crops_text, help=f"NUMxSIZE,... (default {r.crops_text}, the demo's)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", default="", help="also time the ResNet-10 (channels-last, fp32) at these "
                    "widths, e.g. 24,32")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    crops = parse_crops(args.crops)
    variants = with_widths(parse_widths(args.widths))
    shipped = (r.trunk["DEPTH"], r.trunk["CHANNELS_LAST"], False, r.trunk["WIDTH"])
    if shipped != VARIANTS[RECIPE]:
        print(f"bench_demo_trunk: note: {br.DEMO_CONFIG} now ships DEPTH/CHANNELS_LAST/WIDTH "
              f"{shipped[0]}/{shipped[1]}/{shipped[3]}, not {RECIPE}'s")
    steps = {name: Step(name, crops, args.batch, variants) for name in variants}
    times = bm.alternate(steps, args.rounds, warmup=args.warmup)
    med = bm.medians(times)
    base, recipe = med[BASELINE], med[RECIPE]
    print(f"demo training step, batch {args.batch}, crops {args.crops}, {args.threads} thread(s), "
          f"median of {args.rounds} rounds")
    for name in variants:
        print(f"  {name:16s} {med[name]:8.1f} ms/step   speed-up over {BASELINE}: {base / med[name]:5.2f}x   "
              f"time / {RECIPE}'s: {med[name] / recipe:5.2f}x")
    bm.write_json(args.json, bm.record(
        "bench_demo_trunk", __file__, argv, {k: dict(ms=bm.summary(v), speedup_over_baseline=base / med[k],
                                                     time_over_recipe=med[k] / recipe) for k, v in times.items()},
        config=br.DEMO_CONFIG, batch=args.batch, crops=args.crops, rounds=args.rounds, warmup=args.warmup,
        threads=args.threads, variants={k: dict(zip(("depth", "channels_last", "bf16", "width"), v))
                                        for k, v in variants.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
