"""The three launch paths, each with 2 CPU (gloo) processes on the same tiny image folder and
seed, against VISSL's own launcher (``swav-plugin-train``) as the reference:

* ``torchrun --nproc_per_node=2 -m vissl_swav_plugin.tools.torchrun`` (env:// rendezvous):
  the same loss at every iteration of every rank, and the same final weights;
* SLURM through submitit (VISSL's ``launch_distributed_on_slurm``): ``sbatch`` and ``srun``
  are stand-ins on ``PATH`` (submitit picks its SLURM executor when ``srun`` exists), so the
  job script submitit writes is captured without a cluster and its nodes, tasks and command
  are checked; then the job's command is run as ``srun`` would on 2 "nodes" of this machine
  (``SLURM_*`` variables of a 2-node job), which meet at ``tcp://<first node>:SLURM.PORT_ID``
  and train with the same losses as the reference;
* the run-wide launch checks stop a bad config in the process that launches: before
  ``sbatch`` on the SLURM path, in every rank before the process group under torchrun.

Losses are read from the plugin's per-rank trace (``VISSL_SWAV_PLUGIN_TRACE_DIR``)."""
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from testkit import HANG_S, SMALL_TRUNK, folder_data_overrides, launcher_env, make_image_folder, run_script

EPOCHS = 2  # 2 iterations per epoch (16 images / (4 per replica x 2 processes)); the queue from epoch 1
JOB_ID = "4242"


def quick(images, ckpt, *extra):
    return ["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, f"config.OPTIMIZER.num_epochs={EPOCHS}",
            *folder_data_overrides(images), f"config.CHECKPOINT.DIR={ckpt}", *extra]


def run(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=str(cwd), env=launcher_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=HANG_S)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd[:6]} failed (rc={proc.returncode}):\n{proc.stdout[-5000:]}")
    return proc


def losses(trace_dir, world=2):
    out = []
    for rank in range(world):
        lines = (Path(trace_dir) / f"trace_rank{rank}.jsonl").read_text().splitlines()
        out.append([(r["iteration"], r["loss"]) for r in map(json.loads, lines) if r["event"] == "update"])
    return out


def weights(ckpt):
    state = torch.load(Path(ckpt) / f"model_final_checkpoint_phase{EPOCHS - 1}.torch", map_location="cpu",
                       weights_only=False)["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in state[part].items()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch_paths")
    make_image_folder(root / "images")
    return root


@pytest.fixture(scope="module")
def reference(root):
    """VISSL's launcher on one node, 2 processes."""
    proc = run_script(["-m", "vissl_swav_plugin.tools.launch", *quick(root / "images", root / "ck_vissl")], root,
                      env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "tr_vissl")})
    assert proc.returncode == 0, proc.stdout[-5000:]
    ref = losses(root / "tr_vissl")
    assert [[i for i, _ in r] for r in ref] == [list(range(2 * EPOCHS))] * 2
    return {"losses": ref, "weights": weights(root / "ck_vissl")}


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", *args, "-m", "vissl_swav_plugin.tools.torchrun"]


def test_torchrun_two_processes_equal_vissls_launcher(root, reference):
    proc = run(torchrun("--nproc_per_node=2") + quick(root / "images", root / "ck_torchrun"), root,
               env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "tr_torchrun")})
    for rank in (0, 1):
        assert f"Using Distributed init method: env://, world_size: 2, rank: {rank}" in proc.stdout
    assert losses(root / "tr_torchrun") == reference["losses"]
    got = weights(root / "ck_torchrun")
    assert got.keys() == reference["weights"].keys()
    assert [k for k in got if not torch.equal(got[k], reference["weights"][k])] == []


def test_torchrun_refuses_a_process_count_other_than_the_configs(root):
    proc = run(torchrun("--nproc_per_node=1") + quick(root / "images", root / "ck_wrong"), root, check=False)
    assert proc.returncode != 0
    assert "config.DISTRIBUTED.NUM_PROC_PER_NODE=2 (2 processes) but torchrun started 1 node(s) x 1" in proc.stdout
    assert not (root / "ck_wrong" / "log.txt").exists()  # no rank got to VISSL's engine


def test_torchrun_runs_the_launch_checks_before_the_process_group(root):
    missing = root / "no_such_folder"
    proc = run(torchrun("--nproc_per_node=2") + quick(missing, root / "ck_bad"), root, check=False)
    assert proc.returncode != 0
    assert f"config.DATA.TRAIN.DATA_PATHS[0]: disk_folder path {missing}" in proc.stdout
    assert "Using Distributed init method" not in proc.stdout


