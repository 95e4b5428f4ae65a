"""VISSL's CUDA-only code paths on the run's device (CPU), and a CPU speed fix.

What breaks (VISSL hard-codes ``.cuda()`` / asserts a GPU):

* ``vissl/trainer/trainer_main.py``, ``SelfSupervisionTrainer.extract`` /
  ``extract_clusters`` (engines ``extract_features`` and ``extract_cluster``) assert
  ``MACHINE.DEVICE=gpu`` and move every batch with ``.cuda()``;
  ``vissl/utils/distributed_utils.py``, ``all_gather_sizes`` /
  ``all_gather_heterogeneous`` allocate on ``cuda``.
* ``vissl/losses/deepclusterv2_loss.py``, ``DeepClusterV2Loss.init_memory`` /
  ``cluster_memory`` call ``.cuda()``.
* ``tools/nearest_neighbor_test.py``, ``nearest_neighbor_test`` (VISSL's kNN benchmark)
  calls ``.cuda()`` on the features.
* Not a crash, a 10-50x slow-down: on CPU, VISSL runs on tiny or smooth images produce
  denormal floats in backward passes.

Fix: ``shim_extract_features_on_cpu``, ``shim_deepclusterv2_on_cpu`` and
``shim_knn_tool_on_cpu`` run those functions on the task's / memory bank's / run's device
(:func:`cuda_calls_to` turns ``.cuda()`` into a move to that device); the kNN tool is
patched both when imported and when run as a script.  ``shim_cpu_flush_denormal`` makes
``SelfSupervisionTrainer.__init__`` call ``torch.set_flush_denormal(True)`` when
``MACHINE.DEVICE=cpu`` (``VISSL_SWAV_PLUGIN_COMPAT_SKIP=shim_cpu_flush_denormal`` keeps
denormals).
"""
import contextlib
import functools
import logging
import os
import sys
import threading

from vissl_swav_plugin.compat.engine import (
    SKIP_ENV, after_import, patch, patched_by, raw, register, skip_requested, temporarily,
)

FLUSH_DENORMAL = "shim_cpu_flush_denormal"

_redirect_lock = threading.RLock()
_redirect = {"depth": 0, "device": None, "stack": None}


