#!/usr/bin/env python
"""Entry point kept for checkouts: Animal-MNIST and scikit-learn's digits (upscaled to 28x28) as
MNIST-layout IDX files for ``tools/demo.py --source``; the code is
``vissl_swav_plugin.tools.small_sets``.

usage: python tools/make_small_sets.py --out DIR [--set animal_mnist|digits] [--seed 0] [--animal-mnist WHEEL]
"""
import sys

from vissl_swav_plugin.tools.small_sets import main

if __name__ == "__main__":
    sys.exit(main())
