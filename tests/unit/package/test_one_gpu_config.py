"""``pretrain/swav/swav_1gpu_resnet`` composes with the values of the README's scaling table
and runs 2 iterations on CPU (small images, bf16 autocast) through VISSL's stock launcher."""


from testkit import compose
from one_gpu_config_cases import CONFIG  # noqa: F401

IMAGENET_TRAIN = 1281167


def test_composes_with_scaled_recipe():
    cfg = compose([CONFIG])
    bs = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    world = cfg.DISTRIBUTED.NUM_NODES * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    lc = cfg.LOSS.swav_plugin_loss
    assert world == 1 and bs == 64
    assert lc.num_crops == 8 and list(lc.crops_for_assign) == [0, 1]
    # the official small-batch recipe (batch 256, lr 0.6, freeze one epoch) scaled to 64
    lr = cfg.OPTIMIZER.param_schedulers.lr
    assert abs(lr.start_value - 0.6 * bs / 256) < 1e-12 and abs(lr.end_value - lr.start_value / 1000) < 1e-12
    assert lc.freeze_prototypes_niters == IMAGENET_TRAIN // bs
    assert lc.queue.local_queue_length == lc.queue.queue_length == 3840
    assert lc.queue.queue_length + bs >= lc.num_prototypes[0]
    assert lc.queue.use_before_full is False
    assert cfg.MODEL.AMP_PARAMS.USE_AMP and cfg.MODEL.AMP_PARAMS.AMP_DTYPE == "float16"
    assert cfg.MACHINE.DEVICE == "gpu" and not cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN
