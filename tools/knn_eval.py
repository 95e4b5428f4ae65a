#!/usr/bin/env python
"""Entry point kept for checkouts: kNN evaluation (20-NN and 200-NN at once) through VISSL's
own kNN benchmark, with optional random-init and raw-pixel baselines.  The code is
``vissl_swav_plugin.tools.knn_eval`` (console script ``swav-plugin-knn``); ``--help`` lists
the options.
"""
import sys

from vissl_swav_plugin.tools.knn_eval import *  # noqa: F401,F403  (the module's API, for importers)
from vissl_swav_plugin.tools.knn_eval import main

if __name__ == "__main__":
    sys.exit(main())
