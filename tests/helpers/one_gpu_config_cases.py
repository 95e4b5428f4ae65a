"""Definitions shared by ``tests/unit/package/test_one_gpu_config.py`` and its integration part."""


CONFIG = "config=pretrain/swav/swav_1gpu_resnet"
