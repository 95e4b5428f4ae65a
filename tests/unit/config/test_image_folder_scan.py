"""What torchvision's ImageFolder (VISSL's ``disk_folder``) would skip or repeat is named
at launch, in the launcher process: skipped extensions and files read twice are warnings,
a directory symlink loop is an error.  The truth is torchvision's own ImageFolder."""
import os

import pytest
from testkit import compose, make_image_folder

from bad_inputs_cases import QUICK  # noqa: F401


def _torchvision_samples(root):
    from torchvision.datasets import ImageFolder

    return [p for p, _ in ImageFolder(str(root), loader=lambda p: p).samples]


def _launch_checks(root, caplog):
    from vissl_swav_plugin.config.registries import run_launch_checks

    cfg = compose([QUICK, "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{root}]",
                   "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.DATASET_NAMES=[mine]", f"config.DATA.TRAIN.LABEL_PATHS=[{root}]",
                   "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=1"])
    with caplog.at_level("WARNING"):
        run_launch_checks(cfg)
    return caplog.text


@pytest.mark.parametrize("ext,pillow", [(".gif", True), (".heic", False), (".avif", None), (".txt", False),
                                        ("", False), (".JPE", True)])
def test_files_imagefolder_skips_are_named_with_counts(tmp_path, caplog, ext, pillow):
    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    from PIL import Image

    extra = [root / "class0" / f"anim{ext}", root / "class1" / "sub" / f"more{ext}"]
    extra[1].parent.mkdir()
    for p in extra:
        if ext.lower() in (".gif", ".jpe"):
            Image.new("RGB", (8, 8)).save(p, format="GIF" if ext == ".gif" else "JPEG")
        else:
            p.write_bytes(b"\x00" * 32)
    on_disk = sum(len(f) for _, _, f in os.walk(root))
    assert len(_torchvision_samples(root)) == on_disk - 2  # torchvision leaves them out, no word
    text = _launch_checks(root, caplog)
    assert f"2 file(s) with extension {ext.lower() or '(none)'!r} are skipped" in text
    assert str(extra[0]) in text and str(extra[1]) in text and "DATA_PATHS[0]" in text
    from PIL import Image as _I

    if pillow is None:
        pillow = ext in _I.registered_extensions()
    assert ("an image format Pillow reads" in text) == pillow


def test_many_skipped_files_are_grouped_with_a_few_examples(tmp_path, caplog):
    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    for i in range(7):
        (root / "class0" / f"n{i}.txt").write_text("x")
    (root / "class1" / "a.heic").write_bytes(b"x")
    text = _launch_checks(root, caplog)
    assert "7 file(s) with extension '.txt' are skipped" in text and ", ..." in text
    assert "1 file(s) with extension '.heic' are skipped" in text
    assert sum(f"n{i}.txt" in text for i in range(7)) == 3


def test_a_clean_folder_gets_no_warning(tmp_path, caplog):
    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    assert "DATA_PATHS" not in _launch_checks(root, caplog)


@pytest.mark.parametrize("where,target", [
    ("class0/again", "."),                       # the class folder itself, relative
    ("class0/again", "ABS:class0"),              # the same, absolute
    ("class1/a/b/up", "../.."),                  # two levels deeper, to the class folder
    ("class1/a/b/top", "ABS:"),                  # to the data root, absolute
    ("class0/root", ".."),                       # to the data root, relative
    ("loop", "."),                               # a "class" folder that is the root itself
])
def test_directory_symlink_loops_are_an_error_naming_the_link(tmp_path, caplog, where, target):
    from vissl_swav_plugin.config.checkers import ConfigError

    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if target.startswith("ABS:"):
        link.symlink_to((root / target[4:]).resolve(), target_is_directory=True)
    else:
        link.symlink_to(target, target_is_directory=True)
    samples = _torchvision_samples(root)
    assert len(samples) > len({os.path.realpath(p) for p in samples})  # torchvision repeats files
    with pytest.raises(ConfigError, match=rf"DATA_PATHS\[0\].*directory symlink {link} -> .*a loop"):
        _launch_checks(root, caplog)


@pytest.mark.parametrize("kind", ["sibling_dir", "file", "dir_in_other_class"])
def test_files_read_twice_through_a_symlink_are_a_warning(tmp_path, caplog, kind):
    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    if kind == "sibling_dir":
        (root / "class1" / "copy").symlink_to("../class0", target_is_directory=True)
        n = 8
    elif kind == "file":
        (root / "class1" / "dup.png").symlink_to(root / "class0" / "3.png")
        n = 1
    else:
        (root / "class0" / "sub").mkdir()
        (root / "class0" / "sub" / "x.png").write_bytes((root / "class0" / "0.png").read_bytes())
        (root / "class1" / "also").symlink_to(root / "class0" / "sub", target_is_directory=True)
        n = 1
    samples = _torchvision_samples(root)
    assert len(samples) - len({os.path.realpath(p) for p in samples}) == n  # the truth
    text = _launch_checks(root, caplog)
    assert f"{n} file(s) are read twice through a symlink" in text


def test_symlink_to_a_folder_outside_the_dataset_is_fine(tmp_path, caplog):
    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    make_image_folder(tmp_path / "other", classes=1, per_class=4)
    (root / "class2").symlink_to(tmp_path / "other" / "class0", target_is_directory=True)
    assert "DATA_PATHS" not in _launch_checks(root, caplog)


def test_a_loop_stops_the_launch_before_any_worker(monkeypatch, tmp_path):
    import torch.multiprocessing
    from vissl.utils import distributed_launcher as dl
    from vissl_swav_plugin.config.checkers import ConfigError

    root = make_image_folder(tmp_path / "d", classes=2, per_class=8)
    (root / "class0" / "again").symlink_to(".", target_is_directory=True)
    cfg = compose([QUICK, "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{root}]",
                   "config.DATA.TRAIN.DATA_LIMIT=-1", "config.DATA.TRAIN.DATASET_NAMES=[mine]", f"config.DATA.TRAIN.LABEL_PATHS=[{root}]",
                   "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=1", f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"])
    started = []
    monkeypatch.setattr(dl, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: started.append("spawn"))
    monkeypatch.setattr(torch.multiprocessing, "start_processes", lambda *a, **k: started.append("start"))
    monkeypatch.setattr(dl, "_distributed_worker", lambda *a, **k: started.append("worker"))
    with pytest.raises(ConfigError, match=r"directory symlink .*again -> .*a loop"):
        dl.launch_distributed(cfg=cfg, node_id=0, engine_name="train", hook_generator=lambda cfg: [])
    assert started == []
    (root / "class0" / "again").unlink()  # the recorder itself: without the loop, workers start
    dl.launch_distributed(cfg=cfg, node_id=0, engine_name="train", hook_generator=lambda cfg: [])
    assert started
