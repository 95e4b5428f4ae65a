"""The suite's warm start (tests/helpers/zygote.py) against the truth it stands in for: a
launcher in a fresh interpreter with spawned ranks.  The same config run both ways must give
the same log lines of every iteration's loss and the same checkpoint, bit for bit; a warm run
that is killed leaves no process behind; a failing warm run reports its exit code and output;
a test that changed the environment gets a fresh interpreter."""
import os
import re

import torch

import testkit
import zygote
from testkit import SMALL_TRUNK, run_launcher

SMALL = [
    "config=test/swav_plugin/quick_cpu",
    *SMALL_TRUNK,
]


def _losses(text):
    return re.findall(r"Rank: (\d); \[ep: (\d+)\] iter: (\d+); lr: [^;]+; loss: ([^;]+);", text)


def _state(path):
    ck = torch.load(path, map_location="cpu", weights_only=False)
    return ck["classy_state_dict"]["base_model"]["model"], ck["loss"]


def _same(a, b, where=""):
    if torch.is_tensor(a):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def test_a_warm_run_equals_a_fresh_run_bit_for_bit(tmp_path):
    runs = {}
    for fresh in (True, False):
        ck = tmp_path / f"ck_{fresh}"
        proc = run_launcher(SMALL + [f"config.CHECKPOINT.DIR={ck}"], cwd=tmp_path, fresh=fresh)
        runs[fresh] = (_losses(proc.stdout), _state(ck / "model_final_checkpoint_phase1.torch"))
    (loss_fresh, state_fresh), (loss_warm, state_warm) = runs[True], runs[False]
    assert len(loss_fresh) >= 4, loss_fresh  # rank 0 logs every iteration
    assert loss_warm == loss_fresh
    _same(state_warm, state_fresh)


