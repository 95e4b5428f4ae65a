"""Crash-safe checkpoint writes for VISSL's engine, and the plugin's checkpoint errors.

What breaks in VISSL 0.1.6 and how it is fixed is below; the patch is applied with the
others of :mod:`vissl_swav_plugin.compat` (every process that imports ``vissl``).  It
changes no result, only *how* files are written.  The loads (clear load errors) are in
:mod:`.checkpoint_load`, which raises the :class:`CheckpointError` /
:class:`CheckpointMismatchError` (defined with the file primitives in
:mod:`.checkpoint_files`, importable from here) and installs its patch through
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
import logging
import os

from vissl_swav_plugin.compat import checkpoint_checksums as sums
from vissl_swav_plugin.compat.checkpoint_files import (  # noqa: F401  (re-exported: the plugin's checkpoint errors)
    TMP_PREFIX,
    TMP_SUFFIX,
    CheckpointError,
    CheckpointMismatchError,
    _host,
    _is_local,
    _temporary_name_in,
    atomic_symlink,
    atomic_torch_save,
    cleanup_stale_partials,
)
from vissl_swav_plugin.compat.engine import original, patch, register, skip_requested

WRITES = "shim_atomic_checkpoints"

# "Owner.attr" -> VISSL's / Classy's value before our patch (this module's and .checkpoint_load's)
_originals = {}


def _atomic_enabled() -> bool:
    return not skip_requested(WRITES)


def _writer_save(self, name: str, content):
    if not (_atomic_enabled() and _is_local(self.checkpoint_folder)):
        return _originals["CheckpointWriter._save"](self, name=name, content=content)
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
