"""Shared test helpers: launching VISSL's launcher and gloo workers, composing configs, small
image folders.  ``tests/`` is not a package (VISSL owns the top-level name ``tests``):
``tests/conftest.py`` puts this folder on ``sys.path``."""
import contextlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Bound for a *hung* subprocess (seconds), never a speed requirement: far above what any
#: run needs on an idle machine, so a busy one does not fail the suite; below pytest.ini's
#: per-test ``timeout`` (1200 s), so a hung run fails its test with the run's output.
HANG_S = 900
SITE = Path(sysconfig.get_paths()["purelib"])
STOCK_LAUNCHER = SITE / "tools" / "run_distributed_engines.py"
PLUGIN_LAUNCHER = REPO / "tools" / "run_distributed_engines.py"
#: Overrides of ``test/swav_plugin/quick_cpu`` for the plugin's small ResNet trunk (64 features)
#: in place of VISSL's ResNet-50: for the runs whose subject is not the trunk (a ResNet-50
#: costs seconds per run to build, all-reduce and checkpoint on the CPU).
SMALL_TRUNK = [
    "config.MODEL.TRUNK.NAME=resnet_small_plugin",
    "+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={WIDTH:8,DEPTH:10}",
    "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[64,32,16],use_bn:True,num_clusters:[20]}]]",
]


def run_launcher(overrides, cwd, launcher=STOCK_LAUNCHER, env=None, timeout=HANG_S, check=True):
    """Run a VISSL launcher in a new interpreter (its ranks spawned, as a user's run); returns
    CompletedProcess (stdout+stderr)."""
    proc = run_script([launcher, *overrides], cwd, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-80:])
        raise AssertionError(f"launcher failed (rc={proc.returncode}):\n{tail}")
    return proc


