#!/usr/bin/env python
"""`make demo`: SwAV on Fashion-MNIST on a few CPU cores, end to end.

1. data      -- a class-balanced subset of Fashion-MNIST's training set is written as a
                VISSL ``disk_folder`` (ImageFolder of PNGs) by tools/prepare_fashion_mnist.py
                (reused on the next run);
2. training  -- SwAV pre-training through VISSL's launcher (tools/run_distributed_engines.py,
                a subprocess; 2 gloo processes by default) with
                config=pretrain/swav/swav_fashion_mnist_cpu; VISSL's per-iteration log lines
                are turned into one compact progress line (loss, lr, it/s, ETA), the full
                log goes to OUT/train_log.txt;
3. evaluation -- the final checkpoint is loaded (strictly) into the VISSL model built from
                the same config, in this process, and the trunk's ``res5avg`` features of
                the training subset (the kNN memory bank) and of the test images are
                extracted; the same is done for the randomly initialised model (same
                config, same seed); kNN top-1 (weighted cosine 20-NN / 200-NN as in Wu et
                al. 2018 and VISSL, plain Euclidean 5-NN) for SwAV features, random-init
                features and raw pixels, all on the same train / test images;
4. report    -- OUT/swav_demo_report.png (loss curve, kNN bar chart, images of the
                most-used prototypes) and OUT/swav_demo_report.json (every figure: times,
                accuracies, config).

    python tools/demo.py                 # the full demo (about 11 min on 2 CPU cores)
    python tools/demo.py --quick         # a 4-minute version (smaller subset; the tests)
    python tools/demo.py --help
"""
import argparse
import datetime
import fcntl
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "tools" / "run_distributed_engines.py"
CONFIG = "pretrain/swav/swav_fashion_mnist_cpu"
REPORT_PNG = "swav_demo_report.png"
REPORT_JSON = "swav_demo_report.json"
CLASS_TITLES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
# the raw-pixel 5-NN top-1 of the Fashion-MNIST benchmark (60k train / 10k test)
RAW_PIXEL_5NN_FULL = 85.5

# Settings of the two modes.  Everything not listed comes from the yaml config.
MODES = {
    "full": dict(train_per_class=1000, test_per_class=1000, epochs=16, batch=64, queue=0,
                 freeze=100, prototypes=100),
    "quick": dict(train_per_class=500, test_per_class=100, epochs=12, batch=64, queue=0,
                  freeze=30, prototypes=100),
}


