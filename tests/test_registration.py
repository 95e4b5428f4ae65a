"""Registration in fresh processes, Hydra config resolution, names of our own."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, compose

PROBE = r"""
import json, os, sys
import vissl, vissl.losses, vissl.models.heads
from classy_vision.losses import LOSS_REGISTRY
from vissl.models.heads import MODEL_HEADS_REGISTRY
import vissl_swav_plugin
from hydra.core.plugins import Plugins
print(json.dumps({
    "registered": vissl_swav_plugin.is_registered(),
    "loss": "swav_plugin_loss" in LOSS_REGISTRY,
    "head": "swav_plugin_head" in MODEL_HEADS_REGISTRY,
    "searchpath": any("VisslSwavPluginSearchPath" in k for k in Plugins.instance().class_name_to_class),
    "vissl_losses": sorted(LOSS_REGISTRY), "vissl_heads": sorted(MODEL_HEADS_REGISTRY),
}))
"""


def probe(env=None, cwd=None):
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **(env or {})},
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_import_vissl_registers_everything(tmp_path):
    r = probe(cwd=tmp_path)
    assert r["registered"] and r["loss"] and r["head"] and r["searchpath"]


def test_disable_switch_and_names_do_not_collide_with_vissl(tmp_path):
    off = probe(env={"VISSL_SWAV_PLUGIN_DISABLE": "1"}, cwd=tmp_path)
    assert not off["registered"] and not off["loss"] and not off["head"]
    on = probe(cwd=tmp_path)
    ours_loss = set(on["vissl_losses"]) - set(off["vissl_losses"])
    ours_head = set(on["vissl_heads"]) - set(off["vissl_heads"])
    assert {"swav_plugin_loss"} <= ours_loss and {"swav_plugin_head"} <= ours_head
    assert "swav_loss" in off["vissl_losses"]  # VISSL's own stays as it is


def test_duplicate_registration_raises():
    import vissl  # noqa: F401
    from vissl.models.heads import register_model_head

    with pytest.raises(ValueError):
        register_model_head("swav_plugin_head")(object)


def test_register_all_is_idempotent():
    import vissl_swav_plugin

    vissl_swav_plugin.register_all()
    vissl_swav_plugin.register_all()
    assert vissl_swav_plugin.is_registered()


def test_our_config_wins_over_vissls_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: the search path plugin must find it
    cfg = compose(["config=pretrain/swav/swav_8node_resnet"])
    lc = cfg.LOSS.swav_plugin_loss
    assert cfg.LOSS.name == "swav_plugin_loss"
    assert cfg.MODEL.HEAD.PARAMS[0][0] == "swav_plugin_head"
    # the paper's hyper-parameters (appendix A.1)
    assert (lc.epsilon, lc.num_iters, lc.temperature) == (0.05, 3, 0.1)
    assert lc.num_prototypes == [3000] and lc.embedding_dim == 128 and lc.num_crops == 8
    assert lc.freeze_prototypes_niters == 313
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    assert world * cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 4096
    opt = cfg.OPTIMIZER
    assert opt.use_larc and opt.weight_decay == 1e-6 and opt.num_epochs == 800
    sched = opt.param_schedulers.lr.schedulers
    assert sched[0]["end_value"] == 4.8 and sched[1]["end_value"] == 0.0048
    assert opt.param_schedulers.lr.lengths[0] * 800 == pytest.approx(10)  # 10 warm-up epochs


def test_small_batch_config_queue_inferred(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose(["config=pretrain/swav/swav_1node_resnet_queue"])
    q = cfg.LOSS.swav_plugin_loss.queue
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    assert world * cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 256
    assert q.queue_length == 3840 and q.start_epoch == 15 and q.local_queue_length == 3840 // world
