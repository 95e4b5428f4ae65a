"""Helpers for tests/unit/compat/test_compat.py and tests/unit/compat/test_host_regression.py (plain module, not a package).

Configs are written under ``<run dir>/configs/config/compat_test/`` and selected with
``config=compat_test/<name>``: VISSL's Hydra plugin searches ``./configs`` of the working
directory, so every run gets its own small, self-contained config built only from stock
VISSL components (``resnet`` trunk, ``swav_head``, ``swav_loss``, ``multicrop_collator``,
``eval_mlp``, ...).
"""
import os
import sys
from pathlib import Path

TINY_SWAV = """\
# @package _global_
config:
  VERBOSE: False
  LOG_FREQUENCY: 1
  TEST_MODEL: False
  SEED_VALUE: 0
  MULTI_PROCESSING_METHOD: forkserver
  HOOKS:
    PERF_STATS:
      MONITOR_PERF_STATS: False
  DATA:
    NUM_DATALOADER_WORKERS: 1  # forkserver data-loader workers (MULTI_PROCESSING_METHOD)
    TRAIN:
      DATA_SOURCES: [synthetic]
      DATASET_NAMES: [synthetic]
      BATCHSIZE_PER_REPLICA: 4
      LABEL_TYPE: sample_index
      DEFAULT_GRAY_IMG_SIZE: 32
      RANDOM_SYNTHETIC_IMAGES: True
      TRANSFORMS:
        - name: ImgPilToMultiCrop
          total_num_crops: 3
          size_crops: [32, 16]
          num_crops: [2, 1]
          crop_scales: [[0.5, 1], [0.2, 0.5]]
        # at magnitude 10, "PosterizeIncreasing" keeps 0 bits: Pillow 13 raises unless the
        # compat layer is active in the data-loader workers (15 draws per crop, p=0.5 each)
        - name: RandAugment
          magnitude: 10
          magnitude_std: 0
          num_layers: 15
          increasing_severity: True
        - name: ToTensor
      COLLATE_FUNCTION: multicrop_collator
      DATA_LIMIT: 16
      DROP_LAST: True
  TRAINER:
    TRAIN_STEP_NAME: standard_train_step
  METERS:
    name: ""
  MODEL:
    TRUNK:
      NAME: resnet
      RESNETS:
        DEPTH: 50
    HEAD:
      PARAMS: [["swav_head", {"dims": [2048, 32], "use_bn": False, "num_clusters": [10]}]]
    SYNC_BN_CONFIG:
      CONVERT_BN_TO_SYNC_BN: True
      SYNC_BN_TYPE: pytorch
    AMP_PARAMS:
      USE_AMP: True
      AMP_TYPE: pytorch
  LOSS:
    name: swav_loss
    swav_loss:
      temperature: 0.1
      use_double_precision: False
      normalize_last_layer: True
      num_iters: 3
      epsilon: 0.05
      crops_for_assign: [0, 1]
      queue:
        queue_length: 0
        start_iter: 0
  OPTIMIZER:
    name: sgd
    use_larc: True
    larc_config: {clip: False, trust_coefficient: 0.001, eps: 0.00000001}
    weight_decay: 0.000001
    momentum: 0.9
    num_epochs: 1
    param_schedulers:
      lr:
        name: constant
        value: 0.0001
        update_interval: step
  DISTRIBUTED:
    BACKEND: gloo
    NUM_NODES: 1
    NUM_PROC_PER_NODE: 2
    INIT_METHOD: tcp
    RUN_ID: auto
  MACHINE:
    DEVICE: cpu
  CHECKPOINT:
    DIR: "."
    AUTO_RESUME: False
    CHECKPOINT_FREQUENCY: 1
"""

