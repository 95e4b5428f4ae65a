"""Registration in fresh processes, Hydra config resolution, names of our own: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/package/test_registration.py``.
"""
import json
import os
import subprocess
import sys


PROBE = r"""
import json, os, sys
import vissl, vissl.losses, vissl.models.heads
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
}))
"""


def probe(env=None, cwd=None):
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **(env or {})},
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_import_vissl_registers_everything(tmp_path):
    r = probe(cwd=tmp_path)
    assert r["registered"] and r["loss"] and r["head"] and r["searchpath"]


def test_disable_switch_and_names_do_not_collide_with_vissl(tmp_path):
    off = probe(env={"VISSL_SWAV_PLUGIN_DISABLE": "1"}, cwd=tmp_path)
    assert not off["registered"] and not off["loss"] and not off["head"]
    on = probe(cwd=tmp_path)
    ours_loss = set(on["vissl_losses"]) - set(off["vissl_losses"])
    ours_head = set(on["vissl_heads"]) - set(off["vissl_heads"])
    assert {"swav_plugin_loss"} <= ours_loss and {"swav_plugin_head"} <= ours_head
    assert "swav_loss" in off["vissl_losses"]  # VISSL's own stays as it is
