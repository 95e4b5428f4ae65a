"""The wheel ships only vissl_swav_plugin (+ its start-up .pth and configs as data)."""

import pytest

from testkit import REPO, compose

from vissl_swav_plugin.config.yaml_files import shipped_config_names


def test_repo_dirs_vissl_owns_are_not_packages():
    for d in ("configs", "tools", "tests"):
        assert not (REPO / d / "__init__.py").exists(), f"{d}/__init__.py would shadow VISSL's '{d}'"


def test_wheel_configs_found_by_search_path(tmp_path, monkeypatch):
    """search_path.configs_dir() prefers a packaged _configs copy over the repository."""
    import vissl_swav_plugin.config.search_path as sp

    assert sp.configs_dir() == REPO / "configs"  # editable install: the repository's


SHIPPED_CONFIGS = shipped_config_names()


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_every_shipped_config_composes_and_validates(name):
    """Each config we ship goes through Hydra, VISSL's inference and our validation (what the
    launcher does before training) and names the components it uses by registered names."""
    import torch
    from classy_vision.losses import LOSS_REGISTRY
    from vissl.models.heads import MODEL_HEADS_REGISTRY
    from vissl.models.trunks import MODEL_TRUNKS_REGISTRY

    config = compose([f"config={name}"])
    assert config.MODEL.TRUNK.NAME in MODEL_TRUNKS_REGISTRY
    for head in config.MODEL.HEAD.PARAMS:
        assert head[0] in MODEL_HEADS_REGISTRY, head[0]
    # VISSL's build_loss: a registered loss, else a torch.nn loss of that name
    assert config.LOSS.name in LOSS_REGISTRY or hasattr(torch.nn, config.LOSS.name), config.LOSS.name
