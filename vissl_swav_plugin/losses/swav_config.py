"""The SwAV loss's configuration (``LOSS.swav_plugin_loss``): its keys with their defaults
(one table, read by validation and by the loss at run time), the checks of its values, and
its inference when a config is composed (crops, prototypes and embedding size from the
transform and the head, the queue's length per process).

The module depends only on the generic checkers and registries of :mod:`vissl_swav_plugin.config`;
the loss (:mod:`vissl_swav_plugin.losses.swav_loss`) and the hooks import their tables from here.
"""
from vissl_swav_plugin.config.checkers import (
    ConfigError,
    check_known_keys,
    require_bool,
    require_int,
    require_int_list,
    require_positive_number,
)
from vissl_swav_plugin.config.dataset_size import world_size_of
from vissl_swav_plugin.config.registries import register_config_inference, register_inferred_keys, total_num_crops
from vissl_swav_plugin.transforms.multicrop_config import DEVICE_COLLATORS  # config.DATA.TRAIN.DEVICE_AUGMENT

LOSS_NAME = "swav_plugin_loss"

#: Required keys of ``LOSS.swav_plugin_loss`` (``num_crops``, ``num_prototypes`` and
#: ``embedding_dim`` are inferred when the config is composed).
REQUIRED_KEYS = ("temperature", "epsilon", "num_iters", "crops_for_assign", "num_crops", "num_prototypes",
                 "embedding_dim")
#: Optional keys of ``LOSS.swav_plugin_loss`` and their defaults (the same table in
#: validation and at run time; with :data:`REQUIRED_KEYS` and ``queue`` the known keys).
DEFAULTS = {
    "use_double_precision": False,
    "hard_assignment": False,
    "temp_hard_assignment_iters": 0,
    "distributed_sinkhorn": True,
    "normalize_prototypes": True,
    "freeze_prototypes_niters": 0,
    "output_dir": ".",
}
#: Keys of ``LOSS.swav_plugin_loss.queue`` and their defaults.  ``use_before_full: False``
#: is the official implementation's behaviour (the queue is scored only once it is full);
#: ``True`` scores the valid part of a queue that is still filling.
QUEUE_DEFAULTS = {"queue_length": 0, "start_epoch": 0, "local_queue_length": 0, "use_before_full": False}

#: keys the inference fills in, with the value that means "not set" (None: any value is the
#: user's); a user's value that the inference replaces is a ConfigError (output_dir: a warning)
INFERRED_KEYS = {"num_prototypes": None, "embedding_dim": None, "num_crops": None, "output_dir": DEFAULTS["output_dir"],
                 "queue.local_queue_length": QUEUE_DEFAULTS["local_queue_length"]}
register_inferred_keys(LOSS_NAME, INFERRED_KEYS)


def swav_loss_known_keys():
    """``(known keys of LOSS.swav_plugin_loss, known keys of its queue block)``: the run
    time's own tables (``swav_loss.REQUIRED_KEYS``, ``DEFAULTS``, ``QUEUE_DEFAULTS``), plus
    ``queue`` and ``name`` (which Classy Vision's ``build_loss`` adds to the block)."""
    return set(REQUIRED_KEYS) | set(DEFAULTS) | {"queue", "name"}, set(QUEUE_DEFAULTS)


def validate_swav_loss_config(lc, prefix="LOSS.swav_plugin_loss"):
    """Checks on the loss config itself (also used by the loss's ``from_config``): no
    unknown key (its queue block included), then every value."""
    known, queue_known = swav_loss_known_keys()
    check_known_keys(lc, known, f"config.{prefix}")
    check_known_keys(lc.get("queue") or {}, queue_known, f"config.{prefix}.queue")
    require_positive_number(lc.get("temperature"), f"{prefix}.temperature")
    require_positive_number(lc.get("epsilon"), f"{prefix}.epsilon")
    require_int(lc.get("num_iters"), f"{prefix}.num_iters", minimum=1)
    require_int(lc.get("num_crops"), f"{prefix}.num_crops", minimum=2)
    require_int_list(lc.get("num_prototypes"), f"{prefix}.num_prototypes", minimum=1)
    require_int(lc.get("embedding_dim"), f"{prefix}.embedding_dim", minimum=1)
    cfa = lc.get("crops_for_assign")
    require_int_list(cfa, f"{prefix}.crops_for_assign")
    n = lc["num_crops"]
    bad = [c for c in cfa if c >= n]
    if bad:
        raise ConfigError(
            f"config.{prefix}.crops_for_assign={list(cfa)} has crop indices {bad} outside "
            f"[0, num_crops={n})"
        )
    if len(set(cfa)) != len(cfa):
        raise ConfigError(f"config.{prefix}.crops_for_assign={list(cfa)} repeats a crop")
    q = lc.get("queue", {}) or {}
    for key in ("queue_length", "start_epoch"):
        require_int(q.get(key, QUEUE_DEFAULTS[key]), f"{prefix}.queue.{key}")
    require_bool(q.get("use_before_full", QUEUE_DEFAULTS["use_before_full"]), f"{prefix}.queue.use_before_full")
    for key in ("freeze_prototypes_niters", "temp_hard_assignment_iters"):
        require_int(lc.get(key, DEFAULTS[key]), f"{prefix}.{key}")
    for flag in ("use_double_precision", "hard_assignment", "distributed_sinkhorn", "normalize_prototypes"):
        require_bool(lc.get(flag, DEFAULTS[flag]), f"{prefix}.{flag}")


