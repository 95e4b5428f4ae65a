"""Reliability of a real SwAV run through VISSL's stock launcher (2 gloo processes, CPU):

* the uninterrupted run: our loss, prototypes frozen for the configured iterations and unit-norm
  after every step, each process's queue from the configured epoch;
* mid-epoch kill + AUTO_RESUME continues exactly like an uninterrupted run, queue included;
* a process killed while VISSL's CheckpointWriter writes leaves the previous checkpoint
  loadable (plugin's atomic writes; VISSL's own writer does not, shown as a control);
* a non-finite loss stops the run with a clear message and saves the inputs (runs in the test
  process, world size 1), and in a 2-process run every rank stops and the launcher ends non-zero.

Truth: an uninterrupted run with the same seed (second process), the checkpoint files,
and VISSL's own resume logic (``get_resume_checkpoint`` + ``CheckpointLoader``)."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from testkit import (HANG_S, SMALL_TRUNK, folder_data_overrides, launcher_env, make_image_folder, run_launcher,
                     run_launcher_until, train_in_process)

# 32 images, 4 per process x 2 processes -> 4 iterations per epoch; 3 epochs = 12 iterations.
# Queue (8 entries per process) from epoch 1 (iteration 4).  One mid-epoch checkpoint at
# iteration 6 (epoch 1, 2 iterations in, queue full); the kill comes right after it.
ITERS_PER_EPOCH, EPOCHS, CKPT_ITER = 4, 3, 6
FREEZE = 3  # iterations the prototypes stay frozen
SMALL = [
    "config=test/swav_plugin/quick_cpu",
    *SMALL_TRUNK,
    "config.DATA.TRAIN.DATA_LIMIT=-1",
]
# Resume-exact settings: VISSL's stateful sampler (skips the batches of the interrupted
# epoch that were already trained; torch's DistributedSampler restarts the epoch), and
# augmentations without randomness (a scale-(1,1) crop of a square image is the whole image,
# no flip): VISSL does not checkpoint the RNG state of the augmentations (see the report).
RESUME = SMALL + [
    f"config.OPTIMIZER.num_epochs={EPOCHS}",
    f"config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY={CKPT_ITER}",
    "config.DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
    "config.DATA.TRAIN.TRANSFORMS=[{name:ImgPilToMultiCrop,total_num_crops:4,size_crops:[32,16],"
    "num_crops:[2,2],crop_scales:[[1,1],[1,1]]},{name:ToTensor}]",
    f"config.LOSS.swav_plugin_loss.freeze_prototypes_niters={FREEZE}",
]
# Measured on this machine (2 cores, OMP_NUM_THREADS=1): resumed and uninterrupted runs
# agree bit for bit (max |loss diff| = 0, max |weight diff| = 0).  CPU kernels with one
# thread and a 2-process gloo sum are deterministic; the tolerance leaves room for a
# multi-threaded BLAS reordering sums (~1e-7 relative per op) on other machines.
LOSS_TOL = 1e-5
STATE_TOL = 1e-5


def read_trace(d, rank):
    return [json.loads(line) for line in (Path(d) / f"trace_rank{rank}.jsonl").read_text().splitlines()]


def updates(trace):
    return {r["iteration"]: r for r in trace if r["event"] == "update"}


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def flat_tensors(obj, prefix=""):
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{prefix}{k}/"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{prefix}{i}/"))
    elif torch.is_tensor(obj):
        out[prefix.rstrip("/")] = obj
    return out


# --------------------------------------------------------------------------------------
# 1. mid-epoch kill + AUTO_RESUME
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    data = folder_data_overrides(make_image_folder(root / "images", per_class=16))
    ref_ck, ck = root / "ref_ckpt", root / "ckpt"
    ref = run_launcher(RESUME + data + [f"config.CHECKPOINT.DIR={ref_ck}"], cwd=root,
                       env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "trace_ref")})
    killed = run_launcher_until(RESUME + data + [f"config.CHECKPOINT.DIR={ck}"], cwd=root,
                                marker=f"model_iteration{CKPT_ITER}.torch", log_path=root / "killed.log",
                                env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "trace_killed")})
    saved = load(ck / f"model_iteration{CKPT_ITER}.torch")
    resumed = run_launcher(RESUME + data + [f"config.CHECKPOINT.DIR={ck}"], cwd=root,
                           env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(root / "trace_resumed")})
    return dict(root=root, ref_ck=ref_ck, ck=ck, ref=ref.stdout, killed=killed, resumed=resumed.stdout,
                saved=saved,
                t_ref=[read_trace(root / "trace_ref", r) for r in (0, 1)],
                t_killed=[read_trace(root / "trace_killed", r) for r in (0, 1)],
                t_res=[read_trace(root / "trace_resumed", r) for r in (0, 1)])


def test_log_names_our_loss(resume_runs):
    assert "SwAVPluginLoss" in resume_runs["ref"] and "swav_plugin_loss" in resume_runs["ref"]
    assert "SwAVLoss(" not in resume_runs["ref"]


def test_every_iteration_of_both_ranks_has_a_finite_loss(resume_runs):
    for rank in (0, 1):
        ups = updates(resume_runs["t_ref"][rank])
        assert sorted(ups) == list(range(ITERS_PER_EPOCH * EPOCHS))
        assert all(math.isfinite(u["loss"]) for u in ups.values())


def test_prototypes_frozen_exactly_n_iterations_then_moving(resume_runs):
    for rank in (0, 1):
        t = resume_runs["t_ref"][rank]
        start = next(r for r in t if r["event"] == "start")
        ups = updates(t)
        for it in range(FREEZE):
            assert ups[it]["proto_sum"] == start["proto_sum"], f"moved at iteration {it}"
            assert ups[it]["proto_abs_sum"] == start["proto_abs_sum"]
        assert ups[FREEZE]["proto_abs_sum"] != start["proto_abs_sum"], "still frozen after N iterations"


def test_prototypes_unit_norm_after_every_step(resume_runs):
    for key in ("t_ref", "t_killed", "t_res"):
        for rank in (0, 1):
            for r in resume_runs[key][rank]:
                if r["event"] == "update":
                    assert r["proto_norm_err"] < 1e-5, (key, r)


def test_queue_starts_at_configured_epoch_per_rank(resume_runs):
    """The queue (8 entries per process, batch 4) is used from epoch 1, the config's start_epoch,
    and fills one batch per iteration."""
    for rank in (0, 1):
        ups = updates(resume_runs["t_ref"][rank])
        assert [ups[i]["queue_active"] for i in sorted(ups)] == [i >= ITERS_PER_EPOCH for i in sorted(ups)]
        assert [ups[i]["queue_filled"] for i in sorted(ups)] == [
            0 if i < ITERS_PER_EPOCH else min(8, 4 * (i - ITERS_PER_EPOCH + 1)) for i in sorted(ups)]
    ends = [[r for r in resume_runs["t_ref"][rank] if r["event"] == "phase_end"][-1] for rank in (0, 1)]
    assert ends[0]["queue_sum"] != ends[1]["queue_sum"], "ranks must hold their own queues"


def test_killed_mid_epoch_after_the_queue_started(resume_runs):
    s = resume_runs["saved"]
    assert s["iteration"] == CKPT_ITER and CKPT_ITER % ITERS_PER_EPOCH != 0  # mid-epoch
    assert s["train_phase_idx"] == CKPT_ITER // ITERS_PER_EPOCH - 1  # VISSL: last *finished* epoch
    for rank in (0, 1):
        ups = updates(resume_runs["t_killed"][rank])
        assert ups[CKPT_ITER - 1]["queue_active"] and ups[CKPT_ITER - 1]["queue_filled"] == 8
        assert max(ups) < ITERS_PER_EPOCH * EPOCHS - 1, "the run was not interrupted"
    assert "All Done" not in resume_runs["killed"]


def test_resume_starts_from_the_mid_epoch_checkpoint(resume_runs):
    out = resume_runs["resumed"]
    assert f"model_iteration{CKPT_ITER}.torch" in out and "Loaded loss state from checkpoint" in out
    for rank in (0, 1):
        t = resume_runs["t_res"][rank]
        start = next(r for r in t if r["event"] == "start")
        assert start["iteration"] == CKPT_ITER
        # exactly the remaining iterations: the stateful sampler skips the trained batches
        assert sorted(updates(t)) == list(range(CKPT_ITER, ITERS_PER_EPOCH * EPOCHS))


def test_queue_after_resume_equals_the_saved_queue(resume_runs):
    loss_state = resume_runs["saved"]["loss"]
    all_emb = loss_state["queues.0.all_ranks_embeddings"]
    for rank in (0, 1):
        start = next(r for r in resume_runs["t_res"][rank] if r["event"] == "start")
        mine = all_emb[rank].double()
        assert start["queue_active"] and start["queue_filled"] == int(loss_state["queues.0.all_ranks_filled"][rank])
        assert start["queue_sum"] == float(mine.sum())
        assert start["queue_abs_sum"] == float(mine.abs().sum())
        # and the queue the killed run had at that point (its own trace) is that one too
        killed = updates(resume_runs["t_killed"][rank])[CKPT_ITER - 1]
        assert killed["queue_sum"] == start["queue_sum"]
    assert not torch.equal(all_emb[0], all_emb[1]), "each process keeps its own queue"


def test_resumed_loss_curve_matches_uninterrupted_run(resume_runs):
    ref = updates(resume_runs["t_ref"][0])
    res = updates(resume_runs["t_res"][0])
    diffs = [abs(res[i]["loss"] - ref[i]["loss"]) for i in sorted(res)]
    print(f"resume: max |loss diff| over iterations {sorted(res)} = {max(diffs):.3e}")
    assert all(math.isfinite(ref[i]["loss"]) for i in ref)
    assert max(diffs) <= LOSS_TOL * max(1.0, max(abs(ref[i]["loss"]) for i in res))
    # the curve is not flat (a constant loss would match trivially)
    assert len({round(ref[i]["loss"], 6) for i in res}) > 1
    for rank in (0, 1):  # prototypes and queue follow the same path, step by step
        a, b = updates(resume_runs["t_ref"][rank]), updates(resume_runs["t_res"][rank])
        for i in b:
            assert b[i]["proto_sum"] == pytest.approx(a[i]["proto_sum"], abs=STATE_TOL)
            assert b[i]["queue_sum"] == pytest.approx(a[i]["queue_sum"], abs=STATE_TOL)


def test_resumed_final_state_equals_uninterrupted_final_state(resume_runs):
    name = f"model_final_checkpoint_phase{EPOCHS - 1}.torch"
    a = flat_tensors(load(resume_runs["ref_ck"] / name))
    b = flat_tensors(load(resume_runs["ck"] / name))
    assert a.keys() == b.keys()
    worst = 0.0
    for k in a:
        if a[k].is_floating_point():
            worst = max(worst, float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0)
        else:
            assert torch.equal(a[k], b[k]), k
    print(f"resume: max |tensor diff| in the final checkpoint = {worst:.3e} over {len(a)} tensors")
    assert worst <= STATE_TOL
    assert any("momentum_buffer" in k for k in a), "optimizer state is part of the comparison"
    assert any("all_ranks_embeddings" in k for k in a), "the queue is part of the comparison"


# --------------------------------------------------------------------------------------
# 2. atomic checkpoint writes
# --------------------------------------------------------------------------------------
WRITER_CHILD = textwrap.dedent(r"""
    import json, os, random, signal, sys, time
    folder, mode, trials, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "vissl":                    # VISSL 0.1.6's own writer, as a control
        os.environ["VISSL_SWAV_PLUGIN_COMPAT_SKIP"] = "shim_atomic_checkpoints,shim_checkpoint_load_errors"
    import torch
    import vissl  # registers the plugin (atomic writer)
    from vissl.utils.checkpoint import CheckpointWriter, CheckpointLoader, get_resume_checkpoint
    from vissl.config import AttrDict

    rng = random.Random(seed)
    cfg = AttrDict({"CHECKPOINT": {"OVERWRITE_EXISTING": False, "AUTO_RESUME": True,
                                   "LATEST_CHECKPOINT_RESUME_FILE_NUM": 1,
                                   "CHECKPOINT_ITER_FREQUENCY": -1}})

    def content(phase, mb):
        n = mb * 2**20 // 4 // 4
        return {"phase_idx": phase, "iteration": phase, "iteration_num": phase, "train_phase_idx": phase,
                "classy_state_dict": {"w": [torch.full((n,), float(phase)) for _ in range(4)]}}

    class SlowPickle:                      # injected delay: pickling blocks mid-write
        def __reduce__(self):
            time.sleep(60)
            return (int, (0,))

    def write(phase, mb, slow=False):
        c = content(phase, mb)
        if slow:
            c["classy_state_dict"]["slow"] = SlowPickle()
        CheckpointWriter(folder, False, "phase", phase, "disk").save_consolidated_checkpoint(c)

    def check():
        # VISSL's own resume choice must load, and so must every *.torch file
        path = get_resume_checkpoint(cfg, folder)
        res = {"resume": os.path.basename(path) if path else None, "ok": True, "errors": []}
        try:
            ck = CheckpointLoader.load_and_broadcast_checkpoint(folder, path, torch.device("cpu"))
            assert float(ck["classy_state_dict"]["w"][0][0]) == ck["phase_idx"]
            res["resume_phase"] = ck["phase_idx"]
        except Exception as e:
            res["ok"] = False; res["errors"].append(f"resume {path}: {type(e).__name__}: {e}"[:300])
        for f in sorted(os.listdir(folder)):
            p = os.path.join(folder, f)
            if f.endswith(".torch"):
                try:
                    torch.load(p, map_location="cpu")
                except Exception as e:
                    res["ok"] = False; res["errors"].append(f"{f}: {type(e).__name__}"[:200])
        res["files"] = sorted(os.listdir(folder))
        res["partials"] = [f for f in res["files"] if f.startswith(".ckpt_partial_")]
        return res

    write(0, 48)                           # the previous, complete checkpoint
    t0 = time.time(); write(99, 48); dt = time.time() - t0
    os.unlink(os.path.join(folder, "model_phase99.torch"))
    write(0, 48)                           # checkpoint.torch -> model_phase0 again
    results = []
    for t in range(trials):
        slow = t == 0                      # first trial: killed during the injected delay
        phase = 1 + t
        pid = os.fork()
        if pid == 0:
            try:
                write(phase, 48, slow=slow)
            finally:
                os._exit(0)
        time.sleep(0.5 if slow else rng.uniform(0.0, 1.2 * dt))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        r = check(); r.update(trial=t, slow=slow, write_s=round(dt, 3)); results.append(r)
    print("RESULTS " + json.dumps(results))
