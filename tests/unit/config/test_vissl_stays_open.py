"""The key checks leave open what VISSL leaves open, and still catch a typo:

* a ``torch.nn`` loss (Classy Vision's ``build_loss`` passes its block to the constructor): its
  block's keys are the constructor's parameters, judged against ``build_loss`` itself;
* a key added on purpose with ``+`` that is close to no known key is accepted (and logged once);
  one close to a known key is still an error naming both; a key from a config file is checked
  as before;
* ``config.KEY_CHECKS`` and ``VISSL_SWAV_PLUGIN_OPEN_SECTIONS`` switch the check off for a
  section or for the run.
"""
import logging
import re

import pytest

from testkit import compose, write_user_config

QUICK = "config=test/swav_plugin/quick_cpu"
SIMCLR = "config=vissl/test/integration_test/quick_simclr"


def _torch_losses():
    import torch.nn.modules.loss as torch_losses

    return sorted(n for n, c in vars(torch_losses).items()
                  if isinstance(c, type) and issubclass(c, torch_losses._Loss) and not n.startswith("_"))


TORCH_LOSSES = _torch_losses()


def _builds(name, block):
    """Whether Classy Vision's ``build_loss`` (VISSL's path for a loss it has not registered)
    accepts ``block`` for ``torch.nn.<name>``: the independent truth for the check."""
    import inspect

    import torch.nn.modules.loss as torch_losses
    from classy_vision.losses import build_loss

    required = {p.name: 2 for p in inspect.signature(getattr(torch_losses, name)).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    try:
        build_loss({"name": name, **required, **block})
    except TypeError:
        return False
    return True


def _typos(key):
    return [key[:-1], key + key[-1], key[: len(key) // 2] + key[len(key) // 2 + 1:]]


def _one_edit(word):
    """Every string one deletion, insertion, change or neighbour swap away from ``word``
    (over the characters of keys), brute force."""
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return ({a + b[1:] for a, b in splits if b} | {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
            | {a + c + b[1:] for a, b in splits if b for c in chars} | {a + c + b for a, b in splits for c in chars})


def test_the_torch_losses_are_many():
    assert len(TORCH_LOSSES) >= 20 and "CosineEmbeddingLoss" in TORCH_LOSSES


@pytest.fixture(scope="module")
def simclr_raw():
    """The composed quick SimCLR config before inference (what the key check sees)."""
    from omegaconf import OmegaConf
    from vissl.utils.hydra_config import compose_hydra_configuration

    return OmegaConf.to_container(compose_hydra_configuration([SIMCLR]))["config"]


@pytest.mark.parametrize("name", TORCH_LOSSES)
def test_a_torch_loss_block_is_checked_against_what_build_loss_accepts(name, simclr_raw):
    """Property over every ``torch.nn`` loss: a constructor argument composes (with ``+``) and
    builds; every typo of every argument is refused by the check exactly when ``build_loss``
    would refuse it in the workers (from a file or with ``+``: the reader is exact), naming the
    argument where it is the closest one."""
    import copy
    import difflib
    import inspect

    import torch.nn.modules.loss as torch_losses
    from vissl.utils.hydra_config import AttrDict

    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.vissl_schema import check_vissl_keys

    params = [p for p in inspect.signature(getattr(torch_losses, name)).parameters.values()
              if p.default is not p.empty]
    names = {p.name for p in params}
    scalar = [p for p in params if isinstance(p.default, (bool, int, float, str)) and p.default is not None]
    good = next((p for p in scalar if p.name == "reduction"), scalar[-1] if scalar else None)
    if good is not None:
        cfg = compose([SIMCLR, f"config.LOSS.name={name}", f"+config.LOSS.{name}.{good.name}={good.default!r}"])
        assert cfg.LOSS[name][good.name] == good.default
        assert _builds(name, {good.name: good.default})
    for p in params:
        for typo in _typos(p.name):
            if typo in names:
                continue
            assert not _builds(name, {typo: p.default})
            raw = copy.deepcopy(simclr_raw)
            raw["LOSS"].update({"name": name, name: {typo: 1}})
            with pytest.raises(ConfigError) as e:
                check_vissl_keys(AttrDict(raw))
            assert f"config.LOSS.{name}.{typo}: unknown key '{typo}'" in str(e.value)
            ratios = sorted((difflib.SequenceMatcher(None, typo.lower(), n.lower()).ratio(), n) for n in names | {"name"})
            if ratios[-1][1] == p.name and ratios[-1][0] >= 0.6 and (len(ratios) < 2 or ratios[-2][0] < ratios[-1][0]):
                assert f"(did you mean '{p.name}'?)" in str(e.value)


def test_the_issue_s_torch_loss_typo_names_margin():
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=r"CosineEmbeddingLoss\.margn: unknown key 'margn' \(did you mean 'margin'\?\)"):
        compose([SIMCLR, "config.LOSS.name=CosineEmbeddingLoss", "+config.LOSS.CosineEmbeddingLoss.margn=1"])


def test_a_torch_loss_block_from_a_config_file_is_checked_too(tmp_path, monkeypatch):
    """Not only ``+`` keys: the block of VISSL's own configs that use a torch loss
    (``CrossEntropyLoss``) composes, and a typo in a user's file is refused."""
    from vissl_swav_plugin.config.checkers import ConfigError

    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "mine", "  LOSS:\n    name: CrossEntropyLoss\n    CrossEntropyLoss:\n"
                      "      ignore_indx: -1\n", base=None)
    with pytest.raises(ConfigError, match=r"CrossEntropyLoss\.ignore_indx.*did you mean 'ignore_index'"):
        compose(["config=mine"])


# -- keys added with + ----------------------------------------------------------------------------
@pytest.mark.parametrize("key", [
    "LOSS.simclr_info_nce_loss.buffer_params.MY_TEST_KEY",  # VISSL's own test
    "OPTIMIZER.my_optimizer_option",
    "DATA.TRAIN.MY_DATASET_SETTING",
    "MODEL.TRUNK.RESNETS.zzz_custom",
    "HOOKS.MY_HOOK.interval",
    "MY_SECTION.anything",
])
def test_a_key_added_with_plus_that_is_close_to_nothing_is_accepted_and_logged_once(key, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = compose([SIMCLR, f"+config.{key}=dummy"])
        compose([SIMCLR, f"+config.{key}=dummy"])
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert node == "dummy"
    line = f"added key config.{key}: read by no built-in component; fine if yours reads it"
    assert caplog.text.count(line) == 1


@pytest.mark.parametrize("key,near", [
    ("OPTIMIZER.nam", "name"),
    ("LOSS.simclr_info_nce_loss.temperatur", "temperature"),
    ("LOSS.simclr_info_nce_loss.buffer_params.embeding_dim", "embedding_dim"),
    ("DATA.TRAIN.BATCHSIZE_PER_REPLICAS", "BATCHSIZE_PER_REPLICA"),
    ("LOSS.simclr_info_nce_los.temperature", "simclr_info_nce_loss"),
    ("MACHIN.DEVICE", "MACHINE"),
])
def test_a_key_added_with_plus_that_is_close_to_a_known_key_is_still_an_error(key, near):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=rf"unknown key '[^']+' \(did you mean '{near}'\?\)"):
        compose([SIMCLR, f"+config.{key}=1"])


def test_the_same_far_key_from_a_config_file_is_still_refused(tmp_path, monkeypatch):
    """The relaxation is for keys added on purpose on the command line: a key in a config file
    that no component reads is refused as before, and opening its section accepts it."""
    from vissl_swav_plugin.config.checkers import ConfigError

    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "mine", "  OPTIMIZER:\n    zzz_never_read: 1\n")
    with pytest.raises(ConfigError, match=r"config\.OPTIMIZER\.zzz_never_read: unknown key"):
        compose(["config=mine"])
    cfg = compose(["config=mine", "+config.KEY_CHECKS.OPEN_SECTIONS=[OPTIMIZER]"])
    assert cfg.OPTIMIZER.zzz_never_read == 1


# -- switching the check off --------------------------------------------------------------------------
def test_open_sections_switch_off_one_section_only():
    from vissl_swav_plugin.config.checkers import ConfigError

    cfg = compose([QUICK, "+config.KEY_CHECKS.OPEN_SECTIONS=[OPTIMIZER]", "+config.OPTIMIZER.nam=sgd"])
    assert cfg.OPTIMIZER.nam == "sgd"
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.BATCHSIZE_PER_REPLIC: unknown key"):
        compose([QUICK, "+config.KEY_CHECKS.OPEN_SECTIONS=[OPTIMIZER]", "+config.DATA.TRAIN.BATCHSIZE_PER_REPLIC=2"])


@pytest.mark.parametrize("switch", ["+config.KEY_CHECKS.ENABLED=false", "+config.KEY_CHECKS.OPEN_SECTIONS=[all]",
                                    "+config.KEY_CHECKS.OPEN_SECTIONS=[config]"])
def test_the_whole_check_can_be_switched_off_for_a_run(switch):
    cfg = compose([QUICK, switch, "+config.OPTIMIZER.nam=sgd", "+config.DATA.TRAIN.BATCHSIZE_PER_REPLIC=2"])
    assert cfg.OPTIMIZER.nam == "sgd" and cfg.DATA.TRAIN.BATCHSIZE_PER_REPLIC == 2


@pytest.mark.parametrize("value,opened,closed", [
    ("OPTIMIZER", "+config.OPTIMIZER.nam=sgd", "+config.MACHINE.DEVICES=cpu"),
    ("config.MACHINE, OPTIMIZER", "+config.MACHINE.DEVICES=cpu", "+config.SEED_VALU=1"),
    ("all", "+config.SEED_VALU=1", None),
])
def test_the_environment_variable_opens_sections(monkeypatch, value, opened, closed):
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.vissl_schema import OPEN_SECTIONS_ENV

    monkeypatch.setenv(OPEN_SECTIONS_ENV, value)
    compose([QUICK, opened])
    if closed:
        with pytest.raises(ConfigError, match="unknown key"):
            compose([QUICK, closed])


@pytest.mark.parametrize("opened", ["config.NOPE", "OPTIMIZR", "HOOKS.NOPE", "OPTIMIZER.name"])
def test_a_section_that_names_nothing_is_refused_from_the_config_and_the_environment(monkeypatch, opened):
    """A section the config does not have and nothing reads opens nothing: a typo (or a value's
    key, which is no section) is refused at composition naming where it came from, whether
    ``config.KEY_CHECKS.OPEN_SECTIONS`` or ``VISSL_SWAV_PLUGIN_OPEN_SECTIONS`` names it."""
    from vissl_swav_plugin.config.checkers import ConfigError
    from vissl_swav_plugin.config.vissl_schema import OPEN_SECTIONS_ENV

    what = "names a value, not a section" if opened == "OPTIMIZER.name" else "names no section of this config"
    with pytest.raises(ConfigError, match=rf"^config\.KEY_CHECKS\.OPEN_SECTIONS: '{re.escape(opened)}' {what}"):
        compose([QUICK, f"+config.KEY_CHECKS.OPEN_SECTIONS=[{opened}]"])
    monkeypatch.setenv(OPEN_SECTIONS_ENV, f"OPTIMIZER,{opened}")
    with pytest.raises(ConfigError, match=rf"^{OPEN_SECTIONS_ENV}=OPTIMIZER,{re.escape(opened)}: '{re.escape(opened)}' {what}"):
        compose([QUICK])


def test_a_refused_section_names_the_closest_ones():
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=r"'OPTIMIZR' names no section of this config \(did you mean 'OPTIMIZER'\?\)"):
        compose([QUICK, "+config.KEY_CHECKS.OPEN_SECTIONS=[OPTIMIZR]"])


