"""SLURM jobs of CPU runs ask for GPUs.

What breaks: ``vissl/utils/distributed_launcher.py``, ``launch_distributed_on_slurm``
passes ``gpus_per_node=DISTRIBUTED.NUM_PROC_PER_NODE`` to submitit's executor whatever
``MACHINE.DEVICE`` is, so a CPU run (``MACHINE.DEVICE: cpu``) submitted with
``SLURM.USE_SLURM=true`` asks every node for GPUs: on a CPU-only partition the job is
refused or waits for ever.

Fix (patch ``shim_slurm_cpu_no_gpus``): while ``launch_distributed_on_slurm`` runs for a
config with ``MACHINE.DEVICE: cpu``, the executor's ``update_parameters`` gets no
``gpus_per_node``, so the job script has no GPU request; the other parameters are VISSL's.
A GPU run is unchanged.
"""
import functools

from vissl_swav_plugin.compat.engine import patch, raw, register, temporarily


@register
def shim_slurm_cpu_no_gpus():
    """vissl/utils/distributed_launcher.py, launch_distributed_on_slurm(): the submitit
    executor is given gpus_per_node=NUM_PROC_PER_NODE also for MACHINE.DEVICE=cpu.  For a
    CPU config, submitit.AutoExecutor.update_parameters drops gpus_per_node during the call."""
    from vissl.utils import distributed_launcher as dl

    inner = raw(dl, "launch_distributed_on_slurm")

    @functools.wraps(inner)
    def launch_distributed_on_slurm(*args, **kwargs):
        cfg = kwargs["cfg"] if "cfg" in kwargs else args[0]
        if cfg["MACHINE"]["DEVICE"] != "cpu":
            return inner(*args, **kwargs)
        import submitit

        update = raw(submitit.AutoExecutor, "update_parameters")

        @functools.wraps(update)
        def update_parameters(self, **params):
            params.pop("gpus_per_node", None)
            return update(self, **params)

        with temporarily(submitit.AutoExecutor, "update_parameters", update_parameters):
            return inner(*args, **kwargs)

    patch("shim_slurm_cpu_no_gpus", dl, "launch_distributed_on_slurm", launch_distributed_on_slurm)
