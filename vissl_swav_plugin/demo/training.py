"""Step 2 of the demo: SwAV pre-training through VISSL's launcher, in a subprocess.

:func:`training_overrides` turns the demo's settings into the launcher's Hydra overrides,
:func:`run_training` runs the plugin's launcher (``tools/run_distributed_engines.py``) with them (the full log in
``train_log.txt``) while :func:`parse_log_line` and :class:`Progress` turn VISSL's
per-iteration log lines into one compact progress line, and :func:`read_loss_curve`
reads the loss curve back from VISSL's ``stdout.json``.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import CONFIG, TRAIN_LOG, DemoError, compose_config, fmt_secs

LAUNCHER = ["-m", "vissl_swav_plugin.tools.launch"]  # = tools/run_distributed_engines.py, also from a wheel
#: how the collapse detector's warning starts: ``collapse_report.COLLAPSE_HEADLINE`` (not imported
#: here: that module pulls in torch; tests/unit/demo/test_demo.py checks the two are equal)
COLLAPSE_HEADLINE = "COLLAPSE DETECTED"


class Progress:
    """One self-updating line on a terminal; a line every ~5% otherwise (logs, CI).

    Example::

        p = Progress(total=468)
        p.update(it=10, ep=0, num_epochs=12, loss=8.1, lr=0.3)
        p.close()
    """

    def __init__(self, total, stream=sys.stdout):
        self.total = max(1, int(total))
        self.stream = stream
        self.tty = stream.isatty()
        self.t0 = None
        self.last_print = -1
        self.width = 0

    def update(self, it, ep, num_epochs, loss, lr):
        """Show iteration ``it`` (of ``total``) of epoch ``ep`` (0-based): loss, lr, it/s, ETA."""
        now = time.time()
        if self.t0 is None:
            self.t0, self.it0 = now, it
        done = it - self.it0
        rate = done / (now - self.t0) if now > self.t0 and done > 0 else 0.0
        eta = (self.total - it) / rate if rate > 0 else float("nan")
        frac = min(1.0, it / self.total)
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (f"  train [{bar}] {it:>5d}/{self.total} it  ep {ep + 1}/{num_epochs}  loss {loss:7.4f}  "
                f"lr {lr:.4f}  {rate:5.2f} it/s  ETA {fmt_secs(eta) if eta == eta else '?'}")
        if self.tty:
            pad = max(0, self.width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.width = len(line)
            self.stream.flush()
        else:
            step = max(1, self.total // 20)
            if it // step != self.last_print // step or it >= self.total or self.last_print < 0:
                print(line, file=self.stream, flush=True)
                self.last_print = it

    def close(self):
        """End the self-updating line (terminal only)."""
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()

    def note(self, text):
        """Print ``text`` on lines of its own (below a self-updating line, which goes on after it)."""
        if self.tty and self.width:
            self.stream.write("\n")
            self.width = 0
        print(text, file=self.stream, flush=True)


def collapse_warnings(log_text):
    """The collapse detector's warnings in a training log, one string each: the
    ``COLLAPSE DETECTED`` line (from those words on) and the indented lines after it.

    Example: a log whose detector fired once gives ``["COLLAPSE DETECTED (swav_plugin_loss):
    100 consecutive iterations ...\n  What the detector saw ..."]``; a quiet run's gives ``[]``.
    """
    found, block = [], None
    for line in log_text.splitlines():
        if COLLAPSE_HEADLINE in line:
            block = [line[line.index(COLLAPSE_HEADLINE):]]
            found.append(block)
        elif block is not None and line.startswith(" "):
            block.append(line)
        else:
            block = None
    return ["\n".join(b) for b in found]


def parse_log_line(line):
    """VISSL's LogLossLrEtaHook line -> ``dict(iter, ep, loss, lr)``, or None for any other line.

    Example::

        >>> parse_log_line("INFO ... [ep: 0] iter: 5; lr: 0.3; loss: 8.25; eta: 0:01:00")
        {'iter': 5, 'ep': 0, 'loss': 8.25, 'lr': 0.3}
    """
    if "] iter: " not in line or "loss: " not in line:
        return None
    try:
        ep = int(line.split("[ep: ", 1)[1].split("]", 1)[0])
        fields = {}
        for part in line.split("] ", 1)[1].split(";"):
            if ":" in part:
                k, v = part.split(":", 1)
                fields[k.strip()] = v.strip()
        lr = fields.get("lr", "nan")
        lr = float(lr.strip("[]").split(",")[0]) if lr else float("nan")
        return dict(iter=int(fields["iter"]), ep=ep, loss=float(fields["loss"]), lr=lr)
    except (IndexError, KeyError, ValueError):
        return None


def hydra_value(v):
    """A Python value in Hydra's override grammar, e.g.
    ``hydra_value({"dims": [128, 256], "use_bn": True}) == "{dims:[128,256],use_bn:True}"``."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v
    if hasattr(v, "items"):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    return "[" + ",".join(hydra_value(x) for x in v) + "]"


def training_overrides(mode, data_folder, ckpt_dir, use_amp, procs, seed, user_overrides=(), device="cpu"):
    """The launcher's command-line overrides for the demo's config.

    Args:
        mode: the mode's sizes (``batch``, ``epochs`` -- set, see :func:`.cli.epochs_for` --,
            ``queue``, ``freeze``, ``prototypes``) and, when present, ``temperature``,
            ``precise_bn`` (HOOKS.PRECISE_BN.ENABLED), ``color_strength`` (the colour-distortion
            strength s of every ``multicrop_plugin`` entry; 0 turns the colour jitter off; None,
            both modes' default, keeps the config's), ``color_warmup_iters`` (the colour-distortion
            warm-up of every ``multicrop_plugin`` entry; 0: none) and ``normalize`` (``dataset`` /
            ``per_image`` for every ``multicrop_plugin`` entry, :mod:`vissl_swav_plugin.transforms.standardize`;
            None keeps the config's).
        data_folder: the ImageFolder to train on (DATA_PATHS and LABEL_PATHS).
        ckpt_dir: VISSL's CHECKPOINT.DIR.
        use_amp: bf16 autocast (MODEL.AMP_PARAMS.USE_AMP).
        procs: gloo processes (DISTRIBUTED.NUM_PROC_PER_NODE).
        seed: SEED_VALUE.
        user_overrides: ``--override`` values, appended after the demo's own (they win), but
            before the per-entry overrides of the transforms that ``color_strength``,
            ``normalize`` and ``color_warmup_iters`` make (those act on the composed list, the
            user's if the user replaced it).
        device: ``"cpu"`` (the config's gloo/bf16 settings) or ``"gpu"`` (NCCL, one process
            per GPU, fp16 AMP with a GradScaler, 8 data-loader workers).

    Returns:
        The list of overrides, ``config=...`` first.  The mode's number of prototypes goes
        into the config's own head entry, unless ``user_overrides`` set MODEL.HEAD.PARAMS.
    """
    if not mode.get("epochs"):
        raise DemoError("the mode's number of epochs is not chosen yet (cli.epochs_for: from the iteration "
                        "budget and the data size)")
    base = [
        f"config={CONFIG}",
        f"config.DATA.TRAIN.DATA_PATHS=[{data_folder}]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{data_folder}]",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={mode['batch']}",
        f"config.OPTIMIZER.num_epochs={mode['epochs']}",
        f"config.LOSS.swav_plugin_loss.queue.queue_length={mode['queue']}",
        f"config.LOSS.swav_plugin_loss.freeze_prototypes_niters={mode['freeze']}",
        f"config.MODEL.AMP_PARAMS.USE_AMP={use_amp}",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={procs}",
        f"config.SEED_VALUE={seed}",
        f"config.CHECKPOINT.DIR={ckpt_dir}",
    ]
    if mode.get("temperature") is not None:
        base.append(f"config.LOSS.swav_plugin_loss.temperature={mode['temperature']}")
    if mode.get("precise_bn") is not None:
        base.append(f"config.HOOKS.PRECISE_BN.ENABLED={bool(mode['precise_bn'])}")
    if device == "gpu":
        base += ["config.MACHINE.DEVICE=gpu", "config.DISTRIBUTED.BACKEND=nccl",
                 "config.MODEL.AMP_PARAMS.AMP_DTYPE=float16", "config.DATA.NUM_DATALOADER_WORKERS=8",
                 # fork-started loader workers: VISSL's default, forkserver, starts every worker as a
                 # fresh interpreter that imports torch and VISSL again (about 70 s for 8 workers on
                 # a 16-core H100 machine, docs/gpu.md); the workers now persist across epochs
                 # (DATA.PERSISTENT_WORKERS), so fork saves that wait once, at the start
                 "config.MULTI_PROCESSING_METHOD=fork"]
    user = list(user_overrides)
    composed = compose_config(base + user)
    transforms = list(composed.DATA.TRAIN.TRANSFORMS or [])
    crops = [i for i, t in enumerate(transforms) if t.get("name") == "multicrop_plugin"]
    for key in ("color_strength", "color_warmup_iters", "normalize"):
        if mode.get(key) is not None and not crops:
            raise DemoError(f"{CONFIG}: --{key.replace('_', '-')} needs a multicrop_plugin entry in "
                            f"DATA.TRAIN.TRANSFORMS, got {[t.get('name') for t in transforms]}")
    # Per-entry overrides of the transforms come after the user's: their indices are those of the
    # composed list, which a user's --override may have replaced (before, --color-strength on a
    # user's own TRANSFORMS list was silently lost under it).
    entry = []
    if mode.get("color_strength") is not None:
        entry += [f"++config.DATA.TRAIN.TRANSFORMS.{i}.color_strength={mode['color_strength']}" for i in crops]
    if mode.get("normalize") is not None:
        entry += _normalize_overrides(mode["normalize"], transforms, crops)
    if mode.get("color_warmup_iters") is not None:
        entry += _warmup_overrides(int(mode["color_warmup_iters"]), transforms, crops)
    if not any(o.split("=", 1)[0].lstrip("+") == "config.MODEL.HEAD.PARAMS" for o in user):
        head = [list(p) for p in composed.MODEL.HEAD.PARAMS]
        if len(head) != 1 or head[0][0] != "swav_plugin_head":
            raise DemoError(f"{CONFIG}: expected one swav_plugin_head in MODEL.HEAD.PARAMS, got {head}")
        params = dict(head[0][1])
        params["num_clusters"] = [mode["prototypes"]]
        base.append(f"config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{hydra_value(params)}]]")
    return base + user + entry


def _normalize_overrides(normalize, transforms, crops):
    """Overrides that set ``normalize`` on the ``multicrop_plugin`` entries ``crops`` of
    ``transforms``: ``per_image`` also deletes their ``mean`` / ``std`` (which cannot act
    then) and ``dataset`` their ``min_std``."""
    drop = ("mean", "std") if normalize == "per_image" else ("min_std",)
    out = []
    for i in crops:
        out.append(f"++config.DATA.TRAIN.TRANSFORMS.{i}.normalize={normalize}")
        out += [f"~config.DATA.TRAIN.TRANSFORMS.{i}.{key}" for key in drop if key in transforms[i]]
    return out


def _warmup_overrides(iters, transforms, crops):
    """Overrides that set ``color_warmup_iters`` on the ``multicrop_plugin`` entries ``crops``:
    0 also deletes their ``color_warmup_strength`` and ``color_warmup_schedule`` (they could
    not act); more needs a strength."""
    out = []
    for i in crops:
        has = "color_warmup_strength" in transforms[i]
        if iters > 0 and not has:
            raise DemoError(f"{CONFIG}: --color-warmup-iters {iters} needs a color_warmup_strength in "
                            f"DATA.TRAIN.TRANSFORMS[{i}] (the warm-up's strength)")
        out.append(f"++config.DATA.TRAIN.TRANSFORMS.{i}.color_warmup_iters={iters}")
        if iters == 0:  # the warm-up's other keys could not act: removed
            out += [f"~config.DATA.TRAIN.TRANSFORMS.{i}.{key}" for key in ("color_warmup_strength",
                                                                           "color_warmup_schedule")
                    if key in transforms[i]]
    return out


class TrainingStopped(Exception):
    """SIGTERM or SIGHUP reached the demo while the launcher ran; the launcher's processes were
    stopped before this was raised.  ``signum``: the signal."""

    def __init__(self, signum):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def _termination_raises():
    """While inside: SIGTERM and SIGHUP raise :class:`TrainingStopped` in the main thread
    instead of ending the process at once.  The launcher runs in its own session (so that its
    whole process group can be stopped), so it would not see a signal sent to the demo, and
    the training would go on with nobody reading its output.  Outside the main thread, where
    handlers cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise TrainingStopped(signum)

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def run_training(overrides, run_dir, total_iters, num_epochs, threads):
    """Run VISSL's launcher with ``overrides`` in ``run_dir`` and show its progress.

    The command goes to ``run_dir/train_command.txt``, its whole output to
    ``run_dir/train_log.txt``; an interrupt (Ctrl-C) stops the launcher's process group.

    Returns:
        ``(parsed, wall_s)``: the loss records parsed from the log (:func:`parse_log_line`)
        and the launcher's wall time in seconds.

    Raises:
        DemoError: the launcher failed (the message holds the log's last 40 lines).
        TrainingStopped: SIGTERM or SIGHUP arrived; the launcher's processes were stopped.
    """
    log_path = run_dir / TRAIN_LOG
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               PYTHONWARNINGS="ignore")
    cmd = [sys.executable, *LAUNCHER, *overrides]
    (run_dir / "train_command.txt").write_text(" ".join(cmd) + "\n")
    progress = Progress(total_iters)
    curve = []
    warned = False
    t0 = time.time()
    with open(log_path, "w") as log, _termination_raises():
        proc = subprocess.Popen(cmd, cwd=str(run_dir), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        try:
            for line in proc.stdout:
                log.write(line)
                if COLLAPSE_HEADLINE in line and not warned:  # the detector's warning: shown, not only logged
                    warned = True
                    progress.note(f"  WARNING: {line[line.index(COLLAPSE_HEADLINE):].rstrip()}\n"
                                  f"  (the whole message, with the config keys to change: {log_path})")
                rec = parse_log_line(line)
                if rec is not None:
                    curve.append(rec)
                    progress.update(rec["iter"], rec["ep"], num_epochs, rec["loss"], rec["lr"])
            proc.wait()
        except BaseException:
            _stop(proc)
            raise
        finally:
            progress.close()
    wall = time.time() - t0
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise DemoError(f"VISSL training failed (exit code {proc.returncode}); last lines of {log_path}:\n{tail}")
    return curve, wall


def _stop(proc):
    """SIGTERM the launcher's process group, SIGKILL it if it has not ended within 10 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def final_checkpoint(ckpt_dir):
    """The last ``model_final_checkpoint_phase*.torch`` VISSL wrote in ``ckpt_dir``."""
    finals = sorted(Path(ckpt_dir).glob("model_final_checkpoint_phase*.torch"))
    if not finals:
        raise DemoError(f"training finished but wrote no final checkpoint in {ckpt_dir}")
    return finals[-1]


def read_loss_curve(ckpt_dir, parsed):
    """Loss per iteration, ``[dict(iter, ep, loss, lr), ...]`` sorted by iteration, from
    VISSL's ``stdout.json`` (rank 0), else from the records ``parsed`` from the log."""
    path = Path(ckpt_dir) / "stdout.json"
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                d = json.loads(line)
                rows.append(dict(iter=int(d["iter"]), ep=int(d["ep"]), loss=float(d["loss"]),
                                 lr=float(d["lr"][0] if isinstance(d["lr"], list) else d["lr"])))
            except (ValueError, KeyError, TypeError):
                continue
    rows = rows or parsed
    by_iter = {r["iter"]: r for r in rows}
    return [by_iter[i] for i in sorted(by_iter)]


# -- --amp auto on a CPU: the training step timed in fp32 and in bf16 autocast --------------
def step_config(mode, procs, seed, user_overrides=()):
    """The VISSL config the training will compose (the mode's batch and prototypes, the
    user's ``--override`` values), without data paths or epochs: what the step's timing needs."""
    overrides = training_overrides(dict(mode, epochs=mode.get("epochs") or 1), "/nonexistent/demo_data",
                                   "/nonexistent/demo_checkpoints", False, procs, seed, user_overrides)
    return compose_config(overrides)


def step_shape(config, threads):
    """The recipe's shape as the cache key of the step's timing holds it: per-process batch,
    crops, trunk, head and loss (a digest of their config blocks), threads per process."""
    import hashlib

    crops = _crop_sizes(config)
    loss = config.LOSS.name
    blocks = dict(trunk=config.MODEL.TRUNK, head=config.MODEL.HEAD.PARAMS, loss=config.LOSS.get(loss, {}),
                  input=config.MODEL.get("INPUT_TYPE", "rgb"))
    digest = hashlib.sha1(json.dumps(blocks, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return dict(batch=int(config.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
                crops="+".join(f"{n}x{s}" for n, s in crops), trunk=config.MODEL.TRUNK.NAME, loss=loss,
                threads=int(threads), model_digest=digest)


def _crop_sizes(config):
    """``[(number, size), ...]`` of the first multi-crop transform (``num_crops`` and
    ``size_crops``); one 28-px crop where the transforms have none."""
    for t in config.DATA.TRAIN.TRANSFORMS or []:
        if "num_crops" in t and "size_crops" in t:
            return [(int(n), int(s)) for n, s in zip(t["num_crops"], t["size_crops"])]
    return [(1, 28)]


def fp32_head(config):
    """Whether the config's head stays in fp32 under autocast (``fp32_head`` of its entries)."""
    return all(bool(dict(p[1]).get("fp32_head", False)) for p in config.MODEL.HEAD.PARAMS if len(p) > 1)


def step_timer(config, threads, warmup=2, min_rounds=3, max_rounds=12, budget_s=3.0, give_up=None):
    """A timer for :func:`vissl_swav_plugin.utils.amp_measure.measure_or_reuse`: it builds the
    config's model (VISSL's ``build_model``: trunk and head) and loss, random inputs of the
    config's per-process batch and crops, and times one training step (forward of the crops
    as VISSL's multi-resolution forward, loss with its Sinkhorn codes, backward, SGD step) in
    fp32 and under bf16 autocast (as the training's ``MODEL.AMP_PARAMS``: the head stays fp32
    where the config says ``fp32_head``), alternated (:func:`.time_alternating`), on
    ``threads`` torch threads, the training process's.  Returns ``{"fp32": [s, ...],
    "bf16": [s, ...]}``; the process's threads and random state are left as they were.

    The bf16 timing stops as soon as a warm-up step of it takes ``give_up`` times fp32's
    (default :data:`~vissl_swav_plugin.utils.amp_measure.GIVE_UP`, twice), the step itself
    at about that moment: every module's forward and every parameter's gradient check the
    deadline, so on a CPU without bf16 units (a bf16 step ten times fp32's) the choice costs
    part of one bf16 step (``give_up=float("inf")`` times every round)."""

    def timer():
        import torch
        from classy_vision.losses import build_loss
        from vissl.models import build_model

        from vissl_swav_plugin.utils.amp_measure import GIVE_UP, StepTooSlow, time_alternating

        before = torch.get_num_threads()
        torch.set_num_threads(max(1, int(threads)))
        try:
            with torch.random.fork_rng():
                torch.manual_seed(0)
                model = build_model(config.MODEL, config.OPTIMIZER).train()
                name = config.LOSS.name
                loss_fn = build_loss(dict(config.LOSS[name], name=name))  # as VISSL's task builds it
                batch = int(config.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
                crops = [torch.randn(batch, 3, s, s) for n, s in _crop_sizes(config) for _ in range(n)]
                target = torch.zeros(batch, dtype=torch.long)
                opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, weight_decay=1e-5)

                modules = list(model.modules()) + list(loss_fn.modules())
                params = [p for p in model.parameters() if p.requires_grad]

                def stop_at(deadline):
                    """Hooks that stop the step at ``deadline``: before every module's forward
                    and at every parameter's gradient (the backward is most of a bf16 step)."""
                    def check(*_):
                        if time.perf_counter() >= deadline:
                            raise StepTooSlow()
                    return ([m.register_forward_pre_hook(check) for m in modules]
                            + [p.register_hook(check) for p in params])

                def step(bf16, deadline=None):
                    hooks = stop_at(deadline) if deadline is not None else []
                    try:
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                            out = model(crops)
                            loss = loss_fn(out[0] if len(out) == 1 else out, target)
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                    finally:
                        for h in hooks:
                            h.remove()
                    opt.step()

                return time_alternating({"fp32": lambda: step(False), "bf16": lambda **kw: step(True, **kw)},
                                        warmup=warmup, min_rounds=min_rounds, max_rounds=max_rounds,
                                        budget_s=budget_s, give_up=GIVE_UP if give_up is None else give_up)
        finally:
            torch.set_num_threads(before)

    return timer
