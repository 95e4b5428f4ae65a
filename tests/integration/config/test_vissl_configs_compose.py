"""No false positive of the checks of VISSL's sections: every config VISSL ships composes
with the plugin on (the unit tests compose a sample).  In this process; about 75 s on a
2-core Intel Xeon (2026-11-25)."""
import importlib.util
import logging
from pathlib import Path

from testkit import compose

#: Detectron2's configs shipped in VISSL's tree (not VISSL configs), and the one that needs
#: the optional ``augly`` package
NOT_VISSL_RUNS = ("benchmark/object_detection/", "test/transforms/augly_transforms_example")


def test_every_vissl_config_passes_the_plugin_checks():
    from vissl_swav_plugin.config.validation import ConfigError

    root = Path(list(importlib.util.find_spec("configs").submodule_search_locations)[0]) / "config"
    names = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))
    names = [n for n in names if not n.startswith(NOT_VISSL_RUNS)]
    assert len(names) > 450
    rejected = {}
    logging.disable(logging.WARNING)
    try:
        for name in names:
            try:
                compose([f"config=vissl/{name}"])
            except ConfigError as e:
                rejected[name] = str(e)[:300]
    finally:
        logging.disable(logging.NOTSET)
    assert rejected == {}
