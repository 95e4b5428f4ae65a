"""Config precedence (vissl_swav_plugin/config/search_path.py): the user's working-directory
configs win, then ours, then VISSL's; VISSL's originals stay reachable as ``vissl/<name>``;
each config file Hydra loads is logged with its origin."""
import logging
import re

import pytest

import vissl  # noqa: F401  (registers the plugin)
from testkit import REPO
from config_origin_cases import NAME, user_config  # noqa: F401


#: the line logged for each config file loaded: ``config <name> from <file> (<origin>)``
LOADED = re.compile(r"config (\S+) from (.+) \(([^()]+)\)$")


def hydra_compose(overrides):
    from vissl.utils.hydra_config import compose_hydra_configuration

    return compose_hydra_configuration(list(overrides)).config


def last_origin(caplog):
    """``(name, file, origin)`` of the last config file the compositions logged."""
    loaded = [m.groups() for r in caplog.records if (m := LOADED.match(r.getMessage()))]
    return loaded[-1]


def test_working_directory_config_wins_and_is_logged(tmp_path, monkeypatch, caplog):
    path = user_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        cfg = hydra_compose([f"config={NAME}"])
    assert cfg.SEED_VALUE == 4242
    assert f"config {NAME} from {path.resolve()} (user working directory)" in caplog.text
    assert last_origin(caplog) == (NAME, str(path.resolve()), "user working directory")


def test_ours_wins_over_vissl_without_a_user_config(tmp_path, monkeypatch, caplog):
    from vissl_swav_plugin.config.search_path import configs_dir

    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)  # no configs/ here
    cfg = hydra_compose([f"config={NAME}"])
    assert cfg.LOSS.name == "swav_plugin_loss"
    expect = configs_dir().resolve() / "config" / f"{NAME}.yaml"
    assert last_origin(caplog) == (NAME, str(expect), "vissl-swav-plugin")


def test_repository_root_as_working_directory_is_labelled_ours(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(REPO)
    hydra_compose([f"config={NAME}"])
    assert last_origin(caplog)[2] == "vissl-swav-plugin"


def test_vissl_original_reachable_by_prefix(tmp_path, monkeypatch, caplog):
    """``config=vissl/<name>`` is VISSL's own file (its swav_loss), config groups too, and a
    config VISSL ships but we do not is reachable under both names."""
    import vissl as vissl_pkg
    from pathlib import Path

    caplog.set_level(logging.INFO)
    user_config(tmp_path)  # even with a user config of the same name
    monkeypatch.chdir(tmp_path)
    site = Path(vissl_pkg.__file__).resolve().parents[1]
    cfg = hydra_compose([f"config=vissl/{NAME}"])
    assert cfg.LOSS.name == "swav_loss" and cfg.SEED_VALUE != 4242
    assert last_origin(caplog) == (f"vissl/{NAME}", str(site / "configs" / "config" / f"{NAME}.yaml"), "VISSL")
    cfg = hydra_compose([f"config=vissl/{NAME}", "+config/vissl/pretrain/swav/models=resnext101"])
    assert cfg.MODEL.TRUNK.RESNETS.DEPTH == 101
    for name in ("test/integration_test/quick_simclr", "vissl/test/integration_test/quick_simclr"):
        assert hydra_compose([f"config={name}"]).LOSS.name == "simclr_info_nce_loss"
        assert last_origin(caplog)[2] == "VISSL"
    with pytest.raises(Exception, match="vissl/no/such/config"):
        hydra_compose(["config=vissl/no/such/config"])
