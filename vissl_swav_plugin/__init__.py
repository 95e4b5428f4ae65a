"""vissl-swav-plugin: SwAV (Caron et al. 2020), DeepCluster-v2 and SeLa-v2 for VISSL.

Importing this package is cheap and touches neither VISSL nor torch.  Components are
registered with VISSL's / Classy Vision's registries by :func:`register_all`, which runs
automatically in every process that imports ``vissl`` (installed ``.pth`` hook, see
``_autoload``) and may also be called explicitly.
"""
import importlib
import logging
import threading

__version__ = "0.1.0"

# Modules whose import registers components (losses, heads, hooks, transforms, ...).
# ``compat`` comes first: its ``apply_all`` imports every patch module (compat/*.py, see
# ``compat.PATCH_MODULES``) and applies their patches.  Four of them call plugin code through
# slots (``compat.slots``) that modules of this list provide when imported:
# ``config.validation``, ``config.config_names``, ``hooks.registry`` and ``checks.run_wide``;
# they are all imported here before ``register_all`` returns.
COMPONENT_MODULES = [
    "vissl_swav_plugin.compat",
    "vissl_swav_plugin.config.validation",
    "vissl_swav_plugin.config.vissl_fragments",
    "vissl_swav_plugin.config.dataset_stats",
    "vissl_swav_plugin.losses.swav_config",
    "vissl_swav_plugin.losses.swav_loss",
    "vissl_swav_plugin.models.heads",
    "vissl_swav_plugin.hooks.registry",
    "vissl_swav_plugin.hooks.swav_hooks",
    "vissl_swav_plugin.config.search_path",
    "vissl_swav_plugin.losses.deepcluster_v2",
    "vissl_swav_plugin.losses.sela_v2",
    "vissl_swav_plugin.hooks.memory_bank_hooks",
    "vissl_swav_plugin.transforms.standardize",
    "vissl_swav_plugin.transforms.multicrop",
    "vissl_swav_plugin.transforms.device_step",
    "vissl_swav_plugin.hooks.color_warmup",
    "vissl_swav_plugin.models.trunks",
    "vissl_swav_plugin.hooks.progress",
    "vissl_swav_plugin.hooks.online_knn",
    "vissl_swav_plugin.hooks.collapse",
    "vissl_swav_plugin.hooks.precise_bn",
    "vissl_swav_plugin.config.vissl_schema",
    "vissl_swav_plugin.config.vissl_values",
    "vissl_swav_plugin.config.config_names",
    "vissl_swav_plugin.checks.run_wide",
]

_lock = threading.RLock()
_registered = False


def register_all() -> None:
    """Apply the compat patches (:func:`vissl_swav_plugin.compat.apply_all`) and register
    every plugin component (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True  # set first: component imports may re-enter via `import vissl`
        try:
            compat = importlib.import_module("vissl_swav_plugin.compat")
            compat.apply_all()
            for name in COMPONENT_MODULES[1:]:
                importlib.import_module(name)
        except BaseException:
            _registered = False
            raise
        logging.getLogger(__name__).debug("vissl_swav_plugin %s registered", __version__)


def is_registered() -> bool:
    return _registered
