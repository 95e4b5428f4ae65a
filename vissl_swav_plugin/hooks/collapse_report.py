"""Texts of the collapse detector (``collapse.py``): its per-epoch log line and its
``COLLAPSE DETECTED`` message (what it saw, likely causes, config keys to change).

Kept apart from the statistics so that the wording can change without touching the
decision logic; every function is pure (figures and config values in, text out).
"""
import math
from typing import List, Optional

from vissl_swav_plugin.transforms.multicrop_config import WARMUP_LINEAR

_TEMPERATURE = "the predictions' softmax temperature: 0.1 in the paper; a large one makes them uniform"
_SWAV_TEMPERATURE = ("the predictions' softmax temperature, 0.1 in the paper: 0.2 stopped the quick demo's collapse "
                     "at the start of training on small images (docs/experiments/collapse.md)")
#: loss-specific config keys to change, with the advice (``LOSS.<name>.<key>``)
LOSS_ADVICE = {
    "swav_plugin_loss": [
        ("epsilon", "lower it, e.g. 0.03 (the SwAV README's first remedy)"),
        ("freeze_prototypes_niters", "freeze the prototypes longer, e.g. a whole epoch of iterations"),
        ("hard_assignment", "try true, or temp_hard_assignment_iters > 0 (hard codes at first)"),
        ("temperature", _SWAV_TEMPERATURE),
    ],
    "selav2_plugin_loss": [
        ("sinkhorn_epsilon", "lower it for sharper pseudo-labels (more sinkhorn_iterations)"),
        ("temperature", _TEMPERATURE),
    ],
    "deepclusterv2_plugin_loss": [
        ("temperature", _TEMPERATURE),
        ("num_clusters", "fewer clusters than training images, several per class"),
    ],
}

#: how each collapsed state is named in the message
STATE_NAMES = {
    "uniform": "uniform predictions, loss at ln K",
    "one_prototype": "one prototype takes the batch, loss near 0",
    "few_prototypes": "too few prototypes used",
}
_MEANING = {
    "uniform": "every sample gets the same, uniform prediction softmax(z.c/T) over the prototypes, "
               "so the loss sits at ln K whatever the codes: the features carry no information "
               "(SwAV README: \"all examples are mapped to the same unique representation... the only "
               "valid assignment satisfying equipartition is the uniform one\")",
    "one_prototype": "(nearly) every sample is predicted as the same prototype and the loss is ~0: "
                     "the codes / pseudo-labels put the whole batch into one cluster",
    "few_prototypes": "only a handful of prototypes are the top prediction of any sample over a whole "
                      "epoch: the features of all images fall into the same few clusters",
}
_CAUSES = ("a learning rate too high for the batch size, prototypes released too early, too smooth "
           "codes (epsilon too large), augmentations too strong for the images, a number of prototypes "
           "far from the data's (K vs classes and images), BN in the projection head on small batches")


_COLOR = ("a lower color_strength, or a weaker one for the first iterations only (color_warmup_iters / "
          "color_warmup_strength / color_warmup_schedule) (on blurry, low-detail images the colour distortion can erase what two crops "
          "of one image share: docs/experiments/collapse.md, the upscaled digits)")


def run_context(cfg) -> dict:
    """The config values quoted in the collapse message (current value of each key)."""
    name = cfg.LOSS.name
    lc = cfg.LOSS.get(name) or {}
    heads = cfg.MODEL.HEAD.PARAMS or []
    head = dict(heads[-1][1]) if heads and len(heads[-1]) > 1 else {}
    crops = [t for t in (cfg.DATA.TRAIN.TRANSFORMS or []) if "crop_scales" in t]
    world = int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    return {
        "loss": {key: lc.get(key) for key, _ in LOSS_ADVICE.get(name, [])},
        "batch": f"{cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA} x {world} processes",
        "num_clusters": head.get("num_clusters", lc.get("num_clusters", lc.get("num_prototypes"))),
        "crops": (f"crop_scales {_plain(crops[0].get('crop_scales'))}, num_crops {_plain(crops[0].get('num_crops'))}, "
                  f"color_strength {_plain(crops[0].get('color_strength', 'the transform default'))}"
                  + (_warmup_text(crops[0]) if crops[0].get("color_warmup_iters") else "")
                  if crops else "no multi-crop transform"),
        "use_bn": head.get("use_bn"),
        "lr_schedule": f"schedule {(cfg.OPTIMIZER.param_schedulers.get('lr') or {}).get('name')}",
    }


def _warmup_text(crop) -> str:
    """`` (0.25 for the first 200 iterations)`` (step) or `` (ramping from 0.0 over the first 200
    iterations)`` (linear): the colour warm-up of a ``multicrop_plugin`` entry."""
    how = "ramping from {} over" if crop.get("color_warmup_schedule") == WARMUP_LINEAR else "{} for"
    return f" ({how.format(_plain(crop.get('color_warmup_strength')))} the first {crop.get('color_warmup_iters')} iterations)"


def _plain(v):
    """Config containers (AttrDict / ListConfig) as plain dicts / lists, for printing."""
    if hasattr(v, "items"):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig":
        return [_plain(x) for x in v]
    return v


