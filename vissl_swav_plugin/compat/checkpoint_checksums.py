"""SHA-256 checksums of checkpoints: a corrupt file is never loaded without a word.

Compat patch ``shim_checkpoint_checksums`` (see :mod:`vissl_swav_plugin.compat`).  What
breaks in VISSL 0.1.6 and the fix:

VISSL resumes from (or initialises with ``MODEL.WEIGHTS_INIT``) whatever bytes a
checkpoint file holds: flipped bytes in the middle of a ``model_*.torch`` (bit rot, a bad
copy, a failing disk) load without an error as long as the zip structure survives, and
the run silently continues from garbage weights.  Now

* the plugin's checkpoint writer (:mod:`.checkpoint_io`) writes ``<file>.sha256`` next to
  every checkpoint file (``sha256sum`` format: ``<hex>  <name>``; ``sha256sum -c`` checks
  it), atomically, after the checkpoint; a stale one is removed before a file is
  re-written, so a checkpoint and its checksum never disagree after a crash;
* every load through VISSL's readers (resume, ``MODEL.WEIGHTS_INIT``, linear evaluation
  of our checkpoints, ``checkpoint.torch`` resolved to its target) checks the file
  against its checksum first: a mismatch raises :class:`ChecksumMismatchError` naming
  the file and both hashes, and nothing is loaded;
* AUTO_RESUME (``vissl/utils/checkpoint.py``, ``get_checkpoint_resume_files``) falls back
  from a corrupt newest checkpoint to the newest intact one, with a warning naming the
  skipped file, which is kept as ``<file>.corrupt`` (with its checksum) so that the
  resumed run does not overwrite it; with no intact checkpoint left it raises
  :class:`~.checkpoint_files.CheckpointError` instead of starting over.

A checkpoint without a checksum (written by VISSL's own writer, an older plugin, or
copied without it) is checked against the CRC-32 that PyTorch's zip format stores for
every record (:func:`zip_damage`, ``zipfile.ZipFile.testzip``): a damaged record raises
:class:`CorruptCheckpointError` naming the file and the record, and AUTO_RESUME treats it
like a checksum mismatch (skipped, kept as ``.corrupt``, the previous checkpoint tried).
An intact one loads as before, with an info line.  The legacy (non-zip, torch < 1.6
``_use_new_zipfile_serialization=False``) format has no CRC: it loads unverified; a file
whose zip directory is destroyed is left to the loader, which names it as truncated or
corrupt.  Non-local folders (``scheme://``)
get no checksum.  ``VISSL_SWAV_PLUGIN_COMPAT_SKIP=shim_checkpoint_checksums`` switches
writing, checking and the fall-back off.
"""
import hashlib
import logging
import os
import zipfile
import zlib
from typing import Optional

from vissl_swav_plugin.compat.checkpoint_files import CheckpointError, _fsync_dir, _temporary_name_in
from vissl_swav_plugin.compat.engine import original, patch, register, skip_requested

NAME = "shim_checkpoint_checksums"
SUFFIX = ".sha256"
CORRUPT_SUFFIX = ".corrupt"
_CHUNK = 4 << 20


def enabled() -> bool:
    """Whether checksums are written and checked in this process (not skipped)."""
    return not skip_requested(NAME)


def sidecar_of(path: str) -> str:
    """The checksum file of checkpoint ``path``: ``<path>.sha256``."""
    return f"{path}{SUFFIX}"


def sha256_of(path: str) -> str:
    """Hex SHA-256 of the file at ``path`` (read in 4 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def drop_checksum(path: str) -> None:
    """Remove the checksum of ``path`` (before ``path`` is re-written)."""
    try:
        os.unlink(sidecar_of(path))
    except FileNotFoundError:
        pass


def write_checksum(path: str) -> str:
    """Write ``<path>.sha256`` for the complete file ``path`` atomically; returns the hash."""
    digest = sha256_of(path)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    with _temporary_name_in(folder) as tmp:
        with open(tmp, "w") as f:
            f.write(f"{digest}  {os.path.basename(path)}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, sidecar_of(path))
    _fsync_dir(folder)
    return digest


class ChecksumMismatchError(CheckpointError):
    """A checkpoint's bytes differ from the SHA-256 recorded when it was written."""


class CorruptCheckpointError(ChecksumMismatchError):
    """A checkpoint without a checksum file whose zip records fail their CRC-32."""


