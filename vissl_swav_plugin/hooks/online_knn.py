"""Online kNN accuracy during pre-training (config ``HOOKS.ONLINE_KNN``; off by default).

Every ``EVERY_N_EPOCHS`` training epochs (and after the last one) :class:`OnlineKnnHook`
classifies a held-out labelled image folder (``TEST_PATH``) with the weighted cosine kNN of
Wu et al. 2018 (:func:`vissl_swav_plugin.utils.knn.weighted_knn_predict`: the ``TOPK`` most
cosine-similar memory-bank features vote with weight ``exp(cos / TEMPERATURE)``) over the
features of a labelled memory bank (``TRAIN_PATH``), both taken from the trunk's
``FEATURE_LAYER`` in eval mode (BN running statistics, no dropout, no gradients) in fp32.

It runs at the end of the epoch, before VISSL's checkpoint hook, so the accuracy logged for
epoch ``e`` is that of ``model_phase<e>.torch``.  The images are split over the processes
(every process uses rank 0's BN statistics for it, its own are restored afterwards), the
features gathered, and rank 0 logs one line::

    online kNN: epoch 2/2 | res5avg 20-NN top-1 62.50% (10/16) | memory bank 32 / queries 16 images | 0.8 s

and appends a JSON record to ``<CHECKPOINT.DIR>/online_knn.jsonl``; with
``HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true`` the accuracy also goes to TensorBoard as
``Online_kNN/top1_<layer>_<k>NN`` (step: the 0-based epoch, as VISSL's epoch scalars).

Images: ``ImageFolder`` layout (``<path>/<class>/<image>``, the same class folders in both
paths), read as RGB, resized (shorter side ``RESIZE``), centre-cropped to ``CROP_SIZE`` and
normalised with ``MEAN`` / ``STD``, or, with ``MIN_STD`` set, each standardised by its own
mean and std (floor ``MIN_STD``), as ``multicrop_plugin``'s ``normalize: per_image`` does.

Config (defaults used for absent keys)::

    config:
      HOOKS:
        ONLINE_KNN:
          ENABLED: false
          TRAIN_PATH: ""            # labelled ImageFolder: the kNN memory bank
          TEST_PATH: ""             # labelled ImageFolder: the queries
          EVERY_N_EPOCHS: 1
          TOPK: 20
          TEMPERATURE: 0.07
          FEATURE_LAYER: res5avg    # a trunk output (out_feat_keys), flattened
          RESIZE: 256
          CROP_SIZE: 224
          MEAN: [0.485, 0.456, 0.406]
          STD: [0.229, 0.224, 0.225]
          MIN_STD: null             # a number: per-image standardisation (MEAN/STD then left at their defaults)
          BATCH_SIZE: 64
"""
import json
import logging
import os
import time
from typing import List

import torch

from vissl_swav_plugin.config.checkers import (
    ConfigError,
    hook_block,
    require_bool,
    require_int,
    require_positive_number,
    require_str,
)
from vissl_swav_plugin.config.registries import register_config_check
from vissl_swav_plugin.hooks.registry import NoOpHook, register_monitor_hooks
from vissl_swav_plugin.transforms.standardize import PerImageStandardize, check_min_std

#: every key of ``config.HOOKS.ONLINE_KNN`` with its default
DEFAULTS = {
    "ENABLED": False, "TRAIN_PATH": "", "TEST_PATH": "", "EVERY_N_EPOCHS": 1, "TOPK": 20,
    "TEMPERATURE": 0.07, "FEATURE_LAYER": "res5avg", "RESIZE": 256, "CROP_SIZE": 224,
    "MEAN": [0.485, 0.456, 0.406], "STD": [0.229, 0.224, 0.225], "MIN_STD": None, "BATCH_SIZE": 64,
}


def _require_triple(value, key, positive=False):
    """Three finite numbers (per RGB channel), all > 0 if ``positive``."""
    ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
        for v in value)
    if not ok or (positive and min(value) <= 0):
        raise ConfigError(f"config.{key} must be 3 numbers{' > 0' if positive else ''} (one per RGB channel), "
                          f"got {value!r}")


