"""Compatibility layer: VISSL 0.1.6 on Python 3.11, torch 2.14, NumPy 2.4, Pillow 13, Hydra 1.3.

VISSL 0.1.6 (2021) was written for torch 1.x with NVIDIA apex, CUDA-only tools, NumPy 1.19
and Pillow 8.  The installed VISSL is never edited; instead the few functions that break
are replaced at run time through one patch engine (:mod:`.engine`): every patch is a named,
idempotent function that fixes one documented breakage, applied once per process by
:func:`apply_all` (called first by :func:`vissl_swav_plugin.register_all`, i.e. in every
process that imports ``vissl``, spawned / forkserver workers included), listed by
:func:`applied` and undone for a ``with`` block by :func:`disabled`.  Each module below
opens with what breaks in VISSL (file and function) and how it is fixed;
``tests/unit/compat/test_compat.py`` shows each failure with the patch off.

Patches (in the order :func:`names` lists them), by module:

:mod:`.larc`
    ``shim_larc_without_apex`` -- ``OPTIMIZER.use_larc=True`` without NVIDIA apex.
:mod:`.amp`
    ``shim_native_amp`` -- ``MODEL.AMP_PARAMS.USE_AMP`` with torch's native autocast on
    CUDA or CPU, float16 or bfloat16 (new key ``AMP_DTYPE``).
    ``shim_syncbn_without_apex`` -- ``SYNC_BN_TYPE: apex`` without apex: PyTorch SyncBN.
:mod:`.cpu_device`
    ``shim_extract_features_on_cpu`` -- engines ``extract_features`` / ``extract_cluster``.
    ``shim_deepclusterv2_on_cpu`` -- VISSL's DeepCluster-v2 loss memory on CPU.
    ``shim_knn_tool_on_cpu`` -- ``tools/nearest_neighbor_test.py`` on CPU.
    ``shim_cpu_flush_denormal`` -- flush denormal floats on CPU runs (10-50x slow-down).
:mod:`.numpy2`
    ``shim_numpy2_removed_aliases`` -- ``np.float`` / ``np.int`` / ``np.in1d`` users.
    ``shim_svm_ap_scalar`` -- SVM trainers store a size-1 AP array in a scalar slot.
    ``shim_svm_low_shot_mean_ap_scalar`` -- the same in ``SVMLowShotTrainer.test``.
:mod:`.torch_io`
    ``shim_trusted_torch_load`` -- cluster-assignment files under ``weights_only=True``.
    ``shim_fast_broadcast_object`` -- Classy's byte-by-byte checkpoint broadcast.
:mod:`.pillow`
    ``shim_pillow13_posterize`` -- RandAugment's 0-bit posterize raises in Pillow 13.
:mod:`.checkpoint_io`
    ``shim_atomic_checkpoints`` -- crash-safe checkpoint writes (temporary file + rename).
:mod:`.checkpoint_load`
    ``shim_checkpoint_load_errors`` -- load failures and mismatches name the file.
:mod:`.checkpoint_checksums`
    ``shim_checkpoint_checksums`` -- a SHA-256 file next to every checkpoint, checked at
    every load; AUTO_RESUME falls back past a corrupt checkpoint (kept as ``*.corrupt``).
:mod:`.data_safety`
    ``shim_bad_image_errors`` -- unreadable images / missing dataset folders name the file;
    every image mode (16-bit, float, CMYK, ...) reaches RGB with its real value range
    (:mod:`.image_modes`).
:mod:`.persistent_workers`
    ``shim_persistent_workers`` -- loader workers live from epoch to epoch (VISSL starts fresh
    ones every epoch; new key ``DATA.PERSISTENT_WORKERS``), the transforms' per-epoch state
    carried to them with the batches' indices.
:mod:`.cpu_threads`
    ``shim_cpu_rank_threads`` -- each training process of a CPU run gets
    ``cores // NUM_PROC_PER_NODE`` torch threads (VISSL leaves every process a thread per
    core), unless ``OMP_NUM_THREADS`` is set; GPU runs are left as they are.
:mod:`.signals`
    ``shim_launcher_signals`` -- Ctrl-C / SIGTERM of a launcher exits 130 / 143 after
    stopping every process of the run; no process outlives the launcher.
:mod:`.slurm`
    ``shim_slurm_cpu_no_gpus`` -- a SLURM job of a ``MACHINE.DEVICE: cpu`` run asks for no
    GPUs (VISSL asks for ``NUM_PROC_PER_NODE`` per node whatever the device).
:mod:`.config_inference`
    ``plugin_config_inference`` -- VISSL's ``infer_losses_config`` also runs the inference
    and validation of the plugin's losses.
:mod:`.config_names`
    ``plugin_config_names`` -- VISSL's ``compose_hydra_configuration``: a ``config=`` name
    that no configs folder holds names the closest ones (and the overrides are recorded for
    the check of inferred values).
:mod:`.loss_hooks`
    ``plugin_loss_hooks`` -- VISSL's ``add_loss_hooks`` also adds the plugin's loss hooks.
:mod:`.launch_checks`
    ``plugin_launch_checks`` -- VISSL's ``launch_distributed`` / ``launch_distributed_on_slurm``
    first run the plugin's launch checks (head against trunk, dataset size, data paths), in
    the launcher process before any worker starts.

The last four call the plugin's own code (``config``, ``hooks``, ``checks``), which this
layer may not import: each declares a slot (:mod:`.slots`) that the module above provides
when :func:`vissl_swav_plugin.register_all` imports it (``config.validation``,
``config.config_names``, ``hooks.registry``, ``checks.run_wide``); a patched VISSL function
called while its slot is empty raises ``EmptySlotError``.  They are applied as they are
imported (``register(now=True)``), before the others, whose replacements wrap theirs.

Checked and found working on this stack (no patch): Hydra 1.3 composition of VISSL's
configs (``defaults: [_self_, config: ???]``; keys VISSL lacks need ``+``), ``pkg_resources``
(the real one: setuptools >=77.0.3,<81 is required, the last releases that ship it), fairscale 0.3.7 imports, ``np.bool`` (re-added in NumPy 2),
``torch.cuda.amp`` (deprecated, still there), the other VISSL/Classy transforms, VISSL
training checkpoints under ``weights_only=True``, every VISSL/Classy module imports.
On CPU VISSL never converts BatchNorm to SyncBatchNorm (GPU-only in PyTorch): with
``CONVERT_BN_TO_SYNC_BN=True`` a CPU run keeps per-process BatchNorm statistics.

Environment: ``VISSL_SWAV_PLUGIN_COMPAT_SKIP=name1,name2`` (or ``all``) leaves the named
patches out (for tests and bisecting; an unknown name is reported with a warning), e.g.
``shim_atomic_checkpoints`` keeps VISSL's own checkpoint writer and
``shim_cpu_flush_denormal`` keeps denormal floats.  ``VISSL_SWAV_PLUGIN_DISABLE=1``
switches the whole plugin, compat included, off (see ``_autoload``).

Importing this package imports only :mod:`.engine` (standard library); the patch modules
are imported by :func:`apply_all`.
"""
from vissl_swav_plugin.compat.engine import (  # noqa: F401  (the public API)
    PATCH_MODULES,
    SKIP_ENV,
    after_import,
    applied,
    apply,
    apply_all,
    disabled,
    names,
    original,
    patch,
    patched_by,
    raw,
    register,
    skip_requested,
    skipped_names,
    temporarily,
)