def _head_text(h: dict) -> str:
    lk = h["ln_k"] or float("nan")  # K = 1: no ratio
    text = (f"K={h['K']}: prediction entropy per sample {h['sample_entropy']:.4f} "
            f"({h['sample_entropy'] / lk:.3f} ln K), of the mean prediction {h['mean_entropy']:.4f} "
            f"({h['mean_entropy'] / lk:.3f} ln K), prototypes used {h['used']}/{h['K']}")
    if "code_entropy" in h:
        text += f"; codes entropy {h['code_entropy']:.4f} ({h['code_entropy'] / lk:.3f} ln K), used {h['code_used']}/{h['K']}"
    return text


def epoch_line(loss_name: str, epoch: int, loss: float, heads: List[dict], labels: List[dict],
               iters: int, collapsed: int, streak: int, settings: dict) -> str:
    """The one-line epoch summary, e.g. ``Collapse detector, epoch 3 (swav_plugin_loss): mean
    loss 3.1234 = 0.678 ln K | K=100: prediction entropy ... | collapsed iterations 0/39 ...``."""
    ln_k = sum(h["ln_k"] for h in heads) / len(heads) or float("nan")
    parts = [f"Collapse detector, epoch {epoch} ({loss_name}): mean loss {loss:.4f} = {loss / ln_k:.3f} ln K "
             f"(ln K {ln_k:.4f})"]
    prefix = len(heads) > 1
    parts += [("set %d, " % i if prefix else "") + _head_text(h) for i, h in enumerate(heads)]
    parts += [f"set {i} pseudo-labels use {lab['used']}/{lab['K']} clusters (entropy {lab['entropy']:.4f} = "
              f"{lab['entropy'] / (math.log(lab['K']) or float('nan')):.3f} ln K)" for i, lab in enumerate(labels)]
    parts.append(f"collapsed iterations {collapsed}/{iters} (current run {streak}, warns at "
                 f"{settings['PATIENCE_ITERS']}, ON_COLLAPSE={settings['ON_COLLAPSE']})")
    return " | ".join(parts)


#: the first words of the detector's warning (the demo finds the warning in the training log by them)
COLLAPSE_HEADLINE = "COLLAPSE DETECTED"


def collapse_message(kind: str, loss_name: str, loss: float, heads: List[dict], settings: dict, context: dict,
                     iterations, streak: int, epoch: int, lr: Optional[float], epoch_used: List[int]) -> str:
    """The multi-line ``COLLAPSE DETECTED`` text: what was seen (with numbers), what it
    means, the likely causes and the config keys to change with their current values."""
    ln_k = sum(h["ln_k"] for h in heads) / len(heads) or float("nan")
    if kind == "few_prototypes":
        when = f"in epoch {epoch} (the whole epoch, all processes)"
        head = f"{STATE_NAMES[kind]} in epoch {epoch}"
    else:
        when = f"at the last of {streak} consecutive iterations (train iterations {iterations[0]} to {iterations[1]}, " \
               f"epoch {epoch}; all processes)"
        head = f"{streak} consecutive iterations in the collapsed state \"{STATE_NAMES[kind]}\""
    lines = [f"{COLLAPSE_HEADLINE} ({loss_name}): {head}.",
             f"  What the detector saw {when}:",
             f"    loss {loss:.4f}, ln K {ln_k:.4f} (loss = {loss / ln_k:.3f} ln K)"]
    for i, h in enumerate(heads):
        used = f"; used in this epoch so far: {epoch_used[i]}/{h['K']}" if i < len(epoch_used) else ""
        lines.append(f"    prototype set {i}, {_head_text(h)}{used}")
    lines += [f"  What it means: {_MEANING[kind]}.",
              f"  Likely causes: {_CAUSES}.",
              "  Config keys to change [current value]:"]
    for key, advice in LOSS_ADVICE.get(loss_name, []):
        lines.append(f"    LOSS.{loss_name}.{key} [{context.get('loss', {}).get(key)}]: {advice}")
    lr_now = f"lr now {lr:.4g}" if lr is not None else context.get("lr_schedule")
    queue = f" or a queue (LOSS.{loss_name}.queue.queue_length)" if loss_name == "swav_plugin_loss" else ""
    lines += [
        f"    OPTIMIZER.param_schedulers.lr [{lr_now}]: lower it, or warm up longer",
        f"    DATA.TRAIN.BATCHSIZE_PER_REPLICA [{context.get('batch')}]: larger batches{queue}",
        f"    MODEL.HEAD.PARAMS num_clusters [{_plain(context.get('num_clusters'))}]: K several times the number "
        "of classes and well below the number of training images",
        f"    DATA.TRAIN.TRANSFORMS [{context.get('crops')}]: softer augmentation (larger crop_scales), fewer crops "
        f"(num_crops), {_COLOR}",
        f"    MODEL.HEAD.PARAMS use_bn [{context.get('use_bn')}]: try false (no BN in the projection head)",
    ]
    if settings["ON_COLLAPSE"] == "stop":
        lines.append("  The run stops (HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE=stop).")
    else:
        lines.append("  The run goes on (HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE=warn); set "
                     "HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE=stop to end such a run with an error.")
    lines.append(f"  Detector thresholds: HOOKS.COLLAPSE_DETECTOR PATIENCE_ITERS={settings['PATIENCE_ITERS']}, "
                 f"LOSS_TOL={settings['LOSS_TOL']}, ENTROPY_TOL={settings['ENTROPY_TOL']}, "
                 f"MIN_PROTOTYPES_USED_FRAC={settings['MIN_PROTOTYPES_USED_FRAC']}.")
    return "\n".join(lines)
