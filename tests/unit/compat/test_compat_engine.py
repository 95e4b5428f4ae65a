"""The one patch engine (vissl_swav_plugin/compat/engine.py): every host patch of the plugin
is registered there, applied once per process, listed, undoable, and switchable off with
VISSL_SWAV_PLUGIN_COMPAT_SKIP; its import hook is the one the start-up .pth file arms.  Every
patch module is in compat/; the patches that call the plugin's own code reach it through
slots (compat/slots.py) that the upper layers fill."""
import logging
import sys
import types

import pytest

import vissl  # noqa: F401  (registers the plugin: every patch applied)
from vissl_swav_plugin import compat
from vissl_swav_plugin.compat import engine, slots

HOST_SHIMS = [
    "shim_larc_without_apex", "shim_native_amp", "shim_syncbn_without_apex",
    "shim_extract_features_on_cpu", "shim_deepclusterv2_on_cpu", "shim_knn_tool_on_cpu",
    "shim_cpu_flush_denormal", "shim_numpy2_removed_aliases", "shim_svm_ap_scalar",
    "shim_svm_low_shot_mean_ap_scalar", "shim_trusted_torch_load", "shim_fast_broadcast_object",
    "shim_pillow13_posterize",
]
MOVED_IN = ["shim_atomic_checkpoints", "shim_checkpoint_load_errors", "shim_bad_image_errors",
            "plugin_config_inference", "plugin_loss_hooks"]


@pytest.fixture
def toy():
    """Names of toy patches a test registers; removed from the engine afterwards."""
    made = []
    yield made
    for name in made:
        engine._REGISTRY.pop(name, None)
        engine._APPLIED.discard(name)
        engine._PATCHES.pop(name, None)


def _snapshot():
    return {n: [(o, a, compat.raw(o, a)) for o, a, _, _ in engine._PATCHES.get(n, [])] for n in compat.names()}


def test_applied_lists_every_patch_in_module_order():
    names = compat.names()
    assert set(HOST_SHIMS + MOVED_IN) <= set(names) and len(names) == len(set(names))
    assert compat.applied() == names
    ranks = [engine._REGISTRY[n][0] for n in names]
    assert ranks == sorted(ranks) and max(ranks) < len(compat.PATCH_MODULES)
    # every patch module registers something
    assert {engine._REGISTRY[n][2].__module__ for n in names} == set(compat.PATCH_MODULES)


def test_each_patch_applied_once_no_double_wrap():
    before = _snapshot()
    counts = {n: len(engine._PATCHES.get(n, [])) for n in compat.names()}
    compat.apply_all()
    compat.apply(*compat.names())
    for name in compat.names():  # running a patch function again must not wrap the wrapper
        engine._REGISTRY[name][2]()
    assert _snapshot() == before
    assert {n: len(engine._PATCHES.get(n, [])) for n in compat.names()} == counts


def test_register_applies_once_when_active(toy):
    calls = []

    def toy_counting_patch():
        calls.append(1)

    toy.append("toy_counting_patch")
    compat.register(toy_counting_patch)  # the engine is active: applied at once
    compat.register(toy_counting_patch)
    compat.apply_all()
    compat.apply("toy_counting_patch")
    assert calls == [1] and "toy_counting_patch" in compat.applied()

    other = lambda: None  # noqa: E731  (another function under the same name)
    other.__name__ = "toy_counting_patch"
    with pytest.raises(ValueError, match="already registered"):
        compat.register(other)


def test_a_failing_patch_is_named(toy):
    def toy_broken_patch():
        raise ImportError("vissl.nothing")

    toy.append("toy_broken_patch")
    with pytest.raises(RuntimeError, match="toy_broken_patch could not be applied"):
        compat.register(toy_broken_patch)
    assert "toy_broken_patch" not in compat.applied()


