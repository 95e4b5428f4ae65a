"""VISSL's config inference knows only VISSL's losses.

What is missing: ``vissl/utils/hydra_config.py``, ``infer_losses_config(cfg)`` (called by
``convert_to_attrdict`` whenever a launcher composes a config) fills in the derived settings
of VISSL's own losses only (number of crops, prototypes, queue length per process, ...): a
plugin's loss gets nothing, no value is checked, and on some inputs VISSL's inference stops
with a bare ``AssertionError``.

Fix (patch ``plugin_config_inference``): ``infer_losses_config`` hands the config and VISSL's
own function to the slot :data:`inference`, provided by
:mod:`vissl_swav_plugin.config.validation` (the inference driver: the plugin's checks before
VISSL's inference, VISSL's inference with a failed assertion turned into a ``ConfigError``,
then the plugin's inferences and checks).  ``__wrapped__`` is VISSL's function.

The patch is applied when this module is imported (``register(now=True)``), before
``apply_all`` applies the other patches, as it was before it moved here: no other patch
wraps ``infer_losses_config``.
"""
from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.slots import Slot

#: ``fn(cfg, vissl_infer_losses_config) -> cfg``: the whole inference of a composed config
inference = Slot("plugin_config_inference", "inference", "vissl_swav_plugin.config.validation")


@register(now=True)
def plugin_config_inference():
    """vissl/utils/hydra_config.py, infer_losses_config(): also the plugin's inference and checks."""
    import vissl.utils.hydra_config as hc

    original = raw(hc, "infer_losses_config")

    def infer_losses_config(cfg):
        return inference(cfg, original)

    infer_losses_config.__wrapped__ = original
    patch("plugin_config_inference", hc, "infer_losses_config", infer_losses_config)
