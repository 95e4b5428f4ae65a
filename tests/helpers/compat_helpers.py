"""Helpers of the compat and host-regression tests (tests/unit/compat/test_compat.py,
tests/unit/compat/test_host_regression.py and their integration parts; a plain module, not a package).

The integration tests' configs are the files of ``tests/integration/compat/compat_test/``, copied
to ``<run dir>/configs/config/compat_test/`` and selected with ``config=compat_test/<name>``:
VISSL's Hydra plugin searches ``./configs`` of the working directory, so every run gets its own
small, self-contained config built only from stock VISSL components (``resnet`` trunk,
``swav_head``, ``swav_loss``, ``multicrop_collator``, ``eval_mlp``, ...).
"""
import shutil
from pathlib import Path

from reference_swav import reference_knn  # noqa: F401  (H.reference_knn: one copy, in tests/helpers/reference_swav.py)

CONFIGS = Path(__file__).resolve().parents[1] / "integration" / "compat" / "compat_test"


def write_configs(root):
    """Copy the configs of CONFIGS to root/configs/config/compat_test/; returns root."""
    root = Path(root)
    shutil.copytree(CONFIGS, root / "configs" / "config" / "compat_test", dirs_exist_ok=True)
    return root


def data_overrides(train_dir, test_dir):
    out = []
    for split, path in (("TRAIN", train_dir), ("TEST", test_dir)):
        out += [f"config.DATA.{split}.DATA_PATHS=[{path}]", f"config.DATA.{split}.LABEL_PATHS=[{path}]"]
    return out


def build_pretrain_model(seed=0):
    """A stock VISSL ResNet-50 + swav_head model, as VISSL builds it from compat_test/tiny_swav.yaml."""
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
