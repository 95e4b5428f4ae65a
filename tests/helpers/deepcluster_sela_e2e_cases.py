"""Definitions shared by ``tests/unit/losses/test_deepcluster_sela_e2e.py`` and its integration part."""
import torch


# ------------------------------------------------------------------ end to end
def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)