""")


def run_writer_child(folder, mode, trials, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", WRITER_CHILD, str(folder), mode, str(trials), str(seed)],
                          env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=HANG_S)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:]
    return json.loads(line[0].split(" ", 1)[1])


def test_killed_checkpoint_write_leaves_previous_checkpoint_loadable(tmp_path):
    results = run_writer_child(tmp_path / "ours", "plugin", trials=8, seed=1)
    for r in results:
        assert r["ok"], r
        assert r["resume"].startswith("model_phase"), r
        # no half-written *.torch file and the symlink always resolves
        assert "checkpoint.torch" in r["files"]
    # the first kill landed inside torch.save (injected delay): a partial temp file is left,
    # the final name never appeared, VISSL resumes from the previous checkpoint
    assert results[0]["slow"] and results[0]["partials"] and results[0]["resume"] == "model_phase0.torch"
    assert "model_phase1.torch" not in results[0]["files"]
    # kills landed both before and after a completed replace (random moments)
    print("atomic write trials:", [(r["trial"], r["resume"]) for r in results])


def test_vissl_writer_without_plugin_loses_the_checkpoint(tmp_path):
    """Control: the same kill with VISSL's own writer leaves a truncated latest file that
    VISSL's resume logic picks (so the test above can fail)."""
    results = run_writer_child(tmp_path / "vissl", "vissl", trials=1)
    r = results[0]
    assert r["slow"] and r["resume"] == "model_phase1.torch" and not r["ok"], r