def _require_folder(value, key):
    require_str(value, key)
    if not os.path.isdir(value):
        raise ConfigError(f"config.{key}={value!r} is not a folder (ImageFolder layout: <path>/<class>/<image>)")


@register_config_check
def online_knn_config(cfg) -> dict:
    """``config.HOOKS.ONLINE_KNN`` with defaults filled in (paths checked only when enabled).

    Raises:
        ConfigError: unknown key or bad value, naming the key.
    """
    int1 = lambda v, k: require_int(v, k, minimum=1)  # noqa: E731
    checks = {"ENABLED": require_bool, "EVERY_N_EPOCHS": int1, "TOPK": int1, "RESIZE": int1, "CROP_SIZE": int1,
              "BATCH_SIZE": int1, "TEMPERATURE": require_positive_number, "FEATURE_LAYER": require_str,
              "MEAN": _require_triple, "STD": lambda v, k: _require_triple(v, k, positive=True)}
    c = hook_block(cfg, "ONLINE_KNN", DEFAULTS, checks)
    if c["MIN_STD"] is not None:  # per-image standardisation, as multicrop_plugin's normalize: per_image
        check_min_std(c["MIN_STD"], "MIN_STD", "config.HOOKS.ONLINE_KNN")
        given = [k for k in ("MEAN", "STD") if list(c[k]) != DEFAULTS[k]]
        if given:
            raise ConfigError(f"config.HOOKS.ONLINE_KNN.{given[0]} cannot act with MIN_STD set (each image is "
                              "standardised by its own mean and std): remove it, or MIN_STD")
    if c["ENABLED"]:
        _require_folder(c["TRAIN_PATH"], "HOOKS.ONLINE_KNN.TRAIN_PATH")
        _require_folder(c["TEST_PATH"], "HOOKS.ONLINE_KNN.TEST_PATH")
    return c


def image_folder(path, c):
    """torchvision ``ImageFolder`` of ``path`` with the hook's eval transform (resize,
    centre crop, to tensor, normalise) from config ``c``."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    norm = (PerImageStandardize(c["MIN_STD"]) if c["MIN_STD"] is not None
            else T.Normalize(list(c["MEAN"]), list(c["STD"])))
    tf = T.Compose([T.Resize(c["RESIZE"]), T.CenterCrop(c["CROP_SIZE"]), T.ToTensor(), norm])
    return ImageFolder(path, transform=tf)


def _swap_buffers(module, new):
    """Copy ``new`` into the module's buffers in place; returns their previous values."""
    old = []
    for b, n in zip(module.buffers(), new):
        old.append(b.detach().clone())
        b.data.copy_(n)
    return old


