"""The compatibility layer (vissl_swav_plugin/compat/): every shim is applied, makes the
VISSL code path it targets work, and that path fails with the shim off (shown in-process
with ``compat.disabled(name)``, or end to end with ``VISSL_SWAV_PLUGIN_DISABLE=1``).

Also: shims are active in VISSL's spawned/forkserver worker processes (2-process gloo runs)."""
import math
import os
import re

import numpy as np
import pytest
import torch

import vissl  # noqa: F401  (the .pth hook registers the plugin and applies compat)
from vissl_swav_plugin import compat
from vissl_swav_plugin.compat import engine
from vissl_swav_plugin.compat.cpu_device import cuda_calls_to, flush_denormals_for
from vissl_swav_plugin.compat.larc import LARC

import compat_helpers as H
from testkit import REPO, compose


def test_every_shim_applied_documented_and_idempotent():
    names = compat.names()
    assert len(names) == len(set(names)) >= 12
    assert compat.applied() == names
    table = (REPO / "docs" / "compat.md").read_text()
    for name in names:
        assert f"`{name}`" in table, f"{name} missing from docs/compat.md"
    before = {n: [(o, a, compat.raw(o, a)) for o, a, _, _ in engine._PATCHES.get(n, [])] for n in names}
    compat.apply_all()
    compat.apply_all()
    for n in names:
        for owner, attr, value in before[n]:
            assert compat.raw(owner, attr) is value, f"{n} re-patched {attr}"


def test_skip_env_and_disabled(monkeypatch, caplog):
    import logging

    monkeypatch.setenv(compat.SKIP_ENV, "shim_not_in_compat, shim_pillow13_posterize")
    with caplog.at_level(logging.INFO, logger=compat.__name__):
        assert compat.skipped_names() == {"shim_pillow13_posterize"}
    assert "shim_not_in_compat" in caplog.text  # e.g. another plugin module's shim, or a typo
    monkeypatch.setenv(compat.SKIP_ENV, "all")
    assert compat.skipped_names() == set(compat.names())
    with pytest.raises(ValueError, match="no_such_shim"):
        with compat.disabled("no_such_shim"):
            pass


# ------------------------------------------------------------------------------------------
# LARC without apex
# ------------------------------------------------------------------------------------------
def _larc_reference(params, grads, groups, tc, clip, eps, momentum, steps):
    """LARS/LARC update from its definition (You et al. 2017; apex semantics), fp64 numpy."""
    p = [np.array(x, np.float64) for x in params]
    buf = [None] * len(p)
    for s in range(steps):
        for lr, wd, members in groups:
            for j in members:
                if grads[s][j] is None:
                    continue
                g = np.array(grads[s][j], np.float64)
                pn, gn = np.linalg.norm(p[j]), np.linalg.norm(g)
                if pn > 0 and gn > 0:
                    local = tc * pn / (gn + wd * pn + eps)
                    scale = min(local / lr, 1.0) if clip else local
                    g = (g + wd * p[j]) * scale
                buf[j] = g if buf[j] is None else momentum * buf[j] + g
                p[j] = p[j] - lr * buf[j]
    return p


