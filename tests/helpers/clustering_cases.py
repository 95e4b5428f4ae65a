"""Definitions shared by ``tests/unit/utils/test_clustering.py`` and its integration part."""
import torch
import torch.nn.functional as F


def planted(K=10, D=32, n=100, noise=0.15, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    centers = F.normalize(torch.randn(K, D, generator=g, dtype=dtype), dim=1)
    labels = torch.arange(K).repeat_interleave(n)
    x = F.normalize(centers[labels] + noise * torch.randn(K * n, D, generator=g, dtype=dtype), dim=1)
    perm = torch.randperm(K * n, generator=g)
    return x[perm], labels[perm], centers

# ------------------------------------------------------------------------ SeLa
def random_bank(N, K, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
    c = F.normalize(torch.randn(K, D, generator=g, dtype=torch.float64), dim=1)
    return z, c
