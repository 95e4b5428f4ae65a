"""swav-plugin-export / swav-plugin-import (vissl_swav_plugin.tools.weights).

Truths: torchvision's own ResNet forward (export: the exported state dict in
``torchvision.models.*`` gives VISSL's ``res5avg``), the official SwAV model's forward as
``src/resnet50.py`` computes it (import: zero padding 1 + 7x7 conv with padding 2, the
torchvision blocks, projection MLP -> L2 norm -> prototypes), loaded back through VISSL's
own model building and ``MODEL.WEIGHTS_INIT`` path (``CheckpointLoader`` +
``init_model_from_weights_params_file``) as its benchmarks do.
"""
import argparse
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torchvision
from testkit import compose

from vissl_swav_plugin.tools import feature_eval as fe
from vissl_swav_plugin.tools import weights as w

TOL = 1e-5


def _randomise_bn(model, seed):
    """Non-trivial BN statistics and affine parameters, so eval-mode BN is not the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model


def _vissl_model(overrides, head=None, seed=0):
    from vissl.models import build_model

    config = compose(overrides)
    if head is not None:
        config.MODEL.HEAD.PARAMS = [["swav_plugin_head", head]]
    torch.manual_seed(seed)
    return config, _randomise_bn(build_model(config.MODEL, config.OPTIMIZER), seed).eval()


def _res5avg(trunk, x):
    with torch.no_grad():
        return torch.flatten(trunk(x, ["res5avg"])[0], 1)


# ----------------------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("trunk,tv_ctor,size,naming", [
    ([], torchvision.models.resnet50, 64, "torchvision"),
    ([], torchvision.models.resnet50, 80, "timm"),
    (["config.MODEL.TRUNK.RESNETS.GROUPS=32", "config.MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP=4"],
     torchvision.models.resnext50_32x4d, 72, "torchvision"),
])
def test_export_gives_torchvision_model_with_vissl_features(tmp_path, trunk, tv_ctor, size, naming):
    config, model = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet"] + trunk, seed=1)
    # the checkpoint as VISSL's checkpoint hook writes it: task.get_classy_state() holds the model's
    ckpt = {"classy_state_dict": {"base_model": model.get_classy_state()}, "phase_idx": 3}
    torch.save(ckpt, tmp_path / "model_final_checkpoint_phase3.torch")
    out = tmp_path / "tv.pth"
    assert w.export_main([str(tmp_path / "model_final_checkpoint_phase3.torch"), str(out), "--naming", naming]) == 0

    state = torch.load(out, weights_only=True)
    tv = tv_ctor()
    tv.fc = nn.Identity()
    tv.load_state_dict(state, strict=True)
    tv.eval()
    x = torch.randn(2, 3, size, size + 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = tv(x)
    want = _res5avg(model.trunk, x)
    assert got.shape == want.shape == (2, 2048)
    assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()


def _official_forward(sd, x, eps=1e-5):
    """res5avg of a state dict with the official SwAV ResNet's names, computed as its
    src/resnet50.py does (any width): zero pad 1, 7x7/2 conv with padding 2, BN, ReLU, 3x3/2
    max-pool, bottlenecks (stride in the 3x3 conv), global average pool."""
    import torch.nn.functional as F

    def bn(t, p):
        return F.batch_norm(t, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"],
                            sd[f"{p}.bias"], False, 0.0, eps)

    x = F.conv2d(F.pad(x, (1, 1, 1, 1)), sd["conv1.weight"], stride=2, padding=2)
    x = F.max_pool2d(F.relu(bn(x, "bn1")), 3, 2, 1)
    for i in (1, 2, 3, 4):
        b = 0
        while f"layer{i}.{b}.conv1.weight" in sd:
            p, stride = f"layer{i}.{b}", 2 if (i > 1 and b == 0) else 1
            w2 = sd[f"{p}.conv2.weight"]
            out = F.relu(bn(F.conv2d(x, sd[f"{p}.conv1.weight"]), f"{p}.bn1"))
            out = F.relu(bn(F.conv2d(out, w2, stride=stride, padding=1, groups=w2.shape[0] // w2.shape[1]), f"{p}.bn2"))
            out = bn(F.conv2d(out, sd[f"{p}.conv3.weight"]), f"{p}.bn3")
            if f"{p}.downsample.0.weight" in sd:
                x = bn(F.conv2d(x, sd[f"{p}.downsample.0.weight"], stride=stride), f"{p}.downsample.1")
            x, b = F.relu(out + x), b + 1
    return x.mean(dim=(2, 3))


def test_export_of_a_wide_trunk_gives_the_official_swav_rn50w2(tmp_path, capsys):
    """RN50w2 has no torchvision twin: its export computes what the official resnet50w2 does."""
    _, model = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet", "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=2"],
                            seed=6)
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, tmp_path / "w2.torch")
    del model.heads
    assert w.export_main([str(tmp_path / "w2.torch"), str(tmp_path / "w2.pth")]) == 0
    assert "resnet50w2()" in capsys.readouterr().out
    state = torch.load(tmp_path / "w2.pth", weights_only=True)
    assert state["conv1.weight"].shape[0] == 128 and state["layer4.2.conv3.weight"].shape[0] == 4096
    x = torch.randn(2, 3, 48, 56, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = _official_forward(state, x)
    want = _res5avg(model.trunk, x)
    assert got.shape == want.shape == (2, 4096)
    assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()


def test_export_then_import_gives_back_the_vissl_trunk(tmp_path, capsys):
    """The round trip VISSL -> torchvision names -> VISSL keeps every trunk tensor and feature."""
    from vissl.utils.checkpoint import init_model_from_consolidated_weights

    _, model = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet"], seed=8)
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, tmp_path / "a.torch")
    assert w.main(["export", str(tmp_path / "a.torch"), str(tmp_path / "tv.pth")]) == 0
    assert w.main(["import", str(tmp_path / "tv.pth"), str(tmp_path / "back.torch")]) == 0
    assert "the trunk only" in capsys.readouterr().out
    config, other = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet"], seed=9)
    init_model_from_consolidated_weights(config, other, torch.load(tmp_path / "back.torch", weights_only=True),
                                         "classy_state_dict", ["num_batches_tracked"])
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_res5avg(other.trunk, x), _res5avg(model.trunk, x), atol=TOL, rtol=0)
    a, b = model.trunk.state_dict(), other.trunk.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if not k.endswith("num_batches_tracked"))


def test_export_names_the_constructor_and_refuses_other_trunks(tmp_path, capsys):
    tv = torchvision.models.resnet101().state_dict()
    info = w.describe_trunk(OrderedDict((k, v) for k, v in tv.items() if not k.startswith("fc.")))
    assert info["target"] == "torchvision.models.resnet101()" and info["width"] == 1
    wide = torchvision.models.wide_resnet50_2().state_dict()
    assert w.describe_trunk(wide)["target"] == "torchvision.models.wide_resnet50_2()"
    # a BasicBlock ResNet with a 3x3 stem (the plugin's small trunk) has no torchvision twin
    small = torchvision.models.resnet18().state_dict()
    small["conv1.weight"] = torch.zeros(64, 3, 3, 3)
    torch.save({"model": small}, tmp_path / "small.torch")
    assert w.export_main([str(tmp_path / "small.torch"), str(tmp_path / "o.pth")]) == 2
    err = capsys.readouterr().err
    assert "small.torch" in err
    assert "not a torchvision-layout ResNet" in err and not (tmp_path / "o.pth").exists()


# ----------------------------------------------------------------------------------------
# import
# ----------------------------------------------------------------------------------------
class OfficialSwAV(nn.Module):
    """The official code's ResNet-50 (src/resnet50.py) with its parameter names: a zero
    padding of 1 then a 7x7 conv with padding 2; projection head; prototypes."""

    def __init__(self, hidden_mlp, output_dim, nmb_prototypes):
        super().__init__()
        base = torchvision.models.resnet50()
        self.padding = nn.ConstantPad2d(1, 0.0)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=2, bias=False)
        self.bn1, self.relu, self.maxpool = base.bn1, base.relu, base.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = base.layer1, base.layer2, base.layer3, base.layer4
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        if hidden_mlp == 0:
            self.projection_head = nn.Linear(2048, output_dim)
        else:
            self.projection_head = nn.Sequential(nn.Linear(2048, hidden_mlp), nn.BatchNorm1d(hidden_mlp),
                                                 nn.ReLU(inplace=True), nn.Linear(hidden_mlp, output_dim))
        if isinstance(nmb_prototypes, list):
            self.prototypes = nn.Module()
            for i, k in enumerate(nmb_prototypes):
                self.prototypes.add_module(f"prototypes{i}", nn.Linear(output_dim, k, bias=False))
            self._protos = [getattr(self.prototypes, f"prototypes{i}") for i in range(len(nmb_prototypes))]
        else:
            self.prototypes = nn.Linear(output_dim, nmb_prototypes, bias=False)
            self._protos = [self.prototypes]

    def forward_backbone(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.padding(x)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x):
        feats = self.forward_backbone(x)
        z = nn.functional.normalize(self.projection_head(feats), dim=1, p=2)
        return feats, z, [p(z) for p in self._protos]


def _official_file(path, hidden, dim, protos, wrapped=True, seed=2):
    torch.manual_seed(seed)
    official = _randomise_bn(OfficialSwAV(hidden, dim, protos), seed).eval()
    sd = OrderedDict((f"module.{k}", v) for k, v in official.state_dict().items())
    opt = torch.optim.SGD(official.parameters(), lr=0.1, momentum=0.9)
    # main_swav.py's checkpoint, or the released file (the state dict alone)
    torch.save({"epoch": 5, "state_dict": sd, "optimizer": opt.state_dict()} if wrapped else sd, path)
    return official


@pytest.mark.parametrize("hidden,dim,protos,wrapped", [
    (64, 16, 30, True),          # main_swav.py: 2-layer MLP, one prototype set
    (0, 24, [7, 11], False),     # a released-style state dict: linear projection, two prototype sets
])
def test_import_official_checkpoint_loads_through_vissl_weights_init(tmp_path, hidden, dim, protos, wrapped, capsys):
    from vissl.utils.checkpoint import CheckpointLoader

    official = _official_file(tmp_path / "swav_official.pth.tar", hidden, dim, protos, wrapped)
    out = tmp_path / "imported.torch"
    assert w.import_main([str(tmp_path / "swav_official.pth.tar"), str(out)]) == 0
    printed = capsys.readouterr().out
    head = w._head_settings(torch.load(out, weights_only=True)["classy_state_dict"]["base_model"]["model"]["heads"])
    assert head == {"dims": [2048] + ([hidden] if hidden else []) + [dim], "use_bn": bool(hidden),
                    "num_clusters": protos if isinstance(protos, list) else [protos]}
    assert "WEIGHTS_INIT.PARAMS_FILE" in printed and "DEPTH=50" in printed

    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        feats, z, scores = official(x)

    # 1. the pre-training config (trunk + SwAV head), as VISSL's WEIGHTS_INIT loads it
    config, model = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet"], head=head, seed=3)
    assert not torch.allclose(_res5avg(model.trunk, x), feats, atol=1e-2)  # a different init before
    # VISSL's engine path for MODEL.WEIGHTS_INIT.PARAMS_FILE (train_task._build_model): its reader
    # (with the plugin's checksum check of the file the import wrote) and the model's init
    ckpt = CheckpointLoader.load_and_broadcast_init_weights(str(out), torch.device("cpu"))
    model.init_model_from_weights_params_file(config, ckpt)
    assert torch.allclose(_res5avg(model.trunk, x), feats, atol=TOL, rtol=0)
    with torch.no_grad():
        got = model.heads[0](_res5avg(model.trunk, x))
    assert torch.allclose(got[0], z, atol=TOL, rtol=0)
    assert len(got) - 1 == len(scores) and all(torch.allclose(a, b, atol=TOL, rtol=0) for a, b in zip(got[1:], scores))

    # 2. swav-plugin-eval's strict load of trunk and heads
    _, model2 = _vissl_model(["config=pretrain/swav/swav_1gpu_resnet"], head=head, seed=4)
    fe.load_checkpoint(model2, out)
    assert torch.allclose(_res5avg(model2.trunk, x), feats, atol=TOL, rtol=0)

    # 3. VISSL's linear benchmark (feature-extractor model, heads not loaded)
    config, bench = _vissl_model(
        ["config=benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear"], seed=5)
    bench.init_model_from_weights_params_file(config, ckpt)
    assert torch.allclose(_res5avg(bench.trunk.base_model, x), feats, atol=TOL, rtol=0)


def test_import_refuses_unknown_keys_and_vissl_files(tmp_path, capsys):
    sd = OrderedDict((f"module.{k}", v) for k, v in torchvision.models.resnet50().state_dict().items())
    sd["module.extra_head.weight"] = torch.zeros(3)
    torch.save({"state_dict": sd}, tmp_path / "odd.pth")
    assert w.import_main([str(tmp_path / "odd.pth"), str(tmp_path / "o.torch")]) == 2
    err = capsys.readouterr().err
    assert "odd.pth" in err and "module.extra_head.weight" in err
    torch.save({"classy_state_dict": {}}, tmp_path / "vissl.torch")
    assert w.import_main([str(tmp_path / "vissl.torch"), str(tmp_path / "o.torch")]) == 2
    assert "already a VISSL checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "o.torch").exists()


# ----------------------------------------------------------------------------------------
# a checkpoint must not run code
# ----------------------------------------------------------------------------------------
class _RunsCode:
    """Unpickling this calls Path.touch(marker): code run by reading the file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("payload", ["code", "namespace"])