@pytest.mark.parametrize("opened", [
    "MODEL.TRUNK.REGNET",              # VISSL's defaults.yaml has it (empty: any key), this config leaves it so
    "HOOKS.PROGRESS",                  # a section of the plugin's, which its own table checks
    "LOSS.swav_loss",                  # a registered loss's block
    "OPTIMIZER.param_schedulers.lr",   # a scheduler of this config
    "config", "all",
])
def test_every_section_vissl_or_the_plugin_reads_can_be_opened(monkeypatch, opened):
    from vissl_swav_plugin.config.vissl_schema import OPEN_SECTIONS_ENV

    compose([QUICK, f"+config.KEY_CHECKS.OPEN_SECTIONS=[{opened}]"])
    monkeypatch.setenv(OPEN_SECTIONS_ENV, opened)
    compose([QUICK])


def test_a_users_own_section_can_be_opened_where_the_config_has_it(tmp_path, monkeypatch):
    """A section of the user's (in a config file, or added with ``+``) is the config's own: it
    can be opened, from the file or the environment."""
    from vissl_swav_plugin.config.vissl_schema import OPEN_SECTIONS_ENV

    monkeypatch.chdir(tmp_path)
    write_user_config(tmp_path, "mine", "  HOOKS:\n    MY_HOOK:\n      every: 3\n")
    cfg = compose(["config=mine", "+config.KEY_CHECKS.OPEN_SECTIONS=[HOOKS, HOOKS.MY_HOOK]"])
    assert cfg.HOOKS.MY_HOOK.every == 3
    monkeypatch.setenv(OPEN_SECTIONS_ENV, "HOOKS,HOOKS.MY_HOOK")
    assert compose(["config=mine"]).HOOKS.MY_HOOK.every == 3


