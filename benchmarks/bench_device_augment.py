"""Bytes per batch and time per batch of ``config.DATA.TRAIN.DEVICE_AUGMENT`` = off / normalize /
photometric: what the loader workers send, how long they take, and how long the device side takes.

Images: generated photographs-like JPEGs (smooth colour fields, edges, texture, noise; quality
90), 400-500 px a side, decoded in the timed loop as a worker decodes them.  Recipe 2x224 + 6x96:
the ``multicrop_plugin`` transform of ``pretrain/swav/swav_1gpu_resnet``, read from the config.  Worker side: decode +
``multicrop_plugin`` (with the mode's ``device_augment``) + VISSL's collator, single thread as in a
DataLoader worker.  Device side: :class:`vissl_swav_plugin.transforms.device_augment.DeviceAugmenter`
on the collated batch, on the CPU (``--cpu-threads`` threads) and on CUDA when available
(synchronised).  Rounds alternate between the modes (so machine load hits each alike; one round
of warm-up first, dropped); the figures are medians over rounds.

usage: python benchmarks/bench_device_augment.py [--batch 64] [--rounds 5] [--json out.json]
prints, per mode, MB per batch, worker ms per batch, device ms per batch, and the ratios to ``off``.
"""
import argparse
import io
import statistics
import time

import numpy as np
import torch
from PIL import Image

import recipes as br
import benchmarking as bm

MODES = ("off", "normalize", "photometric")


def make_jpegs(n, seed=0):
    """``n`` JPEG byte strings, 400-500 px a side: colour gradients, a few filled shapes, texture, noise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w, h = (int(v) for v in rng.integers(400, 501, 2))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.zeros((h, w, 3), np.float32)
        for c in range(3):
            a, b, ph = rng.uniform(0.005, 0.03, 2).tolist() + [rng.uniform(0, 6.28)]
            img[..., c] = 128 + 90 * np.sin(a * x + ph) * np.cos(b * y)
        for _ in range(6):  # shapes with edges
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(20, 120)
            img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
        img += 20 * np.sin(0.5 * x + 0.3 * y)[..., None] * rng.uniform(0, 1)  # texture
        img += rng.normal(0, 6, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def batch_bytes(batch):
    """Bytes of the tensors of a collated batch (what a worker hands to the main process)."""
    if torch.is_tensor(batch):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch)
    return 0


def worker_batch(transform, collate, jpegs):
    samples = []
    for i, data in enumerate(jpegs):
        img = Image.open(io.BytesIO(data)).convert("RGB")
        crops = transform(img)
        samples.append({"data": crops, "label": [i] * len(crops), "data_valid": [1] * len(crops),
                        "data_idx": [i] * len(crops)})
    return collate(samples)


def device_time(augmenter, batch, device):
    from vissl_swav_plugin.transforms.device_step import augment_batch

    b = {k: v for k, v in batch.items()}
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    augment_batch(b, augmenter, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds per mode (default 5)")
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads of the device side on the CPU")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)

    import vissl  # noqa: F401  (registers the plugin through the .pth hook)
    from vissl.data.collators.multicrop_collator import multicrop_collator
    from vissl_swav_plugin.transforms.device_step import augmenter_for_transform, multicrop_device_collator
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin

    transform = br.recipe(br.PAPER_CONFIG).transform
    jpegs = make_jpegs(args.batch)
    transforms = {m: MultiCropPlugin(**{k: v for k, v in transform.items() if k != "name"}, device_augment=m)
                  for m in MODES}
    collate = {"off": multicrop_collator, "normalize": multicrop_collator, "photometric": multicrop_device_collator}
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    nbytes, calls = {}, dict.fromkeys(MODES, 0)

    def one_batch(m):
        """The worker's batch of mode ``m``, then its device side on each device: their seconds."""
        torch.set_num_threads(1)
        np.random.seed(calls[m])  # the k-th batch of every mode draws alike
        calls[m] += 1
        t0 = time.perf_counter()
        batch = worker_batch(transforms[m], collate[m], jpegs)
        wt = time.perf_counter() - t0
        nbytes[m] = batch_bytes(batch)
        torch.set_num_threads(args.cpu_threads)
        aug = augmenter_for_transform(transforms[m])
        return wt, {d.type: device_time(aug, batch, d) if m != "off" else 0.0 for d in devices}

    # round 0 warms up (allocators, CUDA context, caches)
    times = bm.alternate({m: (lambda m=m: one_batch(m)) for m in MODES}, args.rounds, warmup=1)
    worker = {m: [t[0] for t in v] for m, v in times.items()}
    res = {}
    for m in MODES:
        res[m] = {"mb_per_batch": nbytes[m] / 1e6, "worker_ms_per_batch": 1e3 * statistics.median(worker[m]),
                  "worker_ms_all_rounds": [round(1e3 * v, 1) for v in worker[m]]}
        for d in devices:
            res[m][f"device_ms_per_batch_{d.type}"] = 1e3 * statistics.median(t[1][d.type] for t in times[m])
    off = res["off"]
    m_info = bm.machine()
    print(f"batch {args.batch}, {'+'.join(f'{n}x{s}' for n, s in br.crops_of(transform))}, {args.rounds} rounds (medians); {m_info['cpu']}")
    for m in MODES:
        r = res[m]
        line = (f"{m:12s} {r['mb_per_batch']:8.1f} MB/batch ({off['mb_per_batch'] / r['mb_per_batch']:.2f}x fewer)  "
                f"worker {r['worker_ms_per_batch']:8.1f} ms/batch ({off['worker_ms_per_batch'] / r['worker_ms_per_batch']:.2f}x)")
        for d in devices:
            line += f"  device[{d.type}] {r[f'device_ms_per_batch_{d.type}']:7.1f} ms"
        print(line)
    record = bm.record("bench_device_augment", __file__, argv, res, machine_info=m_info, batch=args.batch,
                       rounds=args.rounds, cpu_threads_device_side=args.cpu_threads, transform=transform)
    bm.write_json(args.json, record)
    return record


if __name__ == "__main__":
    main()
