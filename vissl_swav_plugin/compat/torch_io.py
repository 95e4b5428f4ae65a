"""``torch.load`` / checkpoint broadcast of VISSL and Classy Vision under torch >= 2.6.

What breaks:

* ``vissl/utils/cluster_utils.py``, ``ClusterAssignmentLoader.load_cluster_assigment``
  reads the file VISSL's own extract_cluster engine wrote (it holds the run's AttrDict
  config) and fails under torch >= 2.6's ``weights_only=True`` default.
* ``classy_vision/generic/distributed_util.py``, ``broadcast_object`` (used to share
  every loaded checkpoint) builds ``torch.ByteTensor(memoryview)`` element by element
  (12 s for a 190 MB ResNet-50 checkpoint, also with one process) and receivers re-load
  the bytes with ``torch.load`` under the ``weights_only`` default.

Fix: ``shim_trusted_torch_load`` loads that trusted file with ``weights_only=False``
(checkpoints keep the safe default); ``shim_fast_broadcast_object`` installs
:func:`broadcast_object` (``torch.frombuffer``, no round trip in single-process runs,
receivers un-pickle the bytes rank 0 produced itself).
"""
import functools
import io
import tempfile

from vissl_swav_plugin.compat.engine import after_import, patch, raw, register


@register
def shim_trusted_torch_load():
    """vissl/utils/cluster_utils.py, ClusterAssignmentLoader.load_cluster_assigment:
    `torch.load(f)` of the file VISSL's extract_cluster engine wrote; it stores the run's
    config as an AttrDict, which weights_only=True (torch >= 2.6 default) rejects and
    cannot allow-list (a dict subclass).  These files are VISSL's own output.
    """
    def patch_loader(cu):
        orig = raw(cu.ClusterAssignmentLoader, "load_cluster_assigment")

        def load_cluster_assigment(cls, file_path: str):
            import torch

            with cu.g_pathmgr.open(file_path, "rb") as f:
                content = torch.load(f, map_location="cpu", weights_only=False)
            return cu.ClusterAssignment(
                config=content[cls._CONFIG_KEY],
                cluster_assignments=content[cls._ASSIGN_KEY],
            )

        functools.update_wrapper(load_cluster_assigment, getattr(orig, "__func__", orig))
        patch(
            "shim_trusted_torch_load", cu.ClusterAssignmentLoader,
            "load_cluster_assigment", classmethod(load_cluster_assigment),
        )

    after_import("vissl.utils.cluster_utils", patch_loader)


def broadcast_object(obj, src: int = 0, use_disk: bool = True):
    """Drop-in for Classy Vision's ``broadcast_object`` (same protocol and result).

    Differences: no copy at all when there is one process; the payload tensor is made with
    ``torch.frombuffer`` (not element by element); receivers un-pickle with
    ``weights_only=False`` since the bytes are what the source rank serialised from an
    object it already holds (e.g. the checkpoint it loaded under torch's default rules).
    """
    import torch
    from classy_vision.generic import distributed_util as du

    if not du.is_distributed_training_run():
        return obj
    if du.get_rank() == src:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = buffer.getbuffer()
        du.broadcast(torch.tensor([len(payload)], dtype=torch.long), src=src)
        data = torch.frombuffer(payload, dtype=torch.uint8) if len(payload) else torch.empty(0, dtype=torch.uint8)
        du.broadcast(data, src=src)
        del data, payload
        return obj
    length = du.broadcast(torch.zeros(1, dtype=torch.long), src=src)
    data = du.broadcast(torch.empty(int(length.item()), dtype=torch.uint8), src=src)
    if use_disk:
        with tempfile.TemporaryFile("w+b") as f:
            f.write(data.numpy().tobytes())
            del data
            f.seek(0)
            return torch.load(f, weights_only=False)
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


@register
def shim_fast_broadcast_object():
    """classy_vision/generic/distributed_util.py, broadcast_object: `torch.ByteTensor(
    buffer.getbuffer())` converts byte by byte (12 s per 190 MB ResNet-50 checkpoint, paid
    by every resume / weights init, also with one process) and receivers `torch.load`
    under the weights_only default.  classy_vision/generic/util.py imports it by name.
    """
    from classy_vision.generic import distributed_util as du
    from classy_vision.generic import util as cu

    for owner in (du, cu):
        patch("shim_fast_broadcast_object", owner, "broadcast_object", broadcast_object)