# Feature extraction of the trunk's pooled res5 output (2048-d), as VISSL's kNN benchmark
# configs do; DATA paths and PARAMS_FILE come as overrides.
TINY_EXTRACT = """\
# @package _global_
config:
  LOG_FREQUENCY: 1
  TEST_MODEL: True
  SEED_VALUE: 0
  MULTI_PROCESSING_METHOD: spawn
  DATA:
    NUM_DATALOADER_WORKERS: 0
    TRAIN:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [compat_test_train]
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS:
        - name: ToTensor
    TEST:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [compat_test_test]
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS:
        - name: ToTensor
  MODEL:
    FEATURE_EVAL_SETTINGS:
      EVAL_MODE_ON: True
      FREEZE_TRUNK_ONLY: True
      EXTRACT_TRUNK_FEATURES_ONLY: True
      SHOULD_FLATTEN_FEATS: True
      LINEAR_EVAL_FEAT_POOL_OPS_MAP: [["res5avg", ["Identity", []]]]
    TRUNK:
      NAME: resnet
      RESNETS:
        DEPTH: 50
    WEIGHTS_INIT:
      PARAMS_FILE: ""
      STATE_DICT_KEY_NAME: classy_state_dict
  NEAREST_NEIGHBOR:
    SIGMA: 0.1
    TOPK: 5
    L2_NORM_FEATS: True
  DISTRIBUTED:
    BACKEND: gloo
    NUM_NODES: 1
    NUM_PROC_PER_NODE: 2
    INIT_METHOD: tcp
    RUN_ID: auto
  MACHINE:
    DEVICE: cpu
  CHECKPOINT:
    DIR: "."
"""

# VISSL's linear evaluation (frozen trunk, eval_mlp head on pooled res5) from a weights file.
TINY_LINEAR = """\
# @package _global_
config:
  LOG_FREQUENCY: 1
  TEST_MODEL: True
  SEED_VALUE: 1
  MULTI_PROCESSING_METHOD: forkserver
  HOOKS:
    PERF_STATS:
      MONITOR_PERF_STATS: False
  DATA:
    NUM_DATALOADER_WORKERS: 0
    TRAIN:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [compat_test_train]
      BATCHSIZE_PER_REPLICA: 8
      TRANSFORMS:
        - name: RandomHorizontalFlip
        - name: ToTensor
    TEST:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [compat_test_test]
      BATCHSIZE_PER_REPLICA: 8
      TRANSFORMS:
        - name: ToTensor
  METERS:
    name: accuracy_list_meter
    accuracy_list_meter:
      num_meters: 1
      topk_values: [1]
  TRAINER:
    TRAIN_STEP_NAME: standard_train_step
  MODEL:
    FEATURE_EVAL_SETTINGS:
      EVAL_MODE_ON: True
      FREEZE_TRUNK_ONLY: True
      SHOULD_FLATTEN_FEATS: False
      LINEAR_EVAL_FEAT_POOL_OPS_MAP: [["res5avg", ["Identity", []]]]
    TRUNK:
      NAME: resnet
      RESNETS:
        DEPTH: 50
    HEAD:
      PARAMS: [["eval_mlp", {"in_channels": 2048, "dims": [2048, 2]}]]
    WEIGHTS_INIT:
      PARAMS_FILE: ""
      STATE_DICT_KEY_NAME: classy_state_dict
  LOSS:
    name: cross_entropy_multiple_output_single_target
    cross_entropy_multiple_output_single_target:
      ignore_index: -1
  OPTIMIZER:
    name: sgd
    weight_decay: 0.0005
    momentum: 0.9
    num_epochs: 2
    nesterov: True
    param_schedulers:
      lr:
        name: multistep
        values: [0.01, 0.001]
        milestones: [1]
        update_interval: epoch
  DISTRIBUTED:
    BACKEND: gloo
    NUM_NODES: 1
    NUM_PROC_PER_NODE: 1
    INIT_METHOD: tcp
    RUN_ID: auto
  MACHINE:
    DEVICE: cpu
  CHECKPOINT:
    DIR: "."
    AUTO_RESUME: True
    CHECKPOINT_FREQUENCY: 1
"""

