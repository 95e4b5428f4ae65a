"""Helpers for the multi-crop / data-tool / trunk tests (imported as a plain module)."""
import gzip
import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def load_data_tool():
    """tools/prepare_fashion_mnist.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "prepare_fashion_mnist", REPO / "tools" / "prepare_fashion_mnist.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def ramp_image(width, height):
    """RGB image whose R value is the x coordinate and G the y coordinate (B = 128), so a
    crop's source box can be read back from its pixels (bilinear resampling reproduces a
    linear ramp exactly away from the image border)."""
    from PIL import Image

    assert width <= 256 and height <= 256
    x = np.broadcast_to(np.arange(width, dtype=np.uint8)[None, :], (height, width))
    y = np.broadcast_to(np.arange(height, dtype=np.uint8)[:, None], (height, width))
    b = np.full((height, width), 128, np.uint8)
    return Image.fromarray(np.stack([x, y, b], axis=-1))


def recover_box(crop):
    """(left, top, width, height) of the source box of a crop of ``ramp_image``.

    ``crop``: (3, s, s) array of 0..255 values.  Output pixel i samples the source at
    ``left + (i + 0.5) * w / s - 0.5``: fit that line to the R (x) / G (y) values of the
    interior pixels (the two outermost ones may be clamped at the image border)."""
    crop = np.asarray(crop, dtype=np.float64)
    s = crop.shape[-1]
    idx = np.arange(2, s - 2)
    xs = crop[0][:, idx].mean(axis=0)  # R varies along columns
    ys = crop[1][idx, :].mean(axis=1)  # G varies along rows
    sx, ix = np.polyfit(idx + 0.5, xs, 1)
    sy, iy = np.polyfit(idx + 0.5, ys, 1)
    w, h = sx * s, sy * s
    return ix + 0.5, iy + 0.5, w, h