class DemoError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------
def _load_tool(name):
    spec = importlib.util.spec_from_file_location(f"_demo_{name}", REPO / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fmt_secs(s):
    return str(datetime.timedelta(seconds=int(round(max(0.0, s)))))


def _cpu_seconds():
    """CPU time (user + system) of this process and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _bf16_native():
    """True where bf16 matmuls/convs run natively (AVX512-BF16 / AMX), i.e. bf16 autocast
    is a speed-up; elsewhere it would be emulated and slower than fp32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # pragma: no cover - other builds
        return False


class Progress:
    """One self-updating line on a terminal; a line every ~5% otherwise (logs, CI)."""

    def __init__(self, total, stream=sys.stdout):
        self.total = max(1, int(total))
        self.stream = stream
        self.tty = stream.isatty()
        self.t0 = None
        self.last_print = -1
        self.width = 0

    def update(self, it, ep, num_epochs, loss, lr):
        now = time.time()
        if self.t0 is None:
            self.t0, self.it0 = now, it
        done = it - self.it0
        rate = done / (now - self.t0) if now > self.t0 and done > 0 else 0.0
        eta = (self.total - it) / rate if rate > 0 else float("nan")
        frac = min(1.0, it / self.total)
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (f"  train [{bar}] {it:>5d}/{self.total} it  ep {ep + 1}/{num_epochs}  loss {loss:7.4f}  "
                f"lr {lr:.4f}  {rate:5.2f} it/s  ETA {_fmt_secs(eta) if eta == eta else '?'}")
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
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def parse_log_line(line):
    """VISSL's LogLossLrEtaHook line -> dict(iter, ep, loss, lr) or None."""
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


# --------------------------------------------------------------------------------------
# 1. data
# --------------------------------------------------------------------------------------
def prepare_data(args, mode):
    tool = _load_tool("prepare_fashion_mnist")
    try:
        return _prepare_data(tool, args, mode)
    except tool.DataToolError as e:  # missing / truncated / corrupt IDX files, unwritable folder
        raise DemoError(f"{e}\n(`make demo` installs Fashion-MNIST via tools/install_env.sh)") from None


def _prepare_data(tool, args, mode):
    source = Path(args.source)
    for split in ("train", "val"):
        for kind in ("images-idx3", "labels-idx1"):
            tool._find_source(source, split, kind)
    folder = Path(args.data_dir) / f"fashion_mnist_{mode['train_per_class']}pc"
    folder.mkdir(parents=True, exist_ok=True)
    # one writer at a time (concurrent demos / tests); a folder already complete is reused
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = tool.prepare(folder, source=source, splits=("train",),
                               limit_per_class=mode["train_per_class"], formats=("folder",), verbose=False,
                               force=True)  # the folder is the demo's own: redo an interrupted write
    train_images, train_labels = tool.load_split(source, "train")
    keep = tool.select_indices(train_labels, mode["train_per_class"])
    test_images, test_labels = tool.load_split(source, "val")
    keep_test = tool.select_indices(test_labels, mode["test_per_class"])
    n_written = sum(summary["splits"]["train"]["counts"])
    if n_written != len(keep):
        raise DemoError(f"{folder}: holds {n_written} training images, expected {len(keep)}")
    return dict(
        folder=Path(summary["splits"]["train"]["dir"]),
        train_x=train_images[keep], train_y=train_labels[keep], train_index=keep,
        test_x=test_images[keep_test], test_y=test_labels[keep_test], test_index=keep_test,
    )


# --------------------------------------------------------------------------------------
# 2. training (VISSL launcher, subprocess)
# --------------------------------------------------------------------------------------
def _hydra_value(v):
    """A Python value as Hydra override grammar (``{dims:[128,256],use_bn:True}``)."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v
    if hasattr(v, "items"):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    return "[" + ",".join(_hydra_value(x) for x in v) + "]"


def compose_config(overrides):
    import vissl  # noqa: F401  (the plugin registers itself on import)
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    with warnings.catch_warnings():  # Hydra 1.3's notes on VISSL's version_base-less init
        warnings.simplefilter("ignore")
        cfg = compose_hydra_configuration(list(overrides))
    return convert_to_attrdict(cfg, dump_config=False)[1]


def training_overrides(args, mode, data_folder, ckpt_dir, use_amp):
    """The launcher's command-line overrides; the number of prototypes of the mode goes
    into the config's own head entry (unless --override sets MODEL.HEAD.PARAMS)."""
    base = [
        f"config={CONFIG}",
        f"config.DATA.TRAIN.DATA_PATHS=[{data_folder}]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{data_folder}]",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={mode['batch']}",
        f"config.OPTIMIZER.num_epochs={mode['epochs']}",
        f"config.LOSS.swav_plugin_loss.queue.queue_length={mode['queue']}",
        f"config.LOSS.swav_plugin_loss.freeze_prototypes_niters={mode['freeze']}",
        f"config.MODEL.AMP_PARAMS.USE_AMP={use_amp}",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={args.procs}",
        f"config.SEED_VALUE={args.seed}",
        f"config.CHECKPOINT.DIR={ckpt_dir}",
    ]
    user = list(args.override)
    if not any(o.split("=", 1)[0].lstrip("+") == "config.MODEL.HEAD.PARAMS" for o in user):
        head = [list(p) for p in compose_config(base + user).MODEL.HEAD.PARAMS]
        if len(head) != 1 or head[0][0] != "swav_plugin_head":
            raise DemoError(f"{CONFIG}: expected one swav_plugin_head in MODEL.HEAD.PARAMS, got {head}")
        params = dict(head[0][1])
        params["num_clusters"] = [mode["prototypes"]]
        base.append(f"config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{_hydra_value(params)}]]")
    return base + user


def run_training(overrides, run_dir, total_iters, num_epochs, threads):
    log_path = run_dir / "train_log.txt"
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(LAUNCHER), *overrides]
    (run_dir / "train_command.txt").write_text(" ".join(cmd) + "\n")
    progress = Progress(total_iters)
    curve = []
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=str(run_dir), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        try:
            for line in proc.stdout:
                log.write(line)
                rec = parse_log_line(line)
                if rec is not None:
                    curve.append(rec)
                    progress.update(rec["iter"], rec["ep"], num_epochs, rec["loss"], rec["lr"])
            proc.wait()
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            progress.close()
    wall = time.time() - t0
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise DemoError(f"VISSL training failed (exit code {proc.returncode}); last lines of {log_path}:\n{tail}")
    return curve, wall


