#!/usr/bin/env python
"""Entry point kept for checkouts: class-balanced p% label subsets of a ``disk_filelist``
dataset (console script ``swav-plugin-label-subsets``); the code is
``vissl_swav_plugin.tools.label_subsets``.

usage: python tools/make_label_subsets.py --catalog DIR/dataset_catalog.json --dataset NAME --percent 1,10
"""
import sys

from vissl_swav_plugin.tools.label_subsets import main

if __name__ == "__main__":
    sys.exit(main())
