"""Where a loader worker's time goes, per stage, for each ``config.DATA.TRAIN.DEVICE_AUGMENT`` mode
(and ``off`` with ``multicrop_plugin``'s ``jpeg_draft``), and what the main process does per batch.

The worker's work is VISSL's own: ``pretrain/swav/swav_1gpu_resnet``'s transform (2x224 + 6x96)
on a ``disk_filelist`` of ``loop_variants``' generated ImageNet-sized JPEGs, read through VISSL's
``build_dataset`` (the dataset, the plugin's image read, VISSL's transform wrapper) and collated
by the mode's collator, on one thread (as a DataLoader worker).  Each stage is the product code
that does it, timed where it is called:

============  ============================================================================
read+decode   the dataset's image read (``data_safety``: the file, its header and, but with
              ``decode``, its decode; ``jpeg_draft``: the reduced decode in the transform)
draw          ``MultiCropPlugin.sample_params`` (every crop's random parameters)
crop+resize   PIL's ``resize(box=...)`` of each crop
colour        the colour jitter (grayscale folded into its pass where both apply)
blur          the Gaussian blur
to tensor     flip and copy into the batch tensors, normalisation; the parameter rows
other         the rest of ``dataset[i]``: VISSL's wrapper, a grayscale without jitter, ...
collate       the mode's collator, per batch, divided by the batch size
============  ============================================================================

Per batch in the main process: the bytes a worker sends, the device side
(``device_step.augment_batch``: nothing for ``off``) on the CPU (``--cpu-threads``) and on CUDA
where there is one (synchronised), and the pinning of the batch (CUDA only).  Modes alternate
within each round (same images, same numpy draws per round); figures are medians over rounds.

usage: python benchmarks/bench_worker_stages.py [--images 64] [--batch 32] [--rounds 3] [--long-side PX]
          [--variants off,decode,...] [--tiny | --dry-run] [--json out.json]
"""
import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict

import numpy as np
import torch

import recipes as br
import benchmarking as bm

VARIANTS = ("off", "off+jpeg_draft", "normalize", "photometric", "decode")
STAGES = ("read+decode", "draw", "crop+resize", "colour", "blur", "to tensor", "other", "collate")


class StageClock:
    """Seconds per stage, summed over the calls made while :meth:`patched` is active."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def wrap(self, stage, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0

        return timed

    @contextlib.contextmanager
    def patched(self):
        """The product functions of each stage wrapped (where their callers look them up)."""
        from PIL import Image

        from vissl_swav_plugin.compat import data_safety
        from vissl_swav_plugin.compat.image_modes import EncodedImage
        from vissl_swav_plugin.transforms import device_augment, device_decode, multicrop

        slots = [(data_safety, "open_rgb", "read+decode"), (data_safety, "open_encoded", "read+decode"),
                 (EncodedImage, "decode", "read+decode"), (multicrop.MultiCropPlugin, "sample_params", "draw"),
                 (Image.Image, "resize", "crop+resize"), (multicrop, "color_jitter", "colour"),
                 (multicrop, "to_normalized_tensors", "to tensor"), (multicrop, "to_uint8_tensors", "to tensor"),
                 (device_augment, "pack_params", "to tensor"), (device_decode, "pack_decode_params", "to tensor"),
                 (device_decode, "image_source", "to tensor")]
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in slots]
        blur = multicrop.MultiCropPlugin.__dict__["_blur"]
        try:
            for owner, name, stage in slots:
                setattr(owner, name, self.wrap(stage, getattr(owner, name)))
            multicrop.MultiCropPlugin._blur = staticmethod(self.wrap("blur", blur.__func__))
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
            multicrop.MultiCropPlugin._blur = blur


def rescale(path, long_side):
    """Resize the JPEG at ``path`` (bicubic) to ``long_side`` pixels on its longer side, in place
    (quality 90); its new size in kB."""
    from PIL import Image

    with Image.open(path) as im:
        f = long_side / max(im.size)
        big = im.resize((round(im.width * f), round(im.height * f)), Image.BICUBIC)
    big.save(path, "JPEG", quality=90)
    return os.path.getsize(path) / 1024


def variant_config(name, base):
    """The composed config of ``name``: the mode's key, ``jpeg_draft`` set on the transform."""
    mode = name.split("+")[0]
    ov = base + [f"config.DATA.TRAIN.DEVICE_AUGMENT={mode}"]
    if name.endswith("+jpeg_draft"):
        entry = dict(br.compose(base).DATA.TRAIN.TRANSFORMS[0])
        return br.compose(ov, updates={"config.DATA.TRAIN.TRANSFORMS": [{**entry, "jpeg_draft": True}]})
    return br.compose(ov)