# VISSL's extract_cluster engine (SwAV prototype assignment of every image).
TINY_CLUSTER = """\
# @package _global_
engine_name: extract_cluster
config:
  TEST_MODEL: False
  SEED_VALUE: 0
  DATA:
    NUM_DATALOADER_WORKERS: 0
    TRAIN:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [compat_test_train]
      BATCHSIZE_PER_REPLICA: 4
      TRANSFORMS:
        - name: ToTensor
  MODEL:
    FEATURE_EVAL_SETTINGS:
      EVAL_MODE_ON: True
      FREEZE_TRUNK_AND_HEAD: True
      EVAL_TRUNK_AND_HEAD: True
    TRUNK:
      NAME: resnet
      RESNETS:
        DEPTH: 50
    HEAD:
      PARAMS: [["swav_head", {"dims": [2048, 32], "use_bn": False, "num_clusters": [10]}]]
    WEIGHTS_INIT:
      PARAMS_FILE: ""
      STATE_DICT_KEY_NAME: classy_state_dict
  DISTRIBUTED:
    BACKEND: gloo
    NUM_NODES: 1
    NUM_PROC_PER_NODE: 2
    INIT_METHOD: tcp
    RUN_ID: auto
  MACHINE:
    DEVICE: cpu
  CHECKPOINT:
    DIR: "."
"""

CONFIGS = {"tiny_swav": TINY_SWAV, "tiny_extract": TINY_EXTRACT, "tiny_linear": TINY_LINEAR,
           "tiny_cluster": TINY_CLUSTER}


def write_configs(root):
    """Write the configs above under root/configs/config/compat_test/; returns root."""
    root = Path(root)
    d = root / "configs" / "config" / "compat_test"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in CONFIGS.items():
        (d / f"{name}.yaml").write_text(text)
    return root


def data_overrides(train_dir, test_dir):
    out = []
    for split, path in (("TRAIN", train_dir), ("TEST", test_dir)):
        out += [f"config.DATA.{split}.DATA_PATHS=[{path}]", f"config.DATA.{split}.LABEL_PATHS=[{path}]"]
    return out


def build_pretrain_model(seed=0):
    """A stock VISSL ResNet-50 + swav_head model, as built by VISSL from TINY_SWAV."""
    import torch
    from vissl.config import AttrDict
    from vissl.models import build_model
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    cfg = compose_hydra_configuration(["config=test/integration_test/quick_swav"])
    _, config = convert_to_attrdict(cfg, dump_config=False)
    config.MODEL.HEAD.PARAMS = [["swav_head", AttrDict({"dims": [2048, 32], "use_bn": False, "num_clusters": [10]})]]
    torch.manual_seed(seed)
    return build_model(config.MODEL, config.OPTIMIZER)


def save_weights_file(model, path):
    """A weights file in VISSL's checkpoint layout (what MODEL.WEIGHTS_INIT.PARAMS_FILE reads)."""
    import torch

    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, str(path))
    return path


def load_images(folder):
    """Images of a disk_folder dataset in VISSL's order (torchvision ImageFolder), as tensors."""
    import torch
    import torchvision

    ds = torchvision.datasets.ImageFolder(str(folder))
    to_tensor = torchvision.transforms.ToTensor()
    x = torch.stack([to_tensor(ds[i][0]) for i in range(len(ds))])
    y = torch.tensor([ds[i][1] for i in range(len(ds))])
    return x, y


from reference_swav import reference_knn  # noqa: E402,F401  (H.reference_knn: one copy, in tests/helpers/reference_swav.py)


