"""`make demo`: SwAV on Fashion-MNIST on a few CPU cores, end to end.

The pipeline (:func:`vissl_swav_plugin.demo.cli.main`, run by ``tools/demo.py``):

1. data       (:mod:`.data`) -- a class-balanced subset of Fashion-MNIST's training set is
               written as a VISSL ``disk_folder`` (ImageFolder of PNGs) by
               tools/prepare_fashion_mnist.py (reused on the next run);
2. training   (:mod:`.training`) -- SwAV pre-training through VISSL's launcher
               (tools/run_distributed_engines.py, a subprocess; 2 gloo processes by default)
               with config=pretrain/swav/swav_fashion_mnist_cpu; VISSL's per-iteration log
               lines are turned into one compact progress line (loss, lr, it/s, ETA), the
               full log goes to OUT/run/train_log.txt;
3. evaluation (:mod:`.evaluation`) -- the final checkpoint is loaded (strictly) into the
               VISSL model built from the same config, in this process, and the trunk's
               ``res5avg`` features of the training subset (the kNN memory bank) and of the
               test images are extracted; the same is done for randomly initialised models
               (same config); kNN top-1 (weighted cosine 20-NN / 200-NN as in Wu et al. 2018
               and VISSL, plain Euclidean 5-NN, :mod:`vissl_swav_plugin.utils.knn`) for SwAV
               features, random-init features and raw pixels, on the same images;
4. report     (:mod:`.report`) -- OUT/swav_demo_report.png (loss curve, kNN bar chart,
               images of the most-used prototypes) and OUT/swav_demo_report.json (every
               figure: times, accuracies, config).

Importing this package (or any of its modules) is cheap: torch, VISSL, numpy and
matplotlib are imported only by the functions that need them.  The demo runs from a
checkout (``python tools/demo.py``, ``make demo``: outputs in the checkout's
``demo_output/`` and ``data/``) or from an installed wheel (``swav-plugin-demo``: outputs in
the working directory); it starts ``python -m vissl_swav_plugin.tools.launch`` (the code
of ``tools/run_distributed_engines.py``) and uses ``vissl_swav_plugin.tools.fashion_mnist``.

Example::

    python tools/demo.py --quick          # or: from vissl_swav_plugin.demo import main; main(["--quick"])
"""
from .common import DemoError
from .cli import main

__all__ = ["DemoError", "main"]
