"""LARC (``OPTIMIZER.use_larc=True``) without NVIDIA apex.

What breaks: ``classy_vision/optim/sgd.py``, ``SGD.prepare`` imports
``apex.parallel.LARC`` (``RuntimeError: Apex needed for LARC``), and
``vissl/trainer/train_task.py``, ``SelfSupervisionTask._build_optimizer`` asserts apex
("Apex must be available to use LARC").  Every SwAV / DeepCluster-v2 config of the paper
uses LARC, and apex does not build for torch 2.x.

Fix (patch ``shim_larc_without_apex``): without apex the SGD is built as Classy does and
wrapped in :class:`LARC`, an apex-free re-implementation with apex's semantics
(trust_coefficient, clip, eps, weight decay folded into the gradient, parameters without
gradient or with a zero norm left alone).  A real apex keeps its own LARC; ``sgd_fsdp``
already carries VISSL's own apex-free LARC and is untouched.
"""
import functools

from vissl_swav_plugin.compat.engine import patch, raw, register


class LARC:
    """Layer-wise Adaptive Rate Control around a torch optimizer, apex-free.

    Same contract and semantics as ``apex.parallel.LARC`` (You et al. 2017): before
    each step, for every parameter ``p`` with a gradient ``g`` and in a group with
    learning rate ``lr`` and weight decay ``wd``::

        local_lr = trust_coefficient * ||p|| / (||g|| + wd * ||p|| + eps)
        clip=True :  g <- (g + wd * p) * min(local_lr / lr, 1)   # effective lr = min(local_lr, lr)
        clip=False:  g <- (g + wd * p) * local_lr                # effective lr = lr * local_lr

    The wrapped optimizer then steps with its weight decay temporarily set to 0 (weight
    decay is folded into the gradient above).  Parameters without a gradient, or whose
    weight norm or gradient norm is 0, are left to the plain optimizer step with no
    weight decay, as apex does.  Computed without host synchronisation.
    """

    def __init__(self, optimizer, trust_coefficient: float = 0.02, clip: bool = True, eps: float = 1e-8):
        if trust_coefficient <= 0:
            raise ValueError(
                f"config.OPTIMIZER.larc_config.trust_coefficient must be > 0, got {trust_coefficient}"
            )
        if eps < 0:
            raise ValueError(f"config.OPTIMIZER.larc_config.eps must be >= 0, got {eps}")
        self.optim = optimizer
        self.trust_coefficient = float(trust_coefficient)
        self.clip = bool(clip)
        self.eps = float(eps)

    # -- the torch.optim.Optimizer surface that ClassyOptimizer / GradScaler use --------
    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    def __repr__(self):
        return f"LARC(trust_coefficient={self.trust_coefficient}, clip={self.clip}, eps={self.eps}, {self.optim!r})"

    @property
    def state(self):
        return self.optim.state

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    @property
    def defaults(self):
        return self.optim.defaults

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self, closure=None):
        import torch

        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                wd = group.get("weight_decay", 0.0) or 0.0
                weight_decays.append(group.get("weight_decay", None))
                group["weight_decay"] = 0.0
                lr = group["lr"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad
                    p_norm = torch.linalg.vector_norm(p.detach())
                    g_norm = torch.linalg.vector_norm(g)
                    active = (p_norm != 0) & (g_norm != 0)
                    local_lr = self.trust_coefficient * p_norm / (g_norm + wd * p_norm + self.eps)
                    if self.clip:
                        local_lr = torch.clamp(local_lr / lr, max=1.0)
                    scale = torch.where(active, local_lr, torch.ones_like(local_lr))
                    if wd != 0:
                        g.add_(p.detach() * (wd * active.to(p.dtype)))
                    g.mul_(scale.to(g.dtype))
        try:
            return self.optim.step() if closure is None else self.optim.step(closure)
        finally:
            for group, wd in zip(self.optim.param_groups, weight_decays):
                if wd is None:
                    group.pop("weight_decay", None)
                else:
                    group["weight_decay"] = wd


def _apex_larc_available() -> bool:
    try:
        from apex.parallel.LARC import LARC as _  # noqa: F401
    except Exception:
        return False
    return True


@register
def shim_larc_without_apex():
    """classy_vision/optim/sgd.py, SGD.prepare: `from apex.parallel.LARC import LARC`
    -> RuntimeError("Apex needed for LARC").  Build the SGD as Classy does, then wrap it
    in our LARC (only when apex is missing: a real apex keeps its own LARC).
    """
    from classy_vision.optim.sgd import SGD

    orig_prepare = raw(SGD, "prepare")

    @functools.wraps(orig_prepare)
    def prepare(self, param_groups):
        if not self._use_larc or _apex_larc_available():
            return orig_prepare(self, param_groups)
        self._use_larc = False
        try:
            orig_prepare(self, param_groups)
        finally:
            self._use_larc = True
        self.optimizer = LARC(optimizer=self.optimizer, **dict(self._larc_config or {}))

    patch("shim_larc_without_apex", SGD, "prepare", prepare)

    # vissl/trainer/train_task.py, SelfSupervisionTask._build_optimizer:
    # `assert is_apex_available(), "Apex must be available to use LARC"`.
    from vissl.trainer import train_task as tt

    orig_build = raw(tt.SelfSupervisionTask, "_build_optimizer")

    @functools.wraps(orig_build)
    def _build_optimizer(self):
        optimizer_config = self.config["OPTIMIZER"]
        if optimizer_config.use_larc and not tt.is_apex_available():
            return tt.build_optimizer(optimizer_config)
        return orig_build(self)

    patch("shim_larc_without_apex", tt.SelfSupervisionTask, "_build_optimizer", _build_optimizer)
