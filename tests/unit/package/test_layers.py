"""The package's architecture: the layers contract of ``.importlinter`` (import-linter), no
import cycle, and a bottom layer that works without VISSL and Classy Vision."""
import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = "vissl_swav_plugin"
#: the bottom layer's modules (``vissl_swav_plugin/utils``), found on disk
UTILS = sorted(f"{PACKAGE}.utils.{p.stem}" for p in (REPO / PACKAGE / "utils").glob("*.py") if p.stem != "__init__")


def _graph():
    import grimp

    return grimp.build_graph(PACKAGE, cache_dir=None)


def _strongly_connected(adj):
    """Tarjan's strongly connected components with more than one module (iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in adj:
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(adj[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_strongly_connected_finds_a_planted_cycle():
    """The cycle finder itself, on a graph with a known cycle (a -> b -> c -> a) and a tail."""
    adj = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert _strongly_connected(adj) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    """No two modules of the package import each other, directly or through others
    (function-level imports included: grimp reads every import statement)."""
    graph = _graph()
    adj = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules
           if m == PACKAGE or m.startswith(PACKAGE + ".")}
    adj = {m: {w for w in ws if w in adj} for m, ws in adj.items()}
    assert _strongly_connected(adj) == []


def test_import_linter_contracts_are_kept(capsys):
    """``lint-imports`` with the repository's ``.importlinter``: every contract kept."""
    import logging

    from importlinter.cli import lint_imports

    # lint_imports configures logging with dictConfig, which disables every existing logger
    # of this process: restore them for the tests that follow
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    disabled = {lg: lg.disabled for lg in loggers}
    try:
        code = lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True, no_logo=True)
    finally:
        for lg, flag in disabled.items():
            lg.disabled = flag
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 kept, 0 broken" in out


def test_the_utils_layer_lists_its_modules():
    assert {f"{PACKAGE}.utils.{m}" for m in ("sinkhorn", "clustering", "memory_bank", "distributed",
                                             "precision", "nonfinite", "knn")} <= set(UTILS)


def test_bottom_layer_imports_without_vissl_and_classy_vision(monkeypatch):
    """Every module of ``utils`` imports and computes with ``vissl`` and ``classy_vision``
    unimportable (``sys.modules[name] = None`` makes ``import name`` raise ImportError)."""
    import torch

    saved = {k: v for k, v in sys.modules.items() if k.startswith(f"{PACKAGE}.utils")
             or k.split(".")[0] in ("vissl", "classy_vision")}
    try:
        for name in saved:
            del sys.modules[name]
        sys.modules["vissl"] = None
        sys.modules["classy_vision"] = None
        with pytest.raises(ImportError):
            importlib.import_module("vissl")
        mods = {m: importlib.import_module(m) for m in UTILS}
        leaked = sorted(k for k, v in sys.modules.items() if v is not None and k.split(".")[0] in ("vissl", "classy_vision"))
        assert leaked == []
        # and they compute: Sinkhorn's codes have the equipartition marginals (paper Eq. 3)
        scores = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
        q = mods[f"{PACKAGE}.utils.sinkhorn"].sinkhorn_knopp(scores, epsilon=0.05, num_iters=50)
        assert torch.allclose(q.sum(dim=1), torch.ones(64), atol=1e-5)
        assert torch.allclose(q.sum(dim=0), torch.full((8,), 64 / 8), rtol=0.1)
    finally:
        for name in [k for k in sys.modules if k.startswith(f"{PACKAGE}.utils")
                     or k.split(".")[0] in ("vissl", "classy_vision")]:
            del sys.modules[name]
        sys.modules.update(saved)
