"""CANDIDATE CODE, NOT SHIPPED: LARC with ``torch._foreach_*`` kernels, timed by
``benchmarks/gpu_check.py``'s ``step_variants`` section against the shipped
``vissl_swav_plugin/compat/larc.py`` (which loops over the parameters: two norms and a few
element-wise kernels per parameter, about 160 parameters for a ResNet-50 with SwAV's head).

Same semantics as the shipped :class:`~vissl_swav_plugin.compat.larc.LARC` (apex's): per
parameter ``p`` with gradient ``g``, learning rate ``lr``, weight decay ``wd``::

    local_lr = trust_coefficient * ||p|| / (||g|| + wd * ||p|| + eps)
    clip=True :  g <- (g + wd * p) * min(local_lr / lr, 1)
    clip=False:  g <- (g + wd * p) * local_lr

parameters with a zero weight or gradient norm left alone; the wrapped optimizer then steps
with its weight decay set to 0.  Here the norms of a group come from two ``_foreach_norm``
calls, the trust ratios are computed on one stacked tensor, and the gradients are updated with
``_foreach_add_`` / ``_foreach_mul_``; no host synchronisation.
``tests/integration/benchmarks/test_larc_foreach.py`` checks it against the shipped LARC.
"""
import torch

from vissl_swav_plugin.compat.larc import LARC


class ForeachLARC(LARC):
    """:class:`LARC` whose gradient rescaling runs as a few ``torch._foreach_*`` kernels per
    parameter group instead of a Python loop over the parameters."""

    def step(self, closure=None):
        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                wd = group.get("weight_decay", 0.0) or 0.0
                weight_decays.append(group.get("weight_decay", None))
                group["weight_decay"] = 0.0
                lr = group["lr"]
                params = [p for p in group["params"] if p.grad is not None]
                if not params:
                    continue
                grads = [p.grad for p in params]
                p_norms = torch.stack([n.float() for n in torch._foreach_norm(params)])
                g_norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])
                active = (p_norms != 0) & (g_norms != 0)
                local_lr = self.trust_coefficient * p_norms / (g_norms + wd * p_norms + self.eps)
                if self.clip:
                    local_lr = torch.clamp(local_lr / lr, max=1.0)
                scale = torch.where(active, local_lr, torch.ones_like(local_lr))
                if wd != 0:
                    coeff = (wd * active.to(p_norms.dtype)).to(grads[0].dtype)
                    torch._foreach_add_(grads, torch._foreach_mul(params, list(coeff.unbind())))
                torch._foreach_mul_(grads, list(scale.to(grads[0].dtype).unbind()))
        try:
            return self.optim.step() if closure is None else self.optim.step(closure)
        finally:
            for group, wd in zip(self.optim.param_groups, weight_decays):
                if wd is None:
                    group.pop("weight_decay", None)
                else:
                    group["weight_decay"] = wd


def swap_into(classy_optimizer):
    """Replace the shipped LARC inside a Classy optimizer (``task.optimizer``) by a
    :class:`ForeachLARC` around the same torch optimizer; returns it."""
    inner = classy_optimizer.optimizer
    if not isinstance(inner, LARC):
        raise TypeError(f"expected the plugin's LARC inside the Classy optimizer, got {type(inner).__name__}")
    new = ForeachLARC(inner.optim, trust_coefficient=inner.trust_coefficient, clip=inner.clip, eps=inner.eps)
    classy_optimizer.optimizer = new
    return new
