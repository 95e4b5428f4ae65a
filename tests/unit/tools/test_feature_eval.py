"""swav-plugin-eval's own parts: image folders, arguments, the random-init seeds (the
evaluation itself is checked against the demo's numbers in
tests/integration/demo/test_real_data_swav_integration.py)."""
import json

import numpy as np
import pytest
from PIL import Image

from vissl_swav_plugin.tools import feature_eval as fe


def _folder(root, classes=("a", "b"), n=3, size=(8, 6), mode="L"):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            shape = (size[1], size[0]) + (() if mode == "L" else (3,))
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / c / f"{i}.png")
    return root


def test_gray_images_load_as_one_channel_and_rgb_as_three(tmp_path):
    x, y, names = fe.load_image_folder(_folder(tmp_path / "g"))
    assert x.shape == (6, 6, 8) and x.dtype == np.uint8 and y.tolist() == [0, 0, 0, 1, 1, 1] and names == ["a", "b"]
    x, _, _ = fe.load_image_folder(_folder(tmp_path / "c", mode="RGB"))
    assert x.shape == (6, 6, 8, 3)
    x, _, _ = fe.load_image_folder(_folder(tmp_path / "s", size=(20, 10)), size=4)
    assert x.shape == (6, 4, 4)


def test_images_named_by_their_source_index_keep_the_source_order(tmp_path):
    """``00003.png`` ... (as the data tool names them): the order of those numbers across
    classes (the order the demo evaluates in); other names: class then name order."""
    for c, idx in (("a", (5, 1)), ("b", (3, 0))):
        (tmp_path / "n" / c).mkdir(parents=True)
        for i in idx:
            Image.fromarray(np.full((2, 2), i, np.uint8), "L").save(tmp_path / "n" / c / f"{i:05d}.png")
    x, y, _ = fe.load_image_folder(tmp_path / "n")
    assert x[:, 0, 0].tolist() == [0, 1, 3, 5] and y.tolist() == [1, 0, 1, 0]
    x, y, _ = fe.load_image_folder(_folder(tmp_path / "w"))
    assert y.tolist() == [0, 0, 0, 1, 1, 1]


def test_gray_and_rgb_give_the_same_network_input():
    """A gray image and the same image as RGB reach the trunk as the same tensor."""
    g = np.random.default_rng(1).integers(0, 256, (2, 5, 5), dtype=np.uint8)
    norm = dict(mean=[0.1, 0.2, 0.3], std=[0.5, 0.4, 0.3], min_std=None)
    a, b = fe.to_input(g, norm), fe.to_input(np.repeat(g[..., None], 3, axis=-1), norm)
    assert a.shape == (2, 3, 5, 5) and np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("make, match", [
    (lambda root: root / "missing", "image folder not found"),
    (lambda root: (root / "e" / "a").mkdir(parents=True) or root / "e", "no images in class sub-folders"),
    (lambda root: _write(root / "bad" / "a" / "x.png", b"not a png") or root / "bad", "cannot read image file"),
    (lambda root: _folder(_folder(root / "m"), classes=("c",), size=(5, 5)), r"give --size N"),
])
def test_bad_folders_are_named(tmp_path, make, match):
    with pytest.raises(fe.FeatureEvalError, match=match):
        fe.load_image_folder(make(tmp_path))


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_test_folder_must_have_the_training_classes(tmp_path):
    _folder(tmp_path / "t", classes=("a",))
    with pytest.raises(fe.FeatureEvalError, match="no class folder 'b'"):
        fe.load_image_folder(tmp_path / "t", classes=["a", "b"])