def test_patch_original_disabled_on_classes_modules_and_dicts(toy):
    class Base:
        def f(self):
            return "base"

    class Sub(Base):
        pass

    module = types.ModuleType("toy_host")
    module.g = lambda: "host"
    table = {"op": module.g}
    orig_g = module.g

    def f(self):
        return "ours"

    def g():
        return "ours"

    def toy_patch():
        compat.patch("toy_patch", Sub, "f", f)  # inherited: undo deletes ours
        compat.patch("toy_patch", module, "g", g)
        compat.patch("toy_patch", table, "op", g)

    toy.append("toy_patch")
    compat.register(toy_patch)
    toy_patch()  # idempotent
    assert len(engine._PATCHES["toy_patch"]) == 3
    assert Sub().f() == module.g() == table["op"]() == "ours" and compat.patched_by(module.g) == "toy_patch"
    assert compat.original("toy_patch", Sub, "f") is Base.__dict__["f"]
    assert compat.original("toy_patch", module, "g") is orig_g and compat.original("toy_patch", table, "op") is orig_g
    with compat.disabled("toy_patch"):
        assert "f" not in Sub.__dict__ and Sub().f() == "base"
        assert module.g is orig_g and table["op"] is orig_g
    assert Sub().f() == module.g() == table["op"]() == "ours"
    with pytest.raises(KeyError):
        compat.original("toy_patch", Base, "f")


def test_disabled_restores_host_originals_and_reapplies():
    import vissl.hooks as vh
    import vissl.utils.hydra_config as hc
    from vissl.data.disk_dataset import DiskImageDataset
    from vissl.utils import checkpoint as vc

    targets = [("plugin_loss_hooks", vh, "add_loss_hooks"), ("plugin_config_inference", hc, "infer_losses_config"),
               ("shim_atomic_checkpoints", vc.CheckpointWriter, "_save"),
               ("shim_checkpoint_load_errors", vc, "load_checkpoint"),
               ("shim_bad_image_errors", DiskImageDataset, "__getitem__")]
    patched = {(n, a): compat.raw(o, a) for n, o, a in targets}
    with compat.disabled(*[n for n, _, _ in targets]):
        for name, owner, attr in targets:
            assert compat.raw(owner, attr) is compat.original(name, owner, attr)
            assert compat.patched_by(compat.raw(owner, attr)) is None
    for name, owner, attr in targets:
        assert compat.raw(owner, attr) is patched[(name, attr)] and compat.patched_by(patched[(name, attr)]) == name


