"""Wrong config values raise an error naming the key, before anything is started."""
import pytest

from conftest import compose

QUICK = "config=test/swav_plugin/quick_cpu"
L = "config.LOSS.swav_plugin_loss"


@pytest.mark.parametrize("override,key", [
    (f"{L}.crops_for_assign=[0,7]", "crops_for_assign"),
    (f"{L}.crops_for_assign=[1,1]", "crops_for_assign"),
    (f"{L}.epsilon=0.0", "epsilon"),
    (f"{L}.epsilon=-0.05", "epsilon"),
    (f"{L}.temperature=0", "temperature"),
    (f"{L}.num_iters=0", "num_iters"),
    (f"{L}.queue.queue_length=6", "queue.queue_length"),          # 3 per process < batch 4
    (f"{L}.queue.queue_length=15", "queue.queue_length"),         # not divisible by 2 processes
    (f"{L}.queue.start_epoch=-1", "queue.start_epoch"),
    (f"{L}.freeze_prototypes_niters=-3", "freeze_prototypes_niters"),
    ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[2048,16]}]]", "MODEL.HEAD.PARAMS"),
    ("config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,16],num_clusters:[20],use_weight_norm_prototypes:True}]]",
     "use_weight_norm_prototypes"),
    ("config.MODEL.HEAD.PARAMS=[[swav_head,{dims:[2048,16],num_clusters:[20],return_embeddings:False}]]",
     "return_embeddings"),
    (f"{L}.queue.use_before_full=1", "queue.use_before_full"),
    ("config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[2048,16],num_clusters:[0]}]]", "num_prototypes"),
    ("config.DATA.TRAIN.COLLATE_FUNCTION=default_collate", "COLLATE_FUNCTION"),
])
def test_bad_value_names_the_key(override, key):
    from vissl_swav_plugin.config_validation import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([QUICK, override])


def test_good_config_passes():
    cfg = compose([QUICK])
    assert cfg.LOSS.swav_plugin_loss.queue.local_queue_length == 8
