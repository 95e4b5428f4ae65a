"""Images/s of ``multicrop_plugin`` vs VISSL's multi-crop chain, same images, one run.

Baseline (VISSL 0.1.6's SwAV recipe, each op wrapped by VISSL's SSLTransformsWrapper as in
training): ImgPilToMultiCrop -> RandomHorizontalFlip -> ImgPilColorDistortion ->
ImgPilGaussianBlur -> ToTensor -> Normalize.  Ours: one ``multicrop_plugin`` transform
with the same parameters.  Both are built with VISSL's own ``get_transform`` from a
``DATA.TRAIN.TRANSFORMS`` list and fed the same real images (Fashion-MNIST test images,
converted to RGB and upsampled to ``--image-size``, by default 256 px so that the 224 px
crops of the 2x224 + 6x96 recipe are meaningful).  Rounds alternate between the two
chains (so machine load hits both alike); the reported figure is the median over rounds.
Single thread (``torch.set_num_threads(1)``), as in a DataLoader worker.

usage: python benchmarks/bench_multicrop.py [--images 64] [--rounds 7] [--image-size 256]
prints images/s of both and the ratio (target >= 1.5).
"""
import argparse
import gzip
import os
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image

from bench_input_pipeline import transforms  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

FASHION_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def load_images(n, size):
    path = os.path.join(FASHION_DIR, "t10k-images-idx3-ubyte.gz")
    if not os.path.isfile(path):
        sys.exit(
            f"bench_multicrop: {path} not found; install the Debian package "
            "dataset-fashion-mnist (apt-get install -y dataset-fashion-mnist) or set FASHION_MNIST_DIR"
        )
    with gzip.open(path, "rb") as f:
        raw = f.read()
    arr = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)
    return [Image.fromarray(a).convert("RGB").resize((size, size), Image.BILINEAR) for a in arr[:n]]


def build(recipe):
    import vissl  # noqa: F401  (registers the plugin through the .pth hook)
    from vissl.data.ssl_transforms import get_transform

    # the same two transform lists as the input-pipeline benchmark
    return get_transform(transforms("vissl", recipe)), get_transform(transforms("ours", recipe))


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
    ap.add_argument("--recipe", default="2x224+6x96", choices=["2x224+6x96", "2x32+4x16"])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    if args.recipe == "2x224+6x96":
        recipe = ([2, 6], [224, 96], [[0.14, 1.0], [0.05, 0.14]])
    else:
        recipe = ([2, 4], [32, 16], [[0.14, 1.0], [0.05, 0.14]])
    images = load_images(args.images, args.image_size)
    base, ours = build(recipe)
    # warm-up + output sanity check: same number of crops, same shapes
    _, ob = run_once(base, images[:4])
    _, oo = run_once(ours, images[:4])
    shapes_b = [tuple(t.shape) for t in ob["data"]]
    shapes_o = [tuple(t.shape) for t in oo["data"]]
    assert shapes_b == shapes_o, (shapes_b, shapes_o)
    rb, ro = [], []
    for _ in range(args.rounds):
        rb.append(run_once(base, images)[0])
        ro.append(run_once(ours, images)[0])
    b, o = statistics.median(rb), statistics.median(ro)
    print(
        f"multicrop {args.recipe} on {args.images} Fashion-MNIST images upsampled to "
        f"{args.image_size}px, 1 thread, median of {args.rounds} alternating rounds"
    )
    print(f"  VISSL chain (ImgPilToMultiCrop+flip+ColorDistortion+GaussianBlur+ToTensor+Normalize): {b:8.1f} img/s")
    print(f"  multicrop_plugin                                                                  : {o:8.1f} img/s")
    print(f"  ratio (ours / VISSL): {o / b:.2f}x (target >= 1.5x)")
    return o / b


if __name__ == "__main__":
    main()
