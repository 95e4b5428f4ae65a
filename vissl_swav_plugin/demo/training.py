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
#: here: that module pulls in torch; tests/test_demo.py checks the two are equal)
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
                 # fresh interpreter that imports torch and VISSL again, at every epoch (VISSL makes
                 # its DataLoader without persistent_workers); on a 16-core H100 machine that took
                 # about 70 s per epoch against a few seconds of training (docs/gpu.md)
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
