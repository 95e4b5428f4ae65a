"""The evaluation suite (issue 3, item 5) on a checkpoint of ours, end to end on CPU, through
VISSL's own tools and our configs in configs/config/benchmark/swav_plugin/:

* linear classification on frozen features (VISSL's launcher, 2 processes),
* kNN 20-NN and 200-NN (tools/knn_eval.py = VISSL's extract engine + VISSL's kNN, 2 processes),
* low-shot linear SVMs (VISSL's tools/train_svm_low_shot.py, 2 processes),
* semi-supervised fine-tuning with 1% (2 processes) and 10% (1 process) of the labels,
* conversion of the trunk to detectron2 / torchvision names (tools/convert_to_detectron2.py).

The checkpoint is made once per module by a short real SwAV run (our quick_cpu config,
resnet_small_plugin of width 8, Fashion-MNIST 28 px).  Truths checked against: the checkpoint
itself (frozen / initial trunk weights, features recomputed in this process), a kNN and an
AP written here from the definitions, the learning-rate schedule in closed form, and
torchvision's ResNets (strict load + same features).
"""

import numpy as np
import pytest

from testkit import compose
from vissl_swav_plugin.config.yaml_files import shipped_config_names
from eval_suite_cases import (FMNIST, PER_CLASS, TRUNK, _tool, _trunk_of, suite,)  # noqa: F401  (fixtures and cases shared with the unit part)

#: the stems of the plugin's benchmark configs (``config=benchmark/swav_plugin/<stem>``; the group has no subfolders)
BENCH = [n.rsplit("/", 1)[-1] for n in shipped_config_names("benchmark/swav_plugin/")]


# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BENCH)
def test_every_benchmark_config_composes(name, tmp_path):
    cfg = compose([f"config=benchmark/swav_plugin/{name}", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert cfg.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME == "classy_state_dict"
    assert cfg.MACHINE.DEVICE == ("cpu" if name.endswith("_cpu") else "gpu")


@pytest.mark.parametrize("name", [n for n in BENCH if n.endswith("_fashion_mnist_cpu")])
def test_fashion_mnist_benchmarks_build_the_demo_trunk(name, tmp_path):
    """Each Fashion-MNIST benchmark config defaults to the trunk that `make demo` trains
    (pretrain/swav/swav_fashion_mnist_cpu): the demo's checkpoint loads strictly into the
    model the benchmark builds, with no trunk override."""
    from vissl_swav_plugin.models.trunks import resolve_params

    demo = compose(["config=pretrain/swav/swav_fashion_mnist_cpu", f"config.CHECKPOINT.DIR={tmp_path}"])
    bench = compose([f"config=benchmark/swav_plugin/{name}", f"config.CHECKPOINT.DIR={tmp_path}"])
    assert bench.MODEL.TRUNK.NAME == demo.MODEL.TRUNK.NAME

    def shape(model_cfg):  # what the weights depend on (not their memory format)
        p = resolve_params(model_cfg)
        return {k: p[k] for k in ("LAYERS", "WIDTH", "STEM", "NORM")}

    assert shape(bench.MODEL) == shape(demo.MODEL)


@pytest.mark.parametrize("pct,trunk_lr,head_lr", [(1, 0.02, 5.0), (10, 0.01, 0.2)])
@pytest.mark.parametrize("data", ["fashion_mnist_cpu", "in1k_resnet50"])
def test_semi_sup_configs_have_the_papers_hyper_parameters(pct, trunk_lr, head_lr, data, tmp_path):
    cfg = compose([f"config=benchmark/swav_plugin/semi_sup_{pct}pct_{data}", f"config.CHECKPOINT.DIR={tmp_path}"])
    opt = cfg.OPTIMIZER
    assert opt.num_epochs == 20 and opt.weight_decay == 0 and opt.momentum == 0.9
    assert opt.head_optimizer_params.use_different_lr and opt.head_optimizer_params.weight_decay == 0
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * world == 256
    for sched, base in ((opt.param_schedulers.lr, trunk_lr), (opt.param_schedulers.lr_head, head_lr)):
        assert sched.name == "multistep" and list(sched.milestones) == [12, 16]
        assert list(sched["values"]) == pytest.approx([base, base * 0.2, base * 0.04])
    assert cfg.DATA.TRAIN.DATASET_NAMES[0].endswith(f"per{pct:02d}")


def test_label_subsets_are_balanced_seeded_and_nested(tmp_path):
    from vissl_swav_plugin.tools import label_subsets as mls

    labels = np.repeat(np.arange(4), [300, 200, 100, 37])
    a = mls.select_subsets(labels, [1, 10], seed=3)
    b = mls.select_subsets(labels, [1, 10], seed=3)
    assert all(np.array_equal(a[p], b[p]) for p in (1, 10))
    assert np.bincount(labels[a[1]]).tolist() == [3, 2, 1, 1]  # max(1, round(1% of n_c))
    assert np.bincount(labels[a[10]]).tolist() == [30, 20, 10, 4]
    assert set(a[1]) <= set(a[10])
    assert not np.array_equal(a[10], mls.select_subsets(labels, [10], seed=4)[10])
    assert mls.percent_tag(1) == "per01" and mls.percent_tag(10) == "per10"


# ------------------------------------------------------------------------------------------
# the shim the low-shot SVM tool needs (compat.numpy2.shim_svm_low_shot_mean_ap_scalar)
# ------------------------------------------------------------------------------------------
def test_low_shot_trainer_stores_mean_ap_as_numpy_before_2_4_did():
    import vissl  # noqa: F401
    from vissl.utils.svm_utils import svm_low_shot_trainer as lst

    mean_ap = np.mean(np.array([[0.25], [0.75]]), axis=0)  # what SVMLowShotTrainer.test stores
    plain = np.zeros((1, 3))
    if tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4):
        with pytest.raises((ValueError, TypeError)):
            plain[0][1] = mean_ap  # the breakage: NumPy >= 2.4 refuses a size-1 array here
    m = lst.np.zeros((1, 3))  # the module's numpy, as patched by compat
    m[0][1] = mean_ap
    assert m.tolist() == [[0.0, 0.5, 0.0]]
    with pytest.raises(ValueError):
        m[0][1] = np.array([1.0, 2.0])  # anything else behaves as in NumPy
    assert lst.np.mean is np.mean and lst.np.linspace is np.linspace
