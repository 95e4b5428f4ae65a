"""Every module of the package imports first in a fresh interpreter (before ``vissl``,
in any order), and the plugin is registered once VISSL is imported."""
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


import vissl_swav_plugin

MODULES = sorted(m.name for m in pkgutil.walk_packages(vissl_swav_plugin.__path__, "vissl_swav_plugin."))

CHECK = """
import importlib, sys
importlib.import_module(sys.argv[1])
import vissl
from vissl.models.heads import MODEL_HEADS_REGISTRY
from classy_vision.losses import LOSS_REGISTRY
import vissl_swav_plugin as p
assert p.is_registered(), "not registered"
assert "swav_plugin_head" in MODEL_HEADS_REGISTRY and "swav_plugin_loss" in LOSS_REGISTRY
print("OK", sys.argv[1])
"""


def _import_first(module):
    return subprocess.run([sys.executable, "-W", "ignore", "-c", CHECK, module], capture_output=True,
                          text=True, timeout=3600)  # a hang bound, not speed


def test_every_module_imports_first_in_a_fresh_interpreter():
    assert "vissl_swav_plugin.models.heads" in MODULES and len(MODULES) > 10
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(MODULES, pool.map(_import_first, MODULES)))
    failed = {m: (r.stdout + r.stderr).strip().splitlines()[-1:] for m, r in results.items()
              if r.returncode != 0}
    assert not failed, failed
