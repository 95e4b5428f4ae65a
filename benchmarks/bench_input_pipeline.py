"""Throughput (images/s) of the whole SwAV input pipeline with DataLoader workers, one run:
VISSL's ``disk_folder`` dataset (JPEG decode, ``GenericSSLDataset``) -> multi-crop
transforms -> ``multicrop_collator`` -> VISSL's ``build_dataloader`` (its sampler, worker
seeding, ``MULTI_PROCESSING_METHOD``), for the paper's 2x224 + 6x96 recipe.

Compared, on the same images and loader settings:

* stock VISSL: VISSL's chain ``ImgPilToMultiCrop`` -> ``RandomHorizontalFlip`` ->
  ``ImgPilColorDistortion`` -> ``ImgPilGaussianBlur`` -> ``ToTensor`` -> ``Normalize`` (its
  SwAV recipe) and VISSL's own ``DiskImageDataset.__getitem__`` (which decodes every
  ``disk_folder`` image twice; ``VISSL_SWAV_PLUGIN_BAD_IMAGES=vissl``);
* VISSL's chain with the plugin's dataset read (``data_safety``: one decode);
* plugin: one ``multicrop_plugin`` transform with the same parameters, plugin's read.

Images: the first ``--images`` Fashion-MNIST test images, converted to RGB, upsampled to
``--image-size`` px (default 256) and written as JPEG (quality 90) into an ImageFolder in
a temporary directory, so decoding is part of the measured pipeline.  Each round
iterates one full epoch of each pipeline (alternating order); a fresh DataLoader per
epoch as in VISSL training, so worker start-up is included in ``epoch img/s`` and
excluded in ``steady img/s`` (timed from batch ``2 x workers`` on, once the batches
prefetched during start-up are consumed).  Median over ``--rounds``.

usage: python benchmarks/bench_input_pipeline.py [--images 512] [--workers 2] [--batch 32]
          [--rounds 3] [--image-size 256] [--recipe 2x224+6x96] [--start-method fork]
prints images/s of both and the ratio plugin / VISSL.
"""
import argparse
import gzip
import os
import socket
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

FASHION_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
RECIPES = {
    "2x224+6x96": ([2, 6], [224, 96], [[0.14, 1.0], [0.05, 0.14]]),
    "2x32+4x16": ([2, 4], [32, 16], [[0.14, 1.0], [0.05, 0.14]]),
}


def write_image_folder(root, n, size):
    path = os.path.join(FASHION_DIR, "t10k-images-idx3-ubyte.gz")
    if not os.path.isfile(path):
        sys.exit(f"bench_input_pipeline: {path} not found; apt-get install -y dataset-fashion-mnist "
                 "or set FASHION_MNIST_DIR")
    with gzip.open(path, "rb") as f:
        arr = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    for i in range(n):
        d = os.path.join(root, f"class{i % 2}")
        os.makedirs(d, exist_ok=True)
        img = Image.fromarray(arr[i]).convert("RGB").resize((size, size), Image.BILINEAR)
        img.save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
    return root


def transforms(kind, recipe):
    num, sizes, scales = recipe
    total = sum(num)
    if kind == "vissl":
        return [
            {"name": "ImgPilToMultiCrop", "total_num_crops": total, "num_crops": num,
             "size_crops": sizes, "crop_scales": scales},
            {"name": "RandomHorizontalFlip", "p": 0.5},
            {"name": "ImgPilColorDistortion", "strength": 1.0},
            {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0},
            {"name": "ToTensor"},
            {"name": "Normalize", "mean": MEAN, "std": STD},
        ]
    return [{"name": "multicrop_plugin", "total_num_crops": total, "num_crops": num,
             "size_crops": sizes, "crop_scales": scales, "flip_p": 0.5, "color_strength": 1.0,
             "blur_p": 0.5, "blur_sigma": [0.1, 2.0], "mean": MEAN, "std": STD}]


def build_loader(kind, args, folder, recipe):
    """kind: vissl_stock (VISSL chain, VISSL's own DiskImageDataset.__getitem__), vissl (VISSL
    chain, the plugin's single-decode read) or plugin (multicrop_plugin, single decode)."""
    if kind == "vissl_stock":
        old = os.environ.get("VISSL_SWAV_PLUGIN_BAD_IMAGES")
        os.environ["VISSL_SWAV_PLUGIN_BAD_IMAGES"] = "vissl"  # read when the dataset is built
        try:
            return _build_loader("vissl", args, folder, recipe)
        finally:
            if old is None:
                os.environ.pop("VISSL_SWAV_PLUGIN_BAD_IMAGES")
            else:
                os.environ["VISSL_SWAV_PLUGIN_BAD_IMAGES"] = old
    return _build_loader(kind, args, folder, recipe)


