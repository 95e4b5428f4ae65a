"""The test processes' parse cache of Hydra's config files (``tests/helpers/config_parse_cache.py``)
composes what OmegaConf's own ``load`` composes: the truth is the same composition with the
cache removed, in this process."""
import pytest
import yaml
from omegaconf import OmegaConf

import config_parse_cache
from testkit import write_user_config

QUICK = "config=test/swav_plugin/quick_cpu"


@pytest.fixture
def without_cache():
    """Call the returned function to compose with OmegaConf's own load; the cache (as the
    suite had it: on unless VISSL_SWAV_PLUGIN_TEST_PARSE_CACHE=0) comes back afterwards."""
    was = config_parse_cache.installed()

    def compose_plain(overrides):
        config_parse_cache.uninstall()
        try:
            return _composed(overrides)
        finally:
            config_parse_cache.install()

    config_parse_cache.install()
    yield compose_plain
    if not was:
        config_parse_cache.uninstall()


def _composed(overrides):
    """The composed config as YAML text, or the error's class and message."""
    from vissl.utils.hydra_config import compose_hydra_configuration

    try:
        return OmegaConf.to_yaml(compose_hydra_configuration(list(overrides)))
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return f"{type(e).__name__}: {e}"


# configs with a package header, defaults lists several deep (the 8-node recipes), benchmark
# configs on top of VISSL's, VISSL's own, an override, a key added with +, a missing name
CASES = [
    [QUICK],
    ["config=pretrain/swav/swav_8node_resnet"],
    ["config=pretrain/deepcluster_v2/deepclusterv2_8node_resnet"],
    ["config=benchmark/swav_plugin/linear_fashion_mnist_cpu"],
    ["config=benchmark/swav_plugin/knn_in1k_resnet50"],
    ["config=vissl/pretrain/swav/swav_8node_resnet"],
    ["config=vissl/pretrain/simclr/simclr_8node_resnet", "+config/pretrain/simclr/models=resnext101"],
    ["config=vissl/benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear"],
    [QUICK, "config.OPTIMIZER.num_epochs=3", "+config.LOSS.swav_plugin_loss.extra_key=1"],
    ["config=no/such/config"],
]


def test_the_suite_runs_with_the_cache_in_its_processes():
    import os

    on = os.environ.get("VISSL_SWAV_PLUGIN_TEST_PARSE_CACHE", "1") != "0"
    assert config_parse_cache.installed() == on


def test_compositions_equal_those_without_the_cache(without_cache):
    """Some of the plugin's configs and of VISSL's, overrides and a missing name: composed without
    the cache, then with it (the first files parsed, the rest from the cache)."""
    plain = [without_cache(overrides) for overrides in CASES]
    assert [_composed(overrides) for overrides in CASES] == plain
    assert config_parse_cache.STATS["hits"] > len(CASES)
    assert sum("\nconfig:" in text or text.startswith("config:") for text in plain) == len(CASES) - 1


def test_a_config_file_rewritten_between_compositions_is_read_again(without_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "mine", "  OPTIMIZER:\n    num_epochs: 7\n")
    assert "num_epochs: 7" in _composed(["config=mine"])
    write_user_config(tmp_path, "mine", "  OPTIMIZER:\n    num_epochs: 9\n")
    again = _composed(["config=mine"])
    assert "num_epochs: 9" in again and again == without_cache(["config=mine"])


def test_a_yaml_error_names_the_file_as_without_the_cache(without_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "broken", "  OPTIMIZER: [num_epochs: 7\n")
    plain = without_cache(["config=broken"])
    assert "broken.yaml" in plain
    assert _composed(["config=broken"]) == plain == _composed(["config=broken"])


def test_a_loaded_config_changed_by_its_caller_leaves_the_next_load_alone(without_cache, tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump({"config": {"OPTIMIZER": {"num_epochs": 5}, "LIST": [1, 2]}}))
    for _ in range(3):  # parsed, then twice from the cache
        with open(path, encoding="utf-8") as f:
            cfg = OmegaConf.load(f)
        assert cfg.config.OPTIMIZER.num_epochs == 5 and list(cfg.config.LIST) == [1, 2]
        cfg.config.OPTIMIZER.num_epochs = 6
        cfg.config.LIST.append(3)
    assert config_parse_cache.STATS["hits"] > 0
