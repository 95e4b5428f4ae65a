"""A parse cache for the config files Hydra reads, in the test processes only.

Composing one VISSL config reads about eight YAML files (VISSL's ``defaults.yaml`` twice) and
spends about 40% of its time in PyYAML's pure-Python parser and OmegaConf's node building.
The suite composes thousands of configs from the same few hundred files, so the test
processes (``tests/conftest.py``) and the runner of VISSL's own config tests
(``vissl_own_config_cases.py``) keep each file's parsed config, keyed by the file's whole
text, and hand out a copy (unpickled: about 15 ms for VISSL's ``defaults.yaml``, against 25 ms
for ``copy.deepcopy`` and 80 ms for a parse).  Nothing else changes:

* a file is read in full every time, so a file the test rewrites is parsed again (its text
  is the key, not its name);
* a text seen for the first time is parsed by OmegaConf's own ``load`` from the same open
  file, so a YAML error names the file as it does without the cache, and errors are never
  kept;
* a path (``OmegaConf.load("x.yaml")``) and a stream that cannot seek go to OmegaConf as
  they are;
* the processes the tests start (launchers, demos, the zygote) do not install it.

``tests/unit/package/test_config_parse_cache.py`` composes a sample of the plugin's recipes and
of VISSL's configs, with overrides, with the cache and without it and requires the same configs.
"""
import os
import pickle

_ORIGINAL = None
_PARSED = {}
STATS = {"hits": 0, "misses": 0}


def _cached_load(file_):
    read, seek = getattr(file_, "read", None), getattr(file_, "seek", None)
    if read is None or seek is None or not getattr(file_, "seekable", lambda: False)():
        return _ORIGINAL(file_)
    start = file_.tell()
    text = read()
    if not isinstance(text, str):
        seek(start)
        return _ORIGINAL(file_)
    if text in _PARSED:
        STATS["hits"] += 1
        return pickle.loads(_PARSED[text])
    seek(start)
    cfg = _ORIGINAL(file_)
    STATS["misses"] += 1
    _PARSED[text] = pickle.dumps(cfg)
    return cfg


def install_unless_off():
    """:func:`install`, unless ``VISSL_SWAV_PLUGIN_TEST_PARSE_CACHE=0`` (what the suite's
    processes call)."""
    if os.environ.get("VISSL_SWAV_PLUGIN_TEST_PARSE_CACHE", "1") != "0":
        install()


def install():
    """Route ``OmegaConf.load`` through the cache (idempotent)."""
    global _ORIGINAL
    from omegaconf import OmegaConf

    if _ORIGINAL is None:
        _ORIGINAL = OmegaConf.load
        OmegaConf.load = staticmethod(_cached_load)


def uninstall():
    """OmegaConf's own ``load`` again, and the cache emptied."""
    global _ORIGINAL
    from omegaconf import OmegaConf

    if _ORIGINAL is not None:
        OmegaConf.load = staticmethod(_ORIGINAL)
        _ORIGINAL = None
    _PARSED.clear()


def installed():
    return _ORIGINAL is not None
