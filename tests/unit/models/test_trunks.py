"""resnet_small_plugin: registration, shapes, parameter layout vs torchvision's ResNets,
VISSL model building (trunk + heads), feature extraction by key, config errors.
(2-process training with this trunk: tests/integration/tools/test_launch_paths_integration.py.)"""
import pytest
import torch
import torch.nn as nn
import torchvision

import vissl  # noqa: F401  (registers the plugin)
from autocast_emulator import AMP_MODES
from testkit import compose
from vissl.config import AttrDict
from vissl.models import build_model
from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, get_model_trunk
from vissl_swav_plugin.models.trunks import ResNetSmallPlugin, TrunkConfigError


def model_cfg(**params):
    return AttrDict({"TRUNK": {"NAME": "resnet_small_plugin", "RESNET_SMALL_PLUGIN": params},
                     "INPUT_TYPE": "rgb"})


def test_registered_with_vissl():
    assert MODEL_TRUNKS_REGISTRY["resnet_small_plugin"] is ResNetSmallPlugin
    assert get_model_trunk("resnet_small_plugin") is ResNetSmallPlugin


@pytest.mark.parametrize("size, res5", [(28, 4), (32, 4), (64, 8)])
def test_small_stem_shapes(size, res5):
    t = ResNetSmallPlugin(model_cfg(DEPTH=10, WIDTH=8)).eval()
    x = torch.randn(2, 3, size, size)
    keys = ["conv1", "res1", "res2", "res3", "res4", "res5", "res5avg", "flatten"]
    shapes = [tuple(f.shape) for f in t(x, keys)]
    half = (size + 1) // 2
    quarter = (half + 1) // 2
    assert shapes == [(2, 8, size, size), (2, 8, size, size), (2, 8, size, size), (2, 16, half, half),
                      (2, 32, quarter, quarter), (2, 64, res5, res5), (2, 64, 1, 1), (2, 64)]
    assert [tuple(f.shape) for f in t(x)] == [(2, 64)]  # default: last block


def test_imagenet_stem_option():
    t = ResNetSmallPlugin(model_cfg(DEPTH=10, WIDTH=8, STEM="imagenet")).eval()
    assert [tuple(f.shape) for f in t(torch.randn(1, 3, 64, 64), ["res1", "res5"])] == [(1, 8, 16, 16), (1, 64, 2, 2)]


@pytest.mark.parametrize("depth, tv", [(18, torchvision.models.resnet18), (34, torchvision.models.resnet34)])
def test_same_blocks_and_parameter_names_as_torchvision(depth, tv):
    """Width 64 = torchvision's ResNet-18/34 except the stem (3x3 vs 7x7 conv) and fc:
    same parameter names (after dropping '_feature_blocks.') and shapes -- what VISSL's
    checkpoint converters (torchvision / detectron2 naming) rely on."""
    ours = {k.replace("_feature_blocks.", ""): v.shape
            for k, v in ResNetSmallPlugin(model_cfg(DEPTH=depth)).state_dict().items()}
    ref = {k: v.shape for k, v in tv().state_dict().items() if not k.startswith("fc.")}
    assert ours.keys() == ref.keys()
    diff = {k for k in ref if ours[k] != ref[k]}
    assert diff == {"conv1.weight"} and ours["conv1.weight"] == (64, 3, 3, 3)


def test_requested_order_duplicates_and_raw_names():
    t = ResNetSmallPlugin(model_cfg(DEPTH=10, WIDTH=4)).eval()
    x = torch.randn(2, 3, 16, 16)
    a = t(x, ["flatten", "res2", "res5avg", "layer1"])
    b = t(x, ["res2", "res5avg", "flatten"])
    assert torch.equal(a[0], b[2]) and torch.equal(a[1], b[0]) and torch.equal(a[2], b[1])
    assert torch.equal(a[3], b[0])  # raw block name == VISSL name
    assert torch.equal(a[2].flatten(1), a[0])
    with pytest.raises(ValueError, match="unknown feature key"):
        t(x, ["res6"])


