"""Crash-safe checkpoint writes for VISSL's engine, and the plugin's checkpoint errors.

What breaks in VISSL 0.1.6 and how it is fixed is below; the patch is applied with the
others of :mod:`vissl_swav_plugin.compat` (every process that imports ``vissl``).  It
changes no result, only *how* files are written.  The loads (clear load errors) are in
:mod:`.checkpoint_load`, which raises the :class:`CheckpointError` /
:class:`CheckpointMismatchError` defined here and installs its patch through
:func:`_install`.

Writes (``vissl.utils.checkpoint.CheckpointWriter``)
    VISSL 0.1.6 ``torch.save``s straight into the final file (Classy Vision's
    ``save_checkpoint``) and re-creates the ``checkpoint.torch`` symlink by deleting it
    first.  A process killed in the middle (OOM killer, pre-emption, Ctrl-C of a
    launcher) leaves a truncated ``model_*.torch`` that AUTO_RESUME then picks as the
    latest checkpoint -- the run cannot resume -- and a re-written file (e.g.
    ``model_final_checkpoint_phase*.torch`` with ``OVERWRITE_EXISTING``) loses its
    previous content.  Now every checkpoint file is written to a temporary file in the
    same directory (``.ckpt_partial_<host>_<pid>_<random>.tmp``: a name VISSL's resume
    logic never matches), flushed and ``fsync``ed, then ``os.replace``d onto the final
    name, and the directory is ``fsync``ed; the symlink is created under a temporary name
    and ``os.replace``d over ``checkpoint.torch``.  At any instant every ``*.torch`` name
    is either absent, the previous complete file, or the new complete file.  Temporary
    files of dead processes of this host are removed at the next write.  Non-local
    folders (``scheme://``) keep VISSL's own writer.

Compat patch ``shim_atomic_checkpoints`` (see :mod:`vissl_swav_plugin.compat`; the loads'
patch is ``shim_checkpoint_load_errors`` in :mod:`.checkpoint_load`).
``VISSL_SWAV_PLUGIN_COMPAT_SKIP=shim_atomic_checkpoints`` keeps VISSL's own writer (the
load errors stay); it is also honoured by a writer already patched when the variable is
set later in the process.
"""
import contextlib
import logging
import os
import socket
import uuid

from vissl_swav_plugin.compat.engine import original, patch, register, skip_requested

logger = logging.getLogger(__name__)

WRITES = "shim_atomic_checkpoints"
TMP_PREFIX = ".ckpt_partial_"
TMP_SUFFIX = ".tmp"

# "Owner.attr" -> VISSL's / Classy's value before our patch (this module's and .checkpoint_load's)
_originals = {}


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


def _atomic_enabled() -> bool:
    return not skip_requested(WRITES)


def _writer_save(self, name: str, content):
    if not (_atomic_enabled() and _is_local(self.checkpoint_folder)):
        return _originals["CheckpointWriter._save"](self, name=name, content=content)
    from vissl_swav_plugin.compat import checkpoint_checksums as sums

    path = os.path.join(self.checkpoint_folder, name)
    try:
        if sums.enabled():
            sums.drop_checksum(path)  # never a new file with the old file's checksum
        atomic_torch_save(content, path)
        if sums.enabled():
            sums.write_checksum(path)
    except BaseException:
        logging.warning(f"Unable to write checkpoint {path}", exc_info=True)
        raise
    logging.info(f"Saved checkpoint: {self.checkpoint_folder}/{name}")


def _writer_symlink(self, checkpoint_name: str):
    if not (_atomic_enabled() and _is_local(self.checkpoint_folder)):
        return _originals["CheckpointWriter._create_symbolic_link"](self, checkpoint_name)
    logging.info("Creating symlink...")
    link = f"{self.checkpoint_folder}/checkpoint.torch"
    target = f"{self.checkpoint_folder}/{checkpoint_name}"  # what VISSL links to
    try:
        atomic_symlink(target, link)
        logging.info(f"Created symlink: {link}")
    except OSError as e:  # VISSL: a failed symlink does not stop the training
        logging.info(f"Could NOT create symlink. Error: {e}")


# ----------------------------------------------------------------------------------------
# the patches
# ----------------------------------------------------------------------------------------
def _install(name, targets) -> None:
    for key, owner, attr, replacement in targets:
        patch(name, owner, attr, replacement)
        _originals[key] = original(name, owner, attr)


@register
def shim_atomic_checkpoints():
    """vissl/utils/checkpoint.py, CheckpointWriter._save (torch.save into the final name) and
    CheckpointWriter._create_symbolic_link (deletes checkpoint.torch, then re-creates it).
    """
    from vissl.utils import checkpoint as vc

    _install(WRITES, [
        ("CheckpointWriter._save", vc.CheckpointWriter, "_save", _writer_save),
        ("CheckpointWriter._create_symbolic_link", vc.CheckpointWriter, "_create_symbolic_link",
         _writer_symlink),
    ])