def voc_ap(targets, scores):
    """VOC07-style average precision (area under the monotone precision envelope),
    written from the definition: targets in {1: positive, 0/-1: negative}."""
    import numpy as np

    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    pos = (np.asarray(targets)[order] > 0).astype(np.float64)
    tp, fp = np.cumsum(pos), np.cumsum(1 - pos)
    recall = tp / pos.sum()
    precision = tp / (tp + fp)
    ap, prev_r = 0.0, 0.0
    for i in range(len(recall)):
        if recall[i] > prev_r:
            ap += (recall[i] - prev_r) * precision[i:].max()
            prev_r = recall[i]
    return ap


# ------------------------------------------------------------------------------------------
# Worker for the 2-process (gloo, spawn) compat test: spawned children import this module,
# which imports vissl, which (through the installed .pth) applies the compat layer.
# ------------------------------------------------------------------------------------------
def two_process_worker(rank, world_size, init_file, out_dir):
    import pickle

    import numpy as np
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        import vissl  # noqa: F401  (applies the compat layer in this fresh process)
        import vissl_swav_plugin
        from vissl_swav_plugin import compat

        result = {"registered": vissl_swav_plugin.is_registered(), "applied": compat.applied()}

        # -- DeepCluster-v2 memory + distributed k-means on CPU (VISSL's own loss) --------
        from vissl.config import AttrDict
        from vissl.losses.deepclusterv2_loss import DeepClusterV2Loss

        n_total, bs, dim = 16, 4, 8
        cfg = AttrDict({
            "num_train_samples": n_total, "DROP_LAST": False, "BATCHSIZE_PER_REPLICA": bs,
            "num_crops": 2, "temperature": 0.1, "num_clusters": [3, 4], "kmeans_iters": 5,
            "memory_params": {"crops_for_mb": [0], "embedding_dim": dim},
        })
        loss = DeepClusterV2Loss(cfg)
        gen = torch.Generator().manual_seed(123)
        all_emb = torch.randn(n_total, dim, generator=gen)  # "model output" of image i, crop 0
        my_idx = torch.arange(rank, n_total, world_size)  # this rank's share of the dataset
        batches = []
        for s in range(0, len(my_idx), bs):
            idx = my_idx[s:s + bs]
            crop0 = all_emb[idx]
            crop1 = torch.zeros_like(crop0)
            batches.append({"data_idx": [torch.cat([idx, idx])], "data": [[crop0, crop1]]})

        def model(x):
            return [x.clone()]

        torch.manual_seed(7)
        loss.init_memory(batches, model)
        loss.cluster_memory()
        result["dc_assignments"] = loss.assignments.clone()
        result["dc_centroids"] = [getattr(loss, f"centroids{i}").clone() for i in range(2)]
        result["dc_embeddings"] = torch.nn.functional.normalize(all_emb, dim=1, p=2)

        # -- checkpoint broadcast of a non-tensor object (an AttrDict, as in configs) ------
        from classy_vision.generic import distributed_util as du

        obj = {"cfg": AttrDict({"a": {"b": 1}}), "t": torch.arange(5), "n": np.arange(3)} if rank == 0 else None
        got = du.broadcast_object(obj)
        result["broadcast"] = (dict(got["cfg"]), got["t"].tolist(), got["n"].tolist(), type(got["cfg"]).__name__)
        with compat.disabled("shim_fast_broadcast_object"):
            try:
                du.broadcast_object(obj)
                result["broadcast_original"] = "ok"
            except Exception as e:  # the receiver's torch.load(weights_only=True) refuses
                result["broadcast_original"] = f"{type(e).__name__}: {e}"[:300]
        dist.barrier()
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def run_two_process_worker(out_dir):
    """Spawn two_process_worker in 2 fresh ('spawn') processes; returns their results."""
    import pickle

    import torch.multiprocessing as mp

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    init_file = Path(out_dir) / "pg_init"
    mp.start_processes(two_process_worker, args=(2, str(init_file), str(out_dir)), nprocs=2,
                       join=True, start_method="spawn")
    return [pickle.load(open(Path(out_dir) / f"rank{r}.pkl", "rb")) for r in range(2)]
