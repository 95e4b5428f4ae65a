#!/usr/bin/env python
"""Entry point kept for checkouts: Fashion-MNIST (IDX files) -> VISSL's ``disk_folder`` /
``disk_filelist`` layouts and a dataset catalog.  The code is
``vissl_swav_plugin.tools.fashion_mnist`` on top of the generic tool
``vissl_swav_plugin.tools.prepare_data`` (console script ``swav-plugin-prepare-data``,
which also reads MNIST-style IDX files, .npz arrays and image folders).

usage: python tools/prepare_fashion_mnist.py --out DIR [--split train,val] [--limit-per-class N]
           [--size 32] [--rgb] [--format folder,filelist] [--catalog PATH] [--name fashion_mnist]
"""
import sys

from vissl_swav_plugin.tools.fashion_mnist import *  # noqa: F401,F403  (the module's API, for importers)
from vissl_swav_plugin.tools.fashion_mnist import main

if __name__ == "__main__":
    sys.exit(main())
