"""Definitions shared by ``tests/unit/hooks/test_color_warmup.py`` and its integration part."""
import numpy as np
import vissl  # noqa: F401  (registers the plugin)


def sampled(t, seed):
    np.random.seed(seed)
    p = t.sample_params(28, 28)
    return p["jitter"], p["factors"]
