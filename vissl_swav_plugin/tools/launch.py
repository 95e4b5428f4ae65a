"""``swav-plugin-train`` (also ``python tools/run_distributed_engines.py``): VISSL's own
``run_distributed_engines`` with the plugin registered explicitly first (useful where the
.pth start-up hook is disabled, e.g. ``VISSL_SWAV_PLUGIN_DISABLE=1`` or a Python started
with ``-S``).

    swav-plugin-train config=pretrain/swav/swav_8node_resnet [overrides...]

Workers started by VISSL (spawn/forkserver) register the plugin through the .pth hook;
with the hook disabled, pass ``config.MULTI_PROCESSING_METHOD=fork`` so they inherit it.
"""
import sys

USAGE = """usage: swav-plugin-train config=<config name> [VISSL/Hydra overrides ...]

Train (or extract features, ...) with VISSL's engine and the plugin's components, as
VISSL's tools/run_distributed_engines.py does.  Examples:
  swav-plugin-train config=test/swav_plugin/quick_cpu config.CHECKPOINT.DIR=/tmp/swav_cpu
  swav-plugin-train config=pretrain/swav/swav_fashion_mnist_cpu config.DATA.TRAIN.DATA_PATHS=[data/fm/train]
Configs: ./configs/config/<name>.yaml first, then the plugin's, then VISSL's
(VISSL's own of a shadowed name: config=vissl/<name>)."""


def main(argv=None):
    """Compose the config from ``argv`` (Hydra overrides) and launch VISSL's engine.

    Args:
        argv: the overrides (default ``sys.argv[1:]``); ``-h`` / ``--help`` prints the usage.

    Returns:
        0 (VISSL raises on failure).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    import vissl_swav_plugin

    vissl_swav_plugin.register_all()
    from vissl.utils.distributed_launcher import launch_distributed, launch_distributed_on_slurm
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict
    from vissl.hooks import default_hook_generator

    cfg = compose_hydra_configuration(argv)
    args, config = convert_to_attrdict(cfg)
    if config.SLURM.USE_SLURM:
        launch_distributed_on_slurm(engine_name=args.engine_name, cfg=config)
    else:
        launch_distributed(
            cfg=config,
            node_id=args.node_id,
            engine_name=args.engine_name,
            hook_generator=default_hook_generator,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