def test_stale_partial_files_of_dead_writers_are_cleaned(tmp_path):
    from vissl_swav_plugin.compat import checkpoint_io

    # a partial file of a dead process of this host, one of a live process, one of another host
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = checkpoint_io._host()
    names = [f".ckpt_partial_{host}_{dead.pid}_abc.tmp", f".ckpt_partial_{host}_{os.getppid()}_abc.tmp",
             ".ckpt_partial_otherhost_1_abc.tmp"]
    for n in names:
        (tmp_path / n).write_bytes(b"PK")
    checkpoint_io.atomic_torch_save({"a": 1}, str(tmp_path / "model_phase0.torch"))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] not in left and names[1] in left and names[2] in left
    assert "model_phase0.torch" in left


def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path):
    """Bytes flipped in the middle of the newest checkpoint of a 2-process run: AUTO_RESUME
    resumes from the previous intact one, the log names the skipped file, nothing is lost."""
    from reliability_helpers import snapshot

    data = folder_data_overrides(make_image_folder(tmp_path / "images", per_class=8))
    ck = tmp_path / "ckpt"
    run = SMALL + data + ["config.OPTIMIZER.num_epochs=3", f"config.CHECKPOINT.DIR={ck}"]
    run_launcher_until(run, cwd=tmp_path, marker="model_phase1.torch", log_path=tmp_path / "first.log")
    newest = ck / "model_phase1.torch"
    assert (ck / "model_phase1.torch.sha256").is_file() and not list(ck.glob("model_final*"))
    raw = bytearray(newest.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 16] = bytes(b ^ 0xFF for b in raw[mid:mid + 16])
    newest.write_bytes(bytes(raw))
    before = snapshot(ck)
    out = run_launcher(run, cwd=tmp_path).stdout
    assert f"AUTO_RESUME skips {newest}" in out and "is corrupt: its SHA-256" in out
    assert f"Resume from file: {ck}/model_phase0.torch" in out
    kept = ck / "model_phase1.torch.corrupt"
    assert kept.read_bytes() == bytes(raw)  # the corrupt file is kept, not overwritten
    after = snapshot(ck)
    assert all(after.get(k) == v for k, v in before.items() if k.startswith("model_phase0"))
    from vissl_swav_plugin.compat.checkpoint_checksums import verify_checkpoint

    assert verify_checkpoint(str(ck / "model_phase1.torch"))  # re-trained, intact
    assert verify_checkpoint(str(next(ck.glob("model_final_checkpoint_phase*.torch"))))


