"""The one list of the configs a ``configs/config`` folder holds (``config.yaml_files``), which every
module, tool and test that lists configs uses."""
import ast
from pathlib import Path

from vissl_swav_plugin.config import yaml_files
from vissl_swav_plugin.config.search_path import plugin_configs_dir
from vissl_swav_plugin.config.yaml_files import shipped_config_files, shipped_config_names


def _tree(root, files):
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("# @package _global_\n")


def test_names_are_paths_without_yaml_sorted_by_name_and_filtered_by_prefix(tmp_path):
    _tree(tmp_path, ["b.yaml", "g/x.yaml", "g-1/y.yaml", "g/sub/z.yaml", "g/readme.md", "g/w.yml"])
    assert shipped_config_names(root=tmp_path) == ["b", "g-1/y", "g/sub/z", "g/x"]
    assert shipped_config_names("g/", root=tmp_path) == ["g/sub/z", "g/x"]
    assert shipped_config_files("g/", root=tmp_path) == [tmp_path / "g" / "sub" / "z.yaml", tmp_path / "g" / "x.yaml"]
    assert shipped_config_names("nope/", root=tmp_path) == []


def test_a_missing_folder_holds_no_config(tmp_path):
    assert shipped_config_names(root=tmp_path / "absent") == []
    assert shipped_config_files(root=tmp_path / "absent") == []


def test_the_default_folder_is_the_plugins():
    names = shipped_config_names()
    assert "pretrain/swav/swav_8node_resnet" in names and "test/swav_plugin/quick_cpu" in names
    assert shipped_config_files() == [plugin_configs_dir() / f"{n}.yaml" for n in names]


def test_the_module_imports_the_search_path_only_to_find_the_plugins_folder():
    """The runner of VISSL's own config tests lists VISSL's configs with the plugin off: importing
    ``yaml_files`` must not import ``search_path`` (whose import registers the plugin's Hydra
    search path); only a call without a folder does."""
    tree = ast.parse(Path(yaml_files.__file__).read_text())
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("vissl_swav_plugin") for m in top), top
