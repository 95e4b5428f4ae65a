"""CUDA-like fp16 autocast, emulated on CPU (CI has no GPU).

CPU autocast casts fewer ops than CUDA's: in particular it leaves ``torch.mv`` alone, so a
plain ``torch.autocast("cpu", dtype=torch.float16)`` test cannot see what CUDA's fp16 AMP
does to a Sinkhorn-Knopp written with matrix-vector products.  :func:`cuda_like_autocast`
enters CPU autocast and, while autocast is enabled (code that switches it off is left
alone, exactly as on CUDA), casts the floating inputs of the whole matmul family -- mm, mv,
matmul, addmm, addmv, bmm, baddbmm, linear, the ``@`` operator -- to the autocast dtype,
which is what CUDA's autocast does for its "lower precision" op list.
"""
import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

MATMUL_FAMILY = {
    torch.mm, torch.mv, torch.matmul, torch.addmm, torch.addmv, torch.bmm, torch.baddbmm,
    torch.einsum, torch.nn.functional.linear, torch._C._nn.linear,
    torch.Tensor.mm, torch.Tensor.mv, torch.Tensor.matmul, torch.Tensor.addmm, torch.Tensor.addmv,
    torch.Tensor.bmm, torch.Tensor.baddbmm, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
}


class _CastMatmulInputs(TorchFunctionMode):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMUL_FAMILY and torch.is_autocast_enabled("cpu"):
            def cast(t):
                return t.to(self.dtype) if torch.is_tensor(t) and t.is_floating_point() else t

            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_like_autocast(dtype=torch.float16):
    """CPU autocast in ``dtype`` that also casts the matmul family's inputs, as CUDA's does."""
    with torch.autocast("cpu", dtype=dtype), _CastMatmulInputs(dtype):
        yield


#: the precision settings users run: CUDA-like fp16 AMP and bf16 AMP
AMP_MODES = {
    "fp16-cuda-like": lambda: cuda_like_autocast(torch.float16),
    "bf16-cuda-like": lambda: cuda_like_autocast(torch.bfloat16),
    "bf16-cpu": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


def dead_prototype_scores(B, K, D=128, generator=None):
    """Scores of B features near one direction against K unit prototypes, one of them
    (prototype 0) opposite to that direction: the batch that made every fp16 code NaN."""
    g = generator or torch.Generator().manual_seed(0)
    c = torch.nn.functional.normalize(torch.randn(K, D, generator=g), dim=1)
    c[0] = -c[1]
    z = torch.nn.functional.normalize(c[1] + 0.05 * torch.randn(B, D, generator=g), dim=1)
    return z @ c.t()


def swav_loss_config(num_crops=4, K=30, D=16, queue_len=0, **extra):
    """A complete ``LOSS.swav_plugin_loss`` block (as VISSL's inference leaves it)."""
    cfg = {"temperature": 0.1, "epsilon": 0.05, "num_iters": 3, "crops_for_assign": [0, 1],
           "num_crops": num_crops, "num_prototypes": [K], "embedding_dim": D,
           "queue": {"queue_length": queue_len, "start_epoch": 0, "local_queue_length": queue_len}}
    cfg.update(extra)
    return cfg