def batch_bytes(batch):
    """Bytes of a collated batch's tensors and undecoded files (what a worker hands over)."""
    from vissl_swav_plugin.compat.image_modes import EncodedImage

    if torch.is_tensor(batch):
        return batch.numel() * batch.element_size()
    if isinstance(batch, EncodedImage):
        return len(batch.data)
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch)
    return 0


class Variant:
    """One mode's dataset, collator and device side, timed batch by batch."""

    def __init__(self, name, cfg, args, devices):
        from vissl.data import build_dataset
        from vissl.data.collators import get_collator

        from vissl_swav_plugin.transforms import device_step as ds

        self.name, self.args, self.devices = name, args, devices
        self.dataset = build_dataset(cfg=cfg, split="TRAIN")
        self.collate = get_collator(cfg.DATA.TRAIN.COLLATE_FUNCTION, {})
        self.mode = cfg.DATA.TRAIN.get("DEVICE_AUGMENT", "off")
        self.augmenter = ds.augmenter_for(cfg) if self.mode != "off" else None
        self.decoder = ds.decoder_for(cfg) if self.mode == "decode" else None
        self.rounds = 0

    def __call__(self):
        """One pass over the images: per stage ms per image, and per batch figures."""
        from vissl_swav_plugin.transforms import device_step as ds

        args, clock = self.args, StageClock()
        np.random.seed(self.rounds)  # round r of every variant draws alike
        self.rounds += 1
        per_batch = defaultdict(list)
        total = 0.0
        with clock.patched():
            for start in range(0, args.images, args.batch):
                torch.set_num_threads(1)
                t0 = time.perf_counter()
                samples = [self.dataset[i] for i in range(start, min(start + args.batch, args.images))]
                total += time.perf_counter() - t0
                t0 = time.perf_counter()
                batch = self.collate(samples)
                clock.seconds["collate"] += time.perf_counter() - t0
                per_batch["mb"].append(batch_bytes(batch) / 1e6)
                if torch.cuda.is_available():
                    from torch.utils.data._utils.pin_memory import pin_memory

                    t0 = time.perf_counter()
                    pin_memory(batch)
                    per_batch["pin_ms"].append(1e3 * (time.perf_counter() - t0))
                torch.set_num_threads(args.cpu_threads)
                for dev in self.devices:
                    ms = 0.0
                    if self.augmenter is not None:
                        if dev.type == "cuda":
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        ds.augment_batch(dict(batch), self.augmenter, dev, self.decoder)
                        if dev.type == "cuda":
                            torch.cuda.synchronize()
                        ms = 1e3 * (time.perf_counter() - t0)
                    per_batch[f"device_ms_{dev.type}"].append(ms * args.batch / len(samples))
        stages = {s: 1e3 * clock.seconds[s] / args.images for s in STAGES if s not in ("other", "collate")}
        stages["other"] = 1e3 * total / args.images - sum(stages.values())
        stages["collate"] = 1e3 * clock.seconds["collate"] / args.images
        return stages, {k: statistics.fmean(v) for k, v in per_batch.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=64, help="JPEGs per round (default 64)")
    p.add_argument("--batch", type=int, default=32, help="images per collated batch (default 32)")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds, after one of warm-up (default 3)")
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads of the device side on the CPU")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--tiny", action="store_true", help="40-60 px JPEGs and 2x32 + 2x16 crops (checks the code)")
    p.add_argument("--long-side", type=int, default=0,
                   help="scale the generated JPEGs to this longer side (e.g. 4000: a camera's photos; "
                        "default: ImageNet's sizes, 400-500 px)")
    p.add_argument("--dry-run", action="store_true", help="--tiny with 8 images, batch 4, one round (gpu_check's)")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.dry_run:
        args.tiny, args.images, args.batch, args.rounds = True, 8, 4, 1
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")

    import vissl  # noqa: F401  (registers the plugin)
    from loop_variants import write_filelist, write_jpegs

    with tempfile.TemporaryDirectory(prefix="worker_stages_") as tmp:  # the JPEGs go with the run
        paths, kb = write_jpegs(os.path.join(tmp, "jpegs"), args.images, tiny=args.tiny)
        if args.long_side:
            kb = statistics.fmean(rescale(path, args.long_side) for path in paths)
        filelist = write_filelist(paths, args.images, os.path.join(tmp, "filelist.npy"))
        base = ["config=pretrain/swav/swav_1gpu_resnet", "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]",
                "config.DATA.TRAIN.DATASET_NAMES=[worker_stages_jpegs]", f"config.DATA.TRAIN.DATA_PATHS=[{filelist[0]}]",
                "config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist]", f"config.DATA.TRAIN.LABEL_PATHS=[{filelist[1]}]",
                "config.DATA.TRAIN.DATA_LIMIT=-1"]
        if args.tiny:
            base += ["config.DATA.TRAIN.TRANSFORMS.0.num_crops=[2,2]", "config.DATA.TRAIN.TRANSFORMS.0.size_crops=[32,16]",
                     "config.DATA.TRAIN.TRANSFORMS.0.total_num_crops=4"]
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        variants = {n: Variant(n, variant_config(n, base), args, devices) for n in names}
        runs = bm.alternate(variants, args.rounds, warmup=1)

    res = {}
    for n in names:
        stages = {s: statistics.median(r[0][s] for r in runs[n]) for s in STAGES}
        batch = {k: statistics.median(r[1][k] for r in runs[n]) for k in runs[n][0][1]}
        worker = sum(stages.values())
        res[n] = {"ms_per_image": stages, "worker_ms_per_image": worker, "images_per_s_per_core": 1e3 / worker,
                  "per_batch": batch}
    off = res.get("off")
    m_info = bm.machine()
    print(f"{args.images} JPEGs ({kb:.0f} kB on average), batch {args.batch}, {args.rounds} rounds (medians); "
          f"{m_info['cpu']}; ms per image in one worker:")
    print(f"{'stage':12s}" + "".join(f"{n:>16s}" for n in names))
    for s in STAGES + ("worker",):
        row = [res[n]["ms_per_image"][s] if s != "worker" else res[n]["worker_ms_per_image"] for n in names]
        print(f"{s:12s}" + "".join(f"{v:16.2f}" for v in row))
    for n in names:
        r = res[n]
        ratio = f" ({off['worker_ms_per_image'] / r['worker_ms_per_image']:.1f}x off)" if off else ""
        dev = ", ".join(f"{k} {v:.1f}" for k, v in r["per_batch"].items())
        print(f"{n}: {r['images_per_s_per_core']:.0f} images/s per core{ratio}; per batch of {args.batch}: {dev}")
    record = bm.record("bench_worker_stages", __file__, argv, res, machine_info=m_info, images=args.images,
                       batch=args.batch, rounds=args.rounds, cpu_threads_device_side=args.cpu_threads,
                       jpeg_kb=round(kb, 1), tiny=args.tiny, long_side=args.long_side or None)
    bm.write_json(args.json, record)
    return record


if __name__ == "__main__":
    main()