def _build_loader(kind, args, folder, recipe):
    import vissl  # noqa: F401
    from omegaconf import OmegaConf
    from vissl.data import build_dataloader, build_dataset
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    cfg = compose_hydra_configuration([
        "config=test/swav_plugin/quick_cpu",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.LOSS.swav_plugin_loss.queue.queue_length=0",
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
        "config.DATA.TRAIN.DATASET_NAMES=[bench_folder]",
        f"config.DATA.TRAIN.DATA_PATHS=[{folder}]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{folder}]",
        "config.DATA.TRAIN.DATA_LIMIT=-1",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
        f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}",
    ] + ([f"config.MULTI_PROCESSING_METHOD={args.start_method}"] if getattr(args, "start_method", None) else []))
    # the transform list is set after composition (its dicts are not command-line friendly)
    OmegaConf.update(cfg, "config.DATA.TRAIN.TRANSFORMS", transforms(kind, recipe), merge=False)
    # the loss's crop count goes with the transform (the config's own value would be replaced)
    OmegaConf.update(cfg, "config.LOSS.swav_plugin_loss.num_crops", sum(recipe[0]), merge=False)
    _, cfg = convert_to_attrdict(cfg, dump_config=False)
    dataset = build_dataset(cfg, "TRAIN")
    return build_dataloader(dataset=dataset, dataset_config=cfg.DATA.TRAIN,
                            num_dataloader_workers=args.workers, pin_memory=False,
                            multi_processing_method=cfg.MULTI_PROCESSING_METHOD,
                            device=torch.device("cpu"), sampler_seed=0, split="train")


def epoch(loader, epoch_idx, skip):
    """One epoch; returns (epoch img/s incl. worker start-up, steady img/s, crop shapes).
    Steady: from the arrival of batch ``skip`` on (by then the batches the workers
    prefetched while starting are consumed, so the rate is the pipeline's own)."""
    if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch_idx)
    t0 = time.perf_counter()
    n, n_skip, t_skip, shapes = 0, 0, None, None
    for i, batch in enumerate(loader):
        crops = batch["data"][0]
        n += crops[0].shape[0]
        if i == 0:
            shapes = [tuple(c.shape[1:]) for c in crops]
        if i == skip:
            t_skip, n_skip = time.perf_counter(), n
    t1 = time.perf_counter()
    if t_skip is None:
        raise SystemExit(f"bench_input_pipeline: need more than {skip + 1} batches; raise --images")
    return n / (t1 - t0), (n - n_skip) / (t1 - t_skip), shapes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--recipe", default="2x224+6x96", choices=sorted(RECIPES))
    p.add_argument("--start-method", choices=["fork", "forkserver", "spawn"], default=None,
                   help="how the loader workers are started (default: the config's, VISSL's forkserver)")
    args = p.parse_args(argv)
    recipe = RECIPES[args.recipe]
    import torch.distributed as dist
    import vissl  # noqa: F401

    if not dist.is_initialized():  # VISSL's sampler needs a process group (1 process here)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_image_folder(os.path.join(tmp, "images"), args.images, args.image_size)
        kinds = ("vissl_stock", "vissl", "plugin")
        loaders = {k: build_loader(k, args, folder, recipe) for k in kinds}
        res = {k: {"epoch": [], "steady": []} for k in loaders}
        shapes = {}
        for r in range(args.rounds):
            for k in (kinds if r % 2 == 0 else kinds[::-1]):
                e, s, shapes[k] = epoch(loaders[k], r, skip=2 * max(args.workers, 1))
                res[k]["epoch"].append(e)
                res[k]["steady"].append(s)
    assert shapes["vissl"] == shapes["plugin"] == shapes["vissl_stock"], shapes
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
    print(f"bench_input_pipeline: recipe {args.recipe} ({sum(recipe[0])} crops/image), {args.images} "
          f"Fashion-MNIST JPEGs at {args.image_size}px, disk_folder + multicrop_collator, "
          f"{args.workers} workers, batch {args.batch}, {os.cpu_count()} CPU cores, median of "
          f"{args.rounds} epochs each")
    names = {"vissl_stock": "VISSL chain, VISSL's dataset read (decodes twice)",
             "vissl": "VISSL chain, plugin's dataset read (decodes once)",
             "plugin": "multicrop_plugin, plugin's dataset read"}
    print(f"{'':>52} {'epoch img/s':>12} {'steady img/s':>13}")
    for k in kinds:
        print(f"{names[k]:>52} {med[k]['epoch']:12.1f} {med[k]['steady']:13.1f}")
    ratio = med["plugin"]["steady"] / med["vissl_stock"]["steady"]
    print(f"RATIO input pipeline plugin / stock VISSL (steady) = {ratio:.2f}x; "
          f"(epoch incl. worker start-up) = {med['plugin']['epoch'] / med['vissl_stock']['epoch']:.2f}x; "
          f"transform only (plugin / VISSL chain, same read) = "
          f"{med['plugin']['steady'] / med['vissl']['steady']:.2f}x; "
          f"read only (single / double decode, VISSL chain) = "
          f"{med['vissl']['steady'] / med['vissl_stock']['steady']:.2f}x")
    return ratio


if __name__ == "__main__":
    main()
