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

The transform is ``pretrain/swav/swav_1gpu_resnet``'s, read from the config (``--recipe 2x32+4x16``:
the same with 2 x 32 px and 4 x 16 px crops); VISSL's chain gets its parameters.

Images: the first ``--images`` Fashion-MNIST test images, converted to RGB, upsampled to
``--image-size`` px (default 256) and written as JPEG (quality 90) into an ImageFolder in
a temporary directory, so decoding is part of the measured pipeline.  Each round
iterates one full epoch of each pipeline (alternating order); a fresh DataLoader per
epoch as in VISSL training, so worker start-up is included in ``epoch img/s`` and
excluded in ``steady img/s`` (timed from batch ``2 x workers`` on, once the batches
prefetched during start-up are consumed).  Median over ``--rounds``.

usage: python benchmarks/bench_input_pipeline.py [--images 512] [--workers 2] [--batch 32]
          [--rounds 3] [--image-size 256] [--recipe 2x224+6x96] [--start-method fork] [--json out.json]
prints images/s of both and the ratio plugin / VISSL.
"""
import argparse
import os
import sys
import tempfile

import recipes as br
import benchmarking as bm

#: the recipes: the paper's transform as ``pretrain/swav/swav_1gpu_resnet`` ships it, and the
#: same with small crops
RECIPES = {"2x224+6x96": None, "2x32+4x16": [(2, 32), (4, 16)]}
KINDS = ("vissl_stock", "vissl", "plugin")


def recipe_transform(name):
    """The ``multicrop_plugin`` transform of recipe ``name`` (:data:`RECIPES`), read from the config."""
    return br.with_crops(br.recipe(br.PAPER_CONFIG).transform, RECIPES[name])


def write_image_folder(root, n, size):
    try:
        images = br.fashion_mnist_images(n, size)
    except FileNotFoundError as e:
        sys.exit(f"bench_input_pipeline: {e}")
    for i, img in enumerate(images):
        d = os.path.join(root, f"class{i % 2}")
        os.makedirs(d, exist_ok=True)
        img.save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
    return root


def build_loader(kind, args, folder, transform):
    """kind: vissl_stock (VISSL chain, VISSL's own DiskImageDataset.__getitem__), vissl (VISSL
    chain, the plugin's single-decode read) or plugin (multicrop_plugin, single decode)."""
    chain = [dict(transform)] if kind == "plugin" else br.vissl_chain(transform)
    if kind != "vissl_stock":
        return br.folder_loader(folder, chain, args.batch, args.workers, args.start_method)
    old = os.environ.get("VISSL_SWAV_PLUGIN_BAD_IMAGES")
    os.environ["VISSL_SWAV_PLUGIN_BAD_IMAGES"] = "vissl"  # read when the dataset is built
    try:
        return br.folder_loader(folder, chain, args.batch, args.workers, args.start_method)
    finally:
        if old is None:
            os.environ.pop("VISSL_SWAV_PLUGIN_BAD_IMAGES")
        else:
            os.environ["VISSL_SWAV_PLUGIN_BAD_IMAGES"] = old


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
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    transform = recipe_transform(args.recipe)
    n_crops = sum(transform["num_crops"])
    br.init_process_group()  # VISSL's sampler needs a process group (1 process here)
    with tempfile.TemporaryDirectory() as tmp, br.quiet():
        folder = write_image_folder(os.path.join(tmp, "images"), args.images, args.image_size)
        loaders = {k: build_loader(k, args, folder, transform) for k in KINDS}
        epochs = dict.fromkeys(KINDS, 0)
        shapes = {}

        def one_epoch(k):
            try:
                e, s, shapes[k] = br.loader_rates(loaders[k], epochs[k], skip=2 * max(args.workers, 1))
            except ValueError as err:
                raise SystemExit(f"bench_input_pipeline: {err}; raise --images") from None
            epochs[k] += 1
            return e, s

        rates = bm.alternate({k: (lambda k=k: one_epoch(k)) for k in KINDS}, args.rounds)
    assert shapes["vissl"] == shapes["plugin"] == shapes["vissl_stock"], shapes
    res = {k: {"epoch": [r[0] for r in v], "steady": [r[1] for r in v]} for k, v in rates.items()}
    med = {k: bm.medians(d) for k, d in res.items()}
    print(f"bench_input_pipeline: recipe {args.recipe} ({n_crops} crops/image), {args.images} "
          f"Fashion-MNIST JPEGs at {args.image_size}px, disk_folder + multicrop_collator, "
          f"{args.workers} workers, batch {args.batch}, {os.cpu_count()} CPU cores, median of "
          f"{args.rounds} epochs each")
    names = {"vissl_stock": "VISSL chain, VISSL's dataset read (decodes twice)",
             "vissl": "VISSL chain, plugin's dataset read (decodes once)",
             "plugin": "multicrop_plugin, plugin's dataset read"}
    print(f"{'':>52} {'epoch img/s':>12} {'steady img/s':>13}")
    for k in KINDS:
        print(f"{names[k]:>52} {med[k]['epoch']:12.1f} {med[k]['steady']:13.1f}")
    ratio = med["plugin"]["steady"] / med["vissl_stock"]["steady"]
    print(f"RATIO input pipeline plugin / stock VISSL (steady) = {ratio:.2f}x; "
          f"(epoch incl. worker start-up) = {med['plugin']['epoch'] / med['vissl_stock']['epoch']:.2f}x; "
          f"transform only (plugin / VISSL chain, same read) = "
          f"{med['plugin']['steady'] / med['vissl']['steady']:.2f}x; "
          f"read only (single / double decode, VISSL chain) = "
          f"{med['vissl']['steady'] / med['vissl_stock']['steady']:.2f}x")
    bm.write_json(args.json, bm.record(
        "bench_input_pipeline", __file__, argv,
        {k: {m: bm.summary(v) for m, v in d.items()} for k, d in res.items()}, recipe=args.recipe,
        transform=transform, images=args.images, image_size=args.image_size, workers=args.workers,
        batch=args.batch, rounds=args.rounds, start_method=args.start_method,
        ratio_plugin_over_stock_steady=ratio))
    return ratio


if __name__ == "__main__":
    main()
