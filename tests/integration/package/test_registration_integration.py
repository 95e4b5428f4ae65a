"""Registration in fresh processes, Hydra config resolution, names of our own: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/package/test_registration.py``.
"""
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys
import vissl, vissl.losses, vissl.models.heads
from classy_vision.dataset.transforms import TRANSFORM_REGISTRY
from classy_vision.losses import LOSS_REGISTRY
from vissl.models.heads import MODEL_HEADS_REGISTRY
import vissl_swav_plugin
from hydra.core.plugins import Plugins
print(json.dumps({
    "registered": vissl_swav_plugin.is_registered(),
    "loss": "swav_plugin_loss" in LOSS_REGISTRY,
    "head": "swav_plugin_head" in MODEL_HEADS_REGISTRY,
    "searchpath": any("VisslSwavPluginSearchPath" in k for k in Plugins.instance().class_name_to_class),
    "vissl_losses": sorted(LOSS_REGISTRY), "vissl_heads": sorted(MODEL_HEADS_REGISTRY),
    "transforms": sorted(TRANSFORM_REGISTRY),
}))
"""


def probe(env=None, cwd=None):
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **(env or {})},
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def on(tmp_path_factory):
    """What a fresh interpreter (a spawned rank or loader worker, a launcher) has after a plain
    ``import vissl``, with nothing done by a parent."""
    return probe(cwd=tmp_path_factory.mktemp("probe"))


def test_plain_import_vissl_registers_everything(on):
    assert on["registered"] and on["loss"] and on["head"] and on["searchpath"]
    assert {"multicrop_plugin", "per_image_standardize_plugin"} <= set(on["transforms"])


def test_disable_switch_and_names_do_not_collide_with_vissl(tmp_path, on):
    off = probe(env={"VISSL_SWAV_PLUGIN_DISABLE": "1"}, cwd=tmp_path)
    assert not off["registered"] and not off["loss"] and not off["head"]
    ours_loss = set(on["vissl_losses"]) - set(off["vissl_losses"])
    ours_head = set(on["vissl_heads"]) - set(off["vissl_heads"])
    assert "multicrop_plugin" not in off["transforms"]
    assert {"swav_plugin_loss"} <= ours_loss and {"swav_plugin_head"} <= ours_head
    assert "swav_loss" in off["vissl_losses"]  # VISSL's own stays as it is
