"""The plugin's command-line tools, installed as console scripts by ``pip install``.

====================================  =========================================================
console script                        module (``main(argv)``)
====================================  =========================================================
``swav-plugin-demo``                  :mod:`vissl_swav_plugin.demo.cli`: ``make demo``'s pipeline
``swav-plugin-train``                 :mod:`.launch`: VISSL's ``run_distributed_engines``, plugin registered
``swav-plugin-prepare-data``          :mod:`.prepare_data`: IDX / .npz / image folder -> VISSL
                                      ``disk_folder`` + ``disk_filelist`` + dataset catalog
``swav-plugin-mean-std``              :mod:`.mean_std`: per-channel mean/std of a dataset, as a
                                      ``+config/dataset_stats=<name>`` config
``swav-plugin-to-detectron2``         :mod:`.to_detectron2`: trunk weights for detectron2
====================================  =========================================================

In a checkout, ``tools/*.py`` are thin entry points to the same code, but for ``tools/doc_tables.py``
(the documentation's table generator: a checkout's tool, not in the wheel).  (This package is
``vissl_swav_plugin.tools``; the repository's top-level ``tools/`` is not a package: VISSL
owns that name.)
"""
