"""Sinkhorn-Knopp: against the paper's pseudo-code, VISSL's implementation, the
equipartition constraint, 2 processes vs 1, and low-precision inputs."""

import pytest
import torch

from reference_swav import paper_sinkhorn
from vissl_swav_plugin.utils.sinkhorn import sinkhorn_knopp
from sinkhorn_cases import EPSILONS, cosine_scores  # noqa: F401


@pytest.mark.parametrize("B,K,iters,eps", [(64, 30, 3, 0.05), (17, 100, 1, 0.05), (256, 40, 5, 0.1)])
def test_equals_paper_pseudocode(B, K, iters, eps):
    s = cosine_scores(B, K)
    ours = sinkhorn_knopp(s, eps, iters, dtype=torch.float64)
    ref = paper_sinkhorn(s.clone(), eps, iters)
    assert torch.allclose(ours, ref, atol=1e-12, rtol=0)


def test_equals_vissl_builtin():
    from vissl.losses.distibuted_sinkhornknopp import distributed_sinkhornknopp

    s = cosine_scores(128, 50, seed=3)
    Q = torch.exp(s / 0.05).t().clone()
    theirs = distributed_sinkhornknopp(Q, num_iter=3, hard_assignment=False, world_size=1,
                                       use_double_prec=True, use_gpu=False)
    ours = sinkhorn_knopp(s, 0.05, 3, dtype=torch.float64).float()
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)


def test_equipartition_marginals_converge():
    """Both constraints of the transportation polytope hold at convergence (Eq. 4)."""
    B, K = 120, 12
    s = cosine_scores(B, K, seed=1)
    q = sinkhorn_knopp(s, epsilon=0.3, num_iters=200, dtype=torch.float64)
    assert torch.allclose(q.sum(1), torch.ones(B, dtype=q.dtype), atol=1e-12)  # each sample: 1
    per_proto = q.sum(0) / B  # each prototype gets B/K samples
    assert torch.allclose(per_proto, torch.full((K,), 1.0 / K, dtype=q.dtype), atol=1e-6)
    # and three iterations already move a collapsed assignment towards equipartition
    collapsed = s + torch.linspace(0, 0.5, K, dtype=s.dtype)  # everyone prefers the last prototype
    naive = torch.softmax(collapsed / 0.05, dim=1).sum(0) / B
    q3 = sinkhorn_knopp(collapsed, 0.05, 3, dtype=torch.float64).sum(0) / B
    assert (q3 - 1.0 / K).abs().max() < 0.2 * (naive - 1.0 / K).abs().max()


def test_hard_assignment_is_argmax_of_soft():
    s = cosine_scores(50, 20, seed=2)
    soft = sinkhorn_knopp(s, 0.05, 3)
    hard = sinkhorn_knopp(s, 0.05, 3, hard=True)
    assert torch.equal(hard.sum(1), torch.ones(50))
    assert torch.equal(hard.argmax(1), soft.argmax(1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_scores_give_finite_codes(dtype):
    s = (cosine_scores(64, 30, seed=4) * 8).to(dtype)  # s/eps up to ~160: exp overflows
    naive = torch.exp(s / 0.05)
    assert not torch.isfinite(naive).all(), "test premise: the naive exp overflows in this dtype"
    q = sinkhorn_knopp(s, 0.05, 3)
    assert q.dtype == torch.float32 and torch.isfinite(q).all()
    ref = paper_sinkhorn(s.double(), 0.05, 3)  # the same (rounded) scores in fp64
    assert torch.allclose(q.double(), ref, atol=1e-5)


def test_degenerate_scores_stay_finite():
    s = torch.zeros(8, 5)
    s[:, 0] = 1e4  # every sample overwhelmingly prefers prototype 0; others underflow
    q = sinkhorn_knopp(s, 0.05, 3)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(1), torch.ones(8))


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"),
    ({"num_iters": 0}, "num_iters"), ({"dtype": torch.float16}, "dtype"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sinkhorn_knopp(torch.randn(4, 3), **kwargs)


EPSILONS += [5e-324]  # the smallest positive double


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,K,D", [(64, 16, 32), (96, 700, 3), (300, 8, 2)])
def test_codes_finite_for_every_epsilon(dtype, B, K, D):
    """Property sweep: scores in [-1, 1] (unit vectors; D=2/3 spread them over the whole
    range), every epsilon from 0.3 down to the smallest double: finite codes, rows
    summing to 1, equal to the exact iterates (float64 log domain) on the same scores."""
    from vissl_swav_plugin.utils.sinkhorn import _log_domain_iterates

    s = cosine_scores(B, K, D=D, seed=B).to(dtype)
    for eps in EPSILONS:
        q = sinkhorn_knopp(s, eps, 3, dtype=dtype)
        assert q.dtype == dtype and torch.isfinite(q).all(), eps
        assert torch.allclose(q.sum(1), torch.ones(B, dtype=dtype), atol=1e-5), eps
        exact = _log_domain_iterates(s, eps, 3, False, None, B)
        tol = 2e-6 if dtype == torch.float32 else 1e-9
        assert (q.double() - exact).abs().max() < tol, eps
        hard = sinkhorn_knopp(s, eps, 3, dtype=dtype, hard=True)
        assert torch.equal(hard.sum(1), torch.ones(B, dtype=dtype)), eps


def test_log_domain_equals_scaling_form_in_range():
    """Where both apply, the fallback computes the paper's iterates too."""
    from vissl_swav_plugin.utils.sinkhorn import _log_domain_iterates

    s = cosine_scores(64, 30)
    assert torch.allclose(_log_domain_iterates(s, 0.05, 3, False, None, 64), paper_sinkhorn(s.clone(), 0.05, 3),
                          atol=1e-12, rtol=0)
