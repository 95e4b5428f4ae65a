"""The candidate ``_foreach`` LARC (``benchmarks/larc_foreach.py``, not shipped) against the
shipped apex-free LARC (``vissl_swav_plugin/compat/larc.py``): the same parameters after the same
steps, with and without clipping and weight decay, a parameter without gradient and one whose
weight norm is zero (both left to the plain optimizer)."""
import importlib.util

import pytest
import torch

from testkit import REPO
from vissl_swav_plugin.compat.larc import LARC

spec = importlib.util.spec_from_file_location("larc_foreach", REPO / "benchmarks" / "larc_foreach.py")
larc_foreach = importlib.util.module_from_spec(spec)
spec.loader.exec_module(larc_foreach)


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 8, 3, 3), (16,), (32, 16), (32,), (5, 7)]
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    with torch.no_grad():
        ps[3].zero_()  # a zero weight norm: left alone
    return ps


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("wd", [0.0, 1e-4])
def test_foreach_larc_equals_the_shipped_larc(clip, wd):
    a, b = _params(0), _params(0)
    opts = []
    for ps, cls in ((a, LARC), (b, larc_foreach.ForeachLARC)):
        sgd = torch.optim.SGD([{"params": ps[:2], "lr": 0.3}, {"params": ps[2:], "lr": 0.05}],
                              lr=0.1, momentum=0.9, weight_decay=wd)
        opts.append(cls(sgd, trust_coefficient=0.001, clip=clip, eps=1e-8))
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in a]
        for ps, opt in zip((a, b), opts):
            for i, (p, gr) in enumerate(zip(ps, grads)):
                p.grad = None if i == 4 else gr.clone()  # the last one has no gradient
            opt.step()
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pb, pa, rtol=1e-6, atol=1e-7)
    for group in opts[1].param_groups:  # its weight decay restored after the step
        assert group["weight_decay"] == wd


def test_swap_into_a_classy_optimizer():
    class Classy:
        pass

    ps = _params(2)
    c = Classy()
    c.optimizer = LARC(torch.optim.SGD(ps, lr=0.1), trust_coefficient=0.002, clip=True, eps=1e-7)
    new = larc_foreach.swap_into(c)
    assert isinstance(c.optimizer, larc_foreach.ForeachLARC) and new is c.optimizer
    assert (new.trust_coefficient, new.clip, new.eps) == (0.002, True, 1e-7)
    c.optimizer = torch.optim.SGD(ps, lr=0.1)
    with pytest.raises(TypeError, match="plugin's LARC"):
        larc_foreach.swap_into(c)
