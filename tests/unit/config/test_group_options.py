"""``+config/<group>=<option>`` on the command line: a group option no configs folder holds is an
error naming it.  Hydra (as VISSL calls it) composes such an option as a top-level key that VISSL
never reads, so ``+config/dataset_stats=mine`` run from a directory without the file trained with
the recipe's normalisation, without a word."""
import pytest

from testkit import compose

QUICK = "config=pretrain/swav/swav_fashion_mnist_cpu"  # multicrop_plugin, as docs/own_images.md
STATS = {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "images": 3, "pixels": 12}


def _write_stats(root, name):
    from vissl_swav_plugin.tools.mean_std import stats_yaml

    folder = root / "configs" / "config" / "dataset_stats"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(stats_yaml(STATS, name, "three test images"))


def _plain_hydra(overrides):
    """What Hydra composes as VISSL calls it (``compose_hydra_configuration``'s two lines),
    without the plugin's patch of that function."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="vissl.config", version_base=None):
        return hydra_compose("defaults", overrides=overrides)


def test_a_stats_file_in_the_working_directory_sets_the_normalisation(tmp_path, monkeypatch):
    _write_stats(tmp_path, "mine")
    monkeypatch.chdir(tmp_path)
    config = compose([QUICK, "+config/dataset_stats=mine"])
    mc = config.DATA.TRAIN.TRANSFORMS[0]
    assert mc["name"] == "multicrop_plugin"
    assert list(mc["mean"]) == STATS["mean"] and list(mc["std"]) == STATS["std"]


def test_a_group_option_run_from_another_directory_is_an_error_naming_it(tmp_path, monkeypatch):
    from vissl_swav_plugin.config.config_names import UnknownConfigError

    _write_stats(tmp_path / "project", "mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # the truth: Hydra alone takes the option for a top-level key and loads no file
    plain = _plain_hydra([QUICK, "+config/dataset_stats=mine"])
    assert plain["config/dataset_stats"] == "mine"
    with pytest.raises(UnknownConfigError) as e:
        compose([QUICK, "+config/dataset_stats=mine"])
    msg = str(e.value)
    assert msg.startswith("+config/dataset_stats=mine: no such config")
    assert f"configs/config/dataset_stats/mine.yaml in the working directory {elsewhere}" in msg
    assert "swav-plugin-mean-std TRAIN_FOLDER --name mine" in msg


def test_a_misspelt_group_names_the_closest_config(tmp_path, monkeypatch):
    from vissl_swav_plugin.config.config_names import UnknownConfigError

    _write_stats(tmp_path, "mine")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownConfigError, match=r"\+config/dataset_stat=mine: .*closest names: dataset_stats/mine"):
        compose([QUICK, "+config/dataset_stat=mine"])


def test_group_options_that_exist_compose_as_without_the_check(tmp_path, monkeypatch):
    """VISSL's own group option (its test_cfg_composition), and a missing option of a group
    that exists, which Hydra itself refuses."""
    from hydra.errors import MissingConfigException

    monkeypatch.chdir(tmp_path)
    over = ["config=test/integration_test/quick_simclr", "+config/pretrain/simclr/models=resnext101"]
    assert compose(over).MODEL.TRUNK.RESNETS.DEPTH == 101
    _write_stats(tmp_path, "mine")
    with pytest.raises(MissingConfigException, match="dataset_stats/other"):
        compose([QUICK, "+config/dataset_stats=other"])
