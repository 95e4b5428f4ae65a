"""Each registered loss documents its config keys in its class docstring ("Config params", as
VISSL's own losses do): the documented names equal the keys the loss accepts, and every
documented default equals the loss's defaults table."""
import ast
import inspect
import re

import pytest

ENTRY = re.compile(r"^\s+([A-Za-z_][\w.]*) \(([^)]*)\):", re.M)


def documented(cls):
    """{key: type/default text} of the "Config params" sections of ``cls`` and its bases."""
    out = {}
    for klass in reversed(inspect.getmro(cls)):
        doc = klass.__dict__.get("__doc__") or ""
        if "Config params" not in doc:
            continue
        section = doc[doc.index("Config params"):]
        out.update({m.group(1): m.group(2) for m in ENTRY.finditer(section)})
    return out


def default_of(text):
    m = re.search(r"default (.+)$", text)
    return ast.literal_eval(m.group(1)) if m else inspect.Parameter.empty


def _plugin_losses():
    import vissl  # noqa: F401  (registers the plugin)
    from classy_vision.losses import LOSS_REGISTRY

    return {name: cls for name, cls in LOSS_REGISTRY.items() if cls.__module__.startswith("vissl_swav_plugin.")}


def test_every_plugin_loss_is_checked():
    assert set(_plugin_losses()) == {"swav_plugin_loss", "deepclusterv2_plugin_loss", "selav2_plugin_loss"}


def test_swav_loss_documents_exactly_its_keys_and_defaults():
    from vissl_swav_plugin.losses.swav_config import DEFAULTS, QUEUE_DEFAULTS, swav_loss_known_keys

    doc = documented(_plugin_losses()["swav_plugin_loss"])
    known, queue_known = swav_loss_known_keys()
    assert set(doc) == (known - {"queue", "name"}) | {f"queue.{k}" for k in queue_known}
    for key, value in DEFAULTS.items():
        assert default_of(doc[key]) == value, key
    for key, value in QUEUE_DEFAULTS.items():
        assert default_of(doc[f"queue.{key}"]) == value, key


@pytest.mark.parametrize("name", ["deepclusterv2_plugin_loss", "selav2_plugin_loss"])
def test_clustering_losses_document_exactly_their_keys_and_defaults(name):
    cls = _plugin_losses()[name]
    doc = documented(cls)
    assert set(doc) == cls.known_config_keys() - {"name"}
    for key, value in cls.DEFAULTS.items():
        assert default_of(doc[key]) == value, key


def test_the_parser_sees_a_missing_and_a_wrong_entry():
    class Planted:
        """Config params:
            temperature (float, required): tau.
            hard_assignment (bool, default True): wrong default.
        """

    doc = documented(Planted)
    assert set(doc) == {"temperature", "hard_assignment"}
    assert default_of(doc["hard_assignment"]) is True
    assert default_of(doc["temperature"]) is inspect.Parameter.empty
