"""Config inference and checks of the memory-bank clustering losses (DeepCluster-v2,
SeLa-v2; see :mod:`vissl_swav_plugin.losses.memory_bank_loss`).

Two moments, both raising :class:`~vissl_swav_plugin.config.checkers.ConfigError`
naming the key:

* when a config is composed (every launcher), :func:`infer_clustering_loss_config` fills
  in ``num_clusters`` / ``embedding_dim`` from the prototype head and checks
  ``LOSS.<name>`` before any process starts;
* when the loss runs, :class:`ClusteringChecksMixin` reads ``LOSS.<name>`` and checks it
  against the training dataset, the model's prototype layers and the first batch (what
  only the running job knows).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from vissl_swav_plugin.config.checkers import (
    ConfigError,
    check_known_keys,
    require_int,
    require_int_list,
    require_positive_number,
)
from vissl_swav_plugin.config.registries import register_inferred_keys, register_launch_check, total_num_crops
from vissl_swav_plugin.config.dataset_size import train_dataset_size
from vissl_swav_plugin.transforms.multicrop_config import DEVICE_COLLATORS  # config.DATA.TRAIN.DEVICE_AUGMENT
from vissl_swav_plugin.models.heads import find_prototype_layers

__all__ = ["ClusteringChecksMixin", "DTYPES", "INIT_BANK_FORWARDS", "infer_clustering_loss_config", "require_choice"]

#: ``init_bank_forward`` values: how the initial pass calls the model (first: default)
INIT_BANK_FORWARDS = ("per_crop", "joint")
#: dtypes of the clustering computations (``kmeans_dtype``, ``sinkhorn_dtype``)
DTYPES = ("float32", "float64")


#: keys of ``LOSS.<name>`` that :func:`infer_clustering_loss_config` fills in from the head
#: (any value the user sets that differs is a ConfigError, see ``register_inferred_keys``)
INFERRED_KEYS = {"num_clusters": None, "embedding_dim": None}


def require_choice(lc, key: str, choices: Sequence, prefix: str):
    """``lc[key]`` (its default: ``choices[0]``), which must be one of ``choices``; else
    :class:`ConfigError` naming ``config.<prefix>.<key>``.  Returns the value."""
    value = lc.get(key, choices[0])
    if value not in choices:
        raise ConfigError(
            f"config.{prefix}.{key} must be one of {' | '.join(map(str, choices))}, got {value!r}"
        )
    return value


def infer_clustering_loss_config(cfg, loss_cls):
    """Fill in / check ``LOSS.<loss_cls.LOSS_NAME>`` when a config is composed.

    ``num_clusters`` and ``embedding_dim`` come from the prototype head (last entry of
    ``MODEL.HEAD.PARAMS``) when it has ``num_clusters``; else ``embedding_dim`` comes from
    its ``dims`` (a head whose output is the embedding).  The method decides which heads
    it accepts (``loss_cls.check_head_config``) and checks its own keys
    (``loss_cls.validate_method_config``).

    Args:
        cfg: the composed VISSL config (modified in place).
        loss_cls: the loss class, a :class:`~vissl_swav_plugin.losses.memory_bank_loss.MemoryBankClusteringLoss`.

    Returns:
        ``cfg``.
    """
    loss_name = loss_cls.LOSS_NAME
    register_inferred_keys(loss_name, INFERRED_KEYS)
    prefix = f"LOSS.{loss_name}"
    lc = cfg.LOSS[loss_name]
    check_known_keys(lc, loss_cls.known_config_keys(), f"config.{prefix}")
    heads = cfg.MODEL.HEAD.PARAMS
    if not heads:
        raise ConfigError(f"config.MODEL.HEAD.PARAMS is empty; {prefix} needs a projection head")
    head_name, hp = heads[-1][0], heads[-1][1]
    loss_cls.check_head_config(head_name, "num_clusters" in hp, prefix)
    if "num_clusters" in hp:
        require_int_list(list(hp["num_clusters"]), f"MODEL.HEAD.PARAMS.{head_name}.num_clusters", minimum=1)
        lc.num_clusters = [int(k) for k in hp["num_clusters"]]
        if "dims" not in hp:
            raise ConfigError(f"config.MODEL.HEAD.PARAMS: {head_name} needs 'dims'")
        lc.embedding_dim = int(hp["dims"][-1])
    elif "dims" in hp:  # the head's output is the embedding
        lc.embedding_dim = int(hp["dims"][-1])
    require_int_list(lc.get("num_clusters"), f"{prefix}.num_clusters", minimum=1)
    require_int(lc.get("embedding_dim"), f"{prefix}.embedding_dim", minimum=1)
    require_positive_number(lc.get("temperature"), f"{prefix}.temperature")
    cfm = lc.get("crops_for_mb")
    require_int_list(cfm, f"{prefix}.crops_for_mb")
    if len(set(cfm)) != len(cfm):
        raise ConfigError(f"config.{prefix}.crops_for_mb={list(cfm)} repeats a crop")
    crops = total_num_crops(cfg)  # None: unknown here, checked on the first batch
    bad = [c for c in cfm if crops is not None and c >= crops]
    if bad:
        raise ConfigError(
            f"config.{prefix}.crops_for_mb={list(cfm)} has crop indices {bad} outside [0, {crops}) "
            f"(the train transforms give {crops} crops per image)"
        )
    if crops is not None and cfg.DATA.TRAIN.COLLATE_FUNCTION not in ("multicrop_collator", *DEVICE_COLLATORS):
        raise ConfigError(
            "config.DATA.TRAIN.COLLATE_FUNCTION must be multicrop_collator for a multi-crop "
            f"transform with {prefix}, got {cfg.DATA.TRAIN.COLLATE_FUNCTION!r}"
        )
    if "num_train_samples" not in lc:
        lc.num_train_samples = -1  # filled in by VISSL from the training dataset
    require_choice(lc, "init_bank_forward", INIT_BANK_FORWARDS, prefix)
    loss_cls.validate_method_config(lc, prefix)
    return cfg


class ClusteringChecksMixin:
    """Reading and checking of a memory-bank clustering loss' config, at run time.

    Expects ``self.loss_config`` and ``self.name``; :meth:`read_base_config` sets
    ``num_train_samples``, ``temperature``, ``num_clusters``, ``embedding_dim``,
    ``crops_for_mb`` and ``init_memory_pass``.  The ``_positive`` / ``_at_least`` /
    ``_choice`` readers serve the methods' own keys.
    """

    #: keys of ``LOSS.<name>`` read by every memory-bank clustering loss
    BASE_CONFIG_KEYS = ("num_train_samples", "temperature", "num_clusters", "embedding_dim", "crops_for_mb",
                        "init_memory_pass", "init_bank_forward", "output_dir", "name")
    #: the method's own keys (a subclass lists every key it reads, or they are rejected)
    METHOD_CONFIG_KEYS: Tuple[str, ...] = ()

    # ------------------------------------------------------------------ composing
    @classmethod
    def known_config_keys(cls) -> set:
        """Every key of ``LOSS.<name>`` this loss reads; any other key is a
        :class:`ConfigError` when the config is composed (with the closest known key)."""
        return set(cls.BASE_CONFIG_KEYS) | set(cls.METHOD_CONFIG_KEYS)

    @classmethod
    def check_head_config(cls, head_name: str, has_prototypes: bool, prefix: str) -> None:
        """Raise :class:`ConfigError` if the method cannot train with this head (accepts all)."""

    @classmethod
    def validate_method_config(cls, lc, prefix: str) -> None:
        """Check the method's own keys of ``LOSS.<name>`` (none in the base)."""

    # ------------------------------------------------------------------ reading
    def _get(self, key, default):
        cfg = self.loss_config
        try:
            v = cfg[key] if key in cfg else default
        except TypeError:
            v = getattr(cfg, key, default)
        return default if v is None else v

    def _bad(self, key: str, msg: str):
        raise ConfigError(f"config.LOSS.{self.name}.{key} {msg}")

    def _positive(self, key: str, default, cast=float):
        """``cast(LOSS.<name>.<key>)``, which must be > 0."""
        v = cast(self._get(key, default))
        if not v > 0:
            self._bad(key, f"must be > 0, got {v}")
        return v

    def _at_least(self, key: str, default: int, minimum: int) -> int:
        """``int(LOSS.<name>.<key>)``, which must be >= ``minimum``."""
        v = int(self._get(key, default))
        if v < minimum:
            self._bad(key, f"must be >= {minimum}, got {v}")
        return v

    def _choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """``str(LOSS.<name>.<key>)``, which must be one of ``choices``."""
        v = str(self._get(key, default))
        if v not in choices:
            self._bad(key, f"must be {' or '.join(choices)}, got {v}")
        return v

    def _flag(self, key: str, default: bool) -> bool:
        """``LOSS.<name>.<key>``, which must be true or false."""
        v = self._get(key, default)
        if not isinstance(v, bool):
            self._bad(key, f"must be true or false, got {v!r}")
        return v

    def _int_list(self, key: str, default: List[int]) -> List[int]:
        v = self._get(key, default)
        return [int(v)] if isinstance(v, int) else [int(x) for x in v]

    def read_base_config(self) -> None:
        """Read the keys every memory-bank clustering loss has (see the loss' doc)."""
        self.num_train_samples = int(self._get("num_train_samples", -1))
        if self.num_train_samples <= 0:
            self._bad(
                "num_train_samples",
                f"must be > 0 (got {self.num_train_samples}); VISSL fills it in from the training "
                "dataset when the key is present in the loss config",
            )
        self.temperature = self._positive("temperature", 0.1)
        self.num_clusters = self._int_list("num_clusters", [3000, 3000, 3000])
        if len(self.num_clusters) == 0 or any(k <= 0 for k in self.num_clusters):
            self._bad("num_clusters", f"must be a non-empty list of positive integers, got {self.num_clusters}")
        if max(self.num_clusters) > self.num_train_samples:
            self._bad(
                "num_clusters",
                f"{max(self.num_clusters)} clusters for {self.num_train_samples} training samples",
            )
        self.embedding_dim = self._positive("embedding_dim", 128, cast=int)
        self.crops_for_mb = self._int_list("crops_for_mb", [0])
        if len(self.crops_for_mb) == 0 or any(c < 0 for c in self.crops_for_mb):
            self._bad("crops_for_mb", f"must be a non-empty list of crop indices >= 0, got {self.crops_for_mb}")
        if len(set(self.crops_for_mb)) != len(self.crops_for_mb):
            self._bad("crops_for_mb", f"has duplicates: {self.crops_for_mb}")
        self.init_memory_pass = bool(self._get("init_memory_pass", True))
        self.init_bank_forward = self._choice("init_bank_forward", INIT_BANK_FORWARDS[0], INIT_BANK_FORWARDS)

    # ------------------------------------------------------------------ task and model
    def check_task(self, task) -> None:
        """The training dataset must have ``num_train_samples`` samples and the train
        transforms at least ``max(crops_for_mb) + 1`` crops."""
        if "train" in getattr(task, "datasets", {}):
            n = len(task.datasets["train"])
            if n != self.num_train_samples:
                self._bad(
                    "num_train_samples",
                    f"is {self.num_train_samples} but the training dataset has {n} samples "
                    "(memory bank / pseudo-label table size mismatch)",
                )
        total = total_num_crops(task.config)
        if total is not None and max(self.crops_for_mb) >= int(total):
            self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {total} crops of the train transforms")

    def check_model(self, model) -> Dict[int, Tuple[str, torch.nn.Linear]]:
        """Check the model's prototype layers (if any) against ``num_clusters`` and
        ``embedding_dim``; returns them as :func:`~vissl_swav_plugin.models.heads.find_prototype_layers`."""
        protos = find_prototype_layers(model)
        if protos and sorted(protos) != list(range(len(self.num_clusters))):
            self._bad(
                "num_clusters",
                f"has {len(self.num_clusters)} entries but the model has prototype layers {sorted(protos)}",
            )
        for h, (name, layer) in protos.items():
            if tuple(layer.weight.shape) != (self.num_clusters[h], self.embedding_dim):
                self._bad(
                    "num_clusters",
                    f"={self.num_clusters} and embedding_dim={self.embedding_dim} expect {name}.weight of shape "
                    f"{(self.num_clusters[h], self.embedding_dim)}, the model has {tuple(layer.weight.shape)}",
                )
        self._prototype_layers = protos
        return protos

    def prototype_layers(self, model) -> Dict[int, Tuple[str, torch.nn.Linear]]:
        """The model's prototype layers ``{h: (name, layer)}``, as found by
        :meth:`check_model` (looked up now if it has not run)."""
        if getattr(self, "_prototype_layers", None) is None:
            self._prototype_layers = find_prototype_layers(model)
        return self._prototype_layers

    # ------------------------------------------------------------------ batches
    def _split_output(self, output):
        """-> (embedding [R, D], list of H score tensors or None)."""
        if isinstance(output, torch.Tensor):
            return output, None
        if not isinstance(output, (list, tuple)) or len(output) == 0:
            raise ValueError(f"{self.name}: unexpected model output of type {type(output)}")
        if len(output) == 1 and isinstance(output[0], (list, tuple)):
            output = output[0]
        if len(output) == 1:
            return output[0], None
        if len(output) != len(self.num_clusters) + 1:
            raise ValueError(
                f"{self.name}: the head returned {len(output) - 1} prototype score tensors but "
                f"LOSS.{self.name}.num_clusters has {len(self.num_clusters)} entries"
            )
        return output[0], list(output[1:])

    @staticmethod
    def _infer_num_crops(ids: torch.Tensor) -> int:
        R = ids.shape[0]
        for nc in range(R, 0, -1):
            if R % nc == 0:
                v = ids.view(nc, -1)
                if bool((v == v[:1]).all()):
                    return nc
        return 1

    def unpack_batch(self, output, ids: torch.Tensor, num_crops: Optional[int]):
        """Split and check a model output against the batch's sample indices.

        Args:
            output: ``[embedding, scores_0, ..., scores_H-1]`` or the embedding alone.
            ids: the dataset index of every output row (crop-major).
            num_crops: crops per image (``None``: inferred from the repeated ids).

        Returns:
            ``(embedding [R, D], scores list or None, ids [R] long, images per batch B)``.
        """
        emb, scores = self._split_output(output)
        ids = ids.to(emb.device).long().view(-1)
        R = emb.shape[0]
        if ids.shape[0] != R:
            raise ValueError(
                f"{self.name}: {ids.shape[0]} sample indices for {R} model outputs (the loss needs the "
                "dataset index of every row: VISSL's data_idx, or DATA.TRAIN.LABEL_TYPE: sample_index)"
            )
        if emb.shape[1] != self.embedding_dim:
            self._bad("embedding_dim", f"is {self.embedding_dim} but the model's embedding has {emb.shape[1]} dims")
        num_crops = num_crops or self._infer_num_crops(ids)
        if R % num_crops != 0:
            raise ValueError(f"{self.name}: {R} output rows are not a multiple of {num_crops} crops")
        B = R // num_crops
        if max(self.crops_for_mb) >= num_crops:
            self._bad("crops_for_mb", f"={self.crops_for_mb} refers to a crop >= the {num_crops} crops of a sample")
        if not getattr(self, "_checked_batch", False):
            v = ids.view(num_crops, B)
            if not bool((v == v[:1]).all()):
                raise ValueError(
                    f"{self.name}: sample indices are not crop-major (crop 0 of all images, then crop 1, ...); "
                    "use COLLATE_FUNCTION multicrop_collator"
                )
            if int(ids.max()) >= self.num_train_samples or int(ids.min()) < 0:
                self._bad(
                    "num_train_samples",
                    f"is {self.num_train_samples} but the batch holds sample index {int(ids.max())}",
                )
            self._checked_batch = True
        return emb, scores, ids, B


def check_clusters_fit_dataset(cfg, loss_name: str) -> None:
    """``LOSS.<loss_name>.num_clusters`` must not exceed the training samples when their
    number is known now (k-means / equipartition over fewer samples than clusters)."""
    n = train_dataset_size(cfg)
    clusters = list(cfg.LOSS[loss_name].get("num_clusters") or [])
    if n is not None and clusters and max(clusters) > n:
        raise ConfigError(
            f"config.LOSS.{loss_name}.num_clusters={clusters} has {max(clusters)} clusters but the "
            f"training set has {n} samples (config.DATA.TRAIN): at most {n} clusters can be non-empty"
        )


@register_launch_check
def check_clusters_of_the_run(cfg) -> None:
    """At launch: a memory-bank clustering loss (a :class:`ClusteringChecksMixin` in Classy
    Vision's loss registry) has no more clusters than training samples."""
    from classy_vision.losses import LOSS_REGISTRY

    cls = LOSS_REGISTRY.get(cfg.LOSS.name)
    if isinstance(cls, type) and issubclass(cls, ClusteringChecksMixin) and cfg.LOSS.name in cfg.LOSS:
        check_clusters_fit_dataset(cfg, cfg.LOSS.name)
