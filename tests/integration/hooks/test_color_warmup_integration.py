"""The colour-distortion warm-up: ``multicrop_plugin``'s ``color_warmup_iters`` /
``color_warmup_strength`` and :class:`vissl_swav_plugin.hooks.color_warmup.ColorWarmupHook`: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/hooks/test_color_warmup.py``.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import vissl  # noqa: F401  (registers the plugin)
from testkit import compose, folder_data_overrides
from vissl_swav_plugin.hooks.color_warmup import ColorWarmupHook
from color_warmup_cases import sampled  # noqa: F401


def _flat_folder(root, n=8, value=128):
    for c in range(2):
        d = root / f"c{c}"
        d.mkdir(parents=True)
        for i in range(n // 2):
            Image.new("RGB", (28, 28), (value,) * 3).save(d / f"{i}.png")
    return root


def _distinct_values(loader):
    """Per batch: the number of distinct pixel values over all crops (flat images: one value
    per crop, so 1 without colour jitter)."""
    out = []
    for batch in loader:
        crops = batch["data"][0] if isinstance(batch["data"][0], list) else batch["data"]
        vals = torch.cat([c.flatten() for c in crops]).numpy().round(4)
        out.append(len(np.unique(vals)))
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_hook_sets_each_epochs_strength_before_the_loader_workers_start(tmp_path, workers):
    """A VISSL dataset and data loader (``workers`` loader processes), driven as VISSL's
    trainer does: the hook's ``on_start`` / ``on_phase_end`` run before each epoch's
    iterator is created.  Warm-up strength 0 (no jitter: a flat image stays one value), then
    1.0 (brightness/contrast jitter: many values).  A resumed task (train_phase_idx 1) starts
    after the warm-up."""
    from vissl.data import build_dataloader, build_dataset

    folder = _flat_folder(tmp_path / "flat")
    tf = ("[{name:multicrop_plugin,total_num_crops:4,num_crops:[2,2],size_crops:[28,16],"
          "crop_scales:[[0.3,1],[0.1,0.3]],color_strength:1.0,color_jitter_p:1.0,grayscale_p:0.0,blur_p:0.0,"
          "color_warmup_iters:4,color_warmup_strength:0.0,mean:[0.5,0.5,0.5],std:[0.25,0.25,0.25]}]")
    cfg = compose(["config=test/swav_plugin/quick_cpu", *folder_data_overrides(folder), f"config.DATA.TRAIN.TRANSFORMS={tf}",
                   "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2", f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
                   "config.DATA.TRAIN.DATA_LIMIT=-1"])
    ds = build_dataset(cfg, "TRAIN")
    loader = build_dataloader(ds, cfg.DATA.TRAIN, num_dataloader_workers=workers, pin_memory=False,
                              multi_processing_method="forkserver", device=torch.device("cpu"))
    assert len(loader) == 4  # 8 images, batch 2, one process: 4 iterations per epoch -> 1 warm-up epoch
    task = SimpleNamespace(dataloaders={"train": loader}, train_phase_idx=-1, train=True)
    hook = ColorWarmupHook()
    seen = []
    hook.on_start(task)
    for phase in range(3):
        seen.append(_distinct_values(loader))
        task.train_phase_idx = phase
        hook.on_phase_end(task)
    assert all(v == 1 for v in seen[0]), seen      # warm-up: no jitter in the workers' crops
    assert all(v > 2 for v in seen[1] + seen[2]), seen  # then the configured jitter
    resumed = SimpleNamespace(dataloaders={"train": loader}, train_phase_idx=1, train=True)
    ds.transform.transforms[0].transform.set_epoch(0, 4)  # as a fresh process would start
    ColorWarmupHook().on_start(resumed)
    assert all(v > 2 for v in _distinct_values(loader))
