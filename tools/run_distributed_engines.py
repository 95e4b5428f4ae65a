#!/usr/bin/env python
"""vissl-swav-plugin's launcher: VISSL's own ``run_distributed_engines`` with the plugin
registered explicitly first (useful where the .pth start-up hook is disabled, e.g.
``VISSL_SWAV_PLUGIN_DISABLE=1`` or a Python started with ``-S``).

    python tools/run_distributed_engines.py config=pretrain/swav/swav_8node_resnet [overrides...]

Workers started by VISSL (spawn/forkserver) register the plugin through the .pth hook;
with the hook disabled, pass ``config.MULTI_PROCESSING_METHOD=fork`` so they inherit it.
"""
import sys


def main(argv):
    import vissl_swav_plugin

    vissl_swav_plugin.register_all()
    from vissl.utils.distributed_launcher import launch_distributed, launch_distributed_on_slurm
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict
    from vissl.hooks import default_hook_generator

    cfg = compose_hydra_configuration(list(argv))
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


if __name__ == "__main__":
    main(sys.argv[1:])
