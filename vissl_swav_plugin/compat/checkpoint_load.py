"""Clear checkpoint-load errors for VISSL's engine: a failure names the file.

What breaks in VISSL 0.1.6 and how it is fixed is below; the patch is applied with the
others of :mod:`vissl_swav_plugin.compat` (every process that imports ``vissl``).  It
changes no result, only *what* a failure says.  The errors
(:class:`~.checkpoint_io.CheckpointError`, :class:`~.checkpoint_io.CheckpointMismatchError`)
and the crash-safe writes are in :mod:`.checkpoint_io`.

Loads (resume: ``CheckpointLoader.load_and_broadcast_checkpoint``; ``MODEL.WEIGHTS_INIT``)
    A missing, empty, truncated or non-PyTorch file raised, depending on the case,
    ``TypeError: 'NoneType' object is not subscriptable``, ``EOFError: Ran out of input``,
    ``RuntimeError: PytorchStreamReader failed reading zip archive`` or
    ``UnpicklingError: invalid load key`` -- none naming the file; a file with bytes
    flipped in the middle often loaded without an error.  Each file is now checked against
    its SHA-256 (:mod:`.checkpoint_checksums`, written next to it by the writer of
    :mod:`.checkpoint_io`).  Now
    :class:`CheckpointError` names the file, its size and what is wrong, on every rank
    (the primary's failure is broadcast, so no rank hangs in the broadcast).  A resume
    file that is a PyTorch file but no VISSL training checkpoint names the missing keys.
    A checkpoint that does not fit the run (another model, head, loss or world size) made
    VISSL log the error and ``assert`` "Update classy state from checkpoint failed." (the
    loss part failed with the bare ``load_state_dict`` message);
    :class:`CheckpointMismatchError` now names the file and the part (model / optimizer
    state or ``LOSS.<name>`` state) with the original message.

Compat patch ``shim_checkpoint_load_errors`` (see :mod:`vissl_swav_plugin.compat`; the
writes' patch is ``shim_atomic_checkpoints`` in :mod:`.checkpoint_io`).
"""
import contextvars
import os

from vissl_swav_plugin.compat.checkpoint_io import (
    CheckpointError,
    CheckpointMismatchError,
    _install,
    _is_local,
    _originals,
)
from vissl_swav_plugin.compat.engine import register

LOADS = "shim_checkpoint_load_errors"
_ERROR_KEY = "__vissl_swav_plugin_checkpoint_error__"
# keys VISSL's resume path reads from a training checkpoint (train_task.prepare / trainer)
RESUME_KEYS = ("classy_state_dict", "iteration", "iteration_num", "phase_idx", "train_phase_idx")

_loading_init_weights = contextvars.ContextVar("vissl_swav_plugin_init_weights", default=False)


