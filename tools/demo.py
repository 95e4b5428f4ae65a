#!/usr/bin/env python
"""`make demo`: SwAV on Fashion-MNIST on a few CPU cores, end to end.

1. data      -- a class-balanced subset of Fashion-MNIST's training set is written as a
                VISSL ``disk_folder`` (ImageFolder of PNGs) by tools/prepare_fashion_mnist.py
                (reused on the next run);
2. training  -- SwAV pre-training through VISSL's launcher (tools/run_distributed_engines.py,
                a subprocess; 2 gloo processes by default) with
                config=pretrain/swav/swav_fashion_mnist_cpu; VISSL's per-iteration log lines
                are turned into one compact progress line (loss, lr, it/s, ETA), the full
                log goes to OUT/run/train_log.txt;
3. evaluation -- the final checkpoint is loaded (strictly) into the VISSL model built from
                the same config, in this process, and the trunk's ``res5avg`` features of
                the training subset (the kNN memory bank) and of the test images are
                extracted; the same is done for the randomly initialised model (same
                config, same seed); kNN top-1 (weighted cosine 20-NN / 200-NN as in Wu et
                al. 2018 and VISSL, plain Euclidean 5-NN) for SwAV features, random-init
                features and raw pixels, all on the same train / test images;
4. report    -- OUT/swav_demo_report.png (loss curve, kNN bar chart, images of the
                most-used prototypes) and OUT/swav_demo_report.json (every figure: times,
                accuracies, config).

The code is the package ``vissl_swav_plugin.demo`` (``data``, ``training``, ``evaluation``,
``report``; ``cli.main`` is the pipeline); this file is its entry point.

    python tools/demo.py                 # the full demo (about 11 min on 2 CPU cores)
    python tools/demo.py --quick         # 468 iterations on a smaller subset (the tests; 4-19 min on 2 cores)
    python tools/demo.py --help
"""
import sys

from vissl_swav_plugin.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
