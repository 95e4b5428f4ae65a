"""The training step's candidates, timed in alternation in one process (``benchmarks/gpu_check.py``,
section ``step_variants``): VISSL 0.1.6's built-in SwAV step, the plugin's step, and the plugin's
step with channels-last memory format (model and batch), with ``torch.backends.cudnn.benchmark``
on, and with the candidate ``_foreach`` LARC of ``benchmarks/larc_foreach.py`` (not shipped).

Every variant is a VISSL task built as ``benchmarks/bench_train_step.py`` builds one (VISSL's
``SelfSupervisionTrainer`` -> task -> DDP, hooks from ``default_hook_generator``), with LARC on
(``OPTIMIZER.use_larc=True``, as ``swav_1gpu_resnet``), the same starting weights (VISSL's task's)
and the same replayed batch; steps run A B C D E, then rotated, each one timed between two device
synchronisations; the figure is each variant's median.  The first step's loss of each is recorded:
same weights and batch, so they must agree.  cudnn.benchmark is a global switch: it is set for each
step of each variant (on for its variant only).
"""
import argparse
import os
import statistics
import tempfile

VARIANTS = ("vissl", "ours", "ours_channels_last", "ours_cudnn_benchmark", "ours_foreach_larc")


def _to_channels_last(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
    if isinstance(x, list):
        return [_to_channels_last(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_channels_last(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_channels_last(v) for k, v in x.items()}
    return x


def _runner(bt, base, args, ckpt, channels_last=False):
    """A ``bench_train_step.Runner`` of ``base`` ("ours" / "vissl") with LARC on; channels-last:
    the model converted before VISSL wraps it in DDP."""
    import torch
    from vissl.trainer.train_task import SelfSupervisionTask

    orig_overrides = bt.overrides
    orig_ddp = SelfSupervisionTask.init_distributed_data_parallel_model

    def ddp(self, *a, **k):
        self.base_model.to(memory_format=torch.channels_last)
        return orig_ddp(self, *a, **k)

    bt.overrides = lambda v, a, c: orig_overrides(v, a, c) + ["config.OPTIMIZER.use_larc=True"]
    if channels_last:
        SelfSupervisionTask.init_distributed_data_parallel_model = ddp
    try:
        return bt.Runner(base, args, ckpt)
    finally:
        bt.overrides = orig_overrides
        SelfSupervisionTask.init_distributed_data_parallel_model = orig_ddp


def run(dry, bench_module, device):
    """The section's record: ms per step of each variant, ratios to VISSL's, first losses."""
    import torch

    bt = bench_module("bench_train_step")
    larc_foreach = bench_module("larc_foreach")
    cuda = device.type == "cuda"
    p = argparse.Namespace(
        trunk="small" if dry else "resnet50", width=8, batch=4 if dry else 64,
        crops="2x32,2x16" if dry else "2x224,6x96", K=20 if dry else 3000,
        dims="2048,32,16" if dry else "2048,2048,128", queue=0, device=device.type, amp="float16")
    steps, warmup = (2, 1) if dry else (12, 4)
    with tempfile.TemporaryDirectory() as tmp, bt._quiet():
        runners = {}
        for name in VARIANTS:
            base = "vissl" if name == "vissl" else "ours"
            runners[name] = _runner(bt, base, p, os.path.join(tmp, name), channels_last=name == "ours_channels_last")
        sd = runners["vissl"].task.base_model.state_dict()
        for name, r in runners.items():
            if name != "vissl":
                r.task.base_model.load_state_dict(sd)
        batch = runners["vissl"].first_batch()
        for name, r in runners.items():
            r.use_batch(_to_channels_last(batch) if name == "ours_channels_last" else batch)
        larc_foreach.swap_into(runners["ours_foreach_larc"].task.optimizer)
        times = {k: [] for k in VARIANTS}
        order = list(VARIANTS)
        for i in range(warmup + steps):
            for name in order:
                torch.backends.cudnn.benchmark = name == "ours_cudnn_benchmark"
                t = runners[name].step()
                if i >= warmup:
                    times[name].append(t)
            order = order[1:] + order[:1]
        torch.backends.cudnn.benchmark = False
        first = {k: r.step_losses[0] for k, r in runners.items()}
        finite = {k: all(x == x and abs(x) != float("inf") for x in r.step_losses) for k, r in runners.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    ref_loss = first["vissl"]
    return dict(
        trunk=p.trunk, batch=p.batch, crops=p.crops, K=p.K, amp=p.amp, use_larc=True, steps=steps, warmup=warmup,
        device=device.type,
        variants={k: dict(ms=med[k], images_per_s=p.batch * 1e3 / med[k], ratio_to_vissl=med[k] / med["vissl"],
                          first_loss=first[k], first_loss_rel_diff_to_vissl=abs(first[k] - ref_loss) / abs(ref_loss),
                          losses_finite=finite[k]) for k in VARIANTS},
        candidate_code="benchmarks/larc_foreach.py (not shipped)")
