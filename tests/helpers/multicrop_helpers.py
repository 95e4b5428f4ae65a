"""Fashion-MNIST-shaped IDX files for the data-tool, demo-data and multi-crop tests (a plain module)."""
import gzip
from pathlib import Path

import numpy as np

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path, array, gz=True):
    """Write a uint8 array as an IDX file (the format of the MNIST / Fashion-MNIST files)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = {1: 2049, 3: 2051}[array.ndim]
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    path = Path(path)
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def make_fake_fashion(root, n_train=40, n_val=30, seed=0):
    """A Fashion-MNIST-shaped IDX source (random 28x28 images, labels 0..9)."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        imgs = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", imgs)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
        out[prefix] = (imgs, labels)
    return out