@pytest.mark.parametrize("clip", [False, True])
def test_larc_step_equals_closed_form(clip):
    from classy_vision.optim.sgd import SGD

    gen = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (5,), (4,), (3, 2), (7,)]
    params = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    params[2].zero_()  # a zero-norm parameter (e.g. a BN bias): plain step, no weight decay
    groups = [(0.5, 1e-2, [0, 1, 2]), (0.05, 0.0, [3, 4])]  # (lr, weight_decay, members)
    steps = 3
    grads = []
    for s in range(steps):
        g = [torch.randn(sh, generator=gen, dtype=torch.float64) for sh in shapes]
        g[4] = None  # a parameter without gradient is skipped
        if s == 1:
            g[3] = torch.zeros(shapes[3], dtype=torch.float64)  # zero gradient: no LARC scaling
        grads.append(g)
    tc, eps = 0.02, 1e-8
    opt = SGD.from_config({"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False,
                           "use_larc": True, "larc_config": {"clip": clip, "eps": eps, "trust_coefficient": tc}})
    torch_params = [torch.nn.Parameter(x.clone()) for x in params]
    opt.prepare([{"params": [torch_params[j] for j in m], "lr": lr, "weight_decay": wd} for lr, wd, m in groups])
    assert isinstance(opt.optimizer, LARC)
    for s in range(steps):
        for j, p in enumerate(torch_params):
            p.grad = None if grads[s][j] is None else grads[s][j].clone()
        opt.optimizer.step()
        # weight decay is handed back to the wrapped optimizer after every step
        assert [g["weight_decay"] for g in opt.param_groups] == [1e-2, 0.0]
    expected = _larc_reference([x.numpy() for x in params], [[None if g is None else g.numpy() for g in gs] for gs in grads],
                               groups, tc, clip, eps, 0.9, steps)
    for j, p in enumerate(torch_params):
        np.testing.assert_allclose(p.detach().numpy(), expected[j], rtol=1e-12, atol=1e-12)
    # the wrapper is transparent for checkpoints
    assert opt.optimizer.state_dict() == opt.optimizer.optim.state_dict()


