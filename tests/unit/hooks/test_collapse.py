"""The collapse detector (``vissl_swav_plugin/hooks/collapse.py``).

* statistics on synthetic prototype scores against closed forms (the entropy of a uniform
  distribution is ln K, of a one-hot 0; a softmax with one logit ``m`` above K-1 equal ones
  has entropy ``ln Z + m (K-1) e^-m / Z``, ``Z = 1 + (K-1) e^-m``);
* the decision logic on collapsed-uniform, collapsed-one-prototype and healthy outputs,
  through the hook itself (fake task), including the all-reduce over 2 gloo processes;
* config defaults / validation;
* only rank 0 logs (a faked rank 1 acts, and stops, in silence);
* end to end (``tests/integration/hooks/test_collapse_integration.py``, VISSL runs in the test
  process): a forced collapse (epsilon 1e3: uniform codes; temperature 100: uniform
  predictions, so the loss sits at ln K from the first iteration) warns or stops
  (``CollapseError``), a healthy run stays quiet even with ``PATIENCE_ITERS: 1`` and
  ``ON_COLLAPSE: stop``.
"""
import logging
import math
from types import SimpleNamespace

import pytest
import torch
import yaml

from testkit import compose
from vissl_swav_plugin.hooks import collapse as C
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.config.yaml_files import shipped_config_files
from vissl_swav_plugin.losses.swav_loss import summarize_codes
from collapse_cases import (D, FakeLoss, T, drive, fake_task, figures, healthy_scores, make_hook, uniform_scores,)  # noqa: F401  (fixtures and cases shared with the unit part)


def one_prototype_scores(n, K, k=3):
    """Every sample scores prototype k far above the others (1 vs -1 at T=0.01: e^-200)."""
    s = -torch.ones(n, K)
    s[:, k] = 1.0
    return s


def softmax_entropy_one_up(K, m):
    """Closed form: entropy of softmax of K logits, one of them m above the others."""
    z = 1 + (K - 1) * math.exp(-m)
    return math.log(z) + m * (K - 1) * math.exp(-m) / z


class FakeWriter:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, global_step=None):
        self.scalars[(tag, global_step)] = value


def warnings_in(caplog):
    return [r.getMessage() for r in caplog.records if "COLLAPSE DETECTED" in r.getMessage()]


# -- statistics --------------------------------------------------------------------------------
def test_entropy_closed_forms():
    for K in (2, 10, 3000):
        assert float(C.entropy(torch.full((K,), 1.0 / K))) == pytest.approx(math.log(K), rel=1e-6)
    assert float(C.entropy(torch.tensor([0.0, 1.0, 0.0]))) == 0.0
    p = 0.3
    assert float(C.entropy(torch.tensor([p, 1 - p]))) == pytest.approx(-p * math.log(p) - (1 - p) * math.log(1 - p))


def test_figures_of_uniform_one_prototype_and_healthy_outputs():
    K = 10
    f = figures(uniform_scores(16, K))
    assert f["K"] == K and f["rows"] == 16 and f["ln_k"] == pytest.approx(math.log(K))
    assert f["sample_entropy"] == pytest.approx(math.log(K)) and f["mean_entropy"] == pytest.approx(math.log(K))
    f = figures(one_prototype_scores(16, K), temperature=0.01)
    assert f["sample_entropy"] == pytest.approx(0.0, abs=1e-12) and f["mean_entropy"] == pytest.approx(0.0, abs=1e-12)
    assert f["used"] == 1
    f = figures(healthy_scores(K))
    assert f["sample_entropy"] == pytest.approx(softmax_entropy_one_up(K, 0.2 / T), rel=1e-6)  # 0.2 in fp32
    assert f["mean_entropy"] == pytest.approx(math.log(K), rel=1e-9)  # each prototype on top twice
    assert f["used"] == K


