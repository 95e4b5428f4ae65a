"""Definitions shared by ``tests/unit/config/test_bad_inputs.py`` and its integration part."""
import os
import numpy as np
from PIL import Image


QUICK = "config=test/swav_plugin/quick_cpu"

def _corrupt(kind, path):
    good = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    if kind == "random_bytes_jpg":
        path.write_bytes(os.urandom(3000))
    elif kind == "truncated_jpg":
        good.save(path, format="JPEG", quality=95)
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    elif kind == "truncated_jpg_body":  # the header whole (the size reads), the scan cut short
        good.resize((256, 256)).save(path, format="JPEG", quality=95)
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) * 2 // 3])
    elif kind == "truncated_png":
        good.save(path, format="PNG")
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif kind == "text_as_png":
        path.write_text("this is not an image\n")
    elif kind == "empty_jpg":
        path.write_bytes(b"")
