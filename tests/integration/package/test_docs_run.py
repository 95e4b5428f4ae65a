"""Every shell block of README.md and docs/*.md (docs/experiments aside), checked as a new user
runs it after ``make venv``: programs exist (the activation step included), our tools' flags parse,
``config=`` commands compose with their overrides (placeholder paths replaced by generated image
folders) and pass the launch checks, ``--help`` and the small data tools run.  The checker is
``tests/helpers/doc_commands.py``; the planted errors below must each be reported."""
import pytest

import doc_commands as dc
from testkit import REPO


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return dc.setup_world(tmp_path_factory.mktemp("doc_world"))


def _page_cwd(tmp_path):
    import tempfile
    from pathlib import Path

    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    cwd = Path(tempfile.mkdtemp(prefix="cwd", dir=tmp_path))
    dc.make_user_images(cwd)
    return cwd


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", dc.user_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_runs(page, world, tmp_path):
    errors = dc.check_page(page.read_text(), str(page.relative_to(REPO)), world=world, cwd=_page_cwd(tmp_path))
    assert not errors, "\n".join(errors)


# ---------------------------------------------------------------------------------------------
# planted errors in small synthetic pages
# ---------------------------------------------------------------------------------------------
ACTIVATE = "```bash\nsource .venv/bin/activate\n```\n\n"
GOOD_TRAIN = ("```bash\nswav-plugin-train config=pretrain/swav/swav_1gpu_resnet \\\n"
              "    config.DATA.TRAIN.DATA_PATHS=[/path/to/imagenet/train] "
              "config.DATA.TRAIN.LABEL_PATHS=[/path/to/imagenet/train] \\\n"
              "    config.CHECKPOINT.DIR=/path/to/ckpt\n```\n")


def _check(text, world, tmp_path, **kw):
    return dc.check_page(text, "planted.md", world=world, cwd=_page_cwd(tmp_path), **kw)


def test_the_good_page_passes(world, tmp_path):
    assert _check(ACTIVATE + GOOD_TRAIN, world, tmp_path) == []


def test_plant_a_dropped_label_paths(world, tmp_path):
    page = ACTIVATE + GOOD_TRAIN.replace(" config.DATA.TRAIN.LABEL_PATHS=[/path/to/imagenet/train]", "")
    errors = _check(page, world, tmp_path)
    assert any("LABEL_PATHS" in e and "ConfigError" in e for e in errors), errors


def test_plant_a_dropped_label_paths_in_torchrun(world, tmp_path):
    page = ACTIVATE + ("```bash\ntorchrun --nnodes=8 --node_rank=<0..7> --nproc_per_node=8 "
                       "--rdzv_endpoint=<host of node 0>:29500 \\\n    -m vissl_swav_plugin.tools.torchrun "
                       "config=pretrain/swav/swav_8node_resnet \\\n    config.DATA.TRAIN.DATA_PATHS=[/shared/imagenet/train] "
                       "config.CHECKPOINT.DIR=/shared/swav/ckpt\n```\n")
    errors = _check(page, world, tmp_path)
    assert any("LABEL_PATHS" in e for e in errors), errors
    fixed = page.replace("config.CHECKPOINT.DIR", "config.DATA.TRAIN.LABEL_PATHS=[/shared/imagenet/train] config.CHECKPOINT.DIR")
    assert _check(fixed, world, tmp_path) == []
    wrong_world = fixed.replace("--nproc_per_node=8", "--nproc_per_node=4")
    assert any("torchrun starts 32 processes" in e for e in _check(wrong_world, world, tmp_path))


def test_plant_a_config_that_does_not_exist(world, tmp_path):
    page = ACTIVATE + GOOD_TRAIN.replace("swav_1gpu_resnet", "swav_1gpu_resnet50")
    errors = _check(page, world, tmp_path)
    assert any("swav_1gpu_resnet50" in e and "no such config" in e for e in errors), errors


def test_plant_a_missing_data_folder(world, tmp_path):
    page = ACTIVATE + GOOD_TRAIN.replace("imagenet/train]", "imagenet/trian]")
    assert any("does not exist" in e for e in _check(page, world, tmp_path))


