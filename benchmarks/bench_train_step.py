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
          [--warmup 3] [--threads N] [--memory]
prints ms/step of both, the ratio ours/VISSL (target <= 1.02), the loss share and memory.
"""
import argparse
import contextlib
import io
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_dist():
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)


def overrides(variant, args, ckpt_dir):
    sizes, nums = [], []
    for part in args.crops.split(","):
        n, s = part.split("x")
        nums.append(int(n))
        sizes.append(int(s))
    total = sum(nums)
    scales = [[0.14, 1.0]] + [[0.05, 0.14]] * (len(sizes) - 1)
    dims = [int(d) for d in args.dims.split(",")]
    common = [
        "config=test/swav_plugin/quick_cpu",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
        f"config.DATA.TRAIN.DATA_LIMIT={args.batch}",
        "config.DATA.TRAIN.TRANSFORMS=[{name:ImgPilToMultiCrop,total_num_crops:%d,size_crops:%s,"
        "num_crops:%s,crop_scales:%s},{name:ToTensor}]" % (total, sizes, nums, scales),
        "config.LOG_FREQUENCY=100000",
        "config.OPTIMIZER.num_epochs=1000",
        f"config.CHECKPOINT.DIR={ckpt_dir}",
        "config.CHECKPOINT.AUTO_RESUME=False",
    ]
    if getattr(args, "device", "cpu") == "cuda":
        common += ["config.MACHINE.DEVICE=gpu"]
    if getattr(args, "amp", "off") != "off":  # VISSL's native AMP; AMP_DTYPE is the plugin's key
        common += ["config.MODEL.AMP_PARAMS.USE_AMP=True", "config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
                   f"config.MODEL.AMP_PARAMS.AMP_DTYPE={args.amp}"]
    if args.trunk == "small":
        common += ["config.MODEL.TRUNK.NAME=resnet_small_plugin",
                   f"+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={{WIDTH:{args.width},DEPTH:10}}"]
        dims[0] = 8 * args.width
    head = "{dims:%s,use_bn:True,num_clusters:[%d]}" % (dims, args.K)
    if variant == "ours":
        return common + [
            f"config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{head}]]",
            "config.LOSS.name=swav_plugin_loss",
            "config.LOSS.swav_plugin_loss.freeze_prototypes_niters=0",
            f"config.LOSS.swav_plugin_loss.queue.queue_length={args.queue}",
            "config.LOSS.swav_plugin_loss.queue.start_epoch=0",
        ]
    return common + [
        f"config.MODEL.HEAD.PARAMS=[[swav_head,{head}]]",
        "config.LOSS.name=swav_loss",
        "~config.LOSS.swav_plugin_loss",  # VISSL's loss: our block would be ignored (refused at composition)
        "config.LOSS.swav_loss.temperature=0.1",
        "config.LOSS.swav_loss.epsilon=0.05",
        "config.LOSS.swav_loss.num_iters=3",
        "config.LOSS.swav_loss.crops_for_assign=[0,1]",
        "config.LOSS.swav_loss.normalize_last_layer=True",
        f"config.LOSS.swav_loss.queue.queue_length={args.queue}",
        "config.LOSS.swav_loss.queue.start_iter=0",
    ]


class Runner:
    """A VISSL task prepared exactly as SelfSupervisionTrainer.train() does before its loop."""

    def __init__(self, variant, args, ckpt_dir):
        from vissl.hooks import default_hook_generator
        from vissl.trainer.train_steps import get_train_step
        from vissl.trainer.trainer_main import SelfSupervisionTrainer
        from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

        _, cfg = convert_to_attrdict(compose_hydra_configuration(overrides(variant, args, ckpt_dir)),
                                     dump_config=False)
        self.variant = variant
        self.trainer = SelfSupervisionTrainer(cfg, dist_run_id="unused", checkpoint_folder=ckpt_dir,
                                              hooks=default_hook_generator(cfg))
        self.step_fn = get_train_step(cfg.TRAINER.TRAIN_STEP_NAME)
        task = self.trainer.task
        task.prepare(pin_memory=False)
        task.init_distributed_data_parallel_model()
        task, _, _ = self.trainer._init_training_state(cfg, task)
        task.run_hooks("on_start")
        self.trainer._advance_phase(task)
        task.run_hooks("on_phase_start")
        self.task = task
        self.loss_ms, self.qhook_ms, self.step_losses = [], [], []
        loss = task.loss
        fwd = loss.forward

        def timed_forward(*a, **k):
            t0 = time.perf_counter()
            out = fwd(*a, **k)
            self.loss_ms.append((time.perf_counter() - t0) * 1e3)
            return out

        loss.forward = timed_forward  # instance attribute: nn.Module.__call__ finds it
        from vissl.hooks.swav_hooks import SwAVUpdateQueueScoresHook

        for h in task.hooks:
            if isinstance(h, SwAVUpdateQueueScoresHook):
                inner = h.on_forward

                def timed_hook(t, inner=inner):
                    t0 = time.perf_counter()
                    inner(t)
                    self.qhook_ms.append((time.perf_counter() - t0) * 1e3)

                h.on_forward = timed_hook

    def first_batch(self):
        return next(self.task.data_iterator)

    def use_batch(self, batch):
        self.task.data_iterator = _Replay(batch, len(self.task.data_iterator))

    def step(self):
        cuda = torch.cuda.is_available() and self.task.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        task = self.step_fn(self.task)
        task.iteration += 1
        task.local_iteration_num += 1
        task.run_hooks("on_step")
        if cuda:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        self.step_losses.append(float(task.last_batch.loss))
        return dt


class _Replay:
    """The same collated batch forever; ``len`` as VISSL's loader (used by ``task.where``)."""

    def __init__(self, batch, length):
        self.batch, self.length = batch, length

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def __len__(self):
        return self.length


