"""The training-loop hook of the memory-bank clustering losses (DeepCluster-v2, SeLa-v2):
:class:`MemoryClusteringHook` calls the loss' methods
(:class:`~vissl_swav_plugin.losses.memory_bank_loss.MemoryBankClusteringLoss`) at VISSL's hook events;
:func:`memory_clustering_hooks` is registered here for both loss names
(``deepclusterv2_plugin_loss``, ``selav2_plugin_loss``)."""
from typing import List

from vissl_swav_plugin.hooks.registry import NoOpHook, register_loss_hooks
from vissl_swav_plugin.losses.memory_bank_loss import MemoryBankClusteringLoss

__all__ = ["MemoryClusteringHook", "memory_clustering_hooks"]


class MemoryClusteringHook(NoOpHook):
    """Drives a :class:`MemoryBankClusteringLoss` through VISSL's training loop:
    ``on_start`` -> :meth:`~MemoryBankClusteringLoss.setup`, ``on_phase_start`` ->
    :meth:`~MemoryBankClusteringLoss.start_epoch` (assignment step), ``on_forward`` ->
    :meth:`~MemoryBankClusteringLoss.set_batch` (VISSL's ``data_idx`` of the batch),
    ``on_backward`` / ``on_update`` -> :meth:`~MemoryBankClusteringLoss.after_backward` /
    :meth:`~MemoryBankClusteringLoss.after_update`, ``on_phase_end`` ->
    :meth:`~MemoryBankClusteringLoss.end_epoch` (bank gathered for the checkpoint)."""

    @staticmethod
    def _loss(task):
        loss = task.base_loss
        if not isinstance(loss, MemoryBankClusteringLoss):
            raise TypeError(f"MemoryClusteringHook needs a memory-bank clustering loss, got {type(loss)}")
        return loss

    def on_start(self, task) -> None:
        """Validate against the task and fill the bank (initial forward pass)."""
        self._loss(task).setup(task)

    def on_phase_start(self, task) -> None:
        """Assignment step at the start of every training epoch."""
        if task.train:
            self._loss(task).start_epoch(task, task.train_phase_idx)

    def on_forward(self, task) -> None:
        """Hand the batch's sample indices and crop count to the loss."""
        sample = task.last_batch.sample
        ids = sample.get("data_idx")
        if isinstance(ids, (list, tuple)):
            ids = ids[0]
        inp = sample.get("input")
        num_crops = len(inp) if isinstance(inp, (list, tuple)) else 1
        self._loss(task).set_batch(ids, num_crops, task.train, getattr(task, "iteration", None))

    def on_backward(self, task) -> None:
        """After every backward pass, before the optimizer step."""
        self._loss(task).after_backward(task)

    def on_update(self, task) -> None:
        """After every optimizer step."""
        self._loss(task).after_update(task)

    def on_phase_end(self, task) -> None:
        """Gather the bank of all processes at the end of every training epoch."""
        if task.train:
            self._loss(task).end_epoch(task, task.train_phase_idx)


@register_loss_hooks("deepclusterv2_plugin_loss")
@register_loss_hooks("selav2_plugin_loss")
def memory_clustering_hooks(cfg) -> List[MemoryClusteringHook]:
    """The hooks of a memory-bank clustering loss (DeepCluster-v2 and SeLa-v2)."""
    return [MemoryClusteringHook()]
