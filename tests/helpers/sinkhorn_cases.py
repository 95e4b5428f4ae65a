"""Definitions shared by ``tests/unit/utils/test_sinkhorn.py`` and its integration part."""
import torch


def cosine_scores(B, K, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(B, D, generator=g, dtype=dtype), dim=1)
    c = torch.nn.functional.normalize(torch.randn(K, D, generator=g, dtype=dtype), dim=1)
    return z @ c.T

# --------------------------------------------------------------------------------------
# every epsilon > 0 gives finite codes (issue 12): before the log-domain fallback, unit
# vector scores gave NaN for eps <= ~3e-9 (fp32) / ~1e-20 (fp64) and raised near 1e-40
# --------------------------------------------------------------------------------------
EPSILONS = [10.0 ** -e for e in (0.5, 1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 38, 40, 45, 100, 300)]
