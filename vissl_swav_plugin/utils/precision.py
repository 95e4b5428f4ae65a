"""Numerical precision of the assignment and loss computations under mixed precision.

Under VISSL's native AMP (``MODEL.AMP_PARAMS.USE_AMP``) the forward pass runs inside
``torch.autocast``.  On CUDA, fp16 autocast casts the inputs of the whole matmul family
(``mm``, ``mv``, ``matmul``, ``addmm``, ``bmm``, ``linear``) to fp16, so a Sinkhorn-Knopp
iteration written with ``torch.mv`` would run in fp16 whatever dtype its operands have:
its small clamps underflow to 0 and a prototype far from every sample turns every code of
the batch into NaN.  The assignment step (Sinkhorn-Knopp, k-means, the queue's scores) and
the losses' log-softmax therefore run inside :func:`autocast_disabled`, in fp32 (fp64 when
``use_double_precision``), whatever the caller's autocast state and the scores' dtype.

Example::

    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     with autocast_disabled(scores):
    ...         q = exact_fp32_computation(scores.float())
"""
import contextlib
from typing import Iterator

import torch

#: device types whose autocast state :func:`autocast_disabled` switches off
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")


@contextlib.contextmanager
def autocast_disabled(*tensors: torch.Tensor) -> Iterator[None]:
    """Switch autocast off for CPU and for the device type of every tensor given.

    Args:
        tensors: the tensors the block computes with (their device types are covered).
    """
    types = {"cpu"} | {t.device.type for t in tensors if torch.is_tensor(t)}
    with contextlib.ExitStack() as stack:
        for device_type in sorted(types):
            if device_type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        yield


def compute_dtype(use_double: bool) -> torch.dtype:
    """The dtype of the assignment / loss computations: fp64 if ``use_double`` else fp32."""
    return torch.float64 if use_double else torch.float32