@contextlib.contextmanager
def cuda_calls_to(device):
    """While active, ``Tensor.cuda()`` / ``Module.cuda()`` move to ``device`` instead.

    Used around VISSL functions that hard-code ``.cuda()`` (kNN tool, feature and cluster
    extraction, DeepCluster-v2 memory) when the run is on CPU.  A no-op for CUDA devices.
    ``torch.cuda.current_device()`` answers 0 meanwhile when no GPU exists (VISSL passes
    it to ``.cuda()``).  Re-entrant for the same device; the replacements are installed
    with the engine's :func:`~vissl_swav_plugin.compat.engine.temporarily`.

    Example::

        with cuda_calls_to("cpu"):
            torch.ones(2).cuda()  # a CPU tensor
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        yield
        return
    with _redirect_lock:
        if _redirect["depth"] == 0:

            def tensor_cuda(self, device_=None, non_blocking=False, **kwargs):
                return self.to(_redirect["device"], non_blocking=non_blocking)

            def module_cuda(self, device_=None):
                return self.to(_redirect["device"])

            stack = contextlib.ExitStack()
            stack.enter_context(temporarily(torch.Tensor, "cuda", tensor_cuda))
            stack.enter_context(temporarily(torch.nn.Module, "cuda", module_cuda))
            if not torch.cuda.is_available():
                stack.enter_context(temporarily(torch.cuda, "current_device", lambda: 0))
            _redirect.update(device=device, stack=stack)
        elif _redirect["device"] != device:
            raise RuntimeError(
                f"nested cuda_calls_to({device}) inside cuda_calls_to({_redirect['device']})"
            )
        _redirect["depth"] += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirect["depth"] -= 1
            if _redirect["depth"] == 0:
                stack = _redirect["stack"]
                _redirect.update(device=None, stack=None)
                stack.close()


def _on_device(method, device_of):
    """``method`` (of a VISSL class) with its ``.cuda()`` calls sent to ``device_of(self)``."""

    @functools.wraps(method)
    def on_device(self, *args, **kwargs):
        with cuda_calls_to(device_of(self)):
            return method(self, *args, **kwargs)

    return on_device


def _run_device(cfg):
    """torch.device a VISSL config runs on (cpu when MACHINE.DEVICE=cpu or no GPU)."""
    import torch

    if cfg["MACHINE"]["DEVICE"] == "gpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@register
def shim_extract_features_on_cpu():
    """Engines ``extract_features`` / ``extract_cluster`` on the task's device: replaces
    ``SelfSupervisionTrainer.extract`` / ``extract_clusters`` and their ``.cuda()`` helpers,
    and VISSL's CUDA-only ``all_gather_sizes`` / ``all_gather_heterogeneous``."""
    import torch
    from vissl.trainer import trainer_main as tm

    Trainer = tm.SelfSupervisionTrainer
    name = "shim_extract_features_on_cpu"

    # vissl/trainer/trainer_main.py, SelfSupervisionTrainer.extract:
    # `assert self.task.device.type == "cuda", "Set MACHINE.DEVICE = gpu"`.
    orig_extract = raw(Trainer, "extract")

    @functools.wraps(orig_extract)
    def extract(self, output_folder: str) -> None:
        if self.task.device.type == "cuda":
            return orig_extract(self, output_folder)
        # Same steps as VISSL's extract(), on the task's (CPU) device.
        self.task.prepare_extraction(pin_memory=self.cfg.DATA.PIN_MEMORY)
        self._add_dummy_layer()
        self.task.init_distributed_data_parallel_model()
        if tm.is_primary():
            logging.info("Model is:\n {}".format(self.task.model))
        feat_names = tm.get_trunk_output_feature_names(self.cfg.MODEL) or ["heads"]
        for split in self.task.available_splits:
            logging.info(f"Extracting features for partition: {split.lower()} on {self.task.device}")
            self.task.data_iterator = iter(self.task.dataloaders[split.lower()])
            self._extract_split_features(feat_names, self.task, split, output_folder)
        self._cleanup_task()

    patch(name, Trainer, "extract", extract)

    # ..._extract_split_features / _get_cluster_assignment_for_split: `.cuda(non_blocking=True)`
    for attr in ("_extract_split_features", "_get_cluster_assignment_for_split"):
        patch(name, Trainer, attr, _on_device(raw(Trainer, attr), lambda trainer: trainer.task.device))

    # ...extract_clusters: same assert as extract().
    orig_clusters = raw(Trainer, "extract_clusters")

    @functools.wraps(orig_clusters)
    def extract_clusters(self):
        if self.task.device.type == "cuda":
            return orig_clusters(self)
        self.task.prepare_extraction(pin_memory=self.cfg.DATA.PIN_MEMORY)
        if not self.task.base_model.is_clustering_model():
            raise ValueError(
                "Extracting clusters is only available for pre-training methods based on "
                "clusters (config.MODEL.HEAD.PARAMS must contain a prototypes head)"
            )
        self._add_dummy_layer()
        self.task.init_distributed_data_parallel_model()
        assignments = {}
        for split in self.task.available_splits:
            assignments[split] = self._get_cluster_assignment_for_split(self.task, split)
        self._cleanup_task()
        with cuda_calls_to(self.task.device):
            return self._merge_cluster_assignments(assignments)

    patch(name, Trainer, "extract_clusters", extract_clusters)

    # vissl/utils/distributed_utils.py, all_gather_sizes / all_gather_heterogeneous (used by
    # _merge_cluster_assignments): buffers made with device=torch.device("cuda", ...).
    # For CPU tensors: same results, buffers on the tensor's device (padded gather, so it
    # also works with gloo).
    from vissl.utils import distributed_utils as du

    orig_sizes = raw(du, "all_gather_sizes")
    orig_hetero = raw(du, "all_gather_heterogeneous")

    @functools.wraps(orig_sizes)
    def all_gather_sizes(x):
        if x.is_cuda:
            return orig_sizes(x)
        import torch.distributed as dist

        sizes = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=x.device)
        sizes[dist.get_rank()] = x.shape[0]
        dist.all_reduce(sizes)
        return [int(s) for s in sizes.tolist()]

    @functools.wraps(orig_hetero)
    def all_gather_heterogeneous(sizes, x):
        if x.is_cuda:
            return orig_hetero(sizes, x)
        import torch.distributed as dist

        longest = max(sizes)
        padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        gathered = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, padded)
        return [g[:n] for g, n in zip(gathered, sizes)]

    for owner in (du, tm):
        patch(name, owner, "all_gather_sizes", all_gather_sizes)
        patch(name, owner, "all_gather_heterogeneous", all_gather_heterogeneous)