def test_a_failing_warm_run_reports_its_code_and_output(tmp_path):
    proc = run_launcher(SMALL + ["config.OPTIMIZER.nam=sgd", f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "config.OPTIMIZER.nam" in proc.stdout


def _group_members(pgid):
    members = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(p))
    return members


def test_a_killed_warm_run_leaves_no_process(tmp_path):
    """What ``run_launcher_until`` does to a warm run: kill its process group once a marker
    is logged; the copy and its forked ranks are all gone, the zygote lives on."""
    import time

    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        run = zygote.Run([str(testkit.STOCK_LAUNCHER), *SMALL, "config.OPTIMIZER.num_epochs=50",
                          f"config.CHECKPOINT.DIR={tmp_path / 'ck'}"], tmp_path, testkit.launcher_env(), f.fileno())
        deadline = time.time() + testkit.HANG_S
        while "Rank: 0; [ep: 2]" not in log.read_text() and time.time() < deadline:
            assert run.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        assert len(_group_members(run.pid)) >= 3  # the copy and its two ranks
        run.kill()
    assert run.returncode == -9
    deadline = time.time() + 30
    while _group_members(run.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert _group_members(run.pid) == []
    assert zygote._server["proc"].poll() is None


def test_a_changed_environment_restarts_the_zygote(tmp_path, monkeypatch):
    """A variable set by the test must be seen at import, as in a fresh interpreter: a zygote
    is started with it (a module-level read in the launcher's copy sees it).  The zygote of the
    usual environment is kept for the runs after (two per test process, the least recently
    used stopped for a third)."""
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint('seen', os.environ.get('VISSL_SWAV_PLUGIN_TEST_MARK'), "
                      "'torch' in sys.modules)\n")
    run_launcher(SMALL + [f"config.CHECKPOINT.DIR={tmp_path / 'a'}"], cwd=tmp_path)
    first = zygote._server["proc"]
    monkeypatch.setenv("VISSL_SWAV_PLUGIN_TEST_MARK", "1")
    code, out = zygote.run([str(script)], tmp_path, testkit.launcher_env(), timeout=600)
    assert code == 0 and "seen 1 True" in out, out  # warm (torch already imported), new variable
    second = zygote._server["proc"]
    assert second is not first and first.poll() is None
    assert zygote._server["env"]["VISSL_SWAV_PLUGIN_TEST_MARK"] == "1"
    assert testkit._warm(fresh=False) and not testkit._warm(fresh=True)
    monkeypatch.delenv("VISSL_SWAV_PLUGIN_TEST_MARK")
    code, out = zygote.run([str(script)], tmp_path, testkit.launcher_env(), timeout=600)
    assert code == 0 and "seen None True" in out, out
    assert zygote._server["proc"] is first  # the usual environment's zygote, kept
    monkeypatch.setenv("VISSL_SWAV_PLUGIN_TEST_MARK", "2")  # a third environment
    code, out = zygote.run([str(script)], tmp_path, testkit.launcher_env(), timeout=600)
    assert code == 0 and "seen 2 True" in out, out
    assert zygote._server["proc"] not in (first, second)
    assert second.poll() is not None and first.poll() is None  # the least recently used one stopped


def test_a_variable_read_only_at_run_time_keeps_the_zygote(tmp_path):
    """The debug trace folder (read when the loss's hooks are built) reaches the run's copy
    without a new zygote; a variable that is not listed still starts one."""
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('seen', os.environ.get('VISSL_SWAV_PLUGIN_TRACE_DIR'))\n")
    code, out = zygote.run([str(script)], tmp_path, testkit.launcher_env(), timeout=600)
    assert code == 0 and "seen None" in out, out
    first = zygote._server["proc"]
    trace = str(tmp_path / "trace")
    code, out = zygote.run([str(script)], tmp_path, testkit.launcher_env({"VISSL_SWAV_PLUGIN_TRACE_DIR": trace}),
                           timeout=600)
    assert code == 0 and f"seen {trace}" in out, out
    assert zygote._server["proc"] is first and first.poll() is None
    assert "VISSL_SWAV_PLUGIN_TRACE_DIR" in zygote.RUN_TIME_ENV
    zygote.run([str(script)], tmp_path, testkit.launcher_env({"VISSL_SWAV_PLUGIN_TEST_MARK": "2"}), timeout=600)
    assert zygote._server["proc"] is not first


# the demo of the GPU check's dry run, on 2 processes: a warm run of it forks the demo's own
# launcher (``python -m vissl_swav_plugin.tools.launch``) from the demo's copy
TINY_DEMO = ["--quick", "--device", "cpu", "--procs", "2", "--train-per-class", "8", "--test-per-class", "4",
             "--epochs", "1", "--batch", "8", "--prototypes", "10", "--freeze", "1", "--random-inits", "1",
             "--precise-bn", "off", "--threads", "1", "--probes", "off"]  # the probes run in the demo's own process


def test_a_nested_warm_run_equals_fresh_processes(tmp_path):
    """A Python script that a warm run starts (the demo starts VISSL's launcher) is forked
    from the run, reset to the state the run started from, instead of a new interpreter:
    the demo's losses and kNN figures are those of the demo, its launcher and its ranks each
    in a fresh interpreter, and the trace names the forked launcher."""
    import json

    from multicrop_helpers import make_fake_fashion

    source = tmp_path / "fm"
    make_fake_fashion(source, n_train=80, n_val=40)
    trace = tmp_path / "trace.jsonl"
    reports = {}
    for fresh in (True, False):
        out = tmp_path / f"out_{fresh}"
        proc = testkit.run_script([testkit.REPO / "tools" / "demo.py", *TINY_DEMO, "--source", source, "--out", out,
                                   "--data-dir", tmp_path / f"data_{fresh}"], cwd=tmp_path, fresh=fresh,
                                  env={"VISSL_SWAV_PLUGIN_TEST_ZYGOTE_TRACE": str(trace)})
        assert proc.returncode == 0, proc.stdout[-3000:]
        reports[fresh] = json.loads((out / "swav_demo_report.json").read_text())
        if fresh:
            assert not trace.exists()  # nothing was forked
    forked = [json.loads(line)["argv"] for line in trace.read_text().splitlines()]
    assert [a[:2] for a in forked] == [["-m", "vissl_swav_plugin.tools.launch"]], forked
    fresh, warm = reports[True], reports[False]
    assert [(p["iter"], p["loss"]) for p in warm["loss_curve"]] == [(p["iter"], p["loss"]) for p in fresh["loss_curve"]]
    assert len(fresh["loss_curve"]) == 5  # 80 images / (2 processes x 8)
    assert warm["knn"] == fresh["knn"]


def test_a_nested_run_is_forked_only_where_a_fork_gives_what_a_new_interpreter_would(tmp_path):
    """A warm run's ``python child.py``: forked when only a variable the fork applies changed
    (OMP_NUM_THREADS: the child's torch threads), with a new interpreter's signal handlers,
    argv and path; started as a new interpreter when another variable changed (a module may
    read it at import)."""
    import json

    child = tmp_path / "child.py"
    child.write_text(
        "import json, os, signal, sys\nimport torch\n"
        "print(json.dumps(dict(warm='vissl' in sys.modules, threads=torch.get_num_threads(),\n"
        "    mark=os.environ.get('VISSL_SWAV_PLUGIN_TEST_MARK'), argv=sys.argv, path0=sys.path[0],\n"
        "    sigterm=signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)))\n")
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import os, signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"
        "for extra in ({'OMP_NUM_THREADS': '3'}, {'VISSL_SWAV_PLUGIN_TEST_MARK': 'x'}):\n"
        "    r = subprocess.run([sys.executable, sys.argv[1], 'a'], env=dict(os.environ, **extra),\n"
        "                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True)\n"
        "    print('CHILD', r.stdout.strip().splitlines()[-1])\n")
    trace = tmp_path / "trace.jsonl"
    proc = testkit.run_script([parent, child], cwd=tmp_path, env={"VISSL_SWAV_PLUGIN_TEST_ZYGOTE_TRACE": str(trace)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    forked, fresh = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("CHILD ")]
    assert forked == dict(warm=True, threads=3, mark=None, argv=[str(child), "a"], path0=str(tmp_path), sigterm=True)
    assert fresh == dict(warm=False, threads=1, mark="x", argv=[str(child), "a"], path0=str(tmp_path), sigterm=True)
    assert [json.loads(line)["argv"] for line in trace.read_text().splitlines()] == [[str(child), "a"]]


def test_a_shell_command_runs_a_script_warm_with_its_directory_environment_output_and_exit_code(tmp_path):
    """``testkit.python_command`` in a shell command (the own-images section's console-script
    shims): the script runs in a fork of the warm zygote (VISSL already imported), in the
    shell's working directory, with its environment (a variable the shell set), arguments,
    stdout and stderr, and the command exits with the script's code."""
    import shlex
    import subprocess

    script = tmp_path / "s.py"
    script.write_text("import os, sys\n"
                      "print('OUT', os.getcwd(), os.environ.get('MARK'), 'vissl' in sys.modules, sys.argv[1:])\n"
                      "print('ERR', file=sys.stderr)\nsys.exit(3)\n")
    (tmp_path / "here").mkdir()
    cmd = " ".join(shlex.quote(str(a)) for a in [*testkit.python_command(), script, "a b"])
    r = subprocess.run(["bash", "-c", f"cd here && MARK=m {cmd}"], cwd=tmp_path, env=testkit.launcher_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=testkit.HANG_S)
    assert r.returncode == 3, r.stdout
    assert f"OUT {tmp_path / 'here'} m True ['a b']" in r.stdout and "ERR" in r.stdout, r.stdout
