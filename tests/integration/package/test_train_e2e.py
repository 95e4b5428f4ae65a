"""2-process gloo CPU training through VISSL's STOCK launcher with our config, killed
right after its epoch-1 checkpoint, then AUTO_RESUME, then VISSL's own linear-evaluation
benchmark from our checkpoint.

Per-iteration facts are read from the plugin's trace (VISSL_SWAV_PLUGIN_TRACE_DIR), written
by each rank independently; the queue is also checked against the checkpoint file."""
import json
from pathlib import Path

import pytest
import torch

from testkit import (PLUGIN_LAUNCHER, folder_data_overrides, make_image_folder, run_launcher,
                      run_launcher_until)

FREEZE = 3  # iterations; 2 iterations per epoch (16 images / (4 per replica x 2 replicas))
QUICK = ["config=test/swav_plugin/quick_cpu", f"config.LOSS.swav_plugin_loss.freeze_prototypes_niters={FREEZE}",
         "config.OPTIMIZER.num_epochs=3"]


def read_trace(d, rank):
    return [json.loads(line) for line in (Path(d) / f"trace_rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("swav_e2e")
    ckpt, trace_a, trace_b = root / "ckpt", root / "trace_a", root / "trace_b"
    data = folder_data_overrides(make_image_folder(root / "images"))
    # run A: killed (SIGKILL, whole process group) once the epoch-1 checkpoint is saved
    a = run_launcher_until(QUICK + data + [f"config.CHECKPOINT.DIR={ckpt}"], cwd=root,
                           marker="model_phase1.torch", log_path=root / "a.log",
                           env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(trace_a)})
    saved = torch.load(ckpt / "model_phase1.torch", map_location="cpu", weights_only=False)
    # run B: same command, AUTO_RESUME picks up the epoch-1 checkpoint
    b = run_launcher(QUICK + data + [f"config.CHECKPOINT.DIR={ckpt}"], cwd=root,
                     env={"VISSL_SWAV_PLUGIN_TRACE_DIR": str(trace_b)})
    # run A may have begun epoch 2 before it was killed: keep what it did up to epoch 1
    ta = [[r for r in read_trace(trace_a, k) if r["epoch"] <= 1] for k in (0, 1)]
    return dict(root=root, ckpt=ckpt, a=a, b=b.stdout, saved=saved, ta=ta,
                tb=[read_trace(trace_b, r) for r in (0, 1)])


def test_log_names_our_loss(runs):
    assert "SwAVPluginLoss" in runs["a"] and "swav_plugin_loss" in runs["a"]
    assert "SwAVLoss(" not in runs["a"]


def test_loss_finite_and_both_ranks_trained(runs):
    for rank in (0, 1):
        ups = [r for r in runs["ta"][rank] if r["event"] == "update"]
        assert [u["iteration"] for u in ups] == [0, 1, 2, 3]
        assert all(torch.isfinite(torch.tensor(u["loss"])) for u in ups)


def test_prototypes_frozen_exactly_n_iterations_then_moving(runs):
    for rank in (0, 1):
        t = runs["ta"][rank]
        start = next(r for r in t if r["event"] == "start")
        ups = {r["iteration"]: r for r in t if r["event"] == "update"}
        for it in range(FREEZE):
            assert ups[it]["proto_sum"] == start["proto_sum"], f"moved at iteration {it}"
            assert ups[it]["proto_abs_sum"] == start["proto_abs_sum"]
        assert ups[FREEZE]["proto_abs_sum"] != start["proto_abs_sum"], "still frozen after N iterations"


def test_prototypes_unit_norm_after_every_step(runs):
    for rank in (0, 1):
        for r in runs["ta"][rank] + runs["tb"][rank]:
            if r["event"] == "update":
                assert r["proto_norm_err"] < 1e-5, r


def test_queue_starts_at_configured_epoch_per_rank(runs):
    for rank in (0, 1):
        ups = [r for r in runs["ta"][rank] if r["event"] == "update"]
        assert [u["queue_active"] for u in ups] == [False, False, True, True]  # start_epoch = 1
        assert [u["queue_filled"] for u in ups] == [0, 0, 4, 8]  # batch 4, 8 entries per rank
    end0 = [r for r in runs["ta"][0] if r["event"] == "phase_end"][-1]
    end1 = [r for r in runs["ta"][1] if r["event"] == "phase_end"][-1]
    assert end0["queue_sum"] != end1["queue_sum"], "ranks must hold their own queues"


def test_checkpoint_holds_every_ranks_queue(runs):
    loss = runs["saved"]["loss"]
    all_emb = loss["queues.0.all_ranks_embeddings"]
    assert all_emb.shape[0] == 2
    for rank in (0, 1):
        end = [r for r in runs["ta"][rank] if r["event"] == "phase_end"][-1]
        assert float(all_emb[rank].double().sum()) == pytest.approx(end["queue_sum"], abs=1e-9)


def test_auto_resume_continues_with_the_same_queue(runs):
    assert "Loaded loss state from checkpoint" in runs["b"]
    for rank in (0, 1):
        end_a = [r for r in runs["ta"][rank] if r["event"] == "phase_end"][-1]
        start_b = next(r for r in runs["tb"][rank] if r["event"] == "start")
        assert start_b["iteration"] == 4
        assert start_b["queue_active"] and start_b["queue_filled"] == end_a["queue_filled"] == 8
        assert start_b["queue_sum"] == end_a["queue_sum"]
        assert start_b["queue_abs_sum"] == end_a["queue_abs_sum"]
        assert start_b["proto_sum"] == end_a["proto_sum"]
        ups_b = [r for r in runs["tb"][rank] if r["event"] == "update"]
        assert [u["iteration"] for u in ups_b] == [4, 5]


def test_vissl_linear_eval_trains_from_our_checkpoint(runs, tmp_path):
    ours = runs["ckpt"] / "model_final_checkpoint_phase2.torch"
    out = tmp_path / "linear"
    data = []
    for split in ("TRAIN", "TEST"):
        data += [f"config.DATA.{split}.{k}=[synthetic]" for k in ("DATA_SOURCES", "LABEL_SOURCES", "DATASET_NAMES")]
        data += [f"config.DATA.{split}.DATA_LIMIT=4", f"config.DATA.{split}.BATCHSIZE_PER_REPLICA=2"]
    proc = run_launcher([
        "config=benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ours}", *data,
        "config.DATA.NUM_DATALOADER_WORKERS=0", "config.OPTIMIZER.num_epochs=1",
        "config.OPTIMIZER.param_schedulers.lr.name=constant", "config.OPTIMIZER.param_schedulers.lr.value=0.01",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DISTRIBUTED.BACKEND=gloo", "config.MACHINE.DEVICE=cpu",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False", f"config.CHECKPOINT.DIR={out}",
    ], cwd=tmp_path)
    assert "test_accuracy_list_meter" in proc.stdout
    pre = torch.load(ours, map_location="cpu", weights_only=False)["classy_state_dict"]["base_model"]["model"]["trunk"]
    post = torch.load(out / "model_final_checkpoint_phase0.torch", map_location="cpu",
                      weights_only=False)["classy_state_dict"]["base_model"]["model"]["trunk"]
    assert len(pre) > 100
    # VISSL's eval model wraps the trunk as a feature extractor ("base_model." prefix)
    post = {k.split("base_model.", 1)[-1]: v for k, v in post.items()}
    for k, v in pre.items():  # frozen trunk == our pretrained trunk, every tensor
        if k.endswith("num_batches_tracked"):
            continue  # a counter VISSL does not carry over into evaluation models
        assert torch.equal(post[k], v), k


def test_plugin_launcher_runs_our_components(tmp_path):
    proc = run_launcher(["config=test/swav_plugin/quick_cpu", "config.OPTIMIZER.num_epochs=1",
                         f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"], cwd=tmp_path, launcher=PLUGIN_LAUNCHER)
    assert "SwAVPluginLoss" in proc.stdout and "All Done" in proc.stdout
