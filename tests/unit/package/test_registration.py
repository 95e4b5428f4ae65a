"""Registration in fresh processes, Hydra config resolution, names of our own."""

import pytest

from testkit import compose


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
