"""Judge a checkpoint's features by the paper's protocols, as the demo does: kNN (weighted
cosine 20-NN / 200-NN, plain Euclidean 5-NN), a linear classifier on frozen features with
every training label, and learning from few labels (1, 10, 100 per class), each beside the
same two baselines: the same network at random initialisation (mean of several) and the raw
pixels.  The demo's evaluation step is this module on its own images, so that ``swav-plugin-eval``
on the demo's checkpoint and images gives the demo's numbers.

Features: the trunk's ``res5avg`` of the whole image (no crop), in eval mode, fp32, the image
normalised as the training's ``multicrop_plugin`` transform normalises its crops.

usage::

    swav-plugin-eval --checkpoint CKPT --train DIR --test DIR [--size N] [--random-inits 5]
        [--probes on|off] [--probe-draws 5] [--seed 0] [--output-json PATH]
        config=pretrain/swav/... [the training's overrides, e.g. its MODEL.* keys]
    swav-plugin-eval --demo-report demo_output/swav_demo_report.json --train DIR --test DIR

``--train`` / ``--test``: image folders in torchvision's ImageFolder layout (one sub-folder per
class, the same class names in both).  For ImageNet-scale runs, VISSL's own linear benchmark
(``config=benchmark/swav_plugin/...``, docs/evaluation.md) stays the reference.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["FeatureEvalError", "build_vissl_model", "load_checkpoint", "transform_stats", "to_input", "extract",
           "random_init_seeds", "mean_probes", "evaluate_features", "load_image_folder", "main"]


class FeatureEvalError(ValueError):
    """Bad argument, checkpoint or image folder; the message names it."""


def build_vissl_model(overrides, seed):
    """``(config, model)``: the VISSL model of the config ``overrides`` compose to, its
    weights initialised after ``torch.manual_seed(seed)``, in eval mode."""
    import torch
    import vissl  # noqa: F401  (registers the plugin)
    from vissl.models import build_model
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    _, config = convert_to_attrdict(compose_hydra_configuration(list(overrides)), dump_config=False)
    torch.manual_seed(seed)
    model = build_model(config.MODEL, config.OPTIMIZER)
    return config, model.eval()


def load_checkpoint(model, ckpt_path):
    """Strict load of the trunk and heads saved by VISSL's checkpoint hook into ``model``.
    The file is read with ``torch.load(weights_only=True)`` (tensors, numbers, strings,
    containers: what VISSL's checkpoints hold) after its checksum, so a file that carries
    other Python objects is refused rather than unpickled (which could run its code).

    Returns:
        The whole checkpoint dict.

    Raises:
        FeatureEvalError: the file is missing, damaged, holds objects ``weights_only``
            refuses, or is not a VISSL training checkpoint.
    """
    from vissl_swav_plugin.tools.weights import WeightsError, safe_load

    if not Path(ckpt_path).is_file():
        raise FeatureEvalError(f"checkpoint not found: {ckpt_path}")
    try:
        ckpt = safe_load(ckpt_path)  # its .sha256, else the CRC-32 of its zip records, then weights_only
    except WeightsError as e:
        raise FeatureEvalError(str(e)) from e
    try:
        state = ckpt["classy_state_dict"]["base_model"]["model"]
    except (KeyError, TypeError):
        raise FeatureEvalError(f"{ckpt_path}: not a VISSL training checkpoint (no classy_state_dict/base_model)") from None
    model.trunk.load_state_dict(state["trunk"], strict=True)
    model.heads.load_state_dict(state["heads"], strict=True)
    return ckpt


def transform_stats(config):
    """How the training's ``multicrop_plugin`` transform normalises its crops:
    ``{"mean": [r, g, b], "std": [r, g, b], "min_std": None}`` (``normalize: dataset``; its
    defaults: ImageNet's), ``{"mean": None, "std": None, "min_std": m}`` (``normalize:
    per_image``), or the identity ``([0, 0, 0], [1, 1, 1])`` without such a transform."""
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
    from vissl_swav_plugin.transforms.multicrop_config import check_config_keys

    for t in config.DATA.TRAIN.TRANSFORMS:
        if t["name"] == "multicrop_plugin":
            mc = MultiCropPlugin(**check_config_keys(t))
            return dict(mean=mc.mean and list(mc.mean), std=mc.std and list(mc.std), min_std=mc.min_std)
    return dict(mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0], min_std=None)


def to_input(images_u8, norm):
    """uint8 images, gray [N, H, W] or RGB [N, H, W, 3], -> normalised float [N, 3, H, W],
    exactly what the training pipeline does to a full image (PNG -> RGB -> tensor ->
    normalise), without cropping; ``norm`` is :func:`transform_stats`'s dict."""
    import torch
    from vissl_swav_plugin.transforms.standardize import standardize_

    x = torch.from_numpy(images_u8).float().div_(255.0)
    x = x[:, None].expand(-1, 3, -1, -1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    if norm["min_std"] is not None:
        return standardize_(x.contiguous(), norm["min_std"])
    m = torch.tensor(norm["mean"], dtype=torch.float32)[None, :, None, None]
    s = torch.tensor(norm["std"], dtype=torch.float32)[None, :, None, None]
    return (x - m) / s


def extract(model, images_u8, norm, batch=500):
    """``(features, scores)``: res5avg trunk features [N, D] and the head's prototype
    scores [N, K] of uint8 images (fp32, eval mode, no gradients); ``norm``: see
    :func:`to_input`."""
    import torch

    feats, scores = [], []
    with torch.no_grad():
        for i in range(0, len(images_u8), batch):
            x = to_input(images_u8[i:i + batch], norm)
            f = model.trunk(x, out_feat_keys=["res5avg"])[0].flatten(1)
            out = model.heads[0](f)
            feats.append(f)
            scores.append(out[-1])
    return torch.cat(feats), torch.cat(scores)


def random_init_seeds(seed, num_epochs, count):
    """Torch seeds of the random-init baselines: first the training's own starting point
    (VISSL's ``set_seeds`` seeds rank 0 with ``(SEED_VALUE + 0) * num_epochs`` and DDP gives
    every rank rank 0's weights), then ``count - 1`` other initialisations.

    Example: ``random_init_seeds(1, 12, 3) == [12, 1012, 2012]``.
    """
    first = int(seed) * int(num_epochs)
    return [first] + [first + 1000 * j for j in range(1, count)]


def mean_probes(per_init):
    """The mean of several :func:`~vissl_swav_plugin.utils.probes.probe_report` results (one
    per random initialisation): ``linear.top1`` and each ``low_shot[k].mean`` averaged, with
    their ``range`` [min, max] over the initialisations and the per-init results kept."""
    import numpy as np

    lin = [r["linear"]["top1"] for r in per_init]
    out = dict(linear=dict(top1=round(float(np.mean(lin)), 2), range=[min(lin), max(lin)]), low_shot={},
               protocol=per_init[0]["protocol"], per_init=per_init)
    for k in per_init[0]["low_shot"]:
        v = [r["low_shot"][k]["mean"] for r in per_init]
        stds = [r["low_shot"][k]["std"] for r in per_init]
        out["low_shot"][k] = dict(mean=round(float(np.mean(v)), 2), std=round(float(np.mean(stds)), 2),
                                  range=[min(v), max(v)])
    return out


class _FeatureSet:
    """kNN (and probes) of one feature set on the train / test images; times, logs a line."""

    def __init__(self, data, num_classes, probes, timings, log):
        import numpy as np

        self.data, self.num_classes, self.probes, self.timings, self.log = data, num_classes, probes, timings, log
        self.ytr, self.yte = data["train_y"].astype(np.int64), data["test_y"].astype(np.int64)

    def __call__(self, name, ftr, fte, t0, t_feat=None):
        """``(knn results, probe results or None)`` of train / test features ``ftr`` / ``fte``."""
        from vissl_swav_plugin.utils.knn import format_metrics, knn_report
        from vissl_swav_plugin.utils.probes import format_probes, probe_report

        r = knn_report(ftr, self.ytr, fte, self.yte, num_classes=self.num_classes)
        r["feature_dim"] = int(ftr.shape[1])
        line = f"  {name:14s} features {tuple(ftr.shape)} + {tuple(fte.shape)}: " + format_metrics(r)
        pr, times = None, self.timings.setdefault(name, {})
        if self.probes is not None:
            t = time.time()
            pr = probe_report(ftr, self.ytr, fte, self.yte, **self.probes)
            times["probes_s"] = round(time.time() - t, 2)
            line += "; " + format_probes(pr)
        if t_feat is not None:
            times["extract_s"] = round(t_feat, 2)
        times["total_s"] = round(time.time() - t0, 2)
        self.log(line)
        return r, pr


def evaluation_threads():
    """torch threads for the evaluation: ``OMP_NUM_THREADS`` where it is set to a positive
    integer (the user's or a launcher's share of the cores), else every core.

    Example: ``OMP_NUM_THREADS=2 swav-plugin-eval ...`` extracts the features on 2 threads."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, os.cpu_count() or 1)


def evaluate_features(overrides, ckpt_path, data, seed, random_inits=5, probes=None, num_classes=None, log=print):
    """The checkpoint's features, ``random_inits`` random initialisations of the same network
    (the first is the training's own starting point; their mean is the baseline) and the raw
    pixels, judged on the same images by kNN and, with ``probes`` (keyword arguments of
    :func:`~vissl_swav_plugin.utils.probes.probe_report`), the linear and low-shot probes.
    torch runs on :func:`evaluation_threads` threads meanwhile; the caller's number of threads
    is set back on return.

    Args:
        overrides: the training's config overrides (the same model is built from them).
        ckpt_path: VISSL's checkpoint of the training.
        data: ``dict(train_x, train_y, test_x, test_y)``: uint8 images (gray [N, H, W] or RGB
            [N, H, W, 3]) and int labels.
        seed: the training's SEED_VALUE (gives the random-init seeds).
        random_inits: number of random initialisations averaged.
        probes: None (kNN only) or the probes' settings.
        num_classes: the number of classes (default: from the labels).
        log: where the one line per model goes.

    Returns:
        ``dict(config, knn, probes, scores, timings)``: ``knn[method]`` and ``probes[method]``
        for ``swav`` (the checkpoint), ``random_init`` (means, with ``range`` and
        ``per_init``) and ``raw_pixels``; ``probes`` is ``{}`` without ``probes``;
        ``scores[method]`` the test images' prototype scores of ``swav`` and of the first
        random init; ``timings`` seconds per model.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(evaluation_threads())
    try:
        return _evaluate(overrides, ckpt_path, data, seed, random_inits, probes, num_classes, log)
    finally:
        torch.set_num_threads(before)


def _evaluate(overrides, ckpt_path, data, seed, random_inits, probes, num_classes, log):
    """:func:`evaluate_features`' work, on the threads it set."""
    import torch
    from vissl_swav_plugin.utils.knn import mean_over_inits

    num_classes = num_classes or int(max(data["train_y"].max(), data["test_y"].max())) + 1
    timings, knn, probe_results, scores = {}, {}, {}, {}
    config, trained = build_vissl_model(overrides, seed)
    load_checkpoint(trained, ckpt_path)
    norm = transform_stats(config)
    judge = _FeatureSet(data, num_classes, probes, timings, log)

    def model_features(name, model):
        t0 = time.time()
        ftr, _ = extract(model, data["train_x"], norm)
        fte, ste = extract(model, data["test_x"], norm)
        return judge(name, ftr, fte, t0, time.time() - t0), ste

    (knn["swav"], probe_results["swav"]), scores["swav"] = model_features("swav", trained)
    per_init, per_init_probes = [], []
    for i, init_seed in enumerate(random_init_seeds(seed, config.OPTIMIZER.num_epochs, random_inits)):
        _, model = build_vissl_model(overrides, init_seed)
        (r, pr), ste = model_features(f"random_init[{i}]", model)
        per_init.append(dict(r, torch_seed=init_seed))
        per_init_probes.append(pr)
        if i == 0:
            scores["random_init"] = ste
    knn["random_init"] = mean_over_inits(per_init)
    t0 = time.time()
    px_tr = torch.from_numpy(data["train_x"].reshape(len(data["train_y"]), -1)).float() / 255.0
    px_te = torch.from_numpy(data["test_x"].reshape(len(data["test_y"]), -1)).float() / 255.0
    knn["raw_pixels"], probe_results["raw_pixels"] = judge("raw_pixels", px_tr, px_te, t0)
    if probes is None:
        probe_results = {}
    else:
        probe_results["random_init"] = mean_probes(per_init_probes)
    return dict(config=config, knn=knn, probes=probe_results, scores=scores, timings=timings)


def load_image_folder(root, size=None, classes=None):
    """The images of an ImageFolder ``root`` (``root/<class>/<image>``) as uint8 arrays.

    Args:
        root: the folder.
        size: resize every image to ``size`` x ``size`` (bilinear); None: keep the sizes,
            which must then all be equal.
        classes: the class names in label order (default: the sub-folders, sorted).

    Returns:
        ``(images, labels [N] int64, class names)``, in class then file name order, or, when
        every file name is a number (the image's index in its source, as
        ``swav-plugin-prepare-data`` names them), in the order of those numbers (the source's
        order, which the demo evaluates in; the probes' validation split and draws depend on
        the order); the images are uint8 [N, H, W, 3], or [N, H, W] when every image is gray (as the demo's
        Fashion-MNIST: the raw-pixel baseline then has one value per pixel, as the demo's).

    Raises:
        FeatureEvalError: a missing or empty folder, an unreadable image or a size mismatch,
            naming the file.
    """
    import numpy as np
    from PIL import Image
    from vissl_swav_plugin.config.dataset_size import IMAGE_EXTENSIONS  # torchvision's ImageFolder's

    root = Path(root)
    if not root.is_dir():
        raise FeatureEvalError(f"image folder not found: {root}")
    names = classes or sorted(p.name for p in root.iterdir() if p.is_dir())
    images, labels, stems, first = [], [], [], None
    for label, name in enumerate(names):
        folder = root / name
        if not folder.is_dir():
            raise FeatureEvalError(f"{root}: no class folder {name!r} (the classes of the training images)")
        for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS):
            try:
                with Image.open(path) as im:
                    im = im.convert("RGB")
                    if size:
                        im = im.resize((size, size), Image.BILINEAR)
                    a = np.asarray(im, dtype=np.uint8)
            except OSError as e:
                raise FeatureEvalError(f"cannot read image file {path}: {e}") from None
            if first is not None and a.shape != first:
                raise FeatureEvalError(f"{path} is {a.shape[1]}x{a.shape[0]} but {root}'s first image is "
                                       f"{first[1]}x{first[0]}: give --size N")
            first = a.shape
            images.append(a)
            labels.append(label)
            stems.append(path.stem)
    if not images:
        raise FeatureEvalError(f"{root}: no images in class sub-folders (ImageFolder layout <root>/<class>/<image>)")
    x, y = np.stack(images), np.asarray(labels, dtype=np.int64)
    if all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems):
        order = np.argsort([int(s) for s in stems], kind="stable")
        x, y = x[order], y[order]
    if (x[..., 0] == x[..., 1]).all() and (x[..., 0] == x[..., 2]).all():
        x = np.ascontiguousarray(x[..., 0])
    return x, y, names


def build_parser():
    """The ``argparse`` parser of ``swav-plugin-eval`` (the Hydra overrides are positional)."""
    ap = argparse.ArgumentParser(prog="swav-plugin-eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="VISSL checkpoint of the training (model_final_checkpoint_phase<N>.torch)")
    ap.add_argument("--demo-report", help="a demo's swav_demo_report.json: its config, overrides, seed and "
                                          "checkpoint (instead of --checkpoint and config=...), and its "
                                          "evaluation's settings (random inits, probes, draws, shots) where "
                                          "not given")
    ap.add_argument("--train", required=True, help="labelled training images (ImageFolder layout): kNN memory "
                                                   "bank, probe training set")
    ap.add_argument("--test", required=True, help="labelled test images (ImageFolder layout, the same classes)")
    ap.add_argument("--size", type=int, default=None, help="resize every image to N x N (default: keep)")
    ap.add_argument("--seed", type=int, default=None, help="the training's SEED_VALUE (default: the config's)")
    ap.add_argument("--random-inits", type=int, default=None, help="random initialisations averaged (default 5)")
    ap.add_argument("--probes", choices=["on", "off"], default=None, help="linear and low-shot probes (default on)")
    ap.add_argument("--probe-draws", type=int, default=None, help="draws per low-shot size (default 5)")
    ap.add_argument("--shots", default=None, help="labels per class of the low-shot probes (default 1,10,100)")
    ap.add_argument("--output-json", default=None, help="where the results go (default: print only)")
    ap.add_argument("overrides", nargs="*", help="config=NAME and the training's Hydra overrides")
    return ap


EVAL_DEFAULTS = dict(random_inits=5, probes="on", probe_draws=5, shots="1,10,100")


def _report_eval_settings(report):
    """The evaluation settings a demo's report records (those it has): the number of random
    inits, whether the probes ran, their draws and shots."""
    out = {}
    per_init = report.get("knn", {}).get("random_init", {}).get("per_init")
    if per_init:
        out["random_inits"] = len(per_init)
    if "probes" in report:
        out["probes"] = "on" if report["probes"] else "off"
        protocol = (report["probes"] or {}).get("swav", {}).get("protocol", {})
        if "draws" in protocol:
            out["probe_draws"] = int(protocol["draws"])
        if protocol.get("shots"):
            out["shots"] = ",".join(str(int(k)) for k in protocol["shots"])
    return out


def _settings(args, ap):
    """``(overrides, checkpoint, seed, probes)`` from the arguments, or ``ap.error``; the
    evaluation settings not given (``--random-inits``, ``--probes``, ``--probe-draws``,
    ``--shots``) are set on ``args``: the demo report's, else :data:`EVAL_DEFAULTS`."""
    overrides, ckpt, seed = list(args.overrides), args.checkpoint, args.seed
    recorded = {}
    if args.demo_report:
        try:
            report = json.loads(Path(args.demo_report).read_text())
            cfg = report["config"]
            overrides = [f"config={cfg['vissl_config']}", *cfg["overrides"], *overrides]
            ckpt = ckpt or report["checkpoint"]
            seed = cfg["seed"] if seed is None else seed
            recorded = _report_eval_settings(report)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            ap.error(f"--demo-report {args.demo_report}: not a readable demo report ({e!r})")
    for key, default in EVAL_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, recorded.get(key, default))
    if not any(o.startswith("config=") for o in overrides):
        ap.error("missing config=... (the training's config), or --demo-report")
    if not ckpt:
        ap.error("missing --checkpoint (or --demo-report)")
    if args.random_inits < 1 or args.probe_draws < 1 or (args.size is not None and args.size < 1):
        ap.error("--random-inits, --probe-draws and --size must be >= 1")
    try:
        shots = tuple(int(s) for s in args.shots.split(",") if s.strip())
    except ValueError:
        ap.error(f"--shots must be a comma list of integers, got {args.shots!r}")
    if not shots or min(shots) < 1:
        ap.error(f"--shots values must be >= 1, got {args.shots!r}")
    probes = None if args.probes == "off" else dict(shots=shots, draws=args.probe_draws, val_fraction=0.1,
                                                    seed=int(seed or 0))
    return overrides, ckpt, seed, probes


def main(argv=None):
    """Console script ``swav-plugin-eval``: exit 0, or 2 with the error on stderr."""
    ap = build_parser()
    args = ap.parse_args(argv)
    overrides, ckpt, seed, probes = _settings(args, ap)
    try:
        train_x, train_y, classes = load_image_folder(args.train, args.size)
        test_x, test_y, _ = load_image_folder(args.test, args.size, classes)
        if seed is None:
            config, _ = build_vissl_model(overrides, 0)
            seed = int(config.SEED_VALUE)
            if probes is not None:
                probes["seed"] = seed
        data = dict(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)
        r = evaluate_features(overrides, ckpt, data, seed, args.random_inits, probes, num_classes=len(classes))
    except FeatureEvalError as e:
        print(f"swav-plugin-eval: error: {e}", file=sys.stderr)
        return 2
    out = dict(checkpoint=str(ckpt), overrides=overrides, seed=seed, classes=classes,
               train_images=int(len(train_y)), test_images=int(len(test_y)), knn=r["knn"], probes=r["probes"],
               timings=r["timings"])
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"results written to {args.output_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
