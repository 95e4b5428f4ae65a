"""Entry point kept for checkouts: VISSL's ``run_distributed_engines`` with the plugin
registered explicitly first; the code is ``vissl_swav_plugin.tools.launch`` (console script
``swav-plugin-train``).

    python tools/run_distributed_engines.py config=pretrain/swav/swav_8node_resnet [overrides...]
"""
import sys

from vissl_swav_plugin.tools.launch import main

if __name__ == "__main__":
    main(sys.argv[1:])
