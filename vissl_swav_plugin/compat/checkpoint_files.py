"""Checkpoint file primitives shared by the checkpoint patches (:mod:`.checkpoint_io`,
:mod:`.checkpoint_checksums`, :mod:`.checkpoint_load`): the plugin's checkpoint errors,
atomic writes (temporary file in the same folder, ``fsync``, ``os.replace``) and the
clean-up of temporary files left by dead processes.  No patch lives here.
"""
import contextlib
import logging
import os
import socket
import uuid

logger = logging.getLogger(__name__)

TMP_PREFIX = ".ckpt_partial_"
TMP_SUFFIX = ".tmp"


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be read; the message names the file."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint does not fit the run (model, optimizer, loss or world size)."""


# ----------------------------------------------------------------------------------------
# atomic writes
# ----------------------------------------------------------------------------------------
def _is_local(path: str) -> bool:
    return "://" not in str(path)


def _host() -> str:
    return socket.gethostname().replace("_", "-") or "host"


def _tmp_name(folder: str) -> str:
    return os.path.join(folder, f"{TMP_PREFIX}{_host()}_{os.getpid()}_{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale_partials(folder: str) -> list:
    """Remove temporary files left by dead processes of this host; returns their names."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    host = _host()
    for name in names:
        if not (name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)):
            continue
        parts = name[len(TMP_PREFIX):-len(TMP_SUFFIX)].rsplit("_", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid != os.getpid() and not _pid_alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                removed.append(name)
    if removed:
        logger.info(f"Removed {len(removed)} partial checkpoint file(s) of interrupted writes in {folder}")
    return removed


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj, path: str) -> str:
    """``torch.save(obj, path)`` such that ``path`` is never seen half-written."""
    import torch

    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    cleanup_stale_partials(folder)
    with _temporary_name_in(folder) as tmp:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    _fsync_dir(folder)
    return path


def atomic_symlink(target: str, link: str) -> None:
    """Point ``link`` at ``target``; ``link`` always exists once it existed."""
    folder = os.path.dirname(os.path.abspath(link)) or "."
    with _temporary_name_in(folder) as tmp:
        os.symlink(target, tmp)
        os.replace(tmp, link)
    _fsync_dir(folder)


@contextlib.contextmanager
def _temporary_name_in(folder: str):
    """A fresh temporary file name in ``folder``; the file is removed if the block fails."""
    tmp = _tmp_name(folder)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
