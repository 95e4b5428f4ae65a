"""Every module of the package imports first (before ``vissl``, in any order), and the plugin
is registered once VISSL is imported.

"First" means first among the plugin, VISSL, Classy Vision and VISSL's top-level packages
(``tools``, ``configs``, ``hydra_plugins``): the modules the plugin's start-up hook watches or
patches.  Each module is imported in its own process, forked from a driver interpreter that
has imported only the third-party libraries below (torch, NumPy, Hydra, ...), none of which
the hook watches; a fork saves the ~4 s of importing them again per module.  The driver checks
first that none of the watched packages is imported in it.
"""
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import vissl_swav_plugin
from testkit import HANG_S, launcher_env

MODULES = sorted(m.name for m in pkgutil.walk_packages(vissl_swav_plugin.__path__, "vissl_swav_plugin."))

# third-party libraries that VISSL and the plugin import: none is watched by the plugin's hook
PRELOAD = ["numpy", "torch", "torchvision", "PIL", "scipy", "sklearn", "yaml", "omegaconf", "hydra",
           "fvcore", "iopath", "fairscale", "tabulate", "pkg_resources", "tensorboard", "sympy"]
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


def _run_driver(modules):
    return subprocess.run([sys.executable, "-W", "ignore", "-c", DRIVER, ",".join(PRELOAD), ",".join(WATCHED),
                           *modules], capture_output=True, text=True, env=launcher_env(),
                          timeout=HANG_S)  # a hang bound, not speed


def test_every_module_imports_first_in_a_fresh_interpreter():
    assert "vissl_swav_plugin.models.heads" in MODULES and len(MODULES) > 10
    halves = [MODULES[0::2], MODULES[1::2]]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_run_driver, halves))
    for half, proc in zip(halves, results):
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert f"OK {len(half)} FAILED []" in proc.stdout, proc.stdout[-2000:]


def test_the_forked_check_sees_a_module_that_fails_to_import(tmp_path):
    """The driver reports a module whose first import fails (a planted circular import)."""
    pkg = tmp_path / "planted_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted_pkg.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from planted_pkg.a import A\nB = 2\n")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", DRIVER, ",".join(PRELOAD), ",".join(WATCHED),
                           "planted_pkg.a", "vissl_swav_plugin.models.heads"], capture_output=True, text=True,
                          env=launcher_env({"PYTHONPATH": str(tmp_path)}), timeout=HANG_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED planted_pkg.a ImportError" in proc.stdout
    assert "OK 1 FAILED ['planted_pkg.a']" in proc.stdout