def test_sums_add_up_over_batches():
    a, b = healthy_scores(8, repeats=1), uniform_scores(5, 8)
    split = C.head_figures(C.prediction_sums(a, T) + C.prediction_sums(b, T))
    joined = figures(torch.cat([a, b]))
    for key in ("rows", "sample_entropy", "mean_entropy", "used"):
        assert split[key] == pytest.approx(joined[key], rel=1e-12)


def test_code_stats_closed_forms():
    K, B = 6, 8
    s = summarize_codes([torch.full((B, K), 1.0 / K), torch.full((B, K), 1.0 / K)])
    assert float(s["mean_entropy"]) == pytest.approx(math.log(K), rel=1e-6)
    assert int(s["argmax_counts"].sum()) == 2 * B
    onehot = torch.nn.functional.one_hot(torch.arange(B) % K, K).float()
    s = summarize_codes([onehot])
    assert float(s["mean_entropy"]) == 0.0 and s["argmax_counts"].tolist() == [2, 2, 1, 1, 1, 1]
    f = C.head_figures(C.prediction_sums(uniform_scores(4, K), T), C.code_sums(s))
    assert f["code_entropy"] == 0.0 and f["code_used"] == K


def test_swav_loss_exposes_code_stats():
    from vissl.config import AttrDict
    from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss

    K, D, bs = 12, 8, 6

    def run(eps, **kw):
        loss = SwAVPluginLoss(AttrDict({"temperature": 0.1, "epsilon": eps, "num_iters": 3, "crops_for_assign": [0, 1],
                                        "num_crops": 3, "num_prototypes": [K, 5], "embedding_dim": D, **kw}))
        assert loss.last_code_stats is None
        g = torch.Generator().manual_seed(0)
        emb = torch.nn.functional.normalize(torch.randn(3 * bs, D, generator=g), dim=1)
        loss([emb, emb @ torch.randn(D, K, generator=g), emb @ torch.randn(D, 5, generator=g)])
        return loss.last_code_stats

    stats = run(1e3)  # far too large epsilon: uniform codes
    assert [int(s["argmax_counts"].sum()) for s in stats] == [2 * bs, 2 * bs]  # rows of the assigned crops
    assert float(stats[0]["mean_entropy"]) == pytest.approx(math.log(K), rel=1e-6)
    assert float(stats[1]["mean_entropy"]) == pytest.approx(math.log(5), rel=1e-6)
    stats = run(0.05, hard_assignment=True)
    assert float(stats[0]["mean_entropy"]) == 0.0


# -- decision logic ----------------------------------------------------------------------------
def test_collapse_kind_on_synthetic_outputs():
    K = 10
    ln_k = math.log(K)
    S = C.DEFAULTS
    assert C.collapse_kind(ln_k, [figures(uniform_scores(16, K))], S) == "uniform"
    assert C.collapse_kind(0.001, [figures(one_prototype_scores(16, K), 0.01)], S) == "one_prototype"
    healthy = [figures(healthy_scores(K))]
    assert C.collapse_kind(0.5 * ln_k, healthy, S) is None
    # a healthy run passing through ln K (its loss starts above it) is not collapsed:
    # its predictions are not uniform
    assert C.collapse_kind(ln_k, healthy, S) is None
    # uniform predictions but a loss far from ln K (cannot both hold; tolerance respected)
    assert C.collapse_kind(ln_k * (1 + 1.5 * S["LOSS_TOL"]), [figures(uniform_scores(16, K))], S) is None
    assert C.collapse_kind(ln_k * (1 + 0.5 * S["LOSS_TOL"]), [figures(uniform_scores(16, K))], S) == "uniform"
    # every prototype set must be collapsed
    assert C.collapse_kind(ln_k, [figures(uniform_scores(16, K)), figures(healthy_scores(K))], S) is None
    assert C.collapse_kind(float("nan"), [figures(uniform_scores(16, K))], S) is None


