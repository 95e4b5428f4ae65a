"""The training step's settings, timed in alternation in one process: VISSL 0.1.6's built-in SwAV
step, the plugin's step, and the plugin's step with channels-last memory format (model and batch)
and with ``torch.backends.cudnn.benchmark`` on.  ``benchmarks/gpu_check.py`` runs it as its section
``step_variants``.

Every variant is a VISSL task of the SwAV pair (:func:`recipes.pair_runner`:
VISSL's ``SelfSupervisionTrainer`` -> task -> DDP, hooks from ``default_hook_generator``, as
``benchmarks/bench_train_step.py``; the model, crops and batch of ``swav_1gpu_resnet``, read from the
config), with LARC on (``OPTIMIZER.use_larc=True``, as
``swav_1gpu_resnet``), the same starting weights (VISSL's task's) and the same replayed batch; steps
run A B C D, then rotated, each one timed between two device synchronisations; the figure is each
variant's median.  The first step's loss of each is recorded: same weights and batch, so they must
agree.  cudnn.benchmark is a global switch: it is set for each step of each variant (on for its
variant only).

usage: python benchmarks/step_variants.py [--dry-run] [--json out.json]
``--dry-run``: the CPU, the small trunk at batch 4 (checks the code, measures nothing); otherwise
CUDA, ResNet-50, 2x224 + 6x96, batch 64, fp16 AMP.
"""
import argparse
import os
import statistics
import tempfile

import torch

import recipes as br
import benchmarking as bm

VARIANTS = ("vissl", "ours", "ours_channels_last", "ours_cudnn_benchmark")


def _to_channels_last(x):
    if isinstance(x, torch.Tensor):
        return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
    if isinstance(x, list):
        return [_to_channels_last(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_channels_last(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_channels_last(v) for k, v in x.items()}
    return x


def _channels_last_model(task):
    """The model in channels-last memory format, before VISSL wraps it in DDP."""
    task.base_model.to(memory_format=torch.channels_last)


def run(dry, device):
    """The section's record: ms per step of each variant, ratios to VISSL's, first losses."""
    s = br.gpu_pair(dry, device.type)  # swav_1gpu_resnet's recipe, read from the config
    steps, warmup = (2, 1) if dry else (12, 4)
    with tempfile.TemporaryDirectory() as tmp, br.quiet():
        runners = {}
        for name in VARIANTS:
            runners[name] = br.pair_runner(
                "vissl" if name == "vissl" else "ours", s, os.path.join(tmp, name), ["config.OPTIMIZER.use_larc=True"],
                before_ddp=_channels_last_model if name == "ours_channels_last" else None)
        sd = runners["vissl"].task.base_model.state_dict()
        for name, r in runners.items():
            if name != "vissl":
                r.task.base_model.load_state_dict(sd)
        batch = runners["vissl"].first_batch()
        for name, r in runners.items():
            r.use_batch(_to_channels_last(batch) if name == "ours_channels_last" else batch)

        def step(name):
            torch.backends.cudnn.benchmark = name == "ours_cudnn_benchmark"
            return runners[name].step()

        times = bm.alternate({k: (lambda k=k: step(k)) for k in VARIANTS}, steps, warmup=warmup, schedule="rotate")
        torch.backends.cudnn.benchmark = False
        first = {k: r.step_losses[0] for k, r in runners.items()}
        finite = {k: all(x == x and abs(x) != float("inf") for x in r.step_losses) for k, r in runners.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    ref_loss = first["vissl"]
    return dict(
        trunk=s.trunk, batch=s.batch, crops=s.crops, K=s.K, amp=s.amp, use_larc=True, steps=steps, warmup=warmup,
        device=device.type,
        variants={k: dict(ms=med[k], spread=bm.summary(times[k])["spread"], images_per_s=s.batch * 1e3 / med[k],
                          ratio_to_vissl=med[k] / med["vissl"], first_loss=first[k],
                          first_loss_rel_diff_to_vissl=abs(first[k] - ref_loss) / abs(ref_loss),
                          losses_finite=finite[k]) for k in VARIANTS})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the code, measures nothing")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device is visible (use --dry-run on a CPU machine)")
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch.set_num_threads(1 if args.dry_run else max(1, os.cpu_count() or 1))
    br.init_process_group("nccl" if device.type == "cuda" else "gloo")
    res = run(args.dry_run, device)
    for k, v in res["variants"].items():
        print(f"step_variants: {k:22s} {v['ms']:8.1f} ms/step  ratio to VISSL's {v['ratio_to_vissl']:.3f}  "
              f"first loss {v['first_loss']:.5f}")
    bm.write_json(args.json, bm.record("step_variants", __file__, argv, res, dry_run=args.dry_run))
    return res


if __name__ == "__main__":
    main()
