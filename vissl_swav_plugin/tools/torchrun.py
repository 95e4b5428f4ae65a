"""One training process of a run started by ``torchrun`` (PyTorch's elastic launcher,
``python -m torch.distributed.run``): the process group meets through torchrun's ``env://``
rendezvous (``MASTER_ADDR`` / ``MASTER_PORT``), and the process runs VISSL's per-process
engine (``_distributed_worker``, what VISSL's launcher runs in each process it spawns).

    torchrun --nproc_per_node=2 -m vissl_swav_plugin.tools.torchrun config=test/swav_plugin/quick_cpu
    torchrun --nnodes=8 --node_rank=<0..7> --nproc_per_node=8 --rdzv_endpoint=<host of node 0>:29500 \\
        -m vissl_swav_plugin.tools.torchrun config=pretrain/swav/swav_8node_resnet

What it does in each process, before any process group exists:

* reads torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK`` (:func:`torchrun_layout`); outside torchrun it stops, saying so;
* composes the config as ``swav-plugin-train`` does and checks that its
  ``DISTRIBUTED.NUM_NODES`` x ``DISTRIBUTED.NUM_PROC_PER_NODE`` is torchrun's layout
  (the per-replica batch, the learning rate, the queue and the Sinkhorn all depend on the
  world size, so a mismatch is an error naming both, not a silent change of the run);
  ``DISTRIBUTED.INIT_METHOD`` / ``RUN_ID`` become ``env`` / torchrun's endpoint
  (:func:`apply_layout`);
* runs the run-wide launch checks
  (:func:`~vissl_swav_plugin.config.registries.run_launch_checks`).  Every rank runs them:
  torchrun's agent, not our code, is the launching process, and a check that failed in
  rank 0 only would leave the ranks of the other nodes waiting in the rendezvous until it
  times out; the checks depend only on the config and the (shared) data paths, so every
  rank reaches the same verdict and every node's agent sees the failure at once.
"""
import logging
import os
import sys

USAGE = """usage: torchrun [torchrun options] -m vissl_swav_plugin.tools.torchrun config=<config name> [overrides ...]

One process of a VISSL run started by torchrun (env:// rendezvous).  The config's
DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE must equal torchrun's --nnodes x --nproc_per_node.
Examples:
  torchrun --nproc_per_node=2 -m vissl_swav_plugin.tools.torchrun config=test/swav_plugin/quick_cpu
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv_endpoint=node0:29500 \\
      -m vissl_swav_plugin.tools.torchrun config=pretrain/swav/swav_8node_resnet config.DISTRIBUTED.NUM_NODES=2"""

#: the variables torchrun sets in every process it starts
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


class NotUnderTorchrun(RuntimeError):
    """The process was not started by torchrun (its variables are missing or inconsistent)."""