def test_unknown_skip_name_warns(monkeypatch, caplog):
    monkeypatch.setenv(compat.SKIP_ENV, "shim_no_such_patch, plugin_loss_hooks")
    with caplog.at_level(logging.WARNING, logger=engine.__name__):
        assert compat.skipped_names() == {"plugin_loss_hooks"}
    (record,) = [r for r in caplog.records if "shim_no_such_patch" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "shim_atomic_checkpoints" in record.getMessage() and "plugin_loss_hooks" in record.getMessage()


def test_after_import_runs_callbacks_once_after_the_import(tmp_path, monkeypatch):
    """Also for a module named *_test.py, which pytest's assertion rewriter (a finder put on
    sys.meta_path after the start-up hook) claims: VISSL's tools/nearest_neighbor_test.py."""
    (tmp_path / "toy_after_import_test.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def bump(module):
        seen.append(module.VALUE)
        module.VALUE += 1

    try:
        compat.after_import("toy_after_import_test", bump)
        compat.after_import("toy_after_import_test", bump)  # same callback: kept once
        assert seen == []
        import toy_after_import_test

        assert seen == [41] and toy_after_import_test.VALUE == 42
        compat.after_import("toy_after_import_test", lambda m: seen.append("now"))  # already imported
        assert seen == [41, "now"]
    finally:
        sys.modules.pop("toy_after_import_test", None)
        engine._finder.callbacks.pop("toy_after_import_test", None)


# --------------------------------------------------------------------------------------
# compat holds every patch, and reaches the plugin's own code only through slots
# --------------------------------------------------------------------------------------
#: the patches that call the plugin's code: (patch, its compat module, the slots, their provider)
SLOTTED = [
    ("plugin_config_inference", "config_inference", ["inference"], "vissl_swav_plugin.config.validation"),
    ("plugin_config_names", "config_names", ["record_overrides", "unknown_config_error"],
     "vissl_swav_plugin.config.config_names"),
    ("plugin_loss_hooks", "loss_hooks", ["hooks_for_config"], "vissl_swav_plugin.hooks.registry"),
    ("plugin_launch_checks", "launch_checks", ["run_launch_checks"], "vissl_swav_plugin.checks.run_wide"),
]


def test_every_patch_module_is_in_compat():
    """The engine imports (by name) only modules of compat/, in a fixed order: the patches
    that call the plugin's own code come last in the list, keeping their names."""
    assert all(m.startswith("vissl_swav_plugin.compat.") for m in compat.PATCH_MODULES), compat.PATCH_MODULES
    assert compat.PATCH_MODULES[-4:] == [f"vissl_swav_plugin.compat.{m}" for _, m, _, _ in SLOTTED]
    assert compat.names()[-4:] == [p for p, _, _, _ in SLOTTED]
    for name, module, _, _ in SLOTTED:
        assert engine._REGISTRY[name][2].__module__ == f"vissl_swav_plugin.compat.{module}"


def _imports(path):
    """Every module an ``import`` / ``from ... import`` of a source file names (function-level included)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.add(node.module)
    return found


@pytest.mark.parametrize("module", [engine, slots])
def test_the_engine_and_the_slots_import_only_the_standard_library(module):
    """The engine (loaded by the start-up hook in every Python process) and the slots import
    nothing of VISSL, of the plugin's upper layers, or of any other package; nor do they
    name a module of the upper layers as a string to import (``PATCH_MODULES``)."""
    from pathlib import Path

    imports = _imports(Path(module.__file__))
    outside = sorted(m for m in imports if m.split(".")[0] not in sys.stdlib_module_names)
    assert outside == [], f"{module.__name__} imports {outside}"


def test_the_slots_are_filled_by_their_providers():
    for patch_name, module, slot_names, provider in SLOTTED:
        patch_module = sys.modules[f"vissl_swav_plugin.compat.{module}"]
        for slot_name in slot_names:
            slot = getattr(patch_module, slot_name)
            assert isinstance(slot, slots.Slot) and slot.patch == patch_name and slot.provider == provider
            assert slot.filled, slot
            assert slot.get().__module__.startswith(("vissl_swav_plugin.config", "vissl_swav_plugin.hooks",
                                                      "vissl_swav_plugin.checks"))


def test_an_empty_slot_is_a_clear_error_not_a_silent_skip(monkeypatch):
    """VISSL's add_loss_hooks while hooks.registry has not provided its slot: the call names
    the patch and the module that provides the slot, instead of leaving the plugin's hooks out."""
    import vissl.hooks as vh
    from vissl_swav_plugin.compat import loss_hooks

    monkeypatch.setattr(loss_hooks.hooks_for_config, "_fn", None)
    with pytest.raises(slots.EmptySlotError, match=r"'plugin_loss_hooks' needs 'hooks_for_config', which "
                                                   r"vissl_swav_plugin\.hooks\.registry provides"):
        vh.add_loss_hooks([], None, None)
    slot = slots.Slot("toy_patch", "toy", "some.module")
    assert not slot.filled and "empty" in repr(slot)
    with pytest.raises(slots.EmptySlotError, match="register_all"):
        slot(1)
    assert slot.provide(lambda x: x + 1)(1) == 2 and slot(1) == 2 and slot.filled


def test_the_slotted_patches_stay_innermost():
    """They are applied when their modules are imported, before apply_all applies the others,
    so the other patches of the same function wrap them (as before they moved to compat):
    e.g. shim_launcher_signals and shim_knn_tool_on_cpu around plugin_launch_checks."""
    from vissl.utils import distributed_launcher as dl

    for name, _, _, _ in SLOTTED:
        for _owner, attr, before, _ in engine._PATCHES[name]:
            assert compat.patched_by(before) is None, f"{name} wraps {compat.patched_by(before)} at {attr}"
    outer = compat.raw(dl, "launch_distributed")
    assert compat.patched_by(outer) == "shim_launcher_signals"
    assert compat.patched_by(compat.original("shim_launcher_signals", dl, "launch_distributed")) == "shim_cpu_rank_threads"
    assert compat.patched_by(compat.original("shim_cpu_rank_threads", dl, "launch_distributed")) == "shim_knn_tool_on_cpu"
    assert compat.patched_by(compat.original("shim_knn_tool_on_cpu", dl, "launch_distributed")) == "plugin_launch_checks"