def zip_damage(path: str) -> Optional[str]:
    """The first record of zip-format checkpoint ``path`` whose bytes fail the CRC-32
    stored in the archive (e.g. ``archive/data/78``), or None when every record is intact
    or the file is not a readable zip (legacy torch format: nothing to check)."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                try:
                    with zf.open(info) as f:
                        while f.read(_CHUNK):
                            pass
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
                    return info.filename
    except (zipfile.BadZipFile, OSError):
        return None
    return None


def _check_zip_records(path: str, real: str) -> None:
    damaged = zip_damage(real)
    if damaged is not None:
        shown = path if real == os.path.abspath(path) else f"{path} (-> {real})"
        raise CorruptCheckpointError(
            f"checkpoint file {shown} ({os.path.getsize(real)} bytes) is corrupt: its record {damaged} "
            "fails the CRC-32 stored in the file (no checksum file "
            f"{os.path.basename(real)}{SUFFIX} next to it; bit rot, a bad copy, a failing disk?). It was "
            "not loaded and nothing was deleted; AUTO_RESUME uses the newest intact checkpoint")


def verify_checkpoint(path: str) -> bool:
    """Check local checkpoint ``path`` (a symlink: its target) against its checksum.

    Returns:
        True if verified, False if it has no checksum (logged at info level; its zip
        records are checked against their CRC-32 instead).
    Raises:
        ChecksumMismatchError: the file's SHA-256 differs from the recorded one.
        CorruptCheckpointError: no checksum file, and a zip record fails its CRC-32.
    """
    real = os.path.realpath(path)
    for sidecar in dict.fromkeys([sidecar_of(real), sidecar_of(path)]):
        if os.path.isfile(sidecar):
            break
    else:
        _check_zip_records(path, real)
        logging.info(f"Checkpoint {path} has no checksum file ({os.path.basename(real)}{SUFFIX}): checked "
                     "only against the CRC-32 of its zip records (written by VISSL's own writer, an older "
                     "plugin, or copied without it)")
        return False
    with open(sidecar) as f:
        expected = (f.read().split() or [""])[0].lower()
    actual = sha256_of(real)
    if actual != expected:
        shown = path if real == os.path.abspath(path) else f"{path} (-> {real})"
        raise ChecksumMismatchError(
            f"checkpoint file {shown} ({os.path.getsize(real)} bytes) is corrupt: its SHA-256 {actual} "
            f"differs from {expected} recorded in {sidecar} when it was written (bit rot, a bad copy, a "
            "failing disk?). It was not loaded and nothing was deleted; AUTO_RESUME uses the newest intact "
            "checkpoint")
    return True


def verify_before_load(path, error=None) -> None:
    """What a tool runs before it loads checkpoint ``path``: :func:`verify_checkpoint` when
    checksums are enabled; a damaged file is raised as ``error`` (the tool's own error type,
    same message) when one is given."""
    if not enabled():
        return
    try:
        verify_checkpoint(str(path))
    except ChecksumMismatchError as e:
        if error is None:
            raise
        raise error(str(e)) from e


def _keep_aside(folder: str, name: str) -> str:
    """Rename a corrupt checkpoint (and its checksum) to ``<name>.corrupt[.N]``."""
    target, n = f"{name}{CORRUPT_SUFFIX}", 1
    while os.path.exists(os.path.join(folder, target)):
        target, n = f"{name}{CORRUPT_SUFFIX}.{n}", n + 1
    try:
        os.rename(os.path.join(folder, name), os.path.join(folder, target))
        if os.path.exists(os.path.join(folder, name + SUFFIX)):
            os.rename(os.path.join(folder, name + SUFFIX), os.path.join(folder, target + SUFFIX))
    except FileNotFoundError:  # another node of the run moved it first
        pass
    return target


def _candidates(files, config, skip_final: bool, resume_num: int):
    """VISSL's resume order: a final checkpoint, else the numbered ones, newest first,
    from the ``LATEST_CHECKPOINT_RESUME_FILE_NUM``-th on."""
    files = [f for f in files if f.endswith(".torch")]
    finals = [] if skip_final else sorted((f for f in files if "model_final" in f), reverse=True)
    prefix = "model_iteration" if config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY > 0 else "model_phase"
    numbered = sorted(((int(f[len(prefix):-len(".torch")]), f) for f in files
                       if f.startswith(prefix) and f[len(prefix):-len(".torch")].isdigit()), reverse=True)
    start = min(max(0, resume_num - 1), max(0, len(numbered) - 1))
    return finals + [f for _, f in numbered[start:]]


def _resume_files(checkpoint_folder, config, skip_final=False, latest_checkpoint_resume_num=1):
    """VISSL's ``get_checkpoint_resume_files`` that skips corrupt checkpoints (see the
    module docstring); a checksum file is never returned (VISSL's version could return
    ``model_final_*.torch.sha256``: it matches any name containing ``model_final``)."""
    from iopath.common.file_io import g_pathmgr
    from vissl.utils import checkpoint as vc

    folder = str(checkpoint_folder)
    if not enabled() or "://" in folder:
        return original(NAME, vc, "get_checkpoint_resume_files")(
            checkpoint_folder, config, skip_final, latest_checkpoint_resume_num)
    skipped = []
    for name in _candidates(g_pathmgr.ls(folder), config, skip_final, latest_checkpoint_resume_num):
        try:
            verify_checkpoint(os.path.join(folder, name))
        except ChecksumMismatchError as e:
            kept = _keep_aside(folder, name)
            skipped.append(name)
            logging.warning(f"AUTO_RESUME skips {os.path.join(folder, name)}: {e}. The file is kept as "
                            f"{os.path.join(folder, kept)}; trying the previous checkpoint")
            continue
        if skipped:
            logging.warning(f"AUTO_RESUME resumes from {os.path.join(folder, name)} instead of the corrupt "
                            f"{', '.join(skipped)}")
        return name
    if skipped:
        raise CheckpointError(
            f"no intact checkpoint to resume from in {folder}: {', '.join(skipped)} failed their checksums "
            f"or their CRC-32 (kept as *{CORRUPT_SUFFIX}). Restore a good copy, or use another "
            "CHECKPOINT.DIR to start over")
    return None


@register
def shim_checkpoint_checksums():
    """vissl/utils/checkpoint.py, get_checkpoint_resume_files (AUTO_RESUME's file choice:
    falls back past corrupt checkpoints).  The checksum writes and checks themselves are in
    :mod:`.checkpoint_io`'s writer and :mod:`.checkpoint_load`'s reader, switched by this
    patch's name."""
    from vissl.utils import checkpoint as vc

    patch(NAME, vc, "get_checkpoint_resume_files", _resume_files)
