"""The hooks of the SwAV loss (config ``LOSS.swav_plugin_loss``), registered for that loss
name with :func:`~vissl_swav_plugin.hooks.registry.register_loss_hooks`:

* :class:`SwAVAssignmentHook` -- hands the live prototype layers to the loss's Sinkhorn
  assignment (the queue is scored with the current prototypes), switches the queue on at
  epoch ``queue.start_epoch`` and gathers every rank's queue before a checkpoint.
* :class:`FreezePrototypesHook` -- prototypes get no update (grad set to None, so neither
  momentum nor weight decay moves them) for the first ``freeze_prototypes_niters``
  iterations.  Parameters are found by module type, whatever DDP/FSDP prefix they carry.
* :class:`NormalizePrototypesHook` -- L2-normalises each prototype after every update.
* :class:`~vissl_swav_plugin.hooks.trace.TraceHook` -- a debug trace (env
  ``VISSL_SWAV_PLUGIN_TRACE_DIR``), in :mod:`vissl_swav_plugin.hooks.trace`.

At every forward pass the assignment hook also stops the run on a NaN / inf model output
(:func:`~vissl_swav_plugin.utils.nonfinite.guard_finite_model_output`).
"""
import logging
import os
from typing import List

from classy_vision.hooks.classy_hook import ClassyHook

from vissl_swav_plugin.hooks.registry import NoOpHook, register_loss_hooks
from vissl_swav_plugin.hooks.trace import TRACE_ENV, TraceHook
from vissl_swav_plugin.losses.swav_config import DEFAULTS, QUEUE_DEFAULTS
from vissl_swav_plugin.models.heads import find_prototype_layers, normalize_prototypes_, prototype_parameters
from vissl_swav_plugin.utils.nonfinite import guard_finite_model_output


def _prototype_layers(task):
    layers = [layer for _, layer in find_prototype_layers(task.model).values()]
    if not layers:
        raise RuntimeError(
            "vissl_swav_plugin: LOSS.name is swav_plugin_loss but the model has no prototype "
            "layers; set MODEL.HEAD.PARAMS=[[swav_plugin_head, {...}]]"
        )
    return layers


class SwAVAssignmentHook(NoOpHook):
    """Hands the live prototype layers to the loss at every forward pass (the codes and the queue are scored with the current prototypes), switches the queue on at epoch ``queue_start_epoch`` and gathers every process's queue before a checkpoint."""
    def __init__(self, queue_start_epoch: int, checkpoint_iter_frequency: int = 0):
        super().__init__()
        self.queue_start_epoch = int(queue_start_epoch)
        self.checkpoint_iter_frequency = int(checkpoint_iter_frequency)

    def _attach(self, task):
        task.loss.set_prototypes(_prototype_layers(task))

    def on_start(self, task) -> None:
        """Give the loss the prototype layers before the first forward pass."""
        self._attach(task)

    def on_phase_start(self, task) -> None:
        """Switch the queue on from epoch ``queue_start_epoch`` (training phases only)."""
        if not task.train or not task.loss.has_queue:
            return
        epoch = task.train_phase_idx
        active = epoch >= self.queue_start_epoch
        if active and not task.loss.queue_active:
            logging.info(f"SwAV queue starts at epoch {epoch} (queue.start_epoch={self.queue_start_epoch})")
        task.loss.set_queue_active(active)

    def on_forward(self, task) -> None:
        """Re-attach the prototypes (a wrapper may have replaced them) and stop on a non-finite model output."""
        self._attach(task)
        guard_finite_model_output(task)

    def _gather(self, task):
        task.loss.gather_queues_for_checkpoint()

    def on_step(self, task) -> None:
        """Gather the queues before VISSL's iteration checkpoints (``CHECKPOINT_ITER_FREQUENCY``)."""
        f = self.checkpoint_iter_frequency
        if task.train and task.loss.has_queue and f > 0 and task.iteration % f == 0:
            self._gather(task)

    def on_phase_end(self, task) -> None:
        """Gather the queues before the epoch's checkpoint."""
        if task.train and task.loss.has_queue:
            self._gather(task)


class FreezePrototypesHook(NoOpHook):
    """Prototypes get no update for the first ``niters`` iterations (paper App. A.1:
    "freeze the prototypes during the first epoch"): their gradient is set to ``None``
    after the backward pass, so neither momentum nor weight decay moves them."""

    def __init__(self, niters: int):
        super().__init__()
        self.niters = int(niters)

    def on_backward(self, task) -> None:
        """Drop the prototypes' gradients while ``task.iteration < niters``."""
        if task.iteration >= self.niters:
            return
        for p in prototype_parameters(task.model):
            p.grad = None
        if task.iteration + 1 == self.niters:
            logging.info(f"Prototypes frozen until iteration {self.niters}; they train from now on")


class NormalizePrototypesHook(NoOpHook):
    """Keeps the prototypes L2-normalised before every forward pass, as the official code
    (which normalises at the start of every iteration): once at the start of the run (so
    prototypes loaded from another tool's checkpoint or a user's initialisation are
    normalised before the freeze window, which then keeps them), then after every update.
    Frozen prototypes that are already unit-norm are left bit-exact."""

    #: a prototype whose norm differs from 1 by more than this is re-normalised at start
    NORM_TOLERANCE = 1e-5

    def __init__(self, frozen_niters: int = 0):
        super().__init__()
        self.frozen_niters = int(frozen_niters)

    def on_start(self, task) -> None:
        """Normalise prototypes that are not unit-norm at the start of the run."""
        layers = _prototype_layers(task)
        err = max(float((l.weight.detach().float().norm(dim=1) - 1).abs().max()) for l in layers)
        if err > self.NORM_TOLERANCE:
            logging.info(f"Prototypes are not unit-norm at start (max |norm - 1| = {err:.3g}): L2-normalised")
            normalize_prototypes_(layers)

    def on_update(self, task) -> None:
        """Re-normalise the prototypes after every update once they train."""
        if task.iteration < self.frozen_niters:
            return
        normalize_prototypes_(_prototype_layers(task))


@register_loss_hooks("swav_plugin_loss")
def swav_hooks(cfg) -> List[ClassyHook]:
    """The hooks of ``swav_plugin_loss`` for ``cfg``: assignment (always), prototype freeze (``freeze_prototypes_niters > 0``), prototype normalisation (``normalize_prototypes``) and the debug trace (env ``VISSL_SWAV_PLUGIN_TRACE_DIR``)."""
    loss_cfg = cfg.LOSS["swav_plugin_loss"]
    hooks: List[ClassyHook] = [
        SwAVAssignmentHook(
            (loss_cfg.get("queue") or {}).get("start_epoch", QUEUE_DEFAULTS["start_epoch"]),
            cfg.CHECKPOINT.get("CHECKPOINT_ITER_FREQUENCY", 0),
        )
    ]
    freeze = int(loss_cfg.get("freeze_prototypes_niters", DEFAULTS["freeze_prototypes_niters"]))
    if freeze > 0:
        hooks.append(FreezePrototypesHook(freeze))
    if loss_cfg.get("normalize_prototypes", DEFAULTS["normalize_prototypes"]):
        hooks.append(NormalizePrototypesHook(freeze))
    trace_dir = os.environ.get(TRACE_ENV)
    if trace_dir:
        hooks.append(TraceHook(trace_dir))
    return hooks