@pytest.mark.parametrize("override,match", [
    ("+config.KEY_CHECKS.ENABLED=flase", r"config\.KEY_CHECKS\.ENABLED must be true or false, got 'flase'"),
    ("+config.KEY_CHECKS.OPEN_SECTION=[OPTIMIZER]", r"config\.KEY_CHECKS\.OPEN_SECTION: unknown key .*'OPEN_SECTIONS'"),
    ("+config.KEY_CHECKS.OPEN_SECTIONS=OPTIMIZER", r"config\.KEY_CHECKS\.OPEN_SECTIONS must be a list"),
    ("+config.KEY_CHECKS.OPEN_SECTIONS=[1]", r"config\.KEY_CHECKS\.OPEN_SECTIONS must name sections"),
    ("+config.KEY_CHECKS=off", r"config\.KEY_CHECKS must be a mapping"),
])
def test_a_bad_switch_is_refused_naming_it(override, match):
    from vissl_swav_plugin.config.checkers import ConfigError

    with pytest.raises(ConfigError, match=match):
        compose([QUICK, override])


def test_every_one_character_typo_of_a_known_key_added_with_plus_is_refused(monkeypatch, simclr_raw):
    """Property over every key of VISSL's ``defaults.yaml`` (outside the open sections) that the
    composed config has: each typo of one character (dropped, doubled, two swapped) added with
    ``+`` is refused naming the key.  The check is called
    on the composed config with the ``+`` overrides it would have been composed with."""
    import copy

    from vissl.utils.hydra_config import AttrDict

    from vissl_swav_plugin.config import vissl_schema
    from vissl_swav_plugin.config.checkers import ConfigError

    from test_vissl_sections import DEFAULT_PATHS, _mutations

    checked = 0
    for path in DEFAULT_PATHS:
        key = path[-1]
        node = simclr_raw
        for p in path[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node or len(key) < 2:
            continue
        half = len(key) // 2
        for typo in _mutations(key) + [key[:half - 1] + key[half] + key[half - 1] + key[half + 1:]]:
            if typo in node or typo == key:
                continue
            raw = copy.deepcopy(simclr_raw)
            target = raw
            for p in path[:-1]:
                target = target[p]
            target[typo] = 1
            added = "+config." + ".".join(path[:-1] + (typo,)) + "=1"
            monkeypatch.setattr(vissl_schema, "composed_overrides", lambda added=added: [SIMCLR, added])
            with pytest.raises(ConfigError) as e:
                vissl_schema.check_vissl_keys(AttrDict(raw))
            near = re.search(rf"unknown key '{re.escape(typo)}' \(did you mean '([^']+)'\?\)", str(e.value))
            assert near, str(e.value)
            assert near.group(1) == key or near.group(1) in node and near.group(1) in _one_edit(typo), str(e.value)
            checked += 1
    assert checked > 500