def test_larc_fails_without_shim_and_vissl_task_builds_it():
    from classy_vision.optim.sgd import SGD
    from vissl.trainer.train_task import SelfSupervisionTask

    cfg = {"name": "sgd", "use_larc": True, "momentum": 0.9, "weight_decay": 1e-6,
           "larc_config": {"clip": False, "eps": 1e-8, "trust_coefficient": 0.001}}
    with compat.disabled("shim_larc_without_apex"):
        with pytest.raises(RuntimeError, match="Apex needed for LARC"):
            SGD.from_config(dict(cfg)).prepare([torch.nn.Parameter(torch.ones(2))])
    config = compose(["config=test/integration_test/quick_swav", "config.MACHINE.DEVICE=cpu",
                      "config.OPTIMIZER.use_larc=True"])
    task = SelfSupervisionTask.from_config(config)
    with compat.disabled("shim_larc_without_apex"):
        with pytest.raises(AssertionError, match="Apex must be available to use LARC"):
            task._build_optimizer()
    optimizer = task._build_optimizer()
    optimizer.set_param_groups([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    assert isinstance(optimizer.optimizer, LARC)
    assert optimizer.optimizer.trust_coefficient == 0.001 and optimizer.optimizer.clip is False


# ------------------------------------------------------------------------------------------
# Native AMP (fp16/bf16, CPU) and SyncBN without apex
# ------------------------------------------------------------------------------------------
def _amp_task(*overrides):
    from vissl.trainer.train_task import SelfSupervisionTask

    config = compose(["config=test/integration_test/quick_swav", "config.MACHINE.DEVICE=cpu",
                      "config.MODEL.AMP_PARAMS.USE_AMP=True", *overrides])
    return SelfSupervisionTask.from_config(config)


@pytest.mark.parametrize("dtype_name, dtype, scaler_on", [("bfloat16", torch.bfloat16, False),
                                                          ("bf16", torch.bfloat16, False),
                                                          ("float16", torch.float16, True)])
def test_native_amp_autocast_in_vissl_train_step(dtype_name, dtype, scaler_on):
    from classy_vision.tasks.classification_task import AmpType
    from vissl.trainer.train_steps import standard_train_step as sts

    # no '+' needed for the plugin's new key (the override is rewritten to '++')
    task = _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch", f"config.MODEL.AMP_PARAMS.AMP_DTYPE={dtype_name}")
    assert task.amp_type == AmpType.PYTORCH and task.amp_dtype == dtype
    assert task.amp_grad_scaler.is_enabled() is scaler_on
    # what VISSL's standard_train_step enters as `torch.cuda.amp.autocast()`
    with sts.torch.cuda.amp.autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == dtype
    assert not torch.is_autocast_enabled("cpu")
    # the rest of VISSL's `torch` is the real one
    assert sts.torch.enable_grad is torch.enable_grad and sts.torch.cuda.is_available is torch.cuda.is_available


@pytest.mark.parametrize("use_larc", [False, True])
def test_fp16_grad_scaler_steps_vissl_optimizer(use_larc):
    """float16 on CPU: VISSL's backward/step sequence (scaler.scale(loss).backward(),
    scaler.step(task.optimizer, where=...), scaler.update()) through the Classy optimizer
    (plain SGD, or LARC in clip mode) makes the same update as an fp32 step."""
    from vissl.trainer.train_steps import standard_train_step as sts

    task = _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch", f"config.OPTIMIZER.use_larc={use_larc}",
                     "config.OPTIMIZER.weight_decay=0.0", "config.OPTIMIZER.larc_config.clip=True",
                     "config.OPTIMIZER.larc_config.trust_coefficient=0.02")
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(5, 4, generator=gen)
    x = torch.randn(8, 4, generator=gen)
    runs = []
    for amp in (True, False):
        w = torch.nn.Parameter(w0.clone())
        opt = task._build_optimizer()
        opt.set_param_groups([w], lr=0.1)
        with sts.torch.cuda.amp.autocast() if amp else torch.enable_grad():
            loss = (x @ w.t()).float().square().mean()
        opt.zero_grad()
        if amp:
            assert task.amp_grad_scaler.get_scale() > 1
            task.amp_grad_scaler.scale(loss).backward()
            task.amp_grad_scaler.step(opt, where=0.0)
            task.amp_grad_scaler.update()
        else:
            loss.backward()
            opt.step(where=0.0)
        runs.append(w.detach().clone())
    delta_amp, delta_fp32 = runs[0] - w0, runs[1] - w0
    assert delta_fp32.abs().max() > 1e-3
    torch.testing.assert_close(delta_amp, delta_fp32, rtol=2e-2, atol=1e-5)  # fp16 forward


def test_native_amp_fails_without_shim_bad_dtype_and_apex_fallback(caplog):
    with compat.disabled("shim_native_amp"):
        with pytest.raises(AssertionError, match="only available on CUDA"):
            _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch")
        with pytest.raises(Exception, match="AMP_DTYPE"):  # Hydra: key not in VISSL's schema
            _amp_task("config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16")
    with pytest.raises(ValueError, match=re.escape("config.MODEL.AMP_PARAMS.AMP_DTYPE='int8'")):
        _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch", "config.MODEL.AMP_PARAMS.AMP_DTYPE=int8")
    with pytest.raises(ValueError, match="config.MODEL.AMP_PARAMS.AMP_TYPE='fancy'"):
        _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=fancy")
    # VISSL's SwAV configs say AMP_TYPE=apex (opt_level O1): native float16 instead of a crash
    task = _amp_task("config.MODEL.AMP_PARAMS.AMP_TYPE=apex")
    assert task.amp_dtype == torch.float16 and task.amp_grad_scaler.is_enabled()
    assert "apex is not installed" in caplog.text


def test_syncbn_apex_falls_back_to_pytorch_syncbn():
    from vissl.models.model_helpers import convert_sync_bn

    config = compose(["config=test/integration_test/quick_swav", "config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=apex",
                      "config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE=0"])
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    with compat.disabled("shim_syncbn_without_apex"):
        from vissl.models import model_helpers

        with pytest.raises(NameError, match="apex"):
            model_helpers.convert_sync_bn(config, model)
    converted = convert_sync_bn(config, model)
    assert isinstance(converted[1], torch.nn.SyncBatchNorm)
    assert config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE == "apex"  # the caller's config is untouched


# ------------------------------------------------------------------------------------------
# CUDA-only paths on CPU
# ------------------------------------------------------------------------------------------
def test_cuda_calls_redirect_is_scoped():
    t = torch.ones(2)
    with cuda_calls_to("cpu"):
        assert t.cuda(non_blocking=True).device.type == "cpu"
        assert torch.nn.Linear(2, 2).cuda().weight.device.type == "cpu"
        with cuda_calls_to(torch.device("cpu")):  # re-entrant
            assert t.cuda().device.type == "cpu"
    assert "cuda" not in torch.Tensor.__dict__
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            t.cuda()


def _knn_features(tmp_path, n_train=60, n_test=120, classes=6, dim=16, seed=0):
    """Features in the layout VISSL's extract_features engine writes (2 ranks)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)) * 2.0
    data = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, classes, size=n)
        x = (centers[y] + rng.normal(size=(n, dim))).astype(np.float32)
        data[split] = (x, y)
        for rank in (0, 1):
            idx = np.arange(rank, n, 2)
            stem = tmp_path / f"rank{rank}_chunk0_{split}_heads"
            np.save(f"{stem}_features.npy", x[idx])
            np.save(f"{stem}_targets.npy", y[idx].reshape(-1, 1))
            np.save(f"{stem}_inds.npy", idx)
    return data


def test_knn_tool_runs_on_cpu_and_matches_reference(tmp_path):
    import tools.nearest_neighbor_test as knn_tool

    data = _knn_features(tmp_path)
    config = compose(["config=test/integration_test/quick_knn", "config.MACHINE.DEVICE=cpu",
                      f"config.CHECKPOINT.DIR={tmp_path}", "config.NEAREST_NEIGHBOR.TOPK=7",
                      "config.NEAREST_NEIGHBOR.SIGMA=0.5", "config.NEAREST_NEIGHBOR.L2_NORM_FEATS=True"])
    with compat.disabled("shim_knn_tool_on_cpu"):
        with pytest.raises((RuntimeError, AssertionError)):
            knn_tool.nearest_neighbor_test(config, layer_name="heads")
    top1, top5 = knn_tool.nearest_neighbor_test(config, layer_name="heads")
    ref1, ref5 = H.reference_knn(*data["train"], *data["test"], k=7, sigma=0.5, l2_norm=True)
    assert math.isclose(top1, ref1, abs_tol=1e-9) and math.isclose(top5, ref5, abs_tol=1e-9)
    assert 40 < top1 <= 100  # separable clusters: kNN works


def test_deepclusterv2_memory_fails_on_cpu_without_shim():
    from vissl.config import AttrDict
    from vissl.losses.deepclusterv2_loss import DeepClusterV2Loss

    cfg = AttrDict({"num_train_samples": 4, "DROP_LAST": False, "BATCHSIZE_PER_REPLICA": 2, "num_crops": 1,
                    "temperature": 0.1, "num_clusters": [2], "kmeans_iters": 1,
                    "memory_params": {"crops_for_mb": [0], "embedding_dim": 3}})
    loss = DeepClusterV2Loss(cfg)
    batches = [{"data_idx": [torch.tensor([0, 1])], "data": [[torch.randn(2, 3)]]}]
    with compat.disabled("shim_deepclusterv2_on_cpu"):
        with pytest.raises((RuntimeError, AssertionError)):
            loss.init_memory(batches, lambda x: [x])
    loss.init_memory(batches, lambda x: [x])
    assert loss.local_memory_index[:2].tolist() == [0, 1]


# ------------------------------------------------------------------------------------------
# NumPy 2, Pillow 13, torch.load
# ------------------------------------------------------------------------------------------
def test_numpy2_aliases_are_module_local_and_needed():
    import numpy
    from vissl.utils.svm_utils import evaluate

    assert not hasattr(numpy, "float") and not hasattr(numpy, "in1d")  # NumPy itself untouched
    assert evaluate.np.float is float and evaluate.np.ndarray is numpy.ndarray
    a, b = np.array([[1, 5], [3, 7]]), np.array([3, 5])
    assert evaluate.np.in1d(a, b).tolist() == [False, True, True, False]
    targets, scores = np.array([1, -1, 1, 0]), np.array([0.9, 0.8, 0.3, 0.1])
    with compat.disabled("shim_numpy2_removed_aliases"):
        with pytest.raises(AttributeError, match="np.float"):
            evaluate.get_precision_recall(targets, scores)
    *_, ap = evaluate.get_precision_recall(targets, scores)
    assert math.isclose(float(ap[0]), H.voc_ap(targets, scores), abs_tol=1e-12)


def test_numpy2_instance_retrieval_map_and_classy_autoaugment():
    from PIL import Image
    from classy_vision.dataset.transforms import build_transform
    from vissl.utils.instance_retrieval_utils.evaluate import compute_map

    # 1 query; database ranking [2, 0, 1, 3]; positives {0, 3} -> hits at ranks 2 and 4
    ranks = np.array([[2], [0], [1], [3]])
    m, aps, _, _ = compute_map(ranks, [{"ok": [0, 3], "junk": []}], kappas=[1, 2])
    # Oxford/Paris AP: trapezoids over recall steps of 1/2, between the precision just
    # before each hit (0/1, then 1/3) and at the hit (1/2, then 2/4)
    expected = 0.5 * (0 / 1 + 1 / 2) / 2 + 0.5 * (1 / 3 + 2 / 4) / 2
    assert math.isclose(m, expected, abs_tol=1e-12)
    with compat.disabled("shim_numpy2_removed_aliases"):
        with pytest.raises(AttributeError):
            compute_map(ranks, [{"ok": [0, 3], "junk": []}], kappas=[1])
        with pytest.raises(AttributeError):
            build_transform({"name": "imagenet_autoaugment"})
    t = build_transform({"name": "imagenet_autoaugment"})
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    for _ in range(10):
        assert t(img).size == (16, 16)


def test_svm_trainer_ap_scalar(tmp_path):
    from vissl.utils.svm_utils import svm_trainer

    targets, scores = np.array([1, 0, 1, 0, -1]), np.array([0.2, 0.9, 0.8, 0.1, 0.5])
    *_, ap = svm_trainer.get_precision_recall(targets, scores)
    assert isinstance(ap, float) and math.isclose(ap, H.voc_ap(targets, scores), abs_tol=1e-12)
    ap_matrix = np.zeros((1, 1))
    ap_matrix[0][0] = ap  # what SVMTrainer.test does
    with compat.disabled("shim_svm_ap_scalar"):
        *_, raw_ap = svm_trainer.get_precision_recall(targets, scores)
        with pytest.raises((ValueError, TypeError)):
            ap_matrix[0][0] = raw_ap


@pytest.mark.parametrize("op", ["Posterize", "PosterizeIncreasing", "PosterizeOriginal"])
def test_pillow13_posterize_all_magnitudes(op):
    from PIL import Image, ImageOps
    from vissl.data.ssl_transforms import rand_auto_aug as raa

    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    for magnitude in range(0, 11):
        aug = raa.AugmentOp(op, prob=1.0, magnitude=magnitude)
        (bits,) = aug.level_fn(magnitude, aug.hparams)
        out = np.asarray(aug(img))
        if bits <= 0:  # Pillow < 10: posterize to 0 bits = black image
            assert out.max() == 0
        else:
            assert np.array_equal(out, np.asarray(ImageOps.posterize(img, int(bits))))
    if op != "PosterizeOriginal":  # the two ops that reach 0 bits
        magnitude = 0 if op == "Posterize" else 10
        with compat.disabled("shim_pillow13_posterize"):
            with pytest.raises(ValueError, match="bits must be between"):
                raa.AugmentOp(op, prob=1.0, magnitude=magnitude)(img)


def test_cluster_assignments_file_loads(tmp_path):
    from vissl.config import AttrDict
    from vissl.utils.cluster_utils import ClusterAssignment, ClusterAssignmentLoader

    ClusterAssignmentLoader.save_cluster_assignment(
        str(tmp_path), ClusterAssignment(config=AttrDict({"MODEL": {"X": 1}}), cluster_assignments={"TRAIN": {0: 2, 1: 0}}))
    path = str(tmp_path / "cluster_assignments.torch")
    with compat.disabled("shim_trusted_torch_load"):
        with pytest.raises(Exception, match="Weights only load failed"):
            ClusterAssignmentLoader.load_cluster_assigment(path)
    loaded = ClusterAssignmentLoader.load_cluster_assigment(path)
    assert loaded.cluster_assignments == {"TRAIN": {0: 2, 1: 0}} and loaded.config.MODEL.X == 1


def test_broadcast_object_single_process_is_identity():
    from classy_vision.generic import distributed_util as du
    from classy_vision.generic import util as cu

    obj = {"x": torch.ones(3)}
    assert du.broadcast_object(obj) is obj and cu.broadcast_object is du.broadcast_object


def test_flush_denormal_for_cpu_runs(monkeypatch):
    from vissl.trainer import trainer_main as tm

    def denormals_kept():
        return bool((torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() != 0.0)

    try:
        torch.set_flush_denormal(False)
        assert denormals_kept()
        assert flush_denormals_for({"MACHINE": {"DEVICE": "gpu"}}) is False and denormals_kept()
        monkeypatch.setenv(compat.SKIP_ENV, "shim_cpu_flush_denormal")
        assert flush_denormals_for({"MACHINE": {"DEVICE": "cpu"}}) is False and denormals_kept()
        monkeypatch.delenv(compat.SKIP_ENV)
        assert flush_denormals_for({"MACHINE": {"DEVICE": "cpu"}}) is True and not denormals_kept()
    finally:
        torch.set_flush_denormal(False)
    # every VISSL engine builds a SelfSupervisionTrainer in each worker: that is where it runs
    assert "flush_denormals_for" in tm.SelfSupervisionTrainer.__init__.__code__.co_names


# -- SLURM jobs of CPU runs ---------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_slurm_job_of_a_cpu_run_asks_for_no_gpus(tmp_path, monkeypatch, device):
    """VISSL's launch_distributed_on_slurm, rendered by submitit's own SLURM executor into the
    job script (nothing submitted: an `srun` stand-in on PATH, `submit` recorded): a CPU run's
    script has no GPU request, a GPU run's keeps NUM_PROC_PER_NODE per node, and the rest of the
    script is the same for both.  With the patch off the CPU run asks for GPUs (the breakage)."""
    import types

    import submitit
    from vissl.utils import distributed_launcher as dl

    from testkit import compose

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    scripts = []

    def submit(self, fn, *args, **kwargs):
        scripts.append(self._executor._make_submission_file_text("python train.py", "uid"))
        return types.SimpleNamespace(job_id="1")

    monkeypatch.setattr(submitit.AutoExecutor, "submit", submit)
    cfg = compose(["config=test/swav_plugin/quick_cpu", f"config.MACHINE.DEVICE={device}",
                   "config.DISTRIBUTED.NUM_NODES=2", "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                   "config.SLURM.USE_SLURM=true", "config.SLURM.PARTITION=part", "config.SLURM.NUM_CPU_PER_PROC=3",
                   f"config.SLURM.LOG_FOLDER={tmp_path / 'slurm'}", f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}"])
    dl.launch_distributed_on_slurm(cfg=cfg, engine_name="train")
    lines = set(scripts[-1].splitlines())
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=6",
            "#SBATCH --partition=part"} <= lines
    gpu_lines = {line for line in lines if "gpu" in line.lower() or "gres" in line.lower()}
    assert gpu_lines == ({"#SBATCH --gpus-per-node=2"} if device == "gpu" else set())
    if device == "cpu":
        with compat.disabled("shim_slurm_cpu_no_gpus"):
            dl.launch_distributed_on_slurm(cfg=cfg, engine_name="train")
        assert "#SBATCH --gpus-per-node=2" in scripts[-1].splitlines()
        assert set(scripts[-1].splitlines()) - {"#SBATCH --gpus-per-node=2"} == lines
