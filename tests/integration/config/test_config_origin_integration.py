"""Config precedence (vissl_swav_plugin/config/search_path.py): the user's working-directory
configs win, then ours, then VISSL's; VISSL's originals stay reachable as ``vissl/<name>``;
each config file Hydra loads is logged with its origin: the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/config/test_config_origin.py``.
"""
import subprocess
import sys


import vissl  # noqa: F401  (registers the plugin)
from config_origin_cases import NAME, user_config  # noqa: F401


def test_origin_line_printed_by_the_launcher_before_logging_is_set_up(tmp_path):
    """VISSL's launcher composes before it sets up logging: the line goes to stdout."""
    path = user_config(tmp_path)
    script = (f"from vissl.utils.hydra_config import compose_hydra_configuration as c; "
              f"print(c(['config={NAME}']).config.SEED_VALUE)")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"INFO vissl_swav_plugin: config {NAME} from {path.resolve()} (user working directory)" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "4242"
