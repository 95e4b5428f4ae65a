"""Shared by ``tests/integration/compat/test_persistent_workers_integration.py`` and the unit tests of
``vissl_swav_plugin/compat/persistent_workers.py``: a VISSL data loader of flat gray images with
a ``multicrop_plugin`` colour warm-up, and a collate function that reports, from *inside* the
loader worker, its process id and the colour strength its own copy of the transform uses."""
import os

import torch
from PIL import Image

from testkit import compose, folder_data_overrides

WARMUP_TRANSFORM = (
    "[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[28,16],"
    "crop_scales:[[0.3,1],[0.1,0.3]],color_strength:[1.0,0.5],color_jitter_p:1.0,grayscale_p:0.0,blur_p:0.0,"
    "color_warmup_iters:8,color_warmup_strength:0.0,color_warmup_schedule:linear,"
    "mean:[0.5,0.5,0.5],std:[0.25,0.25,0.25]}]")


def flat_folder(root, n=8, value=128):
    for c in range(2):
        d = root / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n // 2):
            Image.new("RGB", (28, 28), (value,) * 3).save(d / f"{i}.png")
    return root


def warmup_config(folder, workers, extra=()):
    """quick_cpu with the warm-up transform on ``folder``: batch 2, ``workers`` workers."""
    return compose(["config=test/swav_plugin/quick_cpu", *folder_data_overrides(folder),
                    f"config.DATA.TRAIN.TRANSFORMS={WARMUP_TRANSFORM}", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
                    f"config.DATA.NUM_DATALOADER_WORKERS={workers}", "config.DATA.TRAIN.DATA_LIMIT=-1", *extra])


def build_loader(cfg, workers, start_method="forkserver", probe=True):
    """VISSL's build_dataset + build_dataloader (the trainer's path); the collate function
    replaced by :func:`probe_collate` when ``probe``."""
    from vissl.data import build_dataloader, build_dataset

    ds = build_dataset(cfg, "TRAIN")
    loader = build_dataloader(ds, cfg.DATA.TRAIN, num_dataloader_workers=workers, pin_memory=False,
                              multi_processing_method=start_method, device=torch.device("cpu"))
    if probe:
        loader.collate_fn = probe_collate  # read when the first iterator is made
    return ds, loader


def probe_collate(batch):
    """Run in the worker after the batch's items were read: its pid and the strength per crop
    group of every colour-warm-up transform in the worker's own dataset copy."""
    from vissl_swav_plugin.hooks.color_warmup import scheduled_transforms

    info = torch.utils.data.get_worker_info()
    dataset = info.dataset if info is not None else None
    strengths = [list(t.current_color_strength) for t in scheduled_transforms(dataset)] if dataset is not None else None
    return {"pid": os.getpid(), "strengths": strengths, "items": len(batch)}


def main_strengths(dataset):
    from vissl_swav_plugin.hooks.color_warmup import scheduled_transforms

    return [list(t.current_color_strength) for t in scheduled_transforms(dataset)]