@pytest.mark.parametrize("tool", ["export", "import"])
def test_a_file_that_needs_more_than_weights_is_refused_and_runs_nothing(tmp_path, capsys, payload, tool):
    marker = tmp_path / "code_ran"
    extra = _RunsCode(marker) if payload == "code" else argparse.Namespace(arch="resnet50", lr=0.6)
    sd = OrderedDict((f"module.{k}", v) for k, v in torchvision.models.resnet50().state_dict().items())
    path = tmp_path / "from_the_internet.pth.tar"
    torch.save({"state_dict": sd, "args": extra}, path)
    main = w.export_main if tool == "export" else w.import_main
    assert main([str(path), str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "refusing to load" in err and "weights_only=True" in err
    assert not marker.exists() and not (tmp_path / "out.pth").exists()
    with pytest.raises(w.WeightsError, match="not found: .*missing.pth"):
        w.safe_load(tmp_path / "missing.pth")


@pytest.mark.parametrize("tool", ["export", "import"])
def test_a_damaged_file_without_checksum_is_refused_naming_the_record(tmp_path, capsys, tool):
    """Bytes overwritten inside a tensor record of a file copied without its .sha256: torch.load
    would read the wrong numbers without a word; the zip's CRC-32 (Python's zipfile, the
    independent truth) names the record, and no output is written."""
    import zipfile

    sd = OrderedDict((f"module.{k}", v) for k, v in torchvision.models.resnet18().state_dict().items())
    path = tmp_path / "copied_alone.pth.tar"
    torch.save({"state_dict": sd}, path)
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    data[at:at + 8] = b"\x00\x11\x22\x33\x44\x55\x66\x77"
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as zf:
        record = zf.testzip()
    assert record is not None
    main = w.export_main if tool == "export" else w.import_main
    assert main([str(path), str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and f"record {record} fails the CRC-32" in err
    assert not (tmp_path / "out.pth").exists()
