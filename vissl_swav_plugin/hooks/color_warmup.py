"""A weaker colour distortion for the first epochs (``multicrop_plugin``'s ``color_warmup_*`` keys).

Why (docs/experiments/collapse.md, fifth and sixth rounds): on sklearn's upscaled 8x8
digits the demo recipe collapsed within its first ~70 iterations whenever the two global crops --
the ones the codes are computed from -- were colour-distorted at strength 0.35 or more, while
Fashion-MNIST loses 1.5-2.7 points of kNN accuracy when trained at a lower strength throughout.
A step warm-up (0.25 on the global crops for 200 iterations, then 0.5) shortened the digits'
collapse but let seed 1 of three sit near ln K for 134 iterations (the detector warned); no
distortion for 200 iterations got away from ln K fastest, and then collapsed the run again at the
step to 0.5.  A linear ramp from 0 to 0.5 (``color_warmup_schedule: linear``) did neither: over
200 iterations (the demo's) its longest near-uniform run was 72 iterations on seed 1, over 400
iterations 33, at a cost of 1.7 points of 20-NN on Fashion-MNIST.

How: the transform keys ``color_warmup_iters: N`` and ``color_warmup_strength: s`` (scalar or
one per crop group) make the training epochs that start within the first ``N`` iterations use
``s`` instead of ``color_strength`` (``color_warmup_schedule: step``, the default), or a strength
ramping from ``s`` at the epoch's first iteration (``linear``) -- whole epochs, because the loader's worker processes get
the transform's state when an epoch's data iterator is built (persistent workers through the
batches' indices, ``vissl_swav_plugin/compat/persistent_workers.py``): with 78 iterations per epoch, N = 200
gives 3 epochs (234 iterations); with 10, 20 epochs (200).  :class:`ColorWarmupHook` (installed
whenever a ``multicrop_plugin`` of ``DATA.TRAIN`` sets ``color_warmup_iters > 0``) calls
``set_epoch`` on those transforms at the start of training and at the end of every training
epoch, before VISSL builds the next epoch's iterator, so the schedule holds whatever the number
of loader workers, and a resumed run gets the strength of the epoch it resumes at.  Rank 0
logs the schedule and each change::

    multicrop_plugin: colour-distortion strength [0.25, 0.5] for the epochs that start within 200 iterations, then [0.5, 0.5]; epoch 3 (78 it/epoch): [0.5, 0.5]
    multicrop_plugin: colour-distortion strength ramping linearly from [0.0, 0.0] for the epochs that start within 200 iterations, then [0.5, 0.5]; epoch 1 (78 it/epoch): [0.195, 0.195]
"""
import logging
from typing import Iterator, List

from vissl_swav_plugin.hooks.registry import NoOpHook, register_monitor_hooks
from vissl_swav_plugin.transforms.multicrop_config import TRANSFORM_NAME, WARMUP_LINEAR

def scheduled_transforms(dataset) -> Iterator:
    """The ``multicrop_plugin`` transforms with a colour warm-up inside a VISSL dataset
    (``GenericSSLDataset.transform``: a ``Compose`` of ``SSLTransformsWrapper``)."""
    compose = getattr(dataset, "transform", None)
    for wrapper in getattr(compose, "transforms", None) or []:
        t = getattr(wrapper, "transform", None)
        if getattr(t, "color_warmup_iters", 0) > 0 and hasattr(t, "set_epoch"):
            yield t


class ColorWarmupHook(NoOpHook):
    """Sets the training transforms' epoch (hence their colour-distortion strength) before
    each training epoch's data iterator is built."""

    _logged = False

    def _set(self, task, epoch: int) -> None:
        loader = getattr(task, "dataloaders", {}).get("train")
        if loader is None:
            return
        per_epoch = len(loader)
        for t in scheduled_transforms(loader.dataset):
            before = list(t.current_color_strength)
            now = t.set_epoch(epoch, per_epoch)
            if now != before or not self._logged:
                how = "ramping linearly from " if t.color_warmup_schedule == WARMUP_LINEAR else ""
                _log_rank0(f"{TRANSFORM_NAME}: colour-distortion strength {how}{t.color_warmup_strength} for the epochs "
                           f"that start within {t.color_warmup_iters} iterations, then {t.color_strength}; "
                           f"epoch {epoch} ({per_epoch} it/epoch): {now}")
        self._logged = True

    def on_start(self, task) -> None:
        """Set the colour-distortion strength of the first iteration."""
        self._logged = False
        self._set(task, int(getattr(task, "train_phase_idx", -1)) + 1)

    def on_phase_end(self, task) -> None:
        """Set the strength for the next epoch's iterations."""
        if getattr(task, "train", True):
            self._set(task, int(getattr(task, "train_phase_idx", -1)) + 1)


def _log_rank0(msg: str) -> None:
    from vissl_swav_plugin.utils import distributed

    if not distributed.active() or distributed.rank() == 0:
        logging.info(msg)  # VISSL's logger (it replaces logging.root; module loggers print nothing)


def _warmup_entries(cfg) -> List[dict]:
    return [t for t in (cfg.DATA.get("TRAIN") or {}).get("TRANSFORMS") or []
            if hasattr(t, "get") and t.get("name") == TRANSFORM_NAME and (t.get("color_warmup_iters") or 0) > 0]


@register_monitor_hooks
def color_warmup_hooks(cfg) -> list:
    """``[ColorWarmupHook]`` when a training ``multicrop_plugin`` has a colour warm-up
    (``color_warmup_iters > 0``)."""
    return [ColorWarmupHook()] if _warmup_entries(cfg) else []
