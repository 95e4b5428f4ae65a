"""``vissl_swav_plugin/compat/persistent_workers.py`` with real loader worker processes: VISSL's
``build_dataloader`` keeps its workers from one epoch to the next (the same process ids), and
the colour warm-up strength that ``ColorWarmupHook`` sets in the main process before each epoch
is the one the workers use in that epoch, read *inside* the workers (``probe_collate``).

Independent truths: the workers' own process ids and their own transform copies; with the
patch off (``compat.disabled``) or the key off, VISSL's fresh workers per epoch; plain torch
``persistent_workers=True`` without the carried state keeps the first epoch's strength (why
the patch carries it).  No timing is asserted."""
from types import SimpleNamespace

import pytest
import torch

import vissl  # noqa: F401  (registers the plugin)
from vissl_swav_plugin import compat
from vissl_swav_plugin.hooks.color_warmup import ColorWarmupHook

from persistent_workers_cases import build_loader, flat_folder, main_strengths, probe_collate, warmup_config

EPOCHS = 3  # linear warm-up over 8 iterations, 4 per epoch: [0, 0], [0.5, 0.25], then [1.0, 0.5]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return flat_folder(tmp_path_factory.mktemp("flat"))


def _epochs(ds, loader, epochs=EPOCHS, first=-1):
    """Drive ``loader`` as VISSL's trainer does (hook ``on_start``, then per epoch a new
    iterator and ``on_phase_end``); per epoch: the workers' pids, the strengths they used,
    and the main process's strength for that epoch."""
    task = SimpleNamespace(dataloaders={"train": loader}, train_phase_idx=first, train=True)
    hook = ColorWarmupHook()
    hook.on_start(task)
    out = []
    for e in range(epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(e)
        expected = main_strengths(ds)
        batches = list(loader)
        assert len(batches) == 4 and all(b["items"] == 2 for b in batches)
        out.append(({b["pid"] for b in batches}, [b["strengths"] for b in batches], expected))
        task.train_phase_idx = first + 1 + e
        hook.on_phase_end(task)
    return out


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_workers_survive_the_epoch_and_use_each_epochs_warmup_strength(folder, start_method):
    """VISSL's default start method (forkserver: a fresh interpreter gets a pickled copy of the
    dataset, as spawn gives it) and fork (the demo's on a GPU: the worker inherits the copy)."""
    ds, loader = build_loader(warmup_config(folder, 2), 2, start_method)
    assert loader.persistent_workers
    seen = _epochs(ds, loader)
    pids = [p for p, _, _ in seen]
    assert len(pids[0]) == 2 and all(p == pids[0] for p in pids), pids  # the same 2 workers
    assert [exp for _, _, exp in seen] == [[[0.0, 0.0]], [[0.5, 0.25]], [[1.0, 0.5]]]
    for e, (_, in_workers, expected) in enumerate(seen):
        assert all(s == expected for s in in_workers), (e, in_workers, expected)


def test_without_the_patch_every_epoch_starts_fresh_workers(folder):
    with compat.disabled("shim_persistent_workers"):
        ds, loader = build_loader(warmup_config(folder, 2), 2, "fork")
    assert type(loader) is torch.utils.data.DataLoader and not loader.persistent_workers
    seen = _epochs(ds, loader, epochs=2)
    assert not seen[0][0] & seen[1][0], [p for p, _, _ in seen]  # other processes in epoch 1
    for _, in_workers, expected in seen:  # VISSL's own way: a fresh copy of the transform
        assert all(s == expected for s in in_workers)


def test_key_off_restores_vissls_fresh_workers(folder):
    ds, loader = build_loader(warmup_config(folder, 2, ["config.DATA.PERSISTENT_WORKERS=false"]), 2, "fork")
    assert not loader.persistent_workers
    seen = _epochs(ds, loader, epochs=2)
    assert not seen[0][0] & seen[1][0]
    for _, in_workers, expected in seen:
        assert all(s == expected for s in in_workers)


def test_plain_persistent_workers_would_keep_the_first_epochs_strength(folder):
    """The failure the carried state prevents: torch's ``persistent_workers=True`` alone."""
    ds, vissl_loader = build_loader(warmup_config(folder, 2), 2, "fork", probe=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, sampler=vissl_loader.sampler, num_workers=2,
                                         collate_fn=probe_collate, persistent_workers=True, drop_last=True)
    seen = _epochs(ds, loader)
    assert all(s == [[0.0, 0.0]] for _, in_workers, _ in seen for s in in_workers)  # stale
    assert seen[2][2] == [[1.0, 0.5]]


def test_train_and_test_loaders_and_a_resumed_loader_each_carry_their_own_state(folder):
    """Two loaders alive at once (a train and a test phase) keep their own workers and states;
    a new loader (a resumed run) started after two epochs uses the third epoch's strength."""
    ds_a, a = build_loader(warmup_config(folder, 2), 2, "fork")
    ds_b, b = build_loader(warmup_config(folder, 1), 1, "fork")
    task_a = SimpleNamespace(dataloaders={"train": a}, train_phase_idx=-1, train=True)
    hook = ColorWarmupHook()
    hook.on_start(task_a)
    pids_a, pids_b = set(), set()
    for e in range(EPOCHS):
        got_a = list(a)
        got_b = list(b)  # never set: keeps the transform's initial warm-up strength
        pids_a |= {x["pid"] for x in got_a}
        pids_b |= {x["pid"] for x in got_b}
        assert all(x["strengths"] == main_strengths(ds_a) for x in got_a), e
        assert all(x["strengths"] == [[0.0, 0.0]] for x in got_b), e
        task_a.train_phase_idx = e
        hook.on_phase_end(task_a)
    assert len(pids_a) == 2 and len(pids_b) == 1 and not pids_a & pids_b
    ds_r, resumed = build_loader(warmup_config(folder, 2), 2, "forkserver")
    seen = _epochs(ds_r, resumed, epochs=1, first=1)  # checkpoint after 2 training epochs
    assert seen[0][2] == [[1.0, 0.5]] and all(s == [[1.0, 0.5]] for s in seen[0][1])