#: heads whose output is ``[embeddings, scores_0, ...]`` with plain ``prototypes<h>`` layers
PROTOTYPE_HEADS = ("swav_plugin_head", "swav_head")


def _prototype_head_of(cfg, prefix):
    """``(name, params)`` of the last head of ``MODEL.HEAD.PARAMS``, which must be our
    ``swav_plugin_head`` or VISSL's ``swav_head`` (with plain prototypes and embeddings)."""
    heads = cfg.MODEL.HEAD.PARAMS
    if not heads or heads[-1][0] not in PROTOTYPE_HEADS:
        raise ConfigError(
            f"config.MODEL.HEAD.PARAMS must end with a swav_plugin_head (or VISSL's swav_head) for "
            f"{prefix}; got {[h[0] for h in heads] if heads else heads}"
        )
    name, params = heads[-1][0], heads[-1][1]
    if name == "swav_head":
        if params.get("use_weight_norm_prototypes", False):
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: swav_head with use_weight_norm_prototypes=True is not "
                f"supported by {prefix} (its prototypes are normalised by the plugin's hooks); set it "
                "to False or use swav_plugin_head"
            )
        if not params.get("return_embeddings", True):
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: swav_head needs return_embeddings=True for {prefix} "
                "(the loss reads the embeddings for the queue)"
            )
    return name, params


@register_config_inference("swav_plugin_loss")
def infer_swav_plugin_loss(cfg):
    """Fill the inferred keys of ``LOSS.swav_plugin_loss`` (``num_prototypes``, ``embedding_dim``, ``num_crops``, ``output_dir``, ``queue.local_queue_length``) from the head, the transforms, the checkpoint folder and the world size, then validate every key (:class:`ConfigError` names the key)."""
    prefix = "LOSS.swav_plugin_loss"
    lc = cfg.LOSS.swav_plugin_loss
    head_name, head = _prototype_head_of(cfg, prefix)
    if "num_clusters" not in head or "dims" not in head:
        raise ConfigError(f"config.MODEL.HEAD.PARAMS: {head_name} needs 'dims' and 'num_clusters'")
    if not isinstance(head["num_clusters"], (list, tuple)):
        raise ConfigError(
            f"config.MODEL.HEAD.PARAMS: {head_name} 'num_clusters' must be a list of prototype "
            f"counts, e.g. [3000]; got {head['num_clusters']!r}"
        )
    if not isinstance(head["dims"], (list, tuple)) or len(head["dims"]) < 2:
        raise ConfigError(
            f"config.MODEL.HEAD.PARAMS: {head_name} 'dims' must list >= 2 sizes, e.g. [2048, 128]; "
            f"got {head['dims']!r}"
        )
    lc.num_prototypes = list(head["num_clusters"])
    lc.embedding_dim = int(head["dims"][-1])
    crops = total_num_crops(cfg)
    if crops is not None:
        lc.num_crops = crops
        if cfg.DATA.TRAIN.COLLATE_FUNCTION not in ("multicrop_collator", "multicrop_mixup_collator", *DEVICE_COLLATORS):
            raise ConfigError(
                "config.DATA.TRAIN.COLLATE_FUNCTION must be multicrop_collator for a multi-crop "
                f"transform, got {cfg.DATA.TRAIN.COLLATE_FUNCTION!r}"
            )
    from vissl.utils.checkpoint import get_checkpoint_folder

    lc.output_dir = get_checkpoint_folder(cfg)
    validate_swav_loss_config(lc, prefix)
    # queue: global length, split evenly over processes
    world = world_size_of(cfg)
    bs = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    qlen = int(lc.queue.queue_length)
    if qlen > 0:
        if qlen % world:
            raise ConfigError(
                f"config.{prefix}.queue.queue_length={qlen} is not divisible by the world size "
                f"{world} (DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE)"
            )
        if qlen // world < bs:
            raise ConfigError(
                f"config.{prefix}.queue.queue_length={qlen} gives {qlen // world} entries per process, "
                f"shorter than DATA.TRAIN.BATCHSIZE_PER_REPLICA={bs}"
            )
    lc.queue.local_queue_length = qlen // world
    return cfg