@pytest.mark.parametrize(
    "params, key",
    [
        (dict(DEPTH=50), "DEPTH"),
        (dict(WIDTH=0), "WIDTH"),
        (dict(STEM="big"), "STEM"),
        (dict(NORM="LayerNorm"), "NORM"),
        (dict(LAYERS=[1, 1, 1]), "LAYERS"),
        (dict(NORM="GroupNorm", WIDTH=12, GROUPNORM_GROUPS=8), "GROUPNORM_GROUPS"),
        (dict(WIDHT=8), "WIDHT"),
        (dict(CHANNELS_LAST="yes"), "CHANNELS_LAST"),
        (dict(ZERO_INIT_RESIDUAL=1), "ZERO_INIT_RESIDUAL"),
    ],
)
def test_config_errors_name_the_key(params, key):
    with pytest.raises(TrunkConfigError, match=key):
        ResNetSmallPlugin(model_cfg(**params))


@pytest.mark.parametrize("norm", ["BatchNorm", "GroupNorm"])
def test_channels_last_is_the_same_network(norm):
    """CHANNELS_LAST changes the memory format only: from the same initialisation, the
    features, the loss's gradients and one SGD step equal the NCHW trunk's (fp32 rounding),
    the weights and activations are NHWC, and a state dict moves both ways."""
    params = dict(DEPTH=10, WIDTH=8, NORM=norm, GROUPNORM_GROUPS=4)
    torch.manual_seed(0)
    ref = ResNetSmallPlugin(model_cfg(**params))
    torch.manual_seed(0)
    cl = ResNetSmallPlugin(model_cfg(CHANNELS_LAST=True, **params))
    conv = cl._feature_blocks["conv1"].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert not ref._feature_blocks["conv1"].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(6, 3, 20, 20)  # a plain NCHW batch, as VISSL's collator gives
    outs = []
    for net in (ref, cl):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        res3, feat = net(x, ["res3", "flatten"])
        feat.pow(2).mean().backward()
        opt.step()
        outs.append((res3, feat, {n: p.grad.clone() for n, p in net.named_parameters()},
                     {n: p.detach().clone() for n, p in net.named_parameters()}))
    (r3a, fa, ga, pa), (r3b, fb, gb, pb) = outs
    assert r3b.is_contiguous(memory_format=torch.channels_last) and not r3a.is_contiguous(
        memory_format=torch.channels_last)
    torch.testing.assert_close(fb, fa, rtol=1e-4, atol=1e-5)
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-3, atol=1e-5, msg=f"grad of {n}")
        torch.testing.assert_close(pb[n], pa[n], rtol=1e-4, atol=1e-5, msg=f"SGD step of {n}")  # lr x grad error
    # checkpoints move between the two layouts (load_state_dict copies into either format)
    back = ResNetSmallPlugin(model_cfg(**params))
    back.load_state_dict(cl.state_dict())
    fwd = ResNetSmallPlugin(model_cfg(CHANNELS_LAST=True, **params))
    fwd.load_state_dict(ref.state_dict())
    assert fwd._feature_blocks["conv1"].weight.is_contiguous(memory_format=torch.channels_last)
    ref.eval(), cl.eval(), back.eval(), fwd.eval()
    torch.testing.assert_close(back(x)[0], cl(x)[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fwd(x)[0], ref(x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16])
def test_channels_last_gradients_of_narrow_trunks_equal_nchw(width, threads):
    """A channels-last trunk of any width gives the NCHW trunk's gradients, on one thread and on
    two, for both stems and image sizes whose stride-2 shortcuts see even and odd sides.
    (oneDNN's NHWC 1x1 stride-2 weight gradient with fewer input channels than its channel
    block corrupted the heap on one thread and returned gradients 40-120% off on two, on an AVX2
    CPU.)  The norms are in eval mode, fixed affine maps: a train-mode BatchNorm over a few
    nearly constant values amplifies fp32 rounding, which differs between the two layouts."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for stem, sizes in (("small", (14, 28, 32)), ("imagenet", (56, 64))):
            params = dict(DEPTH=10, WIDTH=width, STEM=stem)
            torch.manual_seed(0)
            ref = ResNetSmallPlugin(model_cfg(**params)).eval()
            cl = ResNetSmallPlugin(model_cfg(CHANNELS_LAST=True, **params)).eval()
            cl.load_state_dict(ref.state_dict())
            for size in sizes:
                x = torch.randn(4, 3, size, size)
                grads = []
                for net in (ref, cl):
                    net.zero_grad(set_to_none=True)
                    (feat,) = net(x, ["flatten"])
                    feat.mul(torch.linspace(-1, 1, feat.shape[1])).sum().backward()
                    grads.append({n: p.grad for n, p in net.named_parameters()})
                for n, g in grads[0].items():
                    err = (grads[1][n] - g).abs().max().item()
                    assert err <= 1e-4 * g.abs().max().item(), f"{stem} stem, {size} px, grad of {n}: off by {err:.3g}"
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("amp", sorted(AMP_MODES))
def test_channels_last_under_autocast(amp):
    """Under the autocast users run (CUDA-like fp16, bf16), the channels-last trunk computes
    what the NCHW trunk computes under the same autocast, and stays finite."""
    torch.manual_seed(0)
    ref = ResNetSmallPlugin(model_cfg(DEPTH=10, WIDTH=8))
    torch.manual_seed(0)
    cl = ResNetSmallPlugin(model_cfg(DEPTH=10, WIDTH=8, CHANNELS_LAST=True))
    x = torch.randn(8, 3, 28, 28)
    with AMP_MODES[amp]():
        a = ref(x)[0].float()
        b = cl(x)[0].float()
    assert torch.isfinite(b).all()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


def test_layers_groupnorm_and_lab_input():
    cfg = model_cfg(LAYERS=[1, 2, 1, 1], WIDTH=8, NORM="GroupNorm", GROUPNORM_GROUPS=4)
    cfg["INPUT_TYPE"] = "lab"
    t = ResNetSmallPlugin(cfg)
    assert [len(t._feature_blocks[f"layer{i}"]) for i in (1, 2, 3, 4)] == [1, 2, 1, 1]
    assert any(isinstance(m, nn.GroupNorm) for m in t.modules())
    assert t._feature_blocks["conv1"].in_channels == 1
    assert t(torch.randn(2, 3, 20, 20))[0].shape == (2, 64)  # L channel of a LAB input


TRUNK = ["config.MODEL.TRUNK.NAME=resnet_small_plugin", "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}"]


def test_vissl_builds_full_model_from_config(tmp_path):
    cfg = compose(["config=test/swav_plugin/quick_cpu", *TRUNK,
                   "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[10]}]]",
                   f"config.CHECKPOINT.DIR={tmp_path}"])
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    assert isinstance(model.trunk, ResNetSmallPlugin)
    crops = [torch.randn(3, 3, 32, 32)] * 2 + [torch.randn(3, 3, 16, 16)] * 2
    out = model(crops)  # VISSL's multi-resolution forward
    emb, scores = out[0]
    assert emb.shape == (12, 16) and scores.shape == (12, 10)
    assert torch.allclose(emb.norm(dim=1), torch.ones(12), atol=1e-5)
    # VISSL's own heads too (SimCLR-style mlp)
    cfg = compose(["config=test/swav_plugin/quick_cpu", *TRUNK,
                   "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,32]}],[mlp,{dims:[32,16]}]]",
                   "config.LOSS.name=CrossEntropyLoss",
                   f"config.CHECKPOINT.DIR={tmp_path}"])
    assert build_model(cfg.MODEL, cfg.OPTIMIZER)(torch.randn(2, 3, 28, 28))[0].shape == (2, 16)


def test_vissl_feature_extraction_by_key(tmp_path):
    """VISSL's linear-eval feature extractor (LINEAR_EVAL_FEAT_POOL_OPS_MAP) on our trunk
    gives the pooled trunk features, in the configured order."""
    cfg = compose([
        "config=test/swav_plugin/quick_cpu", *TRUNK,
        "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS=False",
        "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
        "[[res5,[AdaptiveAvgPool2d,[[2,2]]]],[res4,[AdaptiveAvgPool2d,[[1,1]]]],[res5avg,[Identity,[]]]]",
        "config.MODEL.HEAD.PARAMS=[]",
        "config.LOSS.name=CrossEntropyLoss",
        f"config.CHECKPOINT.DIR={tmp_path}",
    ])
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = model(x)
    base = model.trunk.base_model
    res5, res4, avg = base(x, ["res5", "res4", "res5avg"])
    assert torch.allclose(feats[0], nn.functional.adaptive_avg_pool2d(res5, 2))
    assert torch.allclose(feats[1], nn.functional.adaptive_avg_pool2d(res4, 1))
    assert torch.allclose(feats[2], avg)
    assert not any(p.requires_grad for p in base.parameters())
