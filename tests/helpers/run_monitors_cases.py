"""Definitions shared by ``tests/unit/hooks/test_run_monitors.py`` and its integration part."""
import importlib.util
import json
import re
import pytest
from testkit import SMALL_TRUNK, make_image_folder, train_in_process


HAVE_TB = importlib.util.find_spec("tensorboard") is not None

PROGRESS = re.compile(r"progress: epoch (\d+)/(\d+) \| iter (\d+)/(\d+) \| loss (\S+) \| lr (\S+) \| "
                      r"(\S+) it/s \| ETA (\S+)$")

#: the run of the ``run`` fixture: quick_cpu's 16 images, 4 per replica, world size 1, 2 epochs
EPOCHS, ITERS = 2, 16 // 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One quick run with the three monitors, in the test process (``testkit.train_in_process``)."""
    root = tmp_path_factory.mktemp("monitors")
    bank = make_image_folder(root / "bank", classes=2, per_class=8, size=32, seed=1)
    query = make_image_folder(root / "query", classes=2, per_class=4, size=32, seed=2)
    out = root / "ckpt"
    _, log = train_in_process(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, f"config.CHECKPOINT.DIR={out}",
                               f"config.OPTIMIZER.num_epochs={EPOCHS}", "config.HOOKS.PROGRESS.FREQUENCY=3",
                               f"config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD={HAVE_TB}",
                               "config.HOOKS.ONLINE_KNN.ENABLED=true", f"config.HOOKS.ONLINE_KNN.TRAIN_PATH={bank}",
                               f"config.HOOKS.ONLINE_KNN.TEST_PATH={query}", "config.HOOKS.ONLINE_KNN.TOPK=5"],
                              cwd=root)
    vissl_losses = [json.loads(line) for line in (out / "stdout.json").read_text().splitlines() if line.strip()]
    return dict(out=out, log=log, bank=bank, query=query, vissl=vissl_losses)
