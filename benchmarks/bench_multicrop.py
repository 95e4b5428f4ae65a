"""Images/s of ``multicrop_plugin`` vs VISSL's multi-crop chain, same images, one run.

Baseline (VISSL 0.1.6's SwAV recipe, each op wrapped by VISSL's SSLTransformsWrapper as in
training): ImgPilToMultiCrop -> RandomHorizontalFlip -> ImgPilColorDistortion ->
ImgPilGaussianBlur -> ToTensor -> Normalize.  Ours: one ``multicrop_plugin`` transform
with the same parameters: ``pretrain/swav/swav_1gpu_resnet``'s, read from the config
(``--recipe 2x32+4x16``: the same with small crops).  Both are built with VISSL's own
``get_transform`` from a ``DATA.TRAIN.TRANSFORMS`` list and fed the same real images
(Fashion-MNIST test images, converted to RGB and upsampled to ``--image-size``, by default
256 px so that the 224 px crops of the 2x224 + 6x96 recipe are meaningful).  Rounds alternate
between the two chains (so machine load hits both alike); the reported figure is the median
over rounds.  Single thread (``torch.set_num_threads(1)``), as in a DataLoader worker.

usage: python benchmarks/bench_multicrop.py [--images 64] [--rounds 7] [--image-size 256]
          [--recipe 2x224+6x96] [--json out.json]
prints images/s of both and the ratio (target >= 1.5).
"""
import argparse
import sys
import time

import numpy as np
import torch

import recipes as br
import benchmarking as bm

RECIPES = {"2x224+6x96": None, "2x32+4x16": [(2, 32), (4, 16)]}


def build(transform):
    import vissl  # noqa: F401  (registers the plugin through the .pth hook)
    from vissl.data.ssl_transforms import get_transform

    return get_transform(br.vissl_chain(transform)), get_transform([dict(transform)])


def run_once(transform, images):
    t0 = time.perf_counter()
    for i, img in enumerate(images):
        sample = {"data": [img], "label": [0], "data_valid": [1], "data_idx": [i]}
        out = transform(sample)
    dt = time.perf_counter() - t0
    return len(images) / dt, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--recipe", default="2x224+6x96", choices=sorted(RECIPES))
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    transform = br.with_crops(br.recipe(br.PAPER_CONFIG).transform, RECIPES[args.recipe])
    try:
        images = br.fashion_mnist_images(args.images, args.image_size)
    except FileNotFoundError as e:
        sys.exit(f"bench_multicrop: {e}")
    base, ours = build(transform)
    # warm-up + output sanity check: same number of crops, same shapes
    _, ob = run_once(base, images[:4])
    _, oo = run_once(ours, images[:4])
    shapes_b = [tuple(t.shape) for t in ob["data"]]
    shapes_o = [tuple(t.shape) for t in oo["data"]]
    assert shapes_b == shapes_o, (shapes_b, shapes_o)
    rates = bm.alternate({"vissl": lambda: run_once(base, images)[0], "ours": lambda: run_once(ours, images)[0]},
                         args.rounds)
    med = bm.medians(rates)
    b, o = med["vissl"], med["ours"]
    print(
        f"multicrop {args.recipe} on {args.images} Fashion-MNIST images upsampled to "
        f"{args.image_size}px, 1 thread, median of {args.rounds} alternating rounds"
    )
    print(f"  VISSL chain (ImgPilToMultiCrop+flip+ColorDistortion+GaussianBlur+ToTensor+Normalize): {b:8.1f} img/s")
    print(f"  multicrop_plugin                                                                  : {o:8.1f} img/s")
    print(f"  ratio (ours / VISSL): {o / b:.2f}x (target >= 1.5x)")
    bm.write_json(args.json, bm.record("bench_multicrop", __file__, argv,
                                       {k: bm.summary(v) for k, v in rates.items()}, recipe=args.recipe,
                                       transform=transform, images=args.images, image_size=args.image_size,
                                       rounds=args.rounds, ratio_ours_over_vissl=o / b))
    return o / b


if __name__ == "__main__":
    main()
