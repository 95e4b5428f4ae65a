"""The plugin's keys and environment variables that the training processes read only later (when
loader workers start, when the dataset or the debug trace is made) are checked when the config
is composed, or when the run is launched, with the key (or variable) and its values named: a
run that would never read one (no loader workers) is no reason to accept a wrong one."""
import re

import pytest

from testkit import compose

QUICK = "config=test/swav_plugin/quick_cpu"
NO_WORKERS = "config.DATA.NUM_DATALOADER_WORKERS=0"


@pytest.mark.parametrize("value,shown", [("sometimes", "'sometimes'"), ("2", "2"), ("yes", "'yes'")])
def test_persistent_workers_takes_true_or_false_even_without_workers(value, shown):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"config\.DATA\.PERSISTENT_WORKERS={shown} must be true or false"):
        compose([QUICK, NO_WORKERS, f"config.DATA.PERSISTENT_WORKERS={value}"])


@pytest.mark.parametrize("value", [True, False])
def test_persistent_workers_true_and_false_compose(value):
    cfg = compose([QUICK, NO_WORKERS, f"config.DATA.PERSISTENT_WORKERS={str(value).lower()}"])
    assert cfg.DATA.PERSISTENT_WORKERS is value


@pytest.mark.parametrize("var,bad,values", [
    ("VISSL_SWAV_PLUGIN_BAD_IMAGES", "skip", ["error", "substitute", "vissl"]),
    ("VISSL_SWAV_PLUGIN_EXIF", "rotate", ["ignore", "apply"]),
])
def test_the_dataset_s_environment_variables_are_checked_at_composition(monkeypatch, var, bad, values):
    """Read by the training processes when they build the dataset: checked when the config is
    composed (every value they accept composes)."""
    from vissl_swav_plugin.config.checkers import ConfigError

    monkeypatch.setenv(var, bad)
    with pytest.raises(ConfigError, match=rf"{var}='{bad}': use one of {re.escape(', '.join(values))}"):
        compose([QUICK])
    for good in values:
        monkeypatch.setenv(var, good)
        compose([QUICK])


def _launch_checks(cfg):
    from vissl_swav_plugin.config.registries import run_launch_checks

    run_launch_checks(cfg)


def test_the_trace_folder_is_checked_when_the_run_is_launched(tmp_path, monkeypatch):
    """``VISSL_SWAV_PLUGIN_TRACE_DIR``: written by every rank at the run's start; a file in its
    place or a folder that cannot be written is refused at launch, naming the variable; a
    folder still to be made is fine (and is not made by the check)."""
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.hooks.trace import TRACE_ENV

    cfg = compose([QUICK, f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"])
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "a_file"))
    with pytest.raises(ConfigError, match=rf"^{TRACE_ENV}=.*a_file: not a folder"):
        _launch_checks(cfg)
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "a_file" / "trace"))
    with pytest.raises(ConfigError, match=rf"^{TRACE_ENV}=.*a_file/trace: .*a_file is not a writable folder"):
        _launch_checks(cfg)
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "new" / "trace"))
    _launch_checks(cfg)
    assert not (tmp_path / "new").exists()