class OnlineKnnHook(NoOpHook):
    """kNN top-1 accuracy of the trunk's features on a held-out set, every N epochs.

    Args:
        cfg: :func:`online_knn_config`'s dict.
        num_epochs: the run's training epochs (the last one is always evaluated).
    """

    def __init__(self, cfg: dict, num_epochs: int):
        super().__init__()
        self.c = dict(cfg)
        self.num_epochs = int(num_epochs)
        self.bank = self.queries = None

    def on_start(self, task) -> None:
        """Load the held-out images once per run."""
        self.bank = image_folder(self.c["TRAIN_PATH"], self.c)
        self.queries = image_folder(self.c["TEST_PATH"], self.c)
        if self.bank.classes != self.queries.classes:
            raise ConfigError(
                f"config.HOOKS.ONLINE_KNN: TRAIN_PATH and TEST_PATH have different class folders: "
                f"{self.bank.classes} vs {self.queries.classes}")
        if self.c["TOPK"] > len(self.bank):
            raise ConfigError(f"config.HOOKS.ONLINE_KNN.TOPK={self.c['TOPK']} exceeds the {len(self.bank)} "
                              f"images of TRAIN_PATH {self.c['TRAIN_PATH']}")

    def _features(self, trunk, dataset, device):
        """This process's share of ``dataset`` (contiguous, in rank order) through ``trunk``,
        gathered: ``[len(dataset), D]`` float32 on CPU."""
        from vissl_swav_plugin.utils.distributed import all_gather_rows, world_size_and_rank

        world, rank = world_size_and_rank()
        mine = torch.arange(len(dataset)).tensor_split(world)[rank].tolist()
        feats = []
        bs = self.c["BATCH_SIZE"]
        for i in range(0, len(mine), bs):
            x = torch.stack([dataset[j][0] for j in mine[i:i + bs]]).to(device)
            feats.append(trunk(x, out_feat_keys=[self.c["FEATURE_LAYER"]])[0].flatten(1).float())
        dim = feats[0].shape[1] if feats else self._dim(trunk, dataset, device)
        local = torch.cat(feats) if feats else torch.zeros(0, dim, device=device)
        return all_gather_rows(local).cpu()

    def _dim(self, trunk, dataset, device):
        x = dataset[0][0][None].to(device)
        return trunk(x, out_feat_keys=[self.c["FEATURE_LAYER"]])[0].flatten(1).shape[1]

    def evaluate(self, task) -> dict:
        """The kNN of the current trunk (all processes take part); returns the record."""
        from vissl_swav_plugin.utils.distributed import broadcast_
        from vissl_swav_plugin.utils.knn import weighted_knn_predict

        t0 = time.time()
        trunk = task.base_model.trunk
        device = next(trunk.parameters()).device
        modes = {m: m.training for m in trunk.modules()}
        own = _swap_buffers(trunk, [broadcast_(b.detach().clone()) for b in trunk.buffers()])
        try:
            trunk.eval()
            with torch.no_grad():
                bank = self._features(trunk, self.bank, device)
                queries = self._features(trunk, self.queries, device)
        finally:
            _swap_buffers(trunk, own)
            for m, training in modes.items():
                m.train(training)
        bank_y = torch.tensor(self.bank.targets)
        query_y = torch.tensor(self.queries.targets)
        pred = weighted_knn_predict(bank, bank_y, queries, self.c["TOPK"], self.c["TEMPERATURE"],
                                    num_classes=len(self.bank.classes))
        correct = int((pred == query_y).sum())
        return dict(epoch=int(task.train_phase_idx), iteration=int(task.iteration), layer=self.c["FEATURE_LAYER"],
                    k=self.c["TOPK"], temperature=self.c["TEMPERATURE"], correct=correct, num_test=len(query_y),
                    num_train=len(bank_y), top1=100.0 * correct / max(1, len(query_y)),
                    seconds=round(time.time() - t0, 3))

    def on_phase_end(self, task) -> None:
        """Every ``EVERY_N_EPOCHS`` training epochs, log the held-out kNN accuracy."""
        if not task.train:
            return
        epoch = int(task.train_phase_idx)
        if (epoch + 1) % self.c["EVERY_N_EPOCHS"] and epoch + 1 != self.num_epochs:
            return
        rec = self.evaluate(task)
        from vissl_swav_plugin.utils.distributed import rank

        if rank() != 0:
            return
        logging.info(
            f"online kNN: epoch {epoch + 1}/{self.num_epochs} | {rec['layer']} {rec['k']}-NN top-1 "
            f"{rec['top1']:.2f}% ({rec['correct']}/{rec['num_test']}) | memory bank {rec['num_train']} / "
            f"queries {rec['num_test']} images | {rec['seconds']:.1f} s")
        folder = task.checkpoint_folder or "."
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "online_knn.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        for hook in task.hooks:
            writer = getattr(hook, "tb_writer", None)
            if writer is not None:
                writer.add_scalar(f"Online_kNN/top1_{rec['layer']}_{rec['k']}NN", rec["top1"], global_step=epoch)
                writer.flush()


@register_monitor_hooks
def online_knn_hooks(cfg) -> List[NoOpHook]:
    """``[OnlineKnnHook]`` when ``config.HOOKS.ONLINE_KNN.ENABLED``, else ``[]``."""
    c = online_knn_config(cfg)
    return [OnlineKnnHook(c, cfg.OPTIMIZER.num_epochs)] if c["ENABLED"] else []