def torchrun_layout(env) -> dict:
    """The run's layout from torchrun's environment variables.

    Args:
        env: a mapping such as ``os.environ``.
    Returns:
        ``{"rank", "local_rank", "world_size", "nproc_per_node", "num_nodes", "node_rank",
        "master"}`` (``master`` is ``"<MASTER_ADDR>:<MASTER_PORT>"``).
    Raises:
        NotUnderTorchrun: a variable is missing or not an integer, or the ranks do not add up
            (nodes with different ``--nproc_per_node``: VISSL numbers ranks
            ``node x NUM_PROC_PER_NODE + local rank``).
    """
    missing = [v for v in TORCHRUN_VARS if v not in env]
    if missing:
        raise NotUnderTorchrun(
            f"environment variable(s) {', '.join(missing)} not set: start this module with torchrun, e.g. "
            "torchrun --nproc_per_node=2 -m vissl_swav_plugin.tools.torchrun config=...; "
            "without torchrun use swav-plugin-train")
    ints = {}
    for v in TORCHRUN_VARS[:5]:
        try:
            ints[v] = int(env[v])
        except ValueError:
            raise NotUnderTorchrun(f"environment variable {v}={env[v]!r} is not an integer") from None
    world, nproc, node, local, rank = (ints["WORLD_SIZE"], ints["LOCAL_WORLD_SIZE"], ints["GROUP_RANK"],
                                       ints["LOCAL_RANK"], ints["RANK"])
    if nproc < 1 or world % nproc or not 0 <= local < nproc or rank != node * nproc + local:
        raise NotUnderTorchrun(
            f"torchrun's ranks do not fit one process count per node: RANK={rank}, GROUP_RANK={node}, "
            f"LOCAL_RANK={local}, LOCAL_WORLD_SIZE={nproc}, WORLD_SIZE={world}; VISSL needs every node to run "
            "the same --nproc_per_node (rank = node x processes per node + local rank)")
    return {"rank": rank, "local_rank": local, "world_size": world, "nproc_per_node": nproc,
            "num_nodes": world // nproc, "node_rank": node, "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"}


def apply_layout(cfg, layout) -> None:
    """Check the config's world against torchrun's and switch its rendezvous to ``env://``.

    Args:
        cfg: the composed VISSL config (AttrDict), changed in place.
        layout: :func:`torchrun_layout`'s result.
    Raises:
        ConfigError: ``DISTRIBUTED.NUM_NODES`` / ``NUM_PROC_PER_NODE`` differ from torchrun's
            ``--nnodes`` / ``--nproc_per_node``; ``COPY_TO_LOCAL_DISK`` is on (VISSL's
            launcher copies once per node, which no process of a torchrun run does).
    """
    from vissl_swav_plugin.config.checkers import ConfigError

    d = cfg.DISTRIBUTED
    if (d.NUM_NODES, d.NUM_PROC_PER_NODE) != (layout["num_nodes"], layout["nproc_per_node"]):
        raise ConfigError(
            f"config.DISTRIBUTED.NUM_NODES={d.NUM_NODES} x config.DISTRIBUTED.NUM_PROC_PER_NODE="
            f"{d.NUM_PROC_PER_NODE} ({d.NUM_NODES * d.NUM_PROC_PER_NODE} processes) but torchrun started "
            f"{layout['num_nodes']} node(s) x {layout['nproc_per_node']} processes ({layout['world_size']}): "
            f"start torchrun with --nnodes={d.NUM_NODES} --nproc_per_node={d.NUM_PROC_PER_NODE}, or pass "
            f"config.DISTRIBUTED.NUM_NODES={layout['num_nodes']} "
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE={layout['nproc_per_node']} (the batch, learning rate and "
            "queue of the config are set for its own process count)")
    for split in ("TRAIN", "TEST"):
        if (cfg.DATA.get(split) or {}).get("COPY_TO_LOCAL_DISK", False):
            raise ConfigError(
                f"config.DATA.{split}.COPY_TO_LOCAL_DISK=True is not supported under torchrun (VISSL's "
                "launcher copies the data once per node); copy it beforehand or use swav-plugin-train")
    if cfg.MACHINE.DEVICE == "gpu":
        import torch

        if layout["nproc_per_node"] > torch.cuda.device_count():
            raise ConfigError(
                f"torchrun --nproc_per_node={layout['nproc_per_node']} with config.MACHINE.DEVICE=gpu but this "
                f"node has {torch.cuda.device_count()} GPU(s); use at most that many processes per node, or "
                "config.MACHINE.DEVICE=cpu config.DISTRIBUTED.BACKEND=gloo")
    if (d.INIT_METHOD, d.RUN_ID) != ("env", "") and layout["rank"] == 0:
        logging.info(f"torchrun: config.DISTRIBUTED.INIT_METHOD={d.INIT_METHOD} RUN_ID={d.RUN_ID} replaced by "
                     f"torchrun's env:// rendezvous ({layout['master']})")
    d.INIT_METHOD, d.RUN_ID = "env", ""


def main(argv=None):
    """Run one process of a torchrun-started VISSL run (see the module docstring).

    Args:
        argv: the overrides (default ``sys.argv[1:]``); ``-h`` / ``--help`` prints the usage.
    Returns:
        0 (errors raise: torchrun reports the failed rank and stops the others).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    layout = torchrun_layout(os.environ)
    import vissl_swav_plugin

    vissl_swav_plugin.register_all()
    from vissl.hooks import default_hook_generator
    from vissl.utils import distributed_launcher as dl
    from vissl.utils.checkpoint import get_checkpoint_folder, get_resume_checkpoint, is_training_finished
    from vissl.utils.env import set_env_vars
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict
    from vissl.utils.logger import setup_logging

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.registries import run_launch_checks

    args, cfg = convert_to_attrdict(compose_hydra_configuration(argv), dump_config=layout["rank"] == 0)
    apply_layout(cfg, layout)
    if args.node_id not in (0, layout["node_rank"]):
        raise ConfigError(f"node_id={args.node_id} but torchrun gave this node GROUP_RANK={layout['node_rank']}: "
                          "under torchrun the node index comes from torchrun --node_rank; drop node_id=")
    run_launch_checks(cfg)  # every rank, before the process group: see the module docstring

    setup_logging(__name__)
    node, local = layout["node_rank"], layout["local_rank"]
    set_env_vars(local_rank=local, node_id=node, cfg=cfg)
    folder = get_checkpoint_folder(cfg)
    if is_training_finished(cfg, checkpoint_folder=folder):
        logging.info(f"Training already succeeded in {folder}, exiting.")
        return 0
    link = f"{folder}/checkpoint.torch"
    from iopath.common.file_io import g_pathmgr

    if cfg.CHECKPOINT.USE_SYMLINK_CHECKPOINT_FOR_RESUME and g_pathmgr.exists(link):
        checkpoint = link
    else:
        checkpoint = get_resume_checkpoint(cfg, checkpoint_folder=folder)
    params = cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE
    if checkpoint is None and params and not g_pathmgr.exists(params):
        raise ConfigError(f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={params} does not exist")
    dl._distributed_worker(local, cfg, node, "", args.engine_name, checkpoint, folder, default_hook_generator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
