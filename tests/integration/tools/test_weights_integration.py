"""An official-format SwAV checkpoint, imported with swav-plugin-import, runs through VISSL's
kNN benchmark (tools/knn_eval.py: VISSL's launcher and feature extraction, world size 1, in the
test process: ``testkit.vissl_run_state``).

Truths: the features VISSL extracts equal the official model's forward (a torchvision
ResNet-50 with the official names; its stem padding differs only in where the zeros are
added) on the same images, preprocessed here with torchvision; the kNN top-1 equals the
weighted kNN of tests/helpers/reference_swav.py on those features.
"""
import json
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn as nn
import torchvision

from reference_swav import reference_knn
from testkit import folder_data_overrides, load_script, make_image_folder, vissl_run_state

from vissl_swav_plugin.tools import weights as w

MEAN, STD = [0.286] * 3, [0.353] * 3  # the Normalize of benchmark/swav_plugin/knn_fashion_mnist_cpu


def _official_resnet(seed=11):
    torch.manual_seed(seed)
    model = torchvision.models.resnet50()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    model.fc = nn.Identity()
    return model.eval()


def _official_features(model, folder):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(folder), transform=T.Compose([T.Resize(28), T.CenterCrop(28), T.ToTensor(),
                                                       T.Normalize(MEAN, STD)]))
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    with torch.no_grad():
        return model(x).numpy(), np.array(ds.targets)


def test_imported_official_checkpoint_runs_vissl_knn_benchmark(tmp_path):
    from vissl.utils.misc import merge_features

    model = _official_resnet()
    sd = OrderedDict((f"module.{k}", v) for k, v in model.state_dict().items() if not k.startswith("fc."))
    sd["module.projection_head.weight"] = torch.randn(16, 2048)
    sd["module.projection_head.bias"] = torch.zeros(16)
    sd["module.prototypes.weight"] = torch.randn(10, 16)
    torch.save({"epoch": 1, "state_dict": sd}, tmp_path / "official.pth")
    ckpt = tmp_path / "imported.torch"
    assert w.import_main([str(tmp_path / "official.pth"), str(ckpt)]) == 0

    train = make_image_folder(tmp_path / "train", classes=5, per_class=24, size=32, seed=3)
    test = make_image_folder(tmp_path / "test", classes=5, per_class=20, size=32, seed=4)
    out = tmp_path / "knn"
    with vissl_run_state(tmp_path):
        code = load_script("tools/knn_eval.py").main([
            "--topk", "20", "config=benchmark/swav_plugin/knn_fashion_mnist_cpu", "config.MODEL.TRUNK.NAME=resnet",
            "config.MODEL.TRUNK.RESNETS.DEPTH=50", *folder_data_overrides(train, "TRAIN", labels=True),
            *folder_data_overrides(test, "TEST", labels=True), "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ckpt}", f"config.CHECKPOINT.DIR={out}"])
    assert code == 0

    ftr, ytr = _official_features(model, train)
    fte, yte = _official_features(model, test)
    for split, f, y in (("train", ftr, ytr), ("test", fte, yte)):
        got = merge_features(str(out), split, "res5avg")
        order = np.argsort(got["inds"].ravel())
        assert np.array_equal(got["targets"].ravel()[order], y)
        np.testing.assert_allclose(got["features"][order], f, atol=1e-4, rtol=0)
    res = json.loads((out / "knn_results.json").read_text())
    sigma = res["sigma"]
    assert res["res5avg"]["20"]["top1"] == pytest.approx(reference_knn(ftr, ytr, fte, yte, 20, sigma, l2_norm=True)[0],
                                                         abs=0.51)