def test_too_few_prototypes_threshold():
    used = lambda n, K=100, rows=6400: {"used": n, "K": K, "rows": rows}  # noqa: E731
    assert C.too_few_prototypes([used(1)], 0.02)  # ceil(0.02 * 100) = 2
    assert not C.too_few_prototypes([used(2)], 0.02)
    assert not C.too_few_prototypes([used(1, K=20)], 0.02)  # K <= 50: never fires at 2%
    assert not C.too_few_prototypes([used(1)], 0.0)  # switched off
    assert C.too_few_prototypes([used(59, K=3000)], 0.02) and not C.too_few_prototypes([used(60, K=3000)], 0.02)


def test_hook_warns_once_after_patience_then_again_after_recovery(caplog):
    caplog.set_level(logging.INFO)
    K, P = 10, 5
    hook = make_hook(PATIENCE_ITERS=P)
    collapsed = (uniform_scores(8, K), math.log(K))
    drive(hook, [collapsed] * (P - 1), end_epoch=False)
    assert hook.streak == P - 1 and not warnings_in(caplog)
    drive(hook, [collapsed] * 10, start_iter=P - 1, end_epoch=False)
    msgs = warnings_in(caplog)
    assert len(msgs) == 1
    m = msgs[0]
    assert f"{P} consecutive iterations" in m and "uniform predictions, loss at ln K" in m
    assert f"loss {math.log(K):.4f}, ln K {math.log(K):.4f} (loss = 1.000 ln K)" in m
    assert f"prediction entropy per sample {math.log(K):.4f} (1.000 ln K)" in m
    assert "train iterations 0 to 4" in m
    for key in ("LOSS.swav_plugin_loss.epsilon", "LOSS.swav_plugin_loss.freeze_prototypes_niters",
                "OPTIMIZER.param_schedulers.lr", "DATA.TRAIN.BATCHSIZE_PER_REPLICA", "num_clusters",
                "crop_scales", "use_bn", "ON_COLLAPSE=stop"):
        assert key in m, key
    drive(hook, [(healthy_scores(K), 0.5)], start_iter=20, end_epoch=False)
    assert hook.streak == 0
    drive(hook, [collapsed] * P, start_iter=21, end_epoch=False)
    assert len(warnings_in(caplog)) == 2


def test_message_quotes_the_runs_augmentation():
    """The advice line on DATA.TRAIN.TRANSFORMS quotes the config's own crop scales, crop
    counts and colour-distortion strength (the values composed, not the yaml's defaults)."""
    from vissl_swav_plugin.hooks.collapse_report import collapse_message, run_context

    cfg = compose(["config=pretrain/swav/swav_fashion_mnist_cpu", "config.DATA.TRAIN.TRANSFORMS.0.color_strength=0.7",
                   "config.DATA.TRAIN.TRANSFORMS.0.crop_scales=[[0.4,1.0],[0.1,0.3]]"])
    lk = math.log(100)
    heads = [dict(K=100, ln_k=lk, sample_entropy=lk, mean_entropy=lk, used=100)]
    settings = dict(ON_COLLAPSE="warn", PATIENCE_ITERS=100, LOSS_TOL=0.02, ENTROPY_TOL=0.05,
                    MIN_PROTOTYPES_USED_FRAC=0.02)
    msg = collapse_message("uniform", "swav_plugin_loss", lk, heads, settings, run_context(cfg), (1, 100), 100, 2,
                           0.3, [100])
    line = [ln for ln in msg.splitlines() if ln.strip().startswith("DATA.TRAIN.TRANSFORMS")]
    assert len(line) == 1, msg
    mc = cfg.DATA.TRAIN.TRANSFORMS[0]
    w = mc["color_warmup_strength"]
    w = list(w) if hasattr(w, "__len__") else w
    how = f"ramping from {w} over" if mc.get("color_warmup_schedule") == "linear" else f"{w} for"
    assert "crop_scales [[0.4, 1.0], [0.1, 0.3]], num_crops [2, 4], color_strength 0.7 " \
        f"({how} the first {mc['color_warmup_iters']} iterations)" in line[0]
    # the step schedule is quoted as such
    step = compose(["config=pretrain/swav/swav_fashion_mnist_cpu", "~config.DATA.TRAIN.TRANSFORMS.0.color_warmup_schedule",
                    "config.DATA.TRAIN.TRANSFORMS.0.color_warmup_strength=[0.25,0.5]"])
    assert f"color_strength 0.5 ([0.25, 0.5] for the first {mc['color_warmup_iters']} iterations)" in run_context(step)["crops"]
    assert "a lower color_strength, or a weaker one for the first iterations only" in line[0]


