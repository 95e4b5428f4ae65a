"""Per-image standardisation: ``multicrop_plugin``'s ``normalize: per_image``, the
``per_image_standardize_plugin`` evaluation transform, the online kNN hook's ``MIN_STD`` and
the demo's evaluation input: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/transforms/test_standardize.py``.
"""
import json
import subprocess
import sys


import vissl  # noqa: F401  (registers the plugin)


def test_registered_in_a_fresh_process(tmp_path):
    """Spawned workers and launchers import VISSL afresh: the names must be registered there
    without anything done by the parent."""
    code = ("import json, vissl\nfrom classy_vision.dataset.transforms import TRANSFORM_REGISTRY\n"
            "print(json.dumps(sorted(n for n in TRANSFORM_REGISTRY if n.endswith('_plugin'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"multicrop_plugin", "per_image_standardize_plugin"} <= set(names)
