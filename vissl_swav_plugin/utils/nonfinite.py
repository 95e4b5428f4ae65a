"""The non-finite guard shared by every loss of the plugin (SwAV, DeepCluster-v2, SeLa-v2).

A NaN or inf in a loss, in the codes / pseudo-label scores it is computed from, or in the
features a clustering runs on means the training has diverged: continuing would only
write checkpoints with broken weights.  :func:`raise_non_finite` saves the offending
tensors to ``<output_dir>/nonfinite_rank<r>_iter<n>_<what>.pth`` (``r`` the process'
rank, ``n`` the training iteration, ``what`` e.g. ``head0``) and stops the run with
:class:`NonFiniteLossError`, whose message ends with ``saved to <path>``.
:func:`guard_finite_model_output` does the same for a training task's model output.

Example::

    >>> import torch
    >>> from vissl_swav_plugin.utils.nonfinite import all_finite
    >>> all_finite(torch.ones(2), torch.tensor(float("nan")))
    False
"""
import os
from typing import Any, Dict, NoReturn

import torch

from vissl_swav_plugin.utils.distributed import rank

__all__ = ["NonFiniteLossError", "all_finite", "guard_finite_model_output", "nonfinite_dump_path", "raise_non_finite"]


class NonFiniteLossError(FloatingPointError):
    """Raised when a loss, its codes / scores or a model output are NaN/inf; the offending
    tensors have been saved (the message names the file)."""


def all_finite(*tensors: torch.Tensor) -> bool:
    """Whether every element of every tensor is finite (one host synchronisation)."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def _to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_cpu(v) for v in obj]
    return obj


def nonfinite_dump_path(output_dir: str, iteration: int, what: str) -> str:
    """``<output_dir>/nonfinite_rank<rank>_iter<iteration>_<what>.pth``."""
    return os.path.join(output_dir, f"nonfinite_rank{rank()}_iter{int(iteration)}_{what}.pth")


def raise_non_finite(
    output_dir: str, iteration: int, what: str, tensors: Dict[str, Any], problem: str, saved: str
) -> NoReturn:
    """Save ``tensors`` (moved to the CPU, nested lists / dicts allowed) and raise.

    Args:
        output_dir: folder of the dump (created if missing), normally the checkpoint folder.
        iteration: training iteration, part of the file name.
        what: last part of the file name, e.g. ``"head1"`` or ``"model_output"``.
        tensors: what to save, e.g. ``{"scores": s, "loss": l, "iteration": n}``.
        problem: first part of the message: what was not finite, where.
        saved: what the file holds, e.g. ``"scores and codes"``.

    Raises:
        NonFiniteLossError: always, with message ``"<problem>; <saved> saved to <path>"``.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = nonfinite_dump_path(output_dir, iteration, what)
    torch.save(_to_cpu(tensors), path)
    raise NonFiniteLossError(f"{problem}; {saved} saved to {path}")


def guard_finite_model_output(task) -> None:
    """Stop with a clear error when the model output (embeddings / prototype scores) is
    NaN/inf, saving output and input batch (:func:`raise_non_finite`, named
    ``model_output``).  ``task`` is a VISSL / Classy Vision task, read by attribute only
    (``last_batch.model_output``, ``last_batch.sample``, ``iteration``, ``loss.output_dir``,
    ``checkpoint_folder``): no VISSL import.  The SwAV assignment hook
    (:mod:`vissl_swav_plugin.hooks.swav_hooks`) calls it in ``on_forward``, before VISSL's
    ``LogLossMetricsCheckpointHook``, which would otherwise write ``model_iteration<N>.torch``
    with the diverged weights (picked by AUTO_RESUME with CHECKPOINT_ITER_FREQUENCY > 0), and
    before VISSL 0.1.6's ``CheckNanModelOutputHook``, which fails with ``AttributeError:
    'CheckNanModelOutputHook' object has no attribute '_checkpoint_model'``."""
    out = task.last_batch.model_output
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if torch.is_tensor(t)]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return
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