def run_script(argv, cwd, env=None, timeout=HANG_S):
    """Run a Python script (``argv``: its path and arguments, or ``-m``, a module and its
    arguments) as ``python argv...`` with ``launcher_env(env)``; returns CompletedProcess
    (stdout+stderr, text)."""
    return subprocess.run([sys.executable, *map(str, argv)], cwd=str(cwd), env=launcher_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def launcher_env(env=None):
    """The environment of a process a test starts: this one's, one torch thread per process
    unless set, unbuffered output, then ``env``'s variables (a value of None removes one, e.g.
    ``{"OMP_NUM_THREADS": None}`` for a run that picks its own threads)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("MKL_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return full_env


def start_launcher(overrides, cwd, log, env=None):
    """Start VISSL's launcher in a session of its own (its pid is the process group's), its output
    to the open file ``log``; returns the Popen."""
    return subprocess.Popen([sys.executable, str(STOCK_LAUNCHER), *overrides], cwd=str(cwd), env=launcher_env(env),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_launcher_until(overrides, cwd, marker, log_path, env=None):
    """Start VISSL's launcher, and kill its whole process group (a crash, as far as the run can
    tell) as soon as ``marker`` appears in its output.  Returns the output so far."""
    import signal
    import time

    with open(log_path, "w") as log:
        proc = start_launcher(overrides, cwd, log, env=env)
        deadline = time.time() + HANG_S
        try:
            while time.time() < deadline:
                text = Path(log_path).read_text()
                if marker in text:
                    break
                if proc.poll() is not None:
                    raise AssertionError(f"run ended before '{marker}':\n{text[-4000:]}")
                time.sleep(0.1)
            else:
                raise AssertionError(f"'{marker}' not seen within {HANG_S}s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Path(log_path).read_text()


def train_in_process(overrides, cwd):
    """A VISSL run in this process, as VISSL's own tests run one
    (``vissl.utils.test_utils.run_integration_test``): the config composed from the launcher's
    overrides as ``swav-plugin-train`` composes it, world size 1 (``NUM_PROC_PER_NODE=1``,
    ``NUM_NODES=1`` unless ``overrides`` set them: VISSL then trains in the calling process),
    VISSL's ``launch_distributed``, all in :func:`vissl_run_state` (working directory ``cwd``).
    A failure raises.  Returns ``(run folder, the run's log.txt)``."""
    from vissl.hooks import default_hook_generator
    from vissl.utils.checkpoint import get_checkpoint_folder
    from vissl.utils.distributed_launcher import launch_distributed
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    overrides = [*(f"config.DISTRIBUTED.{key}=1" for key in ("NUM_PROC_PER_NODE", "NUM_NODES")
                   if not any(o.startswith(f"config.DISTRIBUTED.{key}=") for o in overrides)), *overrides]
    hooks = []
    with vissl_run_state(cwd):
        _, config = convert_to_attrdict(compose_hydra_configuration(overrides))
        try:
            launch_distributed(config, node_id=0, engine_name="train",
                               hook_generator=lambda cfg: hooks.extend(default_hook_generator(cfg)) or hooks)
        finally:
            # VISSL's loss hook keeps stdout.json open, buffered, until the process exits
            for hook in hooks:
                if getattr(hook, "json_stdout_logger", None) is not None:
                    hook.json_stdout_logger.close()
        folder = Path(get_checkpoint_folder(config)).resolve()
    log = folder / "log.txt"
    return folder, log.read_text() if log.exists() else ""


@contextlib.contextmanager
def vissl_run_state(cwd):
    """Runs VISSL's launcher or a tool (``knn_eval.main``) in this process with the working
    directory ``cwd``, then puts back what the run changed in this process and would change
    for the tests after it (each reset: what it undoes; tests/integration/package/
    test_in_process_runner_integration.py fails without any one of VISSL's,
    tests/integration/benchmarks/test_bench_epoch_pause.py needs the benchmark's)."""
    import logging
    import multiprocessing

    import torch.distributed as dist
    from vissl.utils.logger import _cached_log_stream

    environ, here = dict(os.environ), os.getcwd()
    method = multiprocessing.get_start_method(allow_none=True)
    root_handlers, root_level = list(logging.Logger.root.handlers), logging.Logger.root.level
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        # VISSL's setup_distributed keeps its process group
        if dist.is_initialized():
            dist.destroy_process_group()
        # VISSL's set_env_vars leaves the run's RANK, WORLD_SIZE and LOCAL_RANK; a benchmark's
        # one-process group LOCAL_WORLD_SIZE
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            if key in environ:
                os.environ[key] = environ[key]
            else:
                os.environ.pop(key, None)
        # VISSL's setup_multiprocessing_method forces the config's start method
        multiprocessing.set_start_method(method, force=True)
        # VISSL's setup_logging makes its logger logging.root and drops the root's handlers
        logging.root = logging.Logger.root
        logging.root.handlers = root_handlers
        logging.root.setLevel(root_level)  # a benchmark's main sets WARNING
        # VISSL keeps log.txt open by its (relative) name: the next run's would be this one's
        _cached_log_stream.cache_clear()


@contextlib.contextmanager
def catalog_env(env):
    """This process with the environment ``env`` as a new interpreter started with it sees it:
    the variables set and, as VISSL reads VISSL_DATASET_CATALOG_PATH once (when
    ``vissl.data.dataset_catalog`` is imported), that catalog registered in place of the
    registry's datasets (a path that does not exist raises, as that import does); the registry
    and the environment put back afterwards."""
    from vissl.data.dataset_catalog import VisslDatasetCatalog, register_datasets
    from vissl.utils.misc import get_json_data_catalog_file

    registry = VisslDatasetCatalog._VisslDatasetCatalog__REGISTERED_DATASETS
    saved, environ = dict(registry), dict(os.environ)
    try:
        os.environ.update(env)
        if "VISSL_DATASET_CATALOG_PATH" in env:
            path = get_json_data_catalog_file()
            VisslDatasetCatalog.clear()
            register_datasets(path)
        yield
    finally:
        registry.clear()
        registry.update(saved)
        os.environ.clear()
        os.environ.update(environ)


def load_script(relpath):
    """A checkout's file outside the package (``tools/doc_tables.py``, ``benchmarks/*.py``: not in
    the wheel, not importable by name) as a module, loaded once under its file's stem.  Its folder
    is appended to ``sys.path``, so that it imports its neighbours as ``python SCRIPT`` lets it
    (a benchmark imports ``recipes`` and ``benchmarking``)."""
    import importlib.util

    path = REPO / relpath
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path:
        return loaded
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module

def make_image_folder(root, classes=2, per_class=8, size=32, seed=0, ext="png"):
    """A small ImageFolder of distinct random-texture images: root/<class>/<i>.<ext> (``png``, or
    ``jpg`` for JPEGs of quality 90)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = Path(root)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)  # coarse colour blocks
            img = np.kron(base, np.ones((size // 4, size // 4, 1), dtype=np.uint8))
            img = np.clip(img.astype(int) + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / f"class{c}" / f"{i}.{ext}", **({"quality": 90} if ext == "jpg" else {}))
    return root


def folder_data_overrides(path, split="TRAIN", labels=False):
    out = [f"config.DATA.{split}.DATA_SOURCES=[disk_folder]",
           f"config.DATA.{split}.DATASET_NAMES=[plugin_test_folder]",
           f"config.DATA.{split}.DATA_PATHS=[{path}]",
           f"config.DATA.{split}.LABEL_PATHS=[{path}]"]
    if labels:
        out.append(f"config.DATA.{split}.LABEL_SOURCES=[disk_folder]")
    return out


def compose(overrides):
    """Compose + infer a VISSL config exactly as the launchers do (in this process)."""
    import vissl  # noqa: F401  (registers the plugin through the .pth hook)
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    cfg = compose_hydra_configuration(list(overrides))
    _, config = convert_to_attrdict(cfg, dump_config=False)
    return config


def write_user_config(cwd, name, body, base="/config/test/swav_plugin/quick_cpu"):
    """A user's ``configs/config/<name>.yaml`` in ``cwd`` (the working directory's configs come
    first): ``body`` is the YAML under ``config:``, on top of ``base`` (None: no defaults list)."""
    folder = Path(cwd) / "configs" / "config"
    folder.mkdir(parents=True, exist_ok=True)
    head = "# @package _global_\n" + (f"defaults:\n  - {base}\n" if base else "")
    (folder / f"{name}.yaml").write_text(head + "config:\n" + body)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_entry(rank, fn, world, port, args, out):
    import faulthandler

    import torch
    import torch.distributed as dist

    # A rank that dies in native code prints every thread's Python stack (pytest's faulthandler
    # covers the test process only): once in a make test run, rank 0 of a precise-BN test
    # aborted with "terminate called without an active exception" and nothing else.
    faulthandler.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(fn(rank, *args), os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # no rank (rank 0 holds the store) tears down while another still talks to it
    finally:
        dist.destroy_process_group()


def run_gloo_workers(fn, args=(), world=2):
    """Run ``fn(rank, *args)`` in ``world`` spawned processes joined in a gloo process
    group (fresh interpreters, as VISSL's launcher makes them); returns their results in
    rank order (each rank saves its own with ``torch.save``: no third process serves them).
    ``fn`` must be a module-level function (it is pickled)."""
    import shutil
    import tempfile

    import torch
    import torch.multiprocessing as mp

    out = tempfile.mkdtemp(prefix="gloo_results_")
    try:
        mp.start_processes(_gloo_entry, args=(fn, world, _free_port(), tuple(args), out), nprocs=world,
                           start_method="spawn")
        return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