# --------------------------------------------------------------------------------------
# 3. NaN / inf guard in a real run
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["overflow_temperature", "huge_lr"])
def test_nonfinite_loss_stops_the_run_and_saves_inputs(tmp_path, monkeypatch, case):
    """In the test process (``testkit.train_in_process``, world size 1): the failure is raised
    where the loss or the model output first goes non-finite."""
    from vissl_swav_plugin.utils.nonfinite import NonFiniteLossError

    data = folder_data_overrides(make_image_folder(tmp_path / "images", per_class=16))
    ck, trace = tmp_path / "ckpt", tmp_path / "trace"
    extra = {
        # scores / 1e-40 overflow float32 at the first step
        "overflow_temperature": ["config.LOSS.swav_plugin_loss.temperature=1e-40"],
        # a diverging optimiser: weights blow up, the scores become NaN after a few steps
        "huge_lr": ["config.OPTIMIZER.param_schedulers.lr.value=1e30",
                    "config.LOSS.swav_plugin_loss.freeze_prototypes_niters=0"],
    }[case]
    monkeypatch.setenv("VISSL_SWAV_PLUGIN_TRACE_DIR", str(trace))
    with pytest.raises(NonFiniteLossError) as failure:
        train_in_process(SMALL + data + extra + ["config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={ck}"],
                         cwd=tmp_path)
    out = str(failure.value)
    if case == "overflow_temperature":  # the loss goes non-finite: scores and codes saved
        assert "non-finite loss" in out
        dumps = sorted(ck.glob("nonfinite_rank*_iter*_head0.pth"))
        assert dumps, f"no saved inputs in {sorted(p.name for p in ck.iterdir())}"
        saved = torch.load(dumps[0], map_location="cpu", weights_only=False)
        assert saved["scores"].shape[1] == 20 and len(saved["codes"]) == 2
        assert not math.isfinite(float(saved["loss"]))
    else:  # the model output goes non-finite (before the loss): output and input saved
        assert "model output (embeddings / prototype scores) is NaN or inf" in out
        dumps = sorted(ck.glob("nonfinite_rank*_iter*_model_output.pth"))
        assert dumps, f"no saved inputs in {sorted(p.name for p in ck.iterdir())}"
        saved = torch.load(dumps[0], map_location="cpu", weights_only=False)
        assert not all(torch.isfinite(t).all() for t in saved["model_output"])
        assert len(saved["input"]) == 4  # the 4 crops of the batch
    assert any(str(d) in out for d in dumps), "the message names the saved file"
    # no silent NaN training: every completed update had a finite loss, none after the
    # failure, and no checkpoint of the diverged model was written
    p = trace / "trace_rank0.jsonl"
    ups = [r for r in read_trace(trace, 0) if r["event"] == "update"] if p.exists() else []
    assert all(math.isfinite(u["loss"]) for u in ups), ups
    assert all(u["iteration"] < saved["iteration"] for u in ups)
    assert not list(ck.glob("model_*.torch")), sorted(p.name for p in ck.iterdir())


def test_nonfinite_loss_on_two_ranks_stops_every_process(tmp_path):
    """Through VISSL's stock launcher with 2 gloo processes: each rank raises where its loss
    goes non-finite (the temperature overflows float32 at the first step on both), saves its own
    inputs, and the launcher ends non-zero instead of leaving a rank waiting in a collective."""
    data = folder_data_overrides(make_image_folder(tmp_path / "images", per_class=16))
    ck = tmp_path / "ckpt"
    proc = run_launcher(SMALL + data + ["config.LOSS.swav_plugin_loss.temperature=1e-40",
                                        "config.OPTIMIZER.num_epochs=2", f"config.CHECKPOINT.DIR={ck}"],
                        cwd=tmp_path, check=False)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "NonFiniteLossError" in out and "non-finite loss" in out, out[-3000:]
    dumps = {rank: sorted(ck.glob(f"nonfinite_rank{rank}_iter*_head0.pth")) for rank in (0, 1)}
    assert dumps[0] and dumps[1], sorted(p.name for p in ck.iterdir())
    assert any(str(d) in out for d in dumps[0] + dumps[1]), "the message names the saved file"
    assert not list(ck.glob("model_*.torch")), sorted(p.name for p in ck.iterdir())
