"""kNN evaluation of a trunk (random init or from a VISSL checkpoint) on an image folder.

Protocol: trunk ``flatten`` features of the un-augmented images (ToTensor + the
multi-crop transform's ImageNet normalisation); the plugin's shared kNN
(:func:`vissl_swav_plugin.utils.knn.weighted_knn_accuracy`: 20 nearest training images by
cosine, votes ``exp(sim / 0.07)``, Wu et al. 2018 as VISSL's kNN benchmark); top-1.
"""
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def load_folder(root):
    """Images (N x 3 x H x W float, normalised) and labels of an ImageFolder tree."""
    xs, ys = [], []
    for label, d in enumerate(sorted(p for p in Path(root).iterdir() if p.is_dir())):
        for f in sorted(d.iterdir()):
            a = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0
            xs.append(torch.from_numpy(a).permute(2, 0, 1))
            ys.append(label)
    x = torch.stack(xs)
    return (x - MEAN) / STD, torch.tensor(ys)


def build_trunk(config, checkpoint=None, seed=None):
    """VISSL's model for ``config`` (torch seed ``seed``, default SEED_VALUE); trunk weights
    from ``checkpoint`` if given."""
    from vissl.models import build_model

    torch.manual_seed(config.SEED_VALUE if seed is None else seed)
    model = build_model(config.MODEL, config.OPTIMIZER)
    if checkpoint is not None:
        ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
        state = ck["classy_state_dict"]["base_model"]["model"]["trunk"]
        model.trunk.load_state_dict(state, strict=True)
    return model.trunk.eval()


@torch.no_grad()
def features(trunk, x, batch=256):
    out = []
    for i in range(0, x.shape[0], batch):
        f = trunk(x[i : i + batch])
        f = f[0] if isinstance(f, (list, tuple)) else f
        out.append(F.normalize(f.flatten(1), dim=1))
    return torch.cat(out)


def knn_accuracy(config, train_dir, val_dir, checkpoint=None, seed=None):
    trunk = build_trunk(config, checkpoint, seed)
    xtr, ytr = load_folder(train_dir)
    xte, yte = load_folder(val_dir)
    from vissl_swav_plugin.utils.knn import weighted_knn_accuracy

    return weighted_knn_accuracy(features(trunk, xtr), ytr, features(trunk, xte), yte, k=20) / 100.0