def read_loss_curve(ckpt_dir, parsed):
    """Loss per iteration from VISSL's stdout.json (rank 0), else from the parsed log."""
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


# --------------------------------------------------------------------------------------
# 3. evaluation (in process)
# --------------------------------------------------------------------------------------
def build_vissl_model(overrides, seed):
    import torch
    from vissl.models import build_model

    config = compose_config(overrides)
    torch.manual_seed(seed)
    model = build_model(config.MODEL, config.OPTIMIZER)
    return config, model.eval()


def load_checkpoint(model, ckpt_path):
    """Strict load of the trunk and heads saved by VISSL's checkpoint hook."""
    import torch

    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    try:
        state = ckpt["classy_state_dict"]["base_model"]["model"]
    except (KeyError, TypeError):
        raise DemoError(f"{ckpt_path}: not a VISSL training checkpoint (no classy_state_dict/base_model)") from None
    model.trunk.load_state_dict(state["trunk"], strict=True)
    model.heads.load_state_dict(state["heads"], strict=True)
    return ckpt


def to_input(images_u8, mean, std):
    """uint8 [N, 28, 28] gray -> normalised float [N, 3, 28, 28], exactly what the training
    pipeline does to a full image (PNG -> RGB -> tensor -> normalise), without cropping."""
    import torch

    x = torch.from_numpy(images_u8).float().div_(255.0)[:, None].expand(-1, 3, -1, -1)
    m = torch.tensor(mean, dtype=torch.float32)[None, :, None, None]
    s = torch.tensor(std, dtype=torch.float32)[None, :, None, None]
    return (x - m) / s


def extract(model, images_u8, mean, std, batch=500):
    """res5avg trunk features and the head's prototype scores (fp32, eval mode)."""
    import torch

    feats, scores = [], []
    with torch.no_grad():
        for i in range(0, len(images_u8), batch):
            x = to_input(images_u8[i:i + batch], mean, std)
            f = model.trunk(x, out_feat_keys=["res5avg"])[0].flatten(1)
            out = model.heads[0](f)
            feats.append(f)
            scores.append(out[-1])
    return torch.cat(feats), torch.cat(scores)


def describe_model(config):
    trunk = config.MODEL.TRUNK
    if trunk.NAME == "resnet_small_plugin":
        p = dict(trunk.get("RESNET_SMALL_PLUGIN", {}) or {})
        return f"ResNet-{p.get('DEPTH', 18)} (width {p.get('WIDTH', 64)})"
    return str(trunk.NAME)


def describe_crops(config):
    for t in config.DATA.TRAIN.TRANSFORMS:
        if t["name"] in ("multicrop_plugin", "ImgPilToMultiCrop"):
            return "multi-crop " + "+".join(f"{n}x{s}" for n, s in zip(t["num_crops"], t["size_crops"]))
    return "single crop"


def transform_stats(config):
    for t in config.DATA.TRAIN.TRANSFORMS:
        if t["name"] == "multicrop_plugin":
            return list(t.get("mean", (0.485, 0.456, 0.406))), list(t.get("std", (0.229, 0.224, 0.225)))
    return [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]


