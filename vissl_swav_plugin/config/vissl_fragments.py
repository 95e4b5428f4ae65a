"""VISSL's composable SwAV fragments (``+config/pretrain/swav/{models,transforms,optimization,heads}=NAME``)
on the plugin's configs.

Hydra merges a fragment into our config key by key, so a fragment written for VISSL's ``swav_loss`` /
``swav_head`` can leave a config that mixes VISSL's and our components, or sets keys that nothing reads.
What composes as is: ``transforms`` (VISSL's multi-crop chain; our loss counts its crops), ``optimization``
fragments that set only batch, nodes and the learning-rate schedule, trunks, and ``models`` / ``heads``
fragments (they bring VISSL's ``swav_head``, which our SwAV loss takes as it takes ours; the loss's
``num_prototypes`` and ``embedding_dim`` follow the fragment's head).  What cannot, and the error raised at
composition (it names the key and the way out):

* ``LOSS.name`` switched to VISSL's ``swav_loss`` (``models=resnet50_w4`` / ``resnet50_w5``) while the config
  carries our ``LOSS.swav_plugin_loss`` block, which VISSL's loss would ignore;
* a ``LOSS.swav_loss`` value (``optimization=bs64_4gpu``'s queue) under ``swav_plugin_loss``, which reads
  only ``LOSS.swav_plugin_loss``.
"""
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.registries import register_config_check

# VISSL's defaults for the keys of LOSS.swav_loss that its inference does not fill in
# (vissl/config/defaults.yaml); a value other than these was set by someone and must not be ignored.
SWAV_LOSS_DEFAULTS = {"temperature": 0.1, "use_double_precision": False, "normalize_last_layer": True,
                      "num_iters": 3, "epsilon": 0.05, "crops_for_assign": [0, 1], "temp_hard_assignment_iters": 0,
                      "queue.queue_length": 0, "queue.start_iter": 0}
PLUGIN_KEY_FOR = {"temperature": "temperature", "use_double_precision": "use_double_precision",
                  "normalize_last_layer": "normalize_prototypes", "num_iters": "num_iters", "epsilon": "epsilon",
                  "crops_for_assign": "crops_for_assign", "temp_hard_assignment_iters": "temp_hard_assignment_iters",
                  "queue.queue_length": "queue.queue_length",
                  "queue.start_iter": "queue.start_epoch (in epochs: start_iter / iterations per epoch)"}
VISSL_ORIGINAL = "config=vissl/pretrain/swav/swav_8node_resnet"


def _get(block, dotted):
    for part in dotted.split("."):
        if not hasattr(block, "get"):
            return None
        block = block.get(part)
    return block


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


@register_config_check
def check_vissl_fragments(cfg):
    loss = cfg.LOSS.name
    if loss == "swav_loss" and "swav_plugin_loss" in cfg.LOSS:
        raise ConfigError(
            "config.LOSS.name is VISSL's 'swav_loss' but the config is one of the plugin's (it has "
            "LOSS.swav_plugin_loss, which VISSL's loss ignores): a VISSL fragment set LOSS.name (the models "
            "fragments resnet50_w4 / resnet50_w5 do). Add config.LOSS.name=swav_plugin_loss and move the "
            "fragment's LOSS.swav_loss.queue values to LOSS.swav_plugin_loss.queue, or compose the fragment "
            f"with VISSL's own config ({VISSL_ORIGINAL})")
    if loss == "swav_plugin_loss" and "swav_loss" in cfg.LOSS:
        for key, default in SWAV_LOSS_DEFAULTS.items():
            value = _plain(_get(cfg.LOSS.swav_loss, key))
            if value is not None and value != default:
                raise ConfigError(
                    f"config.LOSS.swav_loss.{key} is {value!r} (VISSL's default {default!r}; a VISSL fragment "
                    "such as +config/pretrain/swav/optimization=bs64_4gpu sets it) but config.LOSS.name is "
                    f"'swav_plugin_loss', which reads only LOSS.swav_plugin_loss: set "
                    f"config.LOSS.swav_plugin_loss.{PLUGIN_KEY_FOR[key]} instead")