def _quiet():
    logging.getLogger().setLevel(logging.WARNING)
    return contextlib.redirect_stdout(io.StringIO())


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


def build_pair(args, tmp):
    with _quiet():
        a = Runner("vissl", args, os.path.join(tmp, "vissl"))
        b = Runner("ours", args, os.path.join(tmp, "ours"))
    # same weights: both heads name their parameters projection_head.* / prototypes0.*
    sd_b = b.task.base_model.state_dict()
    sd_a = a.task.base_model.state_dict()
    assert sd_a.keys() == sd_b.keys(), "model state keys differ between the two heads"
    b.task.base_model.load_state_dict(sd_a)
    batch = a.first_batch()
    a.use_batch(batch)
    b.use_batch(batch)
    return a, b, batch


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def memory_child(args, variant):
    """Run one variant alone; print JSON with its memory figures.  CPU: the process's
    resident-set high-water mark (VmHWM) is reset (``/proc/self/clear_refs``) after the
    first step, so ``peak`` is the largest RSS during the measured steps and ``peak - rss``
    the step's transient memory (activations, gradients, loss and Sinkhorn buffers)."""
    _init_dist()
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        r = Runner(variant, args, tmp)
        r.use_batch(r.first_batch())
        r.step()  # first step allocates optimizer state, grads, queue
        rss_before = _status_kb("VmRSS")
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
        out = {"rss_before_mb": rss_before / 1024, "peak_mb": _status_kb("VmHWM") / 1024,
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
        line = [l for l in proc.stdout.splitlines() if l.startswith("MEMORY_JSON ")]
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
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import vissl  # noqa: F401  (registers the plugin)

    if args.memory_child:
        return memory_child(args, args.memory_child)
    _init_dist()
    if args.queue:
        args.warmup = max(args.warmup, -(-args.queue // args.batch) + 1)
    with tempfile.TemporaryDirectory() as tmp:
        a, b, batch = build_pair(args, tmp)
        n_img = batch["data"][0][0].shape[0] if isinstance(batch["data"][0], list) else args.batch
        times = {"vissl": [], "ours": []}
        with _quiet():
            for i in range(args.warmup + args.steps):
                order = (a, b) if i % 2 == 0 else (b, a)
                for r in order:
                    t = r.step()
                    if i >= args.warmup:
                        times[r.variant].append(t)
        w = args.warmup
        loss = {"vissl": statistics.median(a.loss_ms[w:]), "ours": statistics.median(b.loss_ms[w:])}
        qhook = statistics.median(a.qhook_ms[w:]) if a.qhook_ms[w:] else 0.0
        with _quiet():
            fb = {"vissl": loss_fwd_bwd_ms(a, batch, args.steps), "ours": loss_fwd_bwd_ms(b, batch, args.steps)}
        # same weights, same batch: the first step's losses must agree (sanity check)
        first = {"vissl": a.step_losses[0], "ours": b.step_losses[0]}
    med = {k: statistics.median(v) for k, v in times.items()}
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
    return ratio


if __name__ == "__main__":
    main()
