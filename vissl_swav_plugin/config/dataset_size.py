"""How many processes (:func:`world_size_of`), training samples, samples per process and
iterations per epoch a config gives, when that is known before the run (no worker, no
dataset object): used by the run-wide checks (:mod:`vissl_swav_plugin.checks.run_wide`)
and by the losses' config inference (:mod:`vissl_swav_plugin.losses.clustering_config`,
:mod:`vissl_swav_plugin.losses.swav_config`).
"""
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

#: torchvision's ImageFolder extensions (VISSL's disk_folder source)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def world_size_of(cfg) -> int:
    """The run's number of processes: ``DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE``."""
    return int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


def train_dataset_size(cfg) -> Optional[int]:
    """The number of training samples, when it is known before the run: ``DATA_LIMIT``
    (>= 0, VISSL's length then), else the first source's size for ``synthetic`` (VISSL's
    50,000), ``disk_folder`` (images under ``DATA_PATHS[0]``, ImageFolder layout) and
    ``disk_filelist`` (entries of a ``.npy`` file list); None otherwise or when the path is
    unusable or empty (the dataset checks report it, naming the path)."""
    data = cfg.DATA.TRAIN
    limit = data.get("DATA_LIMIT", -1)
    if isinstance(limit, int) and limit >= 0:
        return limit
    sources, paths = list(data.get("DATA_SOURCES") or []), list(data.get("DATA_PATHS") or [])
    if not sources:
        return None
    if sources[0] == "synthetic":
        from vissl.data.synthetic_dataset import SyntheticImageDataset

        return SyntheticImageDataset.DEFAULT_SIZE
    if not paths or not isinstance(paths[0], str):
        return None
    if sources[0] == "disk_folder" and os.path.isdir(paths[0]):
        return count_images(paths[0]) or None  # none: the dataset checks name the folder
    if sources[0] == "disk_filelist" and paths[0].endswith(".npy") and os.path.isfile(paths[0]):
        import numpy as np

        try:
            return int(len(np.load(paths[0], mmap_mode="r", allow_pickle=False))) or None
        except (OSError, ValueError):
            return None
    return None


def count_images(root: str) -> int:
    """Images in the class folders of an ImageFolder ``root`` (as torchvision counts)."""
    n = 0
    for entry in os.scandir(root):
        if entry.is_dir():
            for _, _, files in os.walk(entry.path, followlinks=True):
                n += sum(f.lower().endswith(IMAGE_EXTENSIONS) for f in files)
    return n


def samples_per_process(cfg, num_samples: int) -> int:
    """Training samples each process gets per epoch: VISSL's sampler gives ``ceil(N /
    world)`` (torch's DistributedSampler pads), ``floor`` with the stateful sampler."""
    world = world_size_of(cfg)
    if cfg.DATA.TRAIN.get("USE_STATEFUL_DISTRIBUTED_SAMPLER"):
        return num_samples // world
    return math.ceil(num_samples / world)


def iterations_per_epoch(cfg, num_samples: int) -> int:
    """Training iterations per epoch for ``num_samples`` samples: each process's share
    (:func:`samples_per_process`) in batches of ``BATCHSIZE_PER_REPLICA``, the last partial
    batch dropped with ``DROP_LAST``."""
    per, bs = samples_per_process(cfg, num_samples), int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    return per // bs if cfg.DATA.TRAIN.get("DROP_LAST", False) else math.ceil(per / bs)


@dataclass
class FolderScan:
    """What torchvision's ImageFolder would read from a folder (see :func:`scan_image_folder`)."""

    images: int = 0
    #: extension (lower case, ``""`` for none) -> paths of the files ImageFolder leaves out
    skipped: Dict[str, List[str]] = field(default_factory=dict)
    #: (directory symlink, the ancestor it resolves to): ImageFolder would walk it again and again
    loops: List[Tuple[str, str]] = field(default_factory=list)
    #: (path, the earlier path of the same file): one file reached twice through a symlink
    repeated: List[Tuple[str, str]] = field(default_factory=list)
    #: whether the walk met a symlink (file or directory)
    has_links: bool = False
    #: up to :data:`SAMPLE_PER_CLASS` image paths of each class folder (for header checks)
    sample: List[str] = field(default_factory=list)


SAMPLE_PER_CLASS = 4


def scan_image_folder(root: str) -> FolderScan:
    """Walk the class folders of an ImageFolder ``root`` the way torchvision does
    (``os.walk(followlinks=True)``, a file is a sample when its name ends with one of
    :data:`IMAGE_EXTENSIONS`) and report what it would skip or repeat: files with other
    extensions, directory symlinks that resolve to one of their own ancestors (a loop,
    not followed here), and files reached a second time through a symlink (looked for
    only when the folder holds a symlink: a plain folder is walked once, keeping no list
    of its files)."""
    scan = _scan(root, track=False)
    return _scan(root, track=True) if scan.has_links else scan


def _scan(root: str, track: bool) -> FolderScan:
    scan, seen = FolderScan(), {}
    top = os.path.realpath(root)
    per_class_limit = [0]

    def walk(path: str, real_dir: str, ancestors: Tuple[str, ...]) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            link = e.is_symlink()
            scan.has_links = scan.has_links or link
            if e.is_dir():  # follows symlinks, as torchvision's walk does
                real = os.path.realpath(e.path) if link else os.path.join(real_dir, e.name)
                if link and real in ancestors:
                    scan.loops.append((e.path, real))
                    continue
                walk(e.path, real, ancestors + (real,))
                continue
            real = (os.path.realpath(e.path) if link else os.path.join(real_dir, e.name)) if track else None
            if e.name.lower().endswith(IMAGE_EXTENSIONS):
                scan.images += 1
                if len(scan.sample) < per_class_limit[0]:
                    scan.sample.append(e.path)
                if track:
                    if real in seen:
                        scan.repeated.append((e.path, seen[real]))
                    else:
                        seen[real] = e.path
            elif e.is_file() and not (track and real in seen):
                if track:
                    seen[real] = e.path
                scan.skipped.setdefault(os.path.splitext(e.name)[1].lower(), []).append(e.path)

    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir():
            real = os.path.realpath(entry.path)
            if entry.is_symlink():
                scan.has_links = True
                if real == top:
                    scan.loops.append((entry.path, real))
                    continue
            per_class_limit[0] = len(scan.sample) + SAMPLE_PER_CLASS
            walk(entry.path, real, (top, real))
    return scan