def test_hook_stop_raises_at_patience():
    K, P = 10, 4
    hook = make_hook(PATIENCE_ITERS=P, ON_COLLAPSE="stop")
    drive(hook, [(uniform_scores(8, K), math.log(K))] * (P - 1), end_epoch=False)
    with pytest.raises(C.CollapseError, match="COLLAPSE DETECTED") as e:
        drive(hook, [(uniform_scores(8, K), math.log(K))], start_iter=P - 1, end_epoch=False)
    assert "The run stops" in str(e.value) and isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_logs_every_rank_acts(caplog, monkeypatch, rank):
    """The warning, the epoch line and the TensorBoard figures come from rank 0 only (the
    hook's ``D.rank()`` faked); every rank detects the collapse and, with ``stop``, raises."""
    monkeypatch.setattr(C.D, "rank", lambda: rank)
    caplog.set_level(logging.INFO)
    K, P = 10, 3
    writer = FakeWriter()
    collapsed = (uniform_scores(8, K), math.log(K))
    hook = make_hook(PATIENCE_ITERS=P)
    drive(hook, [collapsed] * P, hooks=[SimpleNamespace(tb_writer=writer)])
    assert hook.warned
    logged = [r.getMessage() for r in caplog.records if "Collapse detector" in r.getMessage()
              or "COLLAPSE DETECTED" in r.getMessage()]
    assert len(logged) == (2 if rank == 0 else 0), logged  # the warning and the epoch line
    assert bool(writer.scalars) == (rank == 0)
    with pytest.raises(C.CollapseError, match="The run stops"):
        drive(make_hook(PATIENCE_ITERS=P, ON_COLLAPSE="stop"), [collapsed] * P)
    assert len(warnings_in(caplog)) == (2 if rank == 0 else 0)


def test_hook_one_prototype_state_stops():
    K = 10
    hook = make_hook(PATIENCE_ITERS=2, ON_COLLAPSE="stop")
    with pytest.raises(C.CollapseError, match="one prototype takes the batch, loss near 0"):
        drive(hook, [(one_prototype_scores(8, K), 1e-4)] * 2, loss_module=FakeLoss(temperature=0.01))


def test_hook_healthy_run_never_triggers(caplog):
    caplog.set_level(logging.INFO)
    K = 10
    hook = make_hook(PATIENCE_ITERS=1, ON_COLLAPSE="stop")
    losses = [1.3 * math.log(K) - 0.02 * i for i in range(60)]  # from above ln K down through it
    for epoch in range(3):
        drive(hook, [(healthy_scores(K), loss) for loss in losses[20 * epoch : 20 * (epoch + 1)]], epoch=epoch,
              start_iter=20 * epoch)
    assert not warnings_in(caplog)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Collapse detector, epoch ")]
    assert len(lines) == 3 and f"prototypes used {K}/{K}" in lines[0] and "collapsed iterations 0/20" in lines[0]


def test_hook_epoch_with_one_prototype_used_stops():
    # every sample's top prototype is 0, but with a flat prediction and a loss far from
    # both ln K and 0: only the per-epoch count of prototypes used sees it
    K = 100
    scores = torch.zeros(64, K)
    scores[:, 0] = 0.05
    hook = make_hook(ON_COLLAPSE="stop")
    with pytest.raises(C.CollapseError, match="too few prototypes used in epoch 0"):
        drive(hook, [(scores, 3.0)] * 3)
    assert hook.last["kind"] == "few_prototypes" and hook.last["heads"][0]["used"] == 1