def prototype_summary(scores, labels, top_protos=8, per_row=10):
    """Assign each image to its best prototype; purity; the most-used prototypes with their
    highest-scoring images."""
    import numpy as np

    s = scores.numpy()
    assign = s.argmax(1)
    counts = np.bincount(assign, minlength=s.shape[1])
    used = int((counts > 0).sum())
    majority = 0
    for p in np.nonzero(counts)[0]:
        majority += np.bincount(labels[assign == p], minlength=10).max()
    purity = 100.0 * majority / len(labels)
    rows = []
    for p in np.argsort(-counts, kind="stable")[:top_protos]:
        members = np.nonzero(assign == p)[0]
        if len(members) == 0:
            continue
        best = members[np.argsort(-s[members, p], kind="stable")[:per_row]]
        hist = np.bincount(labels[members], minlength=10)
        rows.append(dict(prototype=int(p), size=int(len(members)), images=best.tolist(),
                         majority_class=CLASS_TITLES[int(hist.argmax())],
                         majority_pct=round(100.0 * hist.max() / len(members), 1)))
    return dict(num_prototypes=int(s.shape[1]), prototypes_used=used, purity_pct=round(purity, 2), rows=rows)


def random_init_seeds(seed, num_epochs, count):
    """Torch seeds of the random-init baselines: first the training's own starting point
    (VISSL's ``set_seeds`` seeds rank 0 with ``(SEED_VALUE + 0) * num_epochs`` and DDP gives
    every rank rank 0's weights), then ``count - 1`` other initialisations."""
    first = int(seed) * int(num_epochs)
    return [first] + [first + 1000 * j for j in range(1, count)]


def evaluate(overrides, ckpt_path, data, seed, random_inits=5, log=print):
    """kNN of the trained network, of ``random_inits`` randomly initialised copies (the
    first is the training's own starting point; their mean is the baseline, the spread is
    reported) and of the raw pixels, all on the same memory bank and test images."""
    import numpy as np
    import torch
    from vissl_swav_plugin.knn import knn_report

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config, trained = build_vissl_model(overrides, seed)
    load_checkpoint(trained, ckpt_path)
    mean, std = transform_stats(config)
    results, timings, protos = {}, {}, {}
    ytr, yte = data["train_y"].astype(np.int64), data["test_y"].astype(np.int64)

    def features_knn(name, model):
        t = time.time()
        ftr, _ = extract(model, data["train_x"], mean, std)
        fte, ste = extract(model, data["test_x"], mean, std)
        t_feat = time.time() - t
        r = knn_report(ftr, ytr, fte, yte, num_classes=10)
        r["feature_dim"] = int(ftr.shape[1])
        timings[name] = dict(extract_s=round(t_feat, 2), total_s=round(time.time() - t, 2))
        log(f"  {name:14s} features {tuple(ftr.shape)} + {tuple(fte.shape)}: "
            + ", ".join(f"{k} {v:.2f}%" for k, v in r.items() if k.startswith(("knn", "nn"))))
        return r, ste

    results["swav"], scores = features_knn("swav", trained)
    protos["swav"] = prototype_summary(scores, yte)
    per_init = []
    for i, init_seed in enumerate(random_init_seeds(seed, config.OPTIMIZER.num_epochs, random_inits)):
        _, model = build_vissl_model(overrides, init_seed)
        r, scores = features_knn(f"random_init[{i}]", model)
        per_init.append(dict(r, torch_seed=init_seed))
        if i == 0:
            protos["random_init"] = prototype_summary(scores, yte)
    metrics = [k for k in per_init[0] if k.startswith(("knn", "nn"))]
    results["random_init"] = {m: float(np.mean([r[m] for r in per_init])) for m in metrics}
    results["random_init"]["feature_dim"] = per_init[0]["feature_dim"]
    results["random_init"]["range"] = {m: [round(min(r[m] for r in per_init), 2),
                                           round(max(r[m] for r in per_init), 2)] for m in metrics}
    results["random_init"]["per_init"] = per_init
    t = time.time()
    px_tr = torch.from_numpy(data["train_x"].reshape(len(ytr), -1)).float() / 255.0
    px_te = torch.from_numpy(data["test_x"].reshape(len(yte), -1)).float() / 255.0
    results["raw_pixels"] = knn_report(px_tr, ytr, px_te, yte, num_classes=10)
    results["raw_pixels"]["feature_dim"] = int(px_tr.shape[1])
    timings["raw_pixels"] = dict(total_s=round(time.time() - t, 2))
    log(f"  {'raw_pixels':12s} {tuple(px_tr.shape)} + {tuple(px_te.shape)}: "
        + ", ".join(f"{k} {v:.2f}%" for k, v in results["raw_pixels"].items() if k.startswith(("knn", "nn"))))
    return config, results, protos, timings


