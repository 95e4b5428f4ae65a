"""The training processes of a CPU run share the node's cores instead of each taking them all.

What breaks: ``vissl/utils/distributed_launcher.py``, ``launch_distributed`` starts
``DISTRIBUTED.NUM_PROC_PER_NODE`` processes (``_distributed_worker``) and leaves their threads
alone, so on a CPU each process opens an OpenMP pool of one thread per core: two processes on
2 cores run four busy threads, which spin for the core the other process holds.
``test/swav_plugin/quick_cpu`` with 64 images (2 gloo processes, 16 iterations) trained its
iterations in 61-103 s so, and in 15 s with ``OMP_NUM_THREADS=1`` (2-core AMD EPYC, 2026-11-27;
docs/experiments/cpu_threads_amp_2026-11-27.json).  torchrun sets one thread per process itself
when it starts several; VISSL's launcher does not.

Fix (patch ``shim_cpu_rank_threads``): a ``MACHINE.DEVICE: cpu`` run gets
``max(1, cores // DISTRIBUTED.NUM_PROC_PER_NODE)`` threads per training process
(:func:`rank_threads`; the cores are those the process may run on, ``os.sched_getaffinity``),
unless ``OMP_NUM_THREADS`` is set: then torch's own reading of it stands.

* ``launch_distributed`` (VISSL's launcher, ``swav-plugin-train``, a SLURM job's node) says so in
  one log line where it starts several processes per node (:func:`threads_line`), and sets
  ``OMP_NUM_THREADS`` to that number while it runs: the processes it spawns start with it, as
  torchrun's do, so torch, NumPy's BLAS and the loader workers they start all read it.
* ``_distributed_worker`` sets the torch threads of a training process that starts without it
  (the launcher itself in a 1-process run, a torchrun process of one per node).

A GPU run's threads are left as they are.
"""
import functools
import logging
import os
from typing import Mapping, Optional

from vissl_swav_plugin.compat.engine import patch, raw, register

NAME = "shim_cpu_rank_threads"
#: the variable that, when set, leaves every process's thread count to torch (and OpenMP)
THREADS_ENV = "OMP_NUM_THREADS"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where the
    platform has none), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def rank_threads(cfg, environ: Optional[Mapping[str, str]] = None, cores: Optional[int] = None) -> Optional[int]:
    """Torch threads for each training process of ``cfg`` on this node, or None to leave them.

    Args:
        cfg: the run's VISSL config (``MACHINE.DEVICE``, ``DISTRIBUTED.NUM_PROC_PER_NODE``).
        environ: the environment (default ``os.environ``): a non-empty ``OMP_NUM_THREADS``
            leaves the threads to torch.
        cores: the node's cores (default :func:`available_cores`).
    Returns:
        ``max(1, cores // NUM_PROC_PER_NODE)`` for a ``MACHINE.DEVICE: cpu`` run; None for a
        GPU run or where ``OMP_NUM_THREADS`` is set.

    Example: on 2 cores a CPU run of 2 processes per node gets 1 thread each, of 1 process 2,
    of 3 processes 1.
    """
    environ = os.environ if environ is None else environ
    if str(cfg["MACHINE"]["DEVICE"]) != "cpu" or str(environ.get(THREADS_ENV, "")).strip():
        return None
    per_node = max(1, int(cfg["DISTRIBUTED"]["NUM_PROC_PER_NODE"]))
    cores = available_cores() if cores is None else int(cores)
    return max(1, cores // per_node)


def threads_line(cfg, threads: int, cores: Optional[int] = None) -> str:
    """The launcher's log line for :func:`rank_threads`' choice."""
    cores = available_cores() if cores is None else int(cores)
    procs = max(1, int(cfg["DISTRIBUTED"]["NUM_PROC_PER_NODE"]))
    return (f"CPU run: {procs} training process(es) on this node's {cores} core(s): {threads} torch "
            f"thread(s) each ({THREADS_ENV} is not set; set it to choose another number)")


def _say(line: str) -> None:
    # VISSL's logger where it is set up to show INFO (VISSL's launch_distributed does so only
    # after this line: a launcher's root logger may still be Python's, at WARNING), else stdout
    if logging.root.handlers and logging.root.isEnabledFor(logging.INFO):
        logging.info(line)
    else:
        print(f"INFO vissl_swav_plugin: {line}", flush=True)


def _cfg_of(args, kwargs, index):
    return kwargs["cfg"] if "cfg" in kwargs else args[index]


@register
def shim_cpu_rank_threads():
    """vissl/utils/distributed_launcher.py, _distributed_worker (each training process of a
    CPU run takes a thread per core of the node) and launch_distributed (says what each gets)."""
    from vissl.utils import distributed_launcher as dl

    worker = raw(dl, "_distributed_worker")

    @functools.wraps(worker)  # the spawned process unpickles dl._distributed_worker: this function
    def _distributed_worker(*args, **kwargs):
        threads = rank_threads(_cfg_of(args, kwargs, 1))
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return worker(*args, **kwargs)

    launch = raw(dl, "launch_distributed")

    @functools.wraps(launch)
    def launch_distributed(*args, **kwargs):
        cfg = _cfg_of(args, kwargs, 0)
        threads = rank_threads(cfg)
        if threads is None:
            return launch(*args, **kwargs)
        if int(cfg["DISTRIBUTED"]["NUM_PROC_PER_NODE"]) > 1:  # one process: a thread per core, as without us
            _say(threads_line(cfg, threads))
        # the spawned processes start with it: torch, and NumPy's BLAS and the loader workers
        # they start, read it at their start (as under torchrun); the launcher's own threads
        # are set already and stay as they are
        before = os.environ.get(THREADS_ENV)
        os.environ[THREADS_ENV] = str(threads)
        try:
            return launch(*args, **kwargs)
        finally:
            if before is None:
                os.environ.pop(THREADS_ENV, None)
            else:
                os.environ[THREADS_ENV] = before

    patch(NAME, dl, "_distributed_worker", _distributed_worker)
    patch(NAME, dl, "launch_distributed", launch_distributed)