def test_epoch_line_and_tensorboard_figures(caplog):
    caplog.set_level(logging.INFO)
    K = 10
    writer = FakeWriter()
    uniform_codes = summarize_codes([torch.full((8, K), 1.0 / K)])
    drive(make_hook(), [(healthy_scores(K), 1.0)] * 2, epoch=4, loss_module=FakeLoss(code_stats=[uniform_codes]),
          hooks=[SimpleNamespace(tb_writer=writer)])
    line = next(r.getMessage() for r in caplog.records if "Collapse detector, epoch 4" in r.getMessage())
    assert f"codes entropy {math.log(K):.4f} (1.000 ln K)" in line
    expected = softmax_entropy_one_up(K, 2.0) / math.log(K)
    assert writer.scalars[("collapse/head0/sample_entropy_over_ln_k", 4)] == pytest.approx(expected)
    assert writer.scalars[("collapse/head0/mean_entropy_over_ln_k", 4)] == pytest.approx(1.0)
    assert writer.scalars[("collapse/head0/code_entropy_over_ln_k", 4)] == pytest.approx(1.0)
    assert writer.scalars[("collapse/head0/prototypes_used", 4)] == K
    assert writer.scalars[("collapse/loss_over_ln_k", 4)] == pytest.approx(1.0 / math.log(K))


# -- config ------------------------------------------------------------------------------------
def test_settings_defaults_when_absent():
    from vissl.config import AttrDict

    assert C.detector_settings(AttrDict({"HOOKS": {}})) == C.DEFAULTS
    assert C.detector_settings(AttrDict({"HOOKS": {"COLLAPSE_DETECTOR": {"ON_COLLAPSE": "stop"}}}))["ON_COLLAPSE"] == "stop"


@pytest.mark.parametrize("key,value", [
    ("ON_COLLAPSE", "halt"), ("ENABLED", "yes"), ("PATIENCE_ITERS", 0), ("PATIENCE_ITERS", 2.5),
    ("LOSS_TOL", 0), ("LOSS_TOL", 1.5), ("ENTROPY_TOL", True), ("MIN_PROTOTYPES_USED_FRAC", -0.1), ("PATIENCE", 3),
])
def test_bad_settings_name_the_key(key, value):
    from vissl.config import AttrDict

    with pytest.raises(ConfigError, match=f"config.HOOKS.COLLAPSE_DETECTOR.{key}"):
        C.detector_settings(AttrDict({"HOOKS": {"COLLAPSE_DETECTOR": {key: value}}}))


def test_composed_config_is_checked_before_any_process_starts():
    with pytest.raises(ConfigError, match="COLLAPSE_DETECTOR.ON_COLLAPSE must be one of"):
        compose(["config=test/swav_plugin/quick_cpu", "config.HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE=halt"])


def test_shipped_configs_carry_the_block():
    for p in shipped_config_files("pretrain/") + shipped_config_files("test/"):
        cfg = yaml.safe_load(p.read_text())["config"]
        if cfg.get("LOSS", {}).get("name") in C.MONITORED_LOSSES:
            assert cfg["HOOKS"]["COLLAPSE_DETECTOR"] == C.DEFAULTS, p


@pytest.mark.parametrize("config", ["test/swav_plugin/quick_cpu", "pretrain/deepcluster_v2/deepclusterv2_quick_cpu",
                                    "pretrain/sela_v2/selav2_quick_cpu"])
def test_every_plugin_loss_gets_a_detector_unless_disabled(config):
    from vissl_swav_plugin.hooks.registry import hooks_for_config

    def detectors(overrides):
        return [h for h in hooks_for_config(compose([f"config={config}", *overrides]))
                if isinstance(h, C.CollapseDetectorHook)]

    assert len(detectors([])) == 1
    assert detectors(["config.HOOKS.COLLAPSE_DETECTOR.ENABLED=False"]) == []
