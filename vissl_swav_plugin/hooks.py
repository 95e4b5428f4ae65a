"""Training hooks of the plugin and their attachment to VISSL's hook generator.

VISSL builds its hook list in ``vissl.hooks.default_hook_generator``, which calls the
module-level ``vissl.hooks.add_loss_hooks(hooks, loss_cfg, cfg)``.  We wrap that function
once (:func:`install`) so that, for a loss name registered with
:func:`register_loss_hooks`, our hooks are appended right after VISSL's own loss hooks
-- i.e. before VISSL's checkpoint hook, which matters for the queue gather.  Nothing else
of VISSL's hook list changes, so VISSL's stock launcher and any custom launcher that uses
``default_hook_generator`` get our hooks.

SwAV hooks (config ``LOSS.swav_plugin_loss``):

* :class:`SwAVAssignmentHook` -- hands the live prototype layers to the loss's Sinkhorn
  assignment (the queue is scored with the current prototypes), switches the queue on at
  epoch ``queue.start_epoch`` and gathers every rank's queue before a checkpoint.
* :class:`FreezePrototypesHook` -- prototypes get no update (grad set to None, so neither
  momentum nor weight decay moves them) for the first ``freeze_prototypes_niters``
  iterations.  Parameters are found by module type, whatever DDP/FSDP prefix they carry.
* :class:`NormalizePrototypesHook` -- L2-normalises each prototype after every update.
"""
import logging
import os
from typing import Callable, Dict, List

import torch
from classy_vision.hooks.classy_hook import ClassyHook

from vissl_swav_plugin.heads import find_prototype_layers, normalize_prototypes_, prototype_parameters
from vissl_swav_plugin.swav_config import DEFAULTS, QUEUE_DEFAULTS


_LOSS_HOOK_FACTORIES: Dict[str, Callable] = {}


def register_loss_hooks(loss_name: str):
    """Decorator: ``factory(cfg) -> List[ClassyHook]`` added when ``LOSS.name == loss_name``."""

    def deco(factory):
        if loss_name in _LOSS_HOOK_FACTORIES and _LOSS_HOOK_FACTORIES[loss_name] is not factory:
            raise ValueError(f"vissl_swav_plugin: hooks for loss '{loss_name}' already registered")
        _LOSS_HOOK_FACTORIES[loss_name] = factory
        return factory

    return deco


_MONITOR_FACTORIES: List[Callable] = []


def register_monitor_hooks(factory):
    """Decorator: ``factory(cfg) -> List[ClassyHook]`` is asked for hooks in every run, whatever
    the loss (progress line, collapse detector, online kNN, ...); it returns ``[]`` when its
    config section switches it off.  Monitors come after the loss's own hooks."""
    if factory not in _MONITOR_FACTORIES:
        _MONITOR_FACTORIES.append(factory)
    return factory


def hooks_for_config(cfg) -> List[ClassyHook]:
    """Our hooks for this config: the loss's own (by ``LOSS.name``), then the monitors."""
    factory = _LOSS_HOOK_FACTORIES.get(cfg.LOSS.name)
    hooks = list(factory(cfg)) if factory else []
    for monitor in _MONITOR_FACTORIES:
        hooks.extend(monitor(cfg))
    return hooks


def install() -> None:
    """Wrap ``vissl.hooks.add_loss_hooks`` through the compat engine (patch
    ``plugin_loss_hooks``: applied now and once per process, listed by
    ``compat.applied()``, undone by ``compat.disabled("plugin_loss_hooks")``)."""
    from vissl_swav_plugin import compat

    def plugin_loss_hooks():
        import vissl.hooks as vh

        original = compat.raw(vh, "add_loss_hooks")

        def add_loss_hooks(hooks, loss_cfg, cfg):
            hooks = original(hooks, loss_cfg, cfg)
            hooks.extend(hooks_for_config(cfg))
            return hooks

        add_loss_hooks.__wrapped__ = original
        compat.patch("plugin_loss_hooks", vh, "add_loss_hooks", add_loss_hooks)

    compat.register(plugin_loss_hooks, now=True)


class NoOpHook(ClassyHook):
    """A ClassyHook whose unimplemented events are no-ops (base of all our hooks)."""

    on_start = ClassyHook._noop
    on_phase_start = ClassyHook._noop
    on_forward = ClassyHook._noop
    on_loss_and_meter = ClassyHook._noop
    on_backward = ClassyHook._noop
    on_update = ClassyHook._noop
    on_step = ClassyHook._noop
    on_phase_end = ClassyHook._noop
    on_end = ClassyHook._noop
    on_exception = ClassyHook._noop


def _prototype_layers(task):
    layers = [layer for _, layer in find_prototype_layers(task.model).values()]
    if not layers:
        raise RuntimeError(
            "vissl_swav_plugin: LOSS.name is swav_plugin_loss but the model has no prototype "
            "layers; set MODEL.HEAD.PARAMS=[[swav_plugin_head, {...}]]"
        )
    return layers