# --------------------------------------------------------------------------------------
# SLURM through submitit
# --------------------------------------------------------------------------------------
def fake_slurm(bin_dir, record):
    """``sbatch`` that keeps the job script and answers as SLURM does; ``srun`` that only exists."""
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {record}\necho "Submitted batch job {JOB_ID}"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\necho 'srun is a stand-in in this test' >&2\nexit 1\n")
    for f in ("sbatch", "srun"):
        (bin_dir / f).chmod((bin_dir / f).stat().st_mode | stat.S_IEXEC)


def slurm_overrides(root, port, nodes=2, procs=1):
    return ["config.SLURM.USE_SLURM=true", "config.SLURM.PARTITION=cpu_part", f"config.SLURM.LOG_FOLDER={root / 'slurm'}",
            "config.SLURM.TIME_HOURS=1", "config.SLURM.TIME_MINUTES=30", "config.SLURM.NUM_CPU_PER_PROC=3",
            "config.SLURM.MEM_GB=4", f"config.SLURM.PORT_ID={port}", f"config.DISTRIBUTED.NUM_NODES={nodes}",
            f"config.DISTRIBUTED.NUM_PROC_PER_NODE={procs}"]


def sbatch_flags(script):
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines() if line.startswith("#SBATCH --"))


@pytest.fixture(scope="module")
def slurm_job(root):
    bin_dir, record, port = root / "fake_bin", root / "job.sh", free_port()
    fake_slurm(bin_dir, record)
    path = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = run([sys.executable, "-m", "vissl_swav_plugin.tools.launch",
                *quick(root / "images", root / "ck_slurm", *slurm_overrides(root, port))], root, env=path)
    return {"submit": proc.stdout, "script": record.read_text(), "port": port, "path": path}


def test_slurm_job_script_asks_for_the_configs_nodes_and_tasks(root, slurm_job):
    assert f"SUBMITTED: {JOB_ID}" in slurm_job["submit"]
    flags = sbatch_flags(slurm_job["script"])
    # VISSL's layout: one task per node (its launcher), which starts NUM_PROC_PER_NODE processes
    assert flags["nodes"] == "2" and flags["ntasks-per-node"] == "1"
    assert flags["cpus-per-task"] == "3"  # NUM_CPU_PER_PROC x NUM_PROC_PER_NODE
    # a CPU run asks for no GPUs (VISSL alone asks NUM_PROC_PER_NODE per node: compat's shim_slurm_cpu_no_gpus)
    assert not [f for f in flags if "gpu" in f or "gres" in f], flags
    assert flags["partition"] == "cpu_part" and flags["time"] == "90" and flags["mem"] == "4GB"
    assert flags["job-name"] == "vissl"
    srun = [line for line in slurm_job["script"].splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and f"-u -m submitit.core._submit {root / 'slurm'}" in srun[0]
    assert not (root / "ck_slurm" / "log.txt").exists()  # submitted, not run


def test_slurm_job_runs_on_two_nodes_with_the_first_nodes_rendezvous(root, reference, slurm_job):
    command = [line for line in slurm_job["script"].splitlines() if line.startswith("srun ")][0]
    python_cmd = command[command.index(sys.executable):].split()  # what srun starts on each node
    exports = dict(line[len("export "):].split("=", 1) for line in slurm_job["script"].splitlines()
                   if line.startswith("export "))  # set by the script for srun's tasks
    procs, logs = [], []
    for node in (0, 1):
        env = launcher_env({"SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NODELIST": "localhost,localhost",
                            "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURM_NODEID": str(node),
                            "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
                            "VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "tr_slurm"), **slurm_job["path"], **exports})
        log = open(root / f"node{node}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(python_cmd, cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=HANG_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    out = [(root / f"node{n}.log").read_text() for n in (0, 1)]
    # VISSL's job meets at the first host of SLURM_JOB_NODELIST, port SLURM.PORT_ID; node n holds rank n
    for node in (0, 1):
        assert codes[node] == 0, out[node][-5000:]
        assert (f"Using Distributed init method: tcp://localhost:{slurm_job['port']}, world_size: 2, "
                f"rank: {node}") in out[node], out[node][-3000:]
    assert losses(root / "tr_slurm") == reference["losses"]


def test_slurm_path_runs_the_launch_checks_before_sbatch(root):
    bin_dir, record = root / "fake_bin_bad", root / "job_bad.sh"
    fake_slurm(bin_dir, record)
    missing = root / "no_such_folder"
    proc = run([sys.executable, "-m", "vissl_swav_plugin.tools.launch",
                *quick(missing, root / "ck_slurm_bad", *slurm_overrides(root, free_port()))], root,
               env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, check=False)
    assert proc.returncode != 0
    assert f"config.DATA.TRAIN.DATA_PATHS[0]: disk_folder path {missing}" in proc.stdout
    assert not record.exists() and "SUBMITTED" not in proc.stdout
