"""The debug trace of a run: one JSON line per event and rank (env ``VISSL_SWAV_PLUGIN_TRACE_DIR``).

With ``VISSL_SWAV_PLUGIN_TRACE_DIR=dir`` the SwAV loss's hooks (:mod:`.swav_hooks`) add a
:class:`TraceHook`, which every rank uses to append to ``dir/trace_rank<r>.jsonl``: at the
start, after every update and at the end of every training epoch, the iteration, the epoch,
the prototypes' checksum and norms, the loss's queue state (``queue_summary()``) and the
loss.  The multi-process tests read these files to check freezing, normalisation and the
queue of a real run from outside.

Example line::

    {"event": "update", "iteration": 3, "epoch": 0, "proto_sum": 1.25, "proto_abs_sum": 310.2,
     "proto_norm_err": 2.2e-16, "loss": 8.1}
"""
import json
import os

from vissl_swav_plugin.hooks.registry import NoOpHook
from vissl_swav_plugin.models.heads import prototype_parameters
from vissl_swav_plugin.utils.distributed import rank as _rank

#: the environment variable that switches the trace on: the folder of the trace files
TRACE_ENV = "VISSL_SWAV_PLUGIN_TRACE_DIR"


class TraceHook(NoOpHook):
    """Debug trace (env ``VISSL_SWAV_PLUGIN_TRACE_DIR``): one JSON line per event and rank
    with the prototypes' checksum and norms and the queue state, to check freezing,
    normalisation and queue behaviour of a real (multi-process) run from outside."""

    def __init__(self, out_dir: str):
        super().__init__()
        self.out_dir = out_dir

    def _write(self, task, event):
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
        """Trace the state at the start of the run."""
        self._write(task, "start")

    def on_update(self, task) -> None:
        """Trace the state after every update."""
        self._write(task, "update")

    def on_phase_end(self, task) -> None:
        """Trace the state at the end of every training epoch."""
        if task.train:
            self._write(task, "phase_end")