# --------------------------------------------------------------------------------------
# 4. report
# --------------------------------------------------------------------------------------
def make_figure(path, curve, results, protos, test_x, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.gridspec import GridSpec

    fig = plt.figure(figsize=(17, 9.5), dpi=110)
    gs = GridSpec(2, 2, width_ratios=[1.0, 1.05], height_ratios=[1, 1], wspace=0.18, hspace=0.38,
                  left=0.05, right=0.985, top=0.88, bottom=0.07)
    fig.suptitle(meta["title"], fontsize=15, fontweight="bold")
    fig.text(0.5, 0.925, meta["subtitle"], ha="center", fontsize=10.5, color="#333333")

    # (1) loss curve
    ax = fig.add_subplot(gs[0, 0])
    it = np.array([r["iter"] for r in curve])
    loss = np.array([r["loss"] for r in curve])
    ax.plot(it, loss, color="#9ecae1", lw=0.8, label="per iteration (rank 0)")
    if len(loss) >= 10:
        w = max(5, len(loss) // 40)
        smooth = np.convolve(loss, np.ones(w) / w, mode="valid")
        ax.plot(it[w - 1:], smooth, color="#08519c", lw=2.0, label=f"moving average ({w} it)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("SwAV loss (swapped prediction)")
    ax.set_title("(1) Training loss", loc="left", fontweight="bold")
    ax.grid(alpha=0.3)
    ep_iters = sorted({r["iter"] for r in curve if r["iter"] > 0 and
                       any(q["iter"] == r["iter"] - 1 and q["ep"] != r["ep"] for q in curve)})
    for x in ep_iters:
        ax.axvline(x, color="#bbbbbb", lw=0.6, ls=":")
    ax2 = ax.twinx()
    ax2.plot(it, [r["lr"] for r in curve], color="#e6550d", lw=1.0, alpha=0.7, label="learning rate")
    ax2.set_ylabel("learning rate", color="#e6550d")
    ax2.tick_params(axis="y", colors="#e6550d")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8.5)

    # (2) kNN bars
    ax = fig.add_subplot(gs[1, 0])
    methods = [("swav", "SwAV features (res5avg)", "#2171b5"),
               ("random_init", "random-init features (same trunk; mean, min-max of "
                               f"{len(results['random_init'].get('per_init', [])) or 1} inits)", "#9e9ac8"),
               ("raw_pixels", "raw pixels (784-d)", "#969696")]
    metrics = [("knn20", "20-NN\n(weighted cosine)"), ("knn200", "200-NN\n(weighted cosine)"),
               ("nn5_euclid", "5-NN\n(Euclidean, majority)")]
    x = np.arange(len(metrics))
    width = 0.26
    allv = []
    for j, (key, label, color) in enumerate(methods):
        vals = [results[key][m] for m, _ in metrics]
        allv += vals
        spread = results[key].get("range")
        yerr = None
        if spread:
            yerr = np.array([[v - spread[m][0], spread[m][1] - v] for v, (m, _) in zip(vals, metrics)]).T
            allv += [spread[m][0] for m, _ in metrics]
        bars = ax.bar(x + (j - 1) * width, vals, width, label=label, color=color, yerr=yerr, capsize=3,
                      error_kw=dict(lw=0.9, ecolor="#444444"))
        for i, (b, v) in enumerate(zip(bars, vals)):
            top = v if yerr is None else v + yerr[1][i]
            ax.text(b.get_x() + b.get_width() / 2, top + 0.3, f"{v:.1f}", ha="center", va="bottom", fontsize=8.5)
    lo = max(0.0, np.floor(min(allv) / 5.0) * 5.0 - 12.0)  # room for the legend under the bars
    ax.set_ylim(lo, min(100.0, max(allv) + 6.0))
    ax.set_xticks(x, [lbl for _, lbl in metrics])
    ax.set_ylabel("top-1 accuracy on the test images (%)")
    ax.set_title(f"(2) kNN classification: {meta['n_train']} train (memory bank) / {meta['n_test']} test images",
                 loc="left", fontweight="bold")
    ax.axhline(RAW_PIXEL_5NN_FULL, color="#636363", lw=0.8, ls="--")
    ax.text(len(metrics) - 0.5, RAW_PIXEL_5NN_FULL + 0.2,
            f"raw-pixel 5-NN, full 60k/10k: {RAW_PIXEL_5NN_FULL}%", ha="right", va="bottom", fontsize=8,
            color="#636363")
    ax.legend(loc="lower left", fontsize=8.5, framealpha=0.95)
    ax.grid(axis="y", alpha=0.3)

    # (3) prototype grid
    ax = fig.add_subplot(gs[:, 1])
    rows = protos["rows"]
    per_row = max((len(r["images"]) for r in rows), default=1)
    pad = 2
    h = w = test_x.shape[1]
    canvas = np.full((len(rows) * (h + pad) + pad, per_row * (w + pad) + pad), 255, dtype=np.uint8)
    for i, r in enumerate(rows):
        for j, idx in enumerate(r["images"]):
            y0, x0 = pad + i * (h + pad), pad + j * (w + pad)
            canvas[y0:y0 + h, x0:x0 + w] = 255 - test_x[idx]  # dark garments on white
    ax.imshow(canvas, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([pad + i * (h + pad) + h / 2 for i in range(len(rows))],
                  [f"proto {r['prototype']}\n{r['size']} imgs\n{r['majority_pct']:.0f}% {r['majority_class']}"
                   for r in rows], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(f"(3) The {len(rows)} most used of {protos['num_prototypes']} prototypes: their "
                 f"top-{per_row} test images\n(each test image assigned to its best prototype; "
                 f"majority-class purity over all {meta['n_test']}: {protos['purity_pct']:.1f}%)",
                 loc="left", fontweight="bold", fontsize=10.5)
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    # VISSL 0.1.6 / Classy Vision import-time deprecation notices (torch.jit.script, Hydra
    # version_base, ...) would drown the progress display; the training log keeps them
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smaller run (5000 train / 1000 test images, 12 epochs), about 4 minutes; used by the tests")
    ap.add_argument("--out", default=str(REPO / "demo_output"), help="report folder (default demo_output/)")
    ap.add_argument("--data-dir", default=str(REPO / "data"),
                    help="where the Fashion-MNIST ImageFolder is written / reused (default data/)")
    ap.add_argument("--source", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST IDX files")
    ap.add_argument("--seed", type=int, default=0, help="VISSL SEED_VALUE (also the random-init model's seed)")
    ap.add_argument("--procs", type=int, default=2, help="gloo training processes (default 2)")
    ap.add_argument("--random-inits", type=int, default=5,
                    help="random initialisations averaged for the random-init baseline (default 5; the "
                         "first is the training's own starting point)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per training process (default: cores / procs)")
    ap.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                    help="bf16 autocast: auto = on where the CPU has native bf16 (default)")
    for key in MODES["full"]:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None,
                        help=f"override the mode's {key} (full {MODES['full'][key]}, quick {MODES['quick'][key]})")
    ap.add_argument("--override", action="append", default=[],
                    help="extra VISSL override for training and evaluation, e.g. "
                         "config.OPTIMIZER.weight_decay=1e-5 (repeatable)")
    args = ap.parse_args(argv)
    mode = dict(MODES["quick" if args.quick else "full"])
    for key in mode:
        if getattr(args, key) is not None:
            mode[key] = getattr(args, key)
    if args.procs < 1:
        ap.error("--procs must be >= 1")
    if args.random_inits < 1:
        ap.error("--random-inits must be >= 1")

    t_start, cpu_start = time.time(), _cpu_seconds()
    load_start = os.getloadavg()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.procs)
    use_amp = {"on": True, "off": False}.get(args.amp)
    if use_amp is None:
        use_amp = _bf16_native()
    label = "quick" if args.quick else "full"
    print(f"SwAV demo ({label}): report in {out}", flush=True)

    try:
        print("[1/4] data: Fashion-MNIST subset as a VISSL disk_folder", flush=True)
        t = time.time()
        data = prepare_data(args, mode)
        t_data = time.time() - t
        n_train, n_test = len(data["train_y"]), len(data["test_y"])
        print(f"  {n_train} training images ({mode['train_per_class']} per class) in {data['folder']}; "
              f"{n_test} test images ({mode['test_per_class']} per class) [{t_data:.1f}s]", flush=True)

        per_rank = (n_train // args.procs) // mode["batch"]
        if per_rank < 1:
            raise DemoError(f"{n_train} images are too few for {args.procs} x {mode['batch']} per batch")
        total_iters = per_rank * mode["epochs"]
        overrides = training_overrides(args, mode, data["folder"], ckpt_dir, use_amp)
        print(f"[2/4] SwAV pre-training through VISSL's launcher: {args.procs} gloo process(es) x "
              f"{threads} thread(s), {mode['epochs']} epochs x {per_rank} it, batch "
              f"{args.procs}x{mode['batch']}, bf16 autocast {'on' if use_amp else 'off'} "
              f"(log: {run_dir / 'train_log.txt'})", flush=True)
        parsed, t_train = run_training(overrides, run_dir, total_iters, mode["epochs"], threads)
        finals = sorted(ckpt_dir.glob("model_final_checkpoint_phase*.torch"))
        if not finals:
            raise DemoError(f"training finished but wrote no final checkpoint in {ckpt_dir}")
        ckpt = finals[-1]
        curve = read_loss_curve(ckpt_dir, parsed)
        if not curve:
            raise DemoError(f"no loss values found in {ckpt_dir / 'stdout.json'} nor in the log")
        print(f"  done in {_fmt_secs(t_train)}: loss {curve[0]['loss']:.3f} -> {curve[-1]['loss']:.3f}, "
              f"checkpoint {ckpt.name}", flush=True)

        print("[3/4] evaluation: res5avg features of the VISSL model (checkpoint loaded in-process), kNN",
              flush=True)
        t = time.time()
        config, results, protos, eval_times = evaluate(overrides, ckpt, data, args.seed, args.random_inits)
        t_eval = time.time() - t

        print("[4/4] report", flush=True)
        t = time.time()
        gain = results["swav"]["knn20"] - results["random_init"]["knn20"]
        vs_px = results["swav"]["knn20"] - results["raw_pixels"]["nn5_euclid"]
        t_total_before_fig = time.time() - t_start
        meta = dict(
            n_train=n_train, n_test=n_test,
            title=f"SwAV (vissl-swav-plugin) on Fashion-MNIST, {os.cpu_count()} CPU cores, "
                  f"{_fmt_secs(t_train)} of training",
            subtitle=(f"{n_train} unlabelled training images, {mode['epochs']} epochs, {describe_model(config)} "
                      f"({results['swav']['feature_dim']}-d res5avg), {describe_crops(config)}, "
                      f"{mode['prototypes']} prototypes, batch {args.procs}x{mode['batch']}, "
                      f"{'queue ' + str(mode['queue']) if mode['queue'] else 'no queue'}  |  "
                      f"20-NN: SwAV {results['swav']['knn20']:.1f}% vs random init "
                      f"{results['random_init']['knn20']:.1f}% ({gain:+.1f}) vs raw-pixel 5-NN "
                      f"{results['raw_pixels']['nn5_euclid']:.1f}% ({vs_px:+.1f})"),
        )
        png = out / REPORT_PNG
        make_figure(png, curve, results, protos["swav"], data["test_x"], meta)
        t_report = time.time() - t
        total = time.time() - t_start
        report = dict(
            mode=label,
            created=datetime.datetime.now().isoformat(timespec="seconds"),
            summary=dict(
                knn20_swav=round(results["swav"]["knn20"], 2),
                knn20_random_init=round(results["random_init"]["knn20"], 2),
                knn20_random_init_range=results["random_init"]["range"]["knn20"],
                nn5_raw_pixels=round(results["raw_pixels"]["nn5_euclid"], 2),
                knn20_gain_over_random_init=round(gain, 2),
                knn20_swav_minus_raw_pixel_5nn=round(vs_px, 2),
                swav_beats_raw_pixels=bool(vs_px > 0),
                loss_first=curve[0]["loss"], loss_last=curve[-1]["loss"],
                total_wall_s=round(total, 1), train_wall_s=round(t_train, 1),
            ),
            knn={k: {m: (round(v, 2) if isinstance(v, float) else v) for m, v in r.items()}
                 for k, r in results.items()},
            knn_protocols=dict(
                knn20="weighted cosine kNN, k=20, T=0.07 (Wu et al. 2018; VISSL's kNN)",
                knn200="weighted cosine kNN, k=200, T=0.07",
                nn5_euclid="plain 5-NN, Euclidean distance, majority vote (raw pixels: the benchmark's 85.5% on 60k/10k)",
                features="trunk res5avg (global average pool of res5), eval-mode BN, fp32, full 28x28 image",
                random_init="the same VISSL model built from the same config, no training; mean over "
                            "--random-inits initialisations (per_init), the first with torch seed "
                            "(SEED_VALUE + 0) * num_epochs, as VISSL seeds rank 0 (the training's start)",
                raw_pixels_full_dataset_5nn=RAW_PIXEL_5NN_FULL,
            ),
            prototypes={k: {kk: vv for kk, vv in v.items()} for k, v in protos.items()},
            times_s=dict(
                total=round(total, 1), data=round(t_data, 1), train_launcher=round(t_train, 1),
                evaluation=round(t_eval, 1), report=round(t_report, 1), evaluation_detail=eval_times,
                before_figure=round(t_total_before_fig, 1),
                cpu_total=round(_cpu_seconds() - cpu_start, 1),
                train_iterations=len(curve), train_it_per_s=round(len(curve) / t_train, 3),
            ),
            host=dict(cpu_count=os.cpu_count(), train_procs=args.procs, threads_per_proc=threads,
                      bf16_autocast=use_amp, loadavg_start=[round(v, 2) for v in load_start],
                      loadavg_end=[round(v, 2) for v in os.getloadavg()], python=platform.python_version(),
                      torch=__import__("torch").__version__, platform=platform.platform()),
            data=dict(source=str(Path(args.source).resolve()), folder=str(data["folder"]),
                      train_images=n_train, test_images=n_test, train_per_class=mode["train_per_class"],
                      test_per_class=mode["test_per_class"],
                      subset_rule="first N images of each class, in file order (train and t10k files)"),
            config=dict(
                vissl_config=CONFIG, overrides=overrides, mode=mode, seed=args.seed,
                trunk=dict(config.MODEL.TRUNK.NAME and {"name": config.MODEL.TRUNK.NAME,
                                                       **dict(config.MODEL.TRUNK.get("RESNET_SMALL_PLUGIN", {}))}),
                head=[list(p) for p in config.MODEL.HEAD.PARAMS],
                transforms=[dict(t) for t in config.DATA.TRAIN.TRANSFORMS],
                loss={k: (dict(v) if hasattr(v, "items") else v)
                      for k, v in config.LOSS.swav_plugin_loss.items()},
                optimizer=json.loads(json.dumps(config.OPTIMIZER, default=str)),
            ),
            loss_curve=[dict(iter=r["iter"], ep=r["ep"], loss=r["loss"], lr=r["lr"]) for r in curve],
            checkpoint=str(ckpt),
            files=dict(png=str(png), json=str(out / REPORT_JSON), train_log=str(run_dir / "train_log.txt")),
        )
        (out / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str) + "\n")
    except DemoError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2

    print(f"\nkNN top-1 on {n_test} test images (memory bank: the {n_train} training images):")
    for key, name in (("swav", "SwAV"), ("random_init", "random init"), ("raw_pixels", "raw pixels")):
        r = results[key]
        line = f"  {name:12s} 20-NN {r['knn20']:6.2f}%   200-NN {r['knn200']:6.2f}%   5-NN {r['nn5_euclid']:6.2f}%"
        if "range" in r:
            line += (f"   (mean of {len(r['per_init'])} initialisations; 20-NN "
                     f"{r['range']['knn20'][0]:.2f}-{r['range']['knn20'][1]:.2f}%)")
        print(line)
    print(f"prototypes: {protos['swav']['prototypes_used']}/{protos['swav']['num_prototypes']} used on the test "
          f"images, purity {protos['swav']['purity_pct']:.1f}% (random init {protos['random_init']['purity_pct']:.1f}%)")
    print(f"time: total {_fmt_secs(total)} (data {t_data:.0f}s, training {t_train:.0f}s, evaluation {t_eval:.0f}s, "
          f"report {t_report:.0f}s)")
    print(f"\nReport: {png}\n        {out / REPORT_JSON}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
