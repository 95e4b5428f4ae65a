"""Every module of the package imports first (before ``vissl``, in any order), and the plugin
is registered once VISSL is imported.

"First" means first among the plugin, VISSL, Classy Vision and VISSL's top-level packages
(``tools``, ``configs``, ``hydra_plugins``): the modules the plugin's start-up hook watches or
patches.  Each module is imported in its own process, forked from a driver interpreter that
has imported only the third-party libraries below (torch, NumPy, Hydra, ...), none of which
the hook watches; a fork saves the ~4 s of importing them again per module.  The driver checks
first that none of the watched packages is imported in it.  One driver checks every module and a
planted package whose first import fails (a circular import), which it must report: one
interpreter's start-up for both tests, as the two cores are busy for the whole suite.
"""
import pkgutil
import subprocess
import sys

import pytest

import vissl_swav_plugin
from testkit import HANG_S, launcher_env

MODULES = sorted(m.name for m in pkgutil.walk_packages(vissl_swav_plugin.__path__, "vissl_swav_plugin."))

# third-party libraries (and the submodules of them) that VISSL and the plugin import: none is
# watched by the plugin's hook; each one preloaded is not imported again in every fork
PRELOAD = ["numpy", "torch", "torchvision", "PIL", "scipy", "sklearn", "yaml", "omegaconf", "hydra",
           "fvcore", "iopath", "fairscale", "tabulate", "pkg_resources", "tensorboard", "sympy",
           "torch.utils.tensorboard", "fsspec", "absl.flags", "termcolor", "PIL.ImageFile",
           "fvcore.common.checkpoint", "fvcore.common.param_scheduler", "fvcore.nn",
           "hydra.experimental", "hydra._internal.config_loader_impl",
           *(f"hydra._internal.core_plugins.{m}" for m in (
               "basic_launcher", "basic_sweeper", "file_config_source", "importlib_resources_config_source",
               "structured_config_source", "bash_completion", "fish_completion", "zsh_completion")),
           "torchvision.datasets.samplers", "torchvision.transforms._functional_video",
           "torchvision.transforms._transforms_video"]
WATCHED = ("vissl", "vissl_swav_plugin", "classy_vision", "tools", "configs", "hydra_plugins")

DRIVER = r"""
import importlib, os, sys, traceback
preload, watched, modules = sys.argv[1].split(","), tuple(sys.argv[2].split(",")), sys.argv[3:]
for name in preload:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
# the only module of ours a fresh interpreter holds is the start-up hook's (site's .pth)
early = [m for m in sys.modules if m.split(".")[0] in watched
         and m not in ("vissl_swav_plugin", "vissl_swav_plugin._autoload",
                       "vissl_swav_plugin.compat", "vissl_swav_plugin.compat.engine")]
assert not early, f"the preload imported watched modules: {early}"

def check(module):
    importlib.import_module(module)
    import vissl
    from vissl.models.heads import MODEL_HEADS_REGISTRY
    from classy_vision.losses import LOSS_REGISTRY
    import vissl_swav_plugin as p
    assert p.is_registered(), "not registered"
    assert "swav_plugin_head" in MODEL_HEADS_REGISTRY and "swav_plugin_loss" in LOSS_REGISTRY

failed = []
for module in modules:
    pid = os.fork()
    if pid == 0:
        try:
            check(module)
            code = 0
        except BaseException:
            print("FAILED", module, traceback.format_exc().strip().splitlines()[-1], flush=True)
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(module)
print("OK", len(modules) - len(failed), "FAILED", failed)
sys.exit(1 if failed else 0)
"""


PLANTED = "planted_pkg.a"  # fails at its first import: a circular import with planted_pkg.b


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """One driver over the planted package and every module of ours: its output."""
    root = tmp_path_factory.mktemp("planted")
    pkg = root / "planted_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted_pkg.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from planted_pkg.a import A\nB = 2\n")
    return subprocess.run([sys.executable, "-W", "ignore", "-c", DRIVER, ",".join(PRELOAD), ",".join(WATCHED),
                           PLANTED, *MODULES], capture_output=True, text=True,
                          env=launcher_env({"PYTHONPATH": str(root)}), timeout=HANG_S)  # a hang bound, not speed


def test_every_module_imports_first_in_a_fresh_interpreter(driven):
    assert "vissl_swav_plugin.models.heads" in MODULES and len(MODULES) > 10
    ours = [line for line in driven.stdout.splitlines() if line.startswith("FAILED vissl_swav_plugin")]
    assert not ours, (driven.stdout + driven.stderr)[-4000:]
    assert f"OK {len(MODULES)} FAILED ['{PLANTED}']" in driven.stdout, (driven.stdout + driven.stderr)[-4000:]


def test_the_forked_check_sees_a_module_that_fails_to_import(driven):
    """The driver reports a module whose first import fails (the planted circular import), and
    goes on with the next module in a fork of its own."""
    assert driven.returncode == 1, (driven.stdout + driven.stderr)[-4000:]
    assert f"FAILED {PLANTED} ImportError" in driven.stdout
    assert f"OK {len(MODULES)} FAILED ['{PLANTED}']" in driven.stdout
