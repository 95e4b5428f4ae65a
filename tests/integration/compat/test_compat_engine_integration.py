"""The one patch engine (vissl_swav_plugin/compat/engine.py): every host patch of the plugin
is registered there, applied once per process, listed, undoable, and switchable off with
VISSL_SWAV_PLUGIN_COMPAT_SKIP; its import hook is the one the start-up .pth file arms: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/compat/test_compat_engine.py``.
"""
import json
import os
import subprocess
import sys


import vissl  # noqa: F401  (registers the plugin: every patch applied)
from vissl_swav_plugin import compat


SKIP_PROBE = r"""
import json, logging, sys
import vissl
import vissl.hooks as vh
from vissl.data.ssl_transforms import rand_auto_aug as raa
from vissl.utils import checkpoint as vc
from vissl_swav_plugin import compat, is_registered
print(json.dumps({"registered": is_registered(), "applied": compat.applied(), "names": compat.names(),
                  "hooks": compat.patched_by(vh.add_loss_hooks), "posterize": compat.patched_by(raa.posterize),
                  "writer": compat.patched_by(vc.CheckpointWriter._save),
                  "loader": compat.patched_by(vc.load_checkpoint)}))
"""


def _probe(skip):
    env = {**os.environ, compat.SKIP_ENV: skip}
    proc = subprocess.run([sys.executable, "-c", SKIP_PROBE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_skip_switch_leaves_named_patches_out_in_a_fresh_process():
    skip = ["plugin_loss_hooks", "shim_pillow13_posterize", "shim_atomic_checkpoints"]
    r, err = _probe(",".join(skip + ["shim_typo_here"]))
    assert r["registered"] and r["names"] == compat.names()
    assert r["applied"] == [n for n in compat.names() if n not in skip]
    assert r["hooks"] is None and r["posterize"] is None and r["writer"] is None
    assert r["loader"] == "shim_checkpoint_load_errors"  # the other checkpoint patch stays
    warning = [line for line in err.splitlines() if "shim_typo_here" in line]
    assert warning and "shim_pillow13_posterize" in warning[0], err[-3000:]


def test_start_up_hook_is_the_engines_and_imports_nothing_heavy():
    code = ("import sys; from vissl_swav_plugin.compat import engine; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vissl', 'numpy', 'classy_vision'))); "
            "print([type(f).__name__ for f in sys.meta_path].count('AfterImport'), sorted(engine._finder.callbacks))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, hook = proc.stdout.strip().splitlines()
    assert heavy == "[]" and hook == "1 ['vissl', 'vissl_swav_plugin.*']", proc.stdout
    # one finder for the whole process: the plugin's own after-import callbacks share it
    assert [type(f).__name__ for f in sys.meta_path].count("AfterImport") == 1