def test_help_and_data_tools_run(world, tmp_path):
    page = ACTIVATE + ("```bash\nswav-plugin-prepare-data --source my_images --out data/mine --name mine --size 32 "
                       "--rgb --val-fraction 0.5\nswav-plugin-mean-std data/mine/train --name mine\n"
                       "swav-plugin-knn --help\n```\n")
    cwd = _page_cwd(tmp_path)
    assert dc.check_page(page, "planted.md", world=world, cwd=cwd) == []
    assert (cwd / "data" / "mine" / "train").is_dir() and (cwd / "configs" / "config" / "dataset_stats" / "mine.yaml").is_file()
    bad = page.replace("--val-fraction 0.5", "--val-fraction 2.5")
    assert any("failed" in e for e in dc.check_page(bad, "planted.md", world=world, cwd=_page_cwd(tmp_path / "b")))


def test_plant_errors_in_the_real_pages(world, tmp_path):
    """The pages as they were before: the multi-node commands without LABEL_PATHS, the README's
    evaluation without its catalog, docs/own_images.md without the mean/std step."""
    launching = (REPO / "docs" / "launching.md").read_text()
    old = launching.replace(" config.DATA.TRAIN.LABEL_PATHS=[/shared/imagenet/train]", "")
    assert old != launching
    errors = _check(old, world, tmp_path)
    assert len([e for e in errors if "LABEL_PATHS is empty" in e]) == 2, errors  # SLURM and torchrun
    readme = (REPO / "README.md").read_text()
    errors = _check(readme.replace("export VISSL_DATASET_CATALOG_PATH=data/fm/dataset_catalog.json\n", ""),
                    world, tmp_path)
    assert any("fashion_mnist_folder" in e and "dataset catalog" in e for e in errors), errors
    errors = _check(readme.replace("source .venv/bin/activate    # puts", "# puts"), world, tmp_path, compose=False)
    assert any("before `source .venv/bin/activate`" in e for e in errors), errors
    own = (REPO / "docs" / "own_images.md").read_text()
    errors = _check(own.replace("swav-plugin-mean-std data/mine/train --name mine\n", ""), world, tmp_path)
    assert any("dataset_stats/mine.yaml" in e for e in errors), errors


def test_an_exported_catalog_is_the_compositions_and_is_put_back(world, tmp_path):
    """A page's exported VISSL_DATASET_CATALOG_PATH (VISSL reads it at import) is the catalog of
    its compositions, relative to the page's directory; one that does not exist fails as VISSL's
    import does; the test process's catalog and environment are left as they were."""
    import json
    import os

    from vissl.data.dataset_catalog import VisslDatasetCatalog

    before, environ = VisslDatasetCatalog.list(), dict(os.environ)
    page = ACTIVATE + ("```bash\nexport VISSL_DATASET_CATALOG_PATH=cat/catalog.json\n"
                       "swav-plugin-train config=test/swav_plugin/quick_cpu config.DATA.TRAIN.DATA_SOURCES=[disk_folder] "
                       "config.DATA.TRAIN.DATASET_NAMES=[planted_folder] config.CHECKPOINT.DIR=ckpt\n```\n")
    cwd = _page_cwd(tmp_path)
    (cwd / "cat").mkdir()
    (cwd / "cat" / "catalog.json").write_text(json.dumps({"planted_folder": {"train": ["my_images", "my_images"],
                                                                             "val": ["my_images", "my_images"]}}))
    assert dc.check_page(page, "planted.md", world=world, cwd=cwd) == []
    errors = dc.check_page(page.replace("planted_folder]", "unplanted_folder]"), "planted.md", world=world, cwd=cwd)
    assert any("'unplanted_folder' is not in VISSL's dataset catalog" in e and "planted_folder" in e
               for e in errors), errors
    errors = dc.check_page(page, "planted.md", world=world, cwd=_page_cwd(tmp_path / "none"))
    assert any("cat/catalog.json not found" in e for e in errors), errors
    assert VisslDatasetCatalog.list() == before and dict(os.environ) == environ
