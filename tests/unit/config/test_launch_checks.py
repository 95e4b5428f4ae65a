"""Run-wide checks run when a run is launched, in the launcher process, before any worker
starts -- not when a config is only composed (VISSL's own head fragments compose)."""
import pytest

from testkit import compose

#: VISSL's SwAV head fragments meant to be composed onto RegNet trunks
VISSL_HEAD_FRAGMENTS = ["pretrain/swav/heads/d10444_d8192_d8192_d256_proto16k",
                        "pretrain/swav/heads/d7392_d8192_d8192_d256_proto16k"]
QUICK = "config=test/swav_plugin/quick_cpu"


@pytest.mark.parametrize("fragment", VISSL_HEAD_FRAGMENTS)
def test_vissl_head_fragments_compose_and_build_their_loss(fragment):
    """As VISSL's own test suite does with every YAML it ships: compose it as the root
    config, build its loss and meters (plugin active: the plugin's checks all registered)."""
    from classy_vision.losses import build_loss
    from classy_vision.meters import build_meter

    import vissl_swav_plugin

    assert vissl_swav_plugin.is_registered()
    cfg = compose([f"config={fragment}"])
    assert cfg.MODEL.HEAD.PARAMS[0][1]["dims"][0] in (10444, 7392)
    name = cfg.LOSS.name  # as VISSL's SelfSupervisionTask._build_loss
    assert build_loss({**cfg.LOSS[name], "name": name}) is not None
    for name in cfg.METERS.get("names", []):  # as VISSL's SelfSupervisionTask builds them
        build_meter({"name": name, **cfg.METERS[name]})


def _launch_recording(monkeypatch, cfg):
    """Call VISSL's (patched) ``launch_distributed`` with every way of starting a worker
    replaced by a recorder; returns the calls."""
    import torch.multiprocessing
    from vissl.utils import distributed_launcher as dl

    started = []
    # VISSL's setup_logging replaces logging.root for the process: not in a test process
    monkeypatch.setattr(dl, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: started.append("spawn"))
    monkeypatch.setattr(torch.multiprocessing, "start_processes", lambda *a, **k: started.append("start_processes"))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: started.append("_distributed_worker"))
    dl.launch_distributed(cfg=cfg, node_id=0, engine_name="train", hook_generator=lambda cfg: [])
    return started


@pytest.mark.parametrize("procs", [1, 2])
def test_a_vissl_head_fragment_on_resnet50_fails_at_launch_before_any_worker(monkeypatch, tmp_path, procs):
    from vissl_swav_plugin.config.checkers import ConfigError

    cfg = compose([f"config={VISSL_HEAD_FRAGMENTS[0]}", f"config.DISTRIBUTED.NUM_PROC_PER_NODE={procs}",
                   f"config.CHECKPOINT.DIR={tmp_path}", "config.MACHINE.DEVICE=cpu"])
    started = []
    with pytest.raises(ConfigError, match=r"dims\[0\]=10444 but the trunk MODEL\.TRUNK\.NAME=resnet outputs 2048"):
        started = _launch_recording(monkeypatch, cfg)
    assert started == []


def test_a_good_config_reaches_the_workers(monkeypatch, tmp_path):
    """The recorder itself: a config that passes the checks gets to start its workers."""
    cfg = compose([QUICK, f"config.CHECKPOINT.DIR={tmp_path}"])
    assert _launch_recording(monkeypatch, cfg) in (["spawn"], ["start_processes"])


def test_the_slurm_launcher_checks_first(monkeypatch, tmp_path):
    """``launch_distributed_on_slurm`` (submitit) runs the same checks before submitting."""
    import submitit
    from vissl.utils import distributed_launcher as dl

    from vissl_swav_plugin.config.checkers import ConfigError

    submitted = []
    monkeypatch.setattr(submitit, "AutoExecutor", lambda *a, **k: submitted.append(k))
    cfg = compose([f"config={VISSL_HEAD_FRAGMENTS[1]}", "config.SLURM.USE_SLURM=true", "config.SLURM.PARTITION=p",
                   f"config.SLURM.LOG_FOLDER={tmp_path}"])
    with pytest.raises(ConfigError, match=r"dims\[0\]=7392 .* outputs 2048"):
        dl.launch_distributed_on_slurm(cfg=cfg, engine_name="train")
    assert submitted == []


def test_every_launch_check_is_a_plain_composition_no_op():
    """Each registered launch check raises on its own bad input at launch; composing those
    inputs raises nothing (so tools that only compose are not refused)."""
    from vissl_swav_plugin.config.registries import launch_checks

    names = {fn.__name__ for fn in launch_checks()}
    assert {"check_head_input_dim", "check_batches_fit_dataset", "check_settings_that_never_act",
            "check_data_paths", "check_clusters_of_the_run"} <= names
    compose([QUICK, "config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{dims:[512,64,16],num_clusters:[20]}]]"])
    compose([QUICK, "config.DATA.TRAIN.DATA_LIMIT=2"])
    compose([QUICK, "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", "config.DATA.TRAIN.DATA_PATHS=[/no/such/dir]"])


@pytest.mark.parametrize("make, match", [
    (lambda root: root / "missing", r"DATA_PATHS\[0\]: disk_folder path .*missing .*does not exist"),
    (lambda root: root, r"DATA_PATHS\[0\]: disk_folder path .* holds no images in class sub-folders"),
])
def test_data_paths_are_named_at_launch(tmp_path, make, match):
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.registries import run_launch_checks

    path = make(tmp_path)
    (tmp_path / "flat.png").write_bytes(b"")  # a flat folder: no class sub-folder
    cfg = compose([QUICK, "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{path}]",
                   "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.DATASET_NAMES=[mine]"])
    with pytest.raises(ConfigError, match=match):
        run_launch_checks(cfg)
