"""Definitions shared by ``tests/unit/hooks/test_precise_bn.py`` and its integration part."""
import copy
import torch
import torch.nn as nn


def tiny_trunk(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 5, 3, stride=2, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())

def multicrop_batches(n, seed=0, big=12, small=6):
    """``multicrop_collator``-shaped batches: 2 global crops (big px) then 2 small ones, each
    with its own mean, so that mixing them in would show."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        crops = [torch.randn(4, 3, big, big, generator=g) + 1.0, torch.randn(4, 3, big, big, generator=g) * 2,
                 torch.randn(4, 3, small, small, generator=g) - 3.0, torch.randn(4, 3, small, small, generator=g)]
        out.append({"data": [crops], "data_idx": [torch.arange(16)]})
    return out

def expected_stats(net, batches, crops_used, call=None):
    """Average over forward calls of each BN layer's input batch mean / unbiased variance
    (``call(net, x)`` makes a forward call; default ``net(x)``)."""
    net = copy.deepcopy(net).train()
    records = {}

    def hook(name):
        def f(mod, inp, out):
            x = inp[0].transpose(0, 1).flatten(1)
            records.setdefault(name, []).append((x.mean(1), x.var(1, unbiased=True)))
        return f

    for name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(hook(name))
    with torch.no_grad():
        for b in batches:
            for c in crops_used:
                (call or (lambda n, x: n(x)))(net, b["data"][0][c])
    return {k: (torch.stack([r[0] for r in v]).mean(0), torch.stack([r[1] for r in v]).mean(0))
            for k, v in records.items()}