class SwAVAssignmentHook(NoOpHook):
    def __init__(self, queue_start_epoch: int, checkpoint_iter_frequency: int = 0):
        super().__init__()
        self.queue_start_epoch = int(queue_start_epoch)
        self.checkpoint_iter_frequency = int(checkpoint_iter_frequency)

    def _attach(self, task):
        task.loss.set_prototypes(_prototype_layers(task))

    def on_start(self, task) -> None:
        self._attach(task)

    def on_phase_start(self, task) -> None:
        if not task.train or not task.loss.has_queue:
            return
        epoch = task.train_phase_idx
        active = epoch >= self.queue_start_epoch
        if active and not task.loss.queue_active:
            logging.info(f"SwAV queue starts at epoch {epoch} (queue.start_epoch={self.queue_start_epoch})")
        task.loss.set_queue_active(active)

    def on_forward(self, task) -> None:
        self._attach(task)
        guard_finite_model_output(task)

    def _gather(self, task):
        task.loss.gather_queues_for_checkpoint()

    def on_step(self, task) -> None:
        f = self.checkpoint_iter_frequency
        if task.train and task.loss.has_queue and f > 0 and task.iteration % f == 0:
            self._gather(task)

    def on_phase_end(self, task) -> None:
        if task.train and task.loss.has_queue:
            self._gather(task)


def guard_finite_model_output(task) -> None:
    """Stop with a clear error when the model output (embeddings / prototype scores) is
    NaN/inf, saving output and input batch.  Runs in ``on_forward`` before VISSL's
    ``LogLossMetricsCheckpointHook``, which would otherwise write ``model_iteration<N>.torch``
    with the diverged weights (picked by AUTO_RESUME with CHECKPOINT_ITER_FREQUENCY > 0), and
    before VISSL 0.1.6's ``CheckNanModelOutputHook``, which fails with ``AttributeError:
    'CheckNanModelOutputHook' object has no attribute '_checkpoint_model'``."""
    out = task.last_batch.model_output
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if torch.is_tensor(t)]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return
    from vissl_swav_plugin.nonfinite import raise_non_finite

    it = int(task.iteration)
    out_dir = getattr(task.loss, "output_dir", None) or task.checkpoint_folder or "."
    sample = getattr(task.last_batch, "sample", {}) or {}
    raise_non_finite(
        out_dir, it, "model_output", {"model_output": tensors, "input": sample.get("input"), "iteration": it},
        f"swav_plugin_loss: the model output (embeddings / prototype scores) is NaN or inf at "
        f"iteration {it}: the training diverged (learning rate too high? fp16 overflow?). No "
        f"checkpoint was written for this iteration",
        "model output and input batch",
    )


class FreezePrototypesHook(NoOpHook):
    """Prototypes get no update for the first ``niters`` iterations (paper App. A.1:
    "freeze the prototypes during the first epoch"): their gradient is set to ``None``
    after the backward pass, so neither momentum nor weight decay moves them."""

    def __init__(self, niters: int):
        super().__init__()
        self.niters = int(niters)

    def on_backward(self, task) -> None:
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
        layers = _prototype_layers(task)
        err = max(float((l.weight.detach().float().norm(dim=1) - 1).abs().max()) for l in layers)
        if err > self.NORM_TOLERANCE:
            logging.info(f"Prototypes are not unit-norm at start (max |norm - 1| = {err:.3g}): L2-normalised")
            normalize_prototypes_(layers)

    def on_update(self, task) -> None:
        if task.iteration < self.frozen_niters:
            return
        normalize_prototypes_(_prototype_layers(task))


class TraceHook(NoOpHook):
    """Debug trace (env ``VISSL_SWAV_PLUGIN_TRACE_DIR``): one JSON line per event and rank
    with the prototypes' checksum and norms and the queue state, to check freezing,
    normalisation and queue behaviour of a real (multi-process) run from outside."""

    def __init__(self, out_dir: str):
        super().__init__()
        self.out_dir = out_dir

    def _write(self, task, event):
        import json
        import os

        from vissl_swav_plugin.distributed import rank as _rank

        rec = {"event": event, "iteration": int(task.iteration), "epoch": int(task.train_phase_idx)}
        protos = prototype_parameters(task.model)
        if protos:
            w = protos[0].detach().double()
            rec["proto_sum"] = float(w.sum())
            rec["proto_abs_sum"] = float(w.abs().sum())
            rec["proto_norm_err"] = float((w.norm(dim=1) - 1).abs().max())
        queue_summary = getattr(task.loss, "queue_summary", None)
        if queue_summary is not None:
            rec.update(queue_summary())
        if event == "update" and task.last_batch is not None and task.last_batch.loss is not None:
            rec["loss"] = float(task.last_batch.loss)
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"trace_rank{_rank()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")

    def on_start(self, task) -> None:
        self._write(task, "start")

    def on_update(self, task) -> None:
        self._write(task, "update")

    def on_phase_end(self, task) -> None:
        if task.train:
            self._write(task, "phase_end")


@register_loss_hooks("swav_plugin_loss")
def swav_hooks(cfg) -> List[ClassyHook]:
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
    trace_dir = os.environ.get("VISSL_SWAV_PLUGIN_TRACE_DIR")
    if trace_dir:
        hooks.append(TraceHook(trace_dir))
    return hooks


install()