@pytest.mark.parametrize("argv, match", [
    (["--train", "x", "--test", "y", "--checkpoint", "c"], "missing config="),
    (["--train", "x", "--test", "y", "config=a"], "missing --checkpoint"),
    (["--train", "x", "--test", "y", "--checkpoint", "c", "--random-inits", "0", "config=a"], "must be >= 1"),
    (["--train", "x", "--test", "y", "--checkpoint", "c", "--shots", "1,x", "config=a"], "comma list"),
])
def test_bad_arguments_exit_2_naming_the_option(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        fe.main(argv)
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_settings_from_a_demo_report(tmp_path):
    report = dict(config=dict(vissl_config="pretrain/swav/swav_fashion_mnist_cpu", overrides=["config.X=1"], seed=3),
                  checkpoint="ck.torch")
    (tmp_path / "r.json").write_text(json.dumps(report))
    ap = fe.build_parser()
    args = ap.parse_args(["--demo-report", str(tmp_path / "r.json"), "--train", "a", "--test", "b"])
    overrides, ckpt, seed, probes = fe._settings(args, ap)
    assert overrides == ["config=pretrain/swav/swav_fashion_mnist_cpu", "config.X=1"] and ckpt == "ck.torch"
    assert seed == 3 and probes == dict(shots=(1, 10, 100), draws=5, val_fraction=0.1, seed=3)


def _report_with_evaluation(tmp_path, inits, probes):
    report = dict(config=dict(vissl_config="pretrain/swav/swav_fashion_mnist_cpu", overrides=[], seed=1),
                  checkpoint="ck.torch", knn=dict(random_init=dict(per_init=[{}] * inits)), probes=probes)
    (tmp_path / "r.json").write_text(json.dumps(report))
    return str(tmp_path / "r.json")


@pytest.mark.parametrize("extra, expect", [
    # nothing given: the report's evaluation settings
    ([], dict(random_inits=2, probe_draws=3, shots=(1, 10))),
    # given on the command line: those win
    (["--random-inits", "4", "--probe-draws", "6", "--shots", "5"], dict(random_inits=4, probe_draws=6, shots=(5,))),
])
def test_a_demo_report_gives_its_evaluation_settings_where_none_are_given(tmp_path, extra, expect):
    """The tool on a demo's report evaluates as the demo did (a demo run with --random-inits 2
    gives a random-init figure of 2 inits), unless an option says otherwise."""
    path = _report_with_evaluation(tmp_path, 2, dict(swav=dict(protocol=dict(draws=3, shots=[1, 10]))))
    ap = fe.build_parser()
    args = ap.parse_args(["--demo-report", path, "--train", "a", "--test", "b", *extra])
    _, _, seed, probes = fe._settings(args, ap)
    assert args.random_inits == expect["random_inits"]
    assert probes == dict(shots=expect["shots"], draws=expect["probe_draws"], val_fraction=0.1, seed=1)


def test_a_demo_report_without_probes_turns_them_off_unless_asked(tmp_path):
    path = _report_with_evaluation(tmp_path, 5, {})  # a demo run with --probes off
    ap = fe.build_parser()
    for extra, on in (([], False), (["--probes", "on"], True)):
        args = ap.parse_args(["--demo-report", path, "--train", "a", "--test", "b", *extra])
        assert (fe._settings(args, ap)[3] is not None) == on
        assert args.random_inits == 5


def test_random_init_seeds_start_at_the_trainings_own_start():
    assert fe.random_init_seeds(1, 12, 3) == [12, 1012, 2012]


class _Payload:
    """Unpickling this runs code: it writes a marker file (what weights_only=False would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_with_python_objects_is_refused_not_unpickled(tmp_path):
    """swav-plugin-eval reads checkpoints with weights_only=True: a file that carries a pickled
    object is refused with an error naming it, and the object's code never runs."""
    import torch

    from vissl_swav_plugin.tools import feature_eval

    marker = tmp_path / "ran"
    path = tmp_path / "evil.torch"
    torch.save({"classy_state_dict": {"base_model": {"model": {"trunk": {}, "heads": {}}}}, "x": _Payload(str(marker))},
               path)
    with pytest.raises(feature_eval.FeatureEvalError, match=rf"refusing to load {path}"):
        feature_eval.load_checkpoint(None, str(path))
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is real: full unpickling runs it
    assert marker.exists()


@pytest.mark.parametrize("omp,expect", [
    ("1", 1), ("3", 3), (" 2 ", 2),  # a positive integer: the share of the cores the user or launcher gave
    (None, "cores"), ("", "cores"), ("0", "cores"), ("-1", "cores"), ("two", "cores"), ("2,1", "cores"),
])
def test_the_evaluation_runs_on_omp_num_threads_and_gives_the_callers_threads_back(monkeypatch, omp, expect):
    """The evaluation's torch threads follow OMP_NUM_THREADS where it names a positive number of
    threads (as torch's own start-up reads it), else every core; the caller's thread count is
    set back afterwards, also when the evaluation fails."""
    import os

    import torch

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    expect = max(1, os.cpu_count() or 1) if expect == "cores" else expect
    seen = []

    def work(*args):
        seen.append(torch.get_num_threads())
        if len(seen) == 2:
            raise RuntimeError("evaluation failed")
        return "result"

    monkeypatch.setattr(fe, "_evaluate", work)
    before = torch.get_num_threads()
    caller = next(n for n in (5, 6, 7) if n not in (before, expect))  # neither torch's count nor the expected one
    torch.set_num_threads(caller)
    try:
        assert fe.evaluate_features([], "ck", {}, 0) == "result"
        assert seen == [expect] and torch.get_num_threads() == caller
        with pytest.raises(RuntimeError, match="evaluation failed"):
            fe.evaluate_features([], "ck", {}, 0)
        assert seen == [expect, expect] and torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)
