#!/usr/bin/env python
"""Entry point kept for checkouts: the code is ``vissl_swav_plugin.tools.to_detectron2``
(installed as the console script ``swav-plugin-to-detectron2``).

    python tools/convert_to_detectron2.py CKPT OUT.pkl [--torchvision OUT_TV.pth] [--help]
"""
import sys

from vissl_swav_plugin.tools.to_detectron2 import *  # noqa: F401,F403  (the module's API, for importers)
from vissl_swav_plugin.tools.to_detectron2 import main

if __name__ == "__main__":
    sys.exit(main())
