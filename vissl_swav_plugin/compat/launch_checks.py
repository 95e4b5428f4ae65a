"""VISSL starts the workers before anything checks the run as a whole.

What is missing: ``vissl/utils/distributed_launcher.py``, ``launch_distributed`` and
``launch_distributed_on_slurm`` start the workers (or submit the SLURM job) right away: a
head that does not fit the trunk, a dataset smaller than one batch per process or a data
path that does not exist is found only in every worker, ~10 s later, or on the cluster.

Fix (patch ``plugin_launch_checks``): both functions first call the slot
:data:`run_launch_checks` with the config, in the launcher process before any worker or
job starts; it is provided by :mod:`vissl_swav_plugin.checks.run_wide` (the checks
registered with ``register_launch_check``; a failed one raises ``ConfigError``).

The patch is applied when this module is imported (``register(now=True)``), before
``apply_all`` applies the other patches, as it was before it moved here, so the checks stay
the innermost wrapper: ``shim_launcher_signals``, ``shim_knn_tool_on_cpu`` and
``shim_slurm_cpu_no_gpus`` wrap this replacement, and Ctrl-C during a long check exits as
any interrupted launch does.
"""
import functools

from vissl_swav_plugin.compat.engine import patch, raw, register
from vissl_swav_plugin.compat.slots import Slot

#: ``fn(cfg)``: every launch check of a composed config; raises ``ConfigError``
run_launch_checks = Slot("plugin_launch_checks", "run_launch_checks", "vissl_swav_plugin.checks.run_wide")


@register(now=True)
def plugin_launch_checks():
    """vissl/utils/distributed_launcher.py, launch_distributed() and
    launch_distributed_on_slurm(): the plugin's launch checks run first."""
    from vissl.utils import distributed_launcher as dl

    for attr in ("launch_distributed", "launch_distributed_on_slurm"):
        inner = raw(dl, attr)

        @functools.wraps(inner)
        def launch(*args, _inner=inner, **kwargs):
            run_launch_checks(kwargs["cfg"] if "cfg" in kwargs else args[0])
            return _inner(*args, **kwargs)

        patch("plugin_launch_checks", dl, attr, launch)
