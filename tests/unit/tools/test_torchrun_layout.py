"""``vissl_swav_plugin.tools.torchrun``: torchrun's environment -> the run's layout, and the
config's world against it.  The truth for the rank arithmetic is torchrun's own numbering
(homogeneous nodes: RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK) and VISSL's
(``dist_rank = NUM_PROC_PER_NODE x node_id + local_rank``, vissl/utils/env.py)."""
import itertools

import pytest

from testkit import compose
from vissl_swav_plugin.config.checkers import ConfigError
from vissl_swav_plugin.tools.torchrun import NotUnderTorchrun, apply_layout, torchrun_layout


def quick(nnodes, nproc, *extra):
    """The tiny CPU config on ``nnodes`` x ``nproc`` processes (no queue: it must hold a batch per process)."""
    return compose(["config=test/swav_plugin/quick_cpu", f"config.DISTRIBUTED.NUM_NODES={nnodes}",
                    f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}", "config.LOSS.swav_plugin_loss.queue.queue_length=0",
                    *extra])


def torchrun_env(nnodes, nproc, node, local, **extra):
    env = {"RANK": str(node * nproc + local), "LOCAL_RANK": str(local), "WORLD_SIZE": str(nnodes * nproc),
           "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node), "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    env.update(extra)
    return env


@pytest.mark.parametrize("nnodes,nproc", [(1, 1), (1, 2), (2, 1), (2, 8), (8, 8)])
def test_every_process_of_a_layout_gets_vissls_rank(nnodes, nproc):
    from vissl.utils.env import set_env_vars
    import os

    seen = set()
    cfg = quick(nnodes, nproc)
    for node, local in itertools.product(range(nnodes), range(nproc)):
        lay = torchrun_layout(torchrun_env(nnodes, nproc, node, local))
        assert (lay["num_nodes"], lay["nproc_per_node"], lay["world_size"]) == (nnodes, nproc, nnodes * nproc)
        assert lay["master"] == "node0:29500"
        saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        try:
            set_env_vars(local_rank=lay["local_rank"], node_id=lay["node_rank"], cfg=cfg)
            assert int(os.environ["RANK"]) == lay["rank"]  # VISSL's numbering = torchrun's
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        seen.add(lay["rank"])
    assert seen == set(range(nnodes * nproc))


@pytest.mark.parametrize("missing", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "MASTER_ADDR", "MASTER_PORT"])
def test_outside_torchrun_it_says_so(missing):
    env = torchrun_env(1, 2, 0, 1)
    del env[missing]
    with pytest.raises(NotUnderTorchrun, match=f"{missing}.*torchrun"):
        torchrun_layout(env)


@pytest.mark.parametrize("extra", [{"RANK": "3"}, {"WORLD_SIZE": "3"}, {"LOCAL_RANK": "2"}, {"RANK": "x"}])
def test_ranks_that_do_not_add_up_are_refused(extra):
    with pytest.raises(NotUnderTorchrun):
        torchrun_layout(torchrun_env(1, 2, 0, 1, **extra))


@pytest.mark.parametrize("cfg_world,run_world", [((1, 2), (1, 1)), ((1, 2), (2, 2)), ((8, 8), (1, 8)),
                                                 ((2, 1), (1, 2))])
def test_a_config_world_other_than_torchruns_names_both(cfg_world, run_world):
    cfg = quick(*cfg_world)
    lay = torchrun_layout(torchrun_env(*run_world, 0, 0))
    with pytest.raises(ConfigError) as e:
        apply_layout(cfg, lay)
    msg = str(e.value)
    assert f"config.DISTRIBUTED.NUM_PROC_PER_NODE={cfg_world[1]}" in msg
    assert f"--nnodes={cfg_world[0]} --nproc_per_node={cfg_world[1]}" in msg
    assert f"config.DISTRIBUTED.NUM_NODES={run_world[0]} config.DISTRIBUTED.NUM_PROC_PER_NODE={run_world[1]}" in msg


@pytest.mark.parametrize("world", [(1, 2), (2, 1), (4, 2)])
def test_a_matching_config_gets_the_env_rendezvous(world):
    cfg = quick(*world)
    assert cfg.DISTRIBUTED.INIT_METHOD == "tcp"
    apply_layout(cfg, torchrun_layout(torchrun_env(*world, 0, 0)))
    # what VISSL's trainer builds: f"{INIT_METHOD}://{dist_run_id}" with the worker's run id ""
    assert f"{cfg.DISTRIBUTED.INIT_METHOD}://" == "env://" and cfg.DISTRIBUTED.RUN_ID == ""


def test_copy_to_local_disk_is_refused_not_ignored():
    cfg = quick(1, 2, "config.DATA.TRAIN.COPY_TO_LOCAL_DISK=True")
    with pytest.raises(ConfigError, match="COPY_TO_LOCAL_DISK"):
        apply_layout(cfg, torchrun_layout(torchrun_env(1, 2, 0, 0)))