# ----------------------------------------------------------------------------------------
# clear load errors
# ----------------------------------------------------------------------------------------
def _header(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError:
        return b""


def _describe_load_failure(path: str, size: int, exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    low = text.lower()
    head = _header(path) if _is_local(path) else b""
    weights_only = "weights only" in low or "weights_only" in low
    if head and not head.startswith(b"PK") and head[:1] != b"\x80":
        what = f"is not a PyTorch checkpoint (it starts with {head!r}, not a PyTorch zip archive)"
    elif weights_only:
        what = ("holds Python objects that torch.load(weights_only=True) refuses to load; "
                "it is not a plain VISSL checkpoint")
    elif head.startswith(b"PK"):
        what = "is truncated or corrupt (an incomplete PyTorch zip archive: an interrupted write?)"
    elif head[:1] == b"\x80":
        what = "is a pickle / legacy PyTorch file that does not load (truncated or not a checkpoint)"
    elif head:
        what = f"is not a PyTorch checkpoint (it starts with {head!r}, not a PyTorch zip archive)"
    else:
        what = "cannot be loaded"
    return f"checkpoint file {path} ({size} bytes) {what}. [{text}]"


def read_checkpoint(checkpoint_path, device=None):
    """Classy Vision's ``load_checkpoint`` with errors that name the file.

    Like the original, an empty ``checkpoint_path`` returns None and a directory means
    ``<dir>/checkpoint.torch``; unlike it, a missing file raises.
    """
    import torch
    from classy_vision.generic import util as cu

    if not checkpoint_path:
        return None
    device = device if device is not None else torch.device("cpu")
    path = str(checkpoint_path)
    if _is_local(path):
        if os.path.isdir(path):
            path = os.path.join(path.rstrip("/"), cu.CHECKPOINT_FILE)
        if not os.path.exists(path):
            dangling = " (a dangling symlink)" if os.path.islink(path) else ""
            raise CheckpointError(f"checkpoint file {path} does not exist{dangling}")
        size = os.path.getsize(path)
        if size == 0:
            raise CheckpointError(
                f"checkpoint file {path} is empty (0 bytes): an interrupted write? Remove it to "
                "resume from the previous checkpoint"
            )
        from vissl_swav_plugin.compat import checkpoint_checksums as sums

        if sums.enabled():
            sums.verify_checkpoint(path)  # ChecksumMismatchError names the file
    else:
        size = -1
    try:
        return cu.load_checkpoint(path, device)  # Classy's reader (not patched)
    except Exception as e:
        raise CheckpointError(_describe_load_failure(path, size, e)) from e


def load_and_broadcast_checkpoint(checkpoint_path, device=None):
    """Replaces Classy Vision's function of that name as used by VISSL's CheckpointLoader:
    the primary reads the file; a failure is broadcast so every rank raises it."""
    from classy_vision.generic import util as cu

    payload = None
    if cu.is_primary():
        try:
            payload = read_checkpoint(checkpoint_path, device)
        except CheckpointError as e:
            payload = {_ERROR_KEY: str(e)}
    obj = cu.broadcast_object(payload)
    if isinstance(obj, dict) and _ERROR_KEY in obj:
        raise CheckpointError(obj[_ERROR_KEY])
    return obj


def _shard_load_checkpoint(checkpoint_path, device=None):
    return read_checkpoint(checkpoint_path, device)


def _loader_load_and_broadcast(cls, checkpoint_folder, checkpoint_path, device):
    ckpt = _originals["CheckpointLoader.load_and_broadcast_checkpoint"].__func__(
        cls, checkpoint_folder, checkpoint_path, device
    )
    if not _loading_init_weights.get():
        check_resume_checkpoint(ckpt, checkpoint_path)
    return ckpt


def _loader_init_weights(cls, checkpoint_path, device):
    token = _loading_init_weights.set(True)
    try:
        return _originals["CheckpointLoader.load_and_broadcast_init_weights"].__func__(
            cls, checkpoint_path, device
        )
    finally:
        _loading_init_weights.reset(token)


def check_resume_checkpoint(ckpt, path) -> None:
    """A resume file must be a VISSL training checkpoint (the keys VISSL reads)."""
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"checkpoint file {path} holds a {type(ckpt).__name__}, not a VISSL training checkpoint (a dict)"
        )
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        found = sorted(map(str, ckpt))[:10]
        raise CheckpointError(
            f"checkpoint file {path} is not a VISSL training checkpoint: missing {missing} "
            f"(found keys {found}). To start from weights only, use MODEL.WEIGHTS_INIT.PARAMS_FILE "
            "in a fresh CHECKPOINT.DIR"
        )


def _own_error(e: BaseException) -> bool:
    return isinstance(e, CheckpointError) or type(e).__module__.startswith("vissl_swav_plugin")


def _task_update_classy_state(self, state_dict=None):
    """VISSL's version logs the exception and asserts; this one names the checkpoint."""
    if state_dict is None:
        return self
    try:
        self._set_classy_state(state_dict)
    except Exception as e:
        if _own_error(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointMismatchError(
            f"checkpoint file {self.checkpoint_path} does not fit this run: restoring the model / "
            f"optimizer state failed with {type(e).__name__}: {first} -- it was written by another "
            "model or config (trunk, head, prototypes, optimizer); use another CHECKPOINT.DIR or the "
            "matching config"
        ) from e
    return self


def _task_build_loss(self):
    loss = _originals["SelfSupervisionTask._build_loss"](self)
    inner = loss.load_state_dict
    task = self

    def load_state_dict(state_dict, *args, **kwargs):
        try:
            return inner(state_dict, *args, **kwargs)
        except Exception as e:
            if isinstance(e, CheckpointError):
                raise
            name = task.config["LOSS"]["name"]
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointMismatchError(
                f"checkpoint file {task.checkpoint_path} does not fit this run: its loss state does "
                f"not load into LOSS.{name} ({type(e).__name__}: {first})"
            ) from e

    load_state_dict._vissl_swav_plugin_wrapped = True
    loss.load_state_dict = load_state_dict  # instance attribute; nn.Module allows it
    return loss


@register
def shim_checkpoint_load_errors():
    """vissl/utils/checkpoint.py, load_and_broadcast_checkpoint / load_checkpoint (Classy's
    readers, imported by name), CheckpointLoader.load_and_broadcast_checkpoint /
    load_and_broadcast_init_weights; vissl/trainer/train_task.py,
    SelfSupervisionTask._update_classy_state (assert) and _build_loss (loss state).
    """
    from vissl.trainer import train_task as tt
    from vissl.utils import checkpoint as vc

    _install(LOADS, [
        ("vissl.load_and_broadcast_checkpoint", vc, "load_and_broadcast_checkpoint",
         load_and_broadcast_checkpoint),
        ("vissl.load_checkpoint", vc, "load_checkpoint", _shard_load_checkpoint),
        ("CheckpointLoader.load_and_broadcast_checkpoint", vc.CheckpointLoader,
         "load_and_broadcast_checkpoint", classmethod(_loader_load_and_broadcast)),
        ("CheckpointLoader.load_and_broadcast_init_weights", vc.CheckpointLoader,
         "load_and_broadcast_init_weights", classmethod(_loader_init_weights)),
        ("SelfSupervisionTask._update_classy_state", tt.SelfSupervisionTask, "_update_classy_state",
         _task_update_classy_state),
        ("SelfSupervisionTask._build_loss", tt.SelfSupervisionTask, "_build_loss", _task_build_loss),
    ])