@register
def shim_deepclusterv2_on_cpu():
    """vissl/losses/deepclusterv2_loss.py, DeepClusterV2Loss.init_memory (inputs .cuda()) and
    cluster_memory (centroids/counts/emb_sums .cuda()); used by InitMemoryHook and
    ClusterMemoryHook.  Run them on the device holding the loss' memory bank.
    """
    from vissl.losses.deepclusterv2_loss import DeepClusterV2Loss

    for attr in ("init_memory", "cluster_memory"):
        patch("shim_deepclusterv2_on_cpu", DeepClusterV2Loss, attr,
              _on_device(raw(DeepClusterV2Loss, attr), lambda loss: loss.local_memory_embeddings.device))


def _knn_on_run_device(orig):
    @functools.wraps(orig)
    def nearest_neighbor_test(cfg, layer_name: str = "heads"):
        with cuda_calls_to(_run_device(cfg)):
            return orig(cfg, layer_name)

    return nearest_neighbor_test


def _is_vissl_knn_function(fn) -> bool:
    code = getattr(fn, "__code__", None)
    return (
        code is not None
        and os.path.basename(code.co_filename) == "nearest_neighbor_test.py"
        and "cuda" in code.co_names
    )


def _patch_knn_in(module) -> None:
    fn = getattr(module, "nearest_neighbor_test", None)
    if fn is not None and (
        patched_by(fn) == "shim_knn_tool_on_cpu" or _is_vissl_knn_function(fn)
    ):
        patch("shim_knn_tool_on_cpu", module, "nearest_neighbor_test", _knn_on_run_device(fn))


@register
def shim_knn_tool_on_cpu():
    """tools/nearest_neighbor_test.py, nearest_neighbor_test(): `.cuda()` on the train/test
    features and labels.  Patched when the module is imported, and -- when the tool runs
    as a script (`python .../nearest_neighbor_test.py`, module __main__, whose function is
    defined after `import vissl` ran us) -- when its main() calls launch_distributed.
    """
    after_import("tools.nearest_neighbor_test", _patch_knn_in)

    from vissl.utils import distributed_launcher as dl

    orig_launch = raw(dl, "launch_distributed")

    @functools.wraps(orig_launch)
    def launch_distributed(*args, **kwargs):
        main = sys.modules.get("__main__")
        if main is not None:
            _patch_knn_in(main)
        return orig_launch(*args, **kwargs)

    patch("shim_knn_tool_on_cpu", dl, "launch_distributed", launch_distributed)


def flush_denormals_for(cfg) -> bool:
    """Flush denormal floats to zero for a CPU run.

    Args:
        cfg: the run's VISSL config (``cfg["MACHINE"]["DEVICE"]`` is read).
    Returns:
        True when flushing was switched on: ``MACHINE.DEVICE=cpu``, the CPU supports it,
        and ``VISSL_SWAV_PLUGIN_COMPAT_SKIP`` does not name ``shim_cpu_flush_denormal``.
    """
    import torch

    if cfg["MACHINE"]["DEVICE"] != "cpu" or skip_requested(FLUSH_DENORMAL):
        return False
    if torch.set_flush_denormal(True):
        logging.info(
            "CPU run: denormal floats are flushed to zero (%s=%s to keep them)", SKIP_ENV, FLUSH_DENORMAL
        )
        return True
    return False


@register
def shim_cpu_flush_denormal():
    """vissl/trainer/trainer_main.py, SelfSupervisionTrainer.__init__ (every engine builds
    one in each worker): on CPU, denormal floats (e.g. BatchNorm over near-constant crops
    of small images) make backward passes 10-50x slower.  Flush them to zero on CPU runs.
    """
    from vissl.trainer import trainer_main as tm

    orig_init = raw(tm.SelfSupervisionTrainer, "__init__")

    @functools.wraps(orig_init)
    def __init__(self, cfg, *args, **kwargs):
        flush_denormals_for(cfg)
        return orig_init(self, cfg, *args, **kwargs)

    patch(FLUSH_DENORMAL, tm.SelfSupervisionTrainer, "__init__", __init__)
