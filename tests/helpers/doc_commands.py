"""The documentation's shell blocks, checked the way a new user runs them after ``make venv``.

Every ```` ```bash ````, ```` ```sh ```` and ```` ```console ```` block of README.md and docs/*.md
(docs/experiments aside) is read as the shell would read it: backslash continuations joined,
comments dropped, each line split at ``&&``, ``;`` and ``|``, ``VAR=value`` and
``${VAR:-default}`` followed through the page.  For each command:

* **the program exists** in a fresh ``make venv`` world.  ``source .venv/bin/activate`` (the README's
  quick start; each page shows it before its first such command) puts ``.venv/bin`` first on the
  PATH; before that line a bare ``swav-plugin-*``, ``python``, ``pip`` or ``torchrun`` is an error
  (``.venv/bin/<program>`` is always fine).  ``swav-plugin-*`` must be one of setup.py's console
  scripts, ``make`` targets must exist, ``python X.py`` / ``python -m X`` must name a file or an
  importable module, and any other program must be a known system command;
* **flags** of our tools are parsed by their own argparse parsers (the tool's ``main`` is called
  with the command's arguments and stopped right after parsing), torchrun's by torch's parser,
  and ``swav-plugin-train`` takes Hydra overrides only;
* **``config=`` commands** (``swav-plugin-train``, ``tools/run_distributed_engines.py``, VISSL's
  ``run_distributed_engines.py``, ``torchrun ... -m vissl_swav_plugin.tools.torchrun`` and our
  other tools' overrides) are composed with their overrides in the test process, in the page's
  working directory with its exported variables (:func:`compose_jobs`), the placeholder paths
  (:data:`PLACEHOLDERS`) replaced by generated image folders, and the launchers' configs go
  through the plugin's launch checks (``run_launch_checks``): a dropped ``LABEL_PATHS``, a config
  that does not exist, a missing folder fail there as they would at launch.  torchrun's
  ``--nnodes`` x ``--nproc_per_node`` must equal the config's processes;
* **commands that run on CPU in seconds** are run: every ``--help``, and the data tools
  (:data:`RUNNABLE`) when their input exists in the page's working directory, so that the files
  they write are there for the next command.

A block that cannot be checked (an install from the network, output, a cluster's own commands)
has ``<!-- docs-test: skip (the reason) -->`` on the line before it (blank lines between are
allowed); the reason is required.
"""
import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testkit import REPO, SITE, catalog_env, make_image_folder

VENV_BIN = Path(sys.executable).parent

LANGUAGES = ("bash", "sh", "console")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[\w-]+)\s*(?:\((?P<reason>[^)]*)\))?\s*-->\s*$")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*(.*)$")

#: ``<...>`` placeholders of the pages and what stands in for them
ANGLE_PLACEHOLDERS = {
    "<this repository>": "https://example.invalid/vissl-swav-plugin.git",
    "<partition>": "debug",
    "<0..7>": "0",
    "<0..N-1>": "0",
    "<host of node 0>": "127.0.0.1",
    "<free port>": "29500",
    "<gpus>": "1",
}
#: path prefixes of the pages that stand for the user's files, and the world folder they map to
PLACEHOLDERS = {"/path/to/": "path/to/", "/shared/": "shared/"}
#: folders of generated images under the world root (the data the placeholders name)
IMAGE_FOLDERS = {
    "path/to/imagenet/train": 4200,  # the largest documented global batch is 4096
    "path/to/imagenet/val": 64,
    "shared/imagenet/train": 4200,
    "shared/imagenet/val": 64,
}
#: relative paths the pages' commands read as the user's own images (in the page's directory)
USER_IMAGES = ("my_images", "my_labelled")

#: programs every Linux shell has (or the pages' prerequisites install)
SYSTEM = {"git", "make", "cd", "ls", "mkdir", "cp", "mv", "rm", "cat", "echo", "export", "tar", "wget",
          "curl", "sudo", "apt-get", "nvidia-smi", "head", "tail", "du", "df", "bash", "sh", "python3",
          "python3.11", "sbatch", "squeue", "scancel", "true", "test", "unset", "env", "ln", "tee", "sha256sum"}
#: programs that ``make venv`` installs in .venv/bin only
VENV_PROGRAMS = {"python", "pip", "torchrun", "lint-imports"}
#: our data tools: run when their input exists (seconds on a few images); the option naming the input
RUNNABLE = {"swav-plugin-prepare-data": "--source", "swav-plugin-mean-std": None,
            "swav-plugin-label-subsets": "--catalog"}
#: the Debian package's Fashion-MNIST, swav-plugin-prepare-data's default source (no --source)
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: added to a run of swav-plugin-prepare-data on the full Fashion-MNIST, so that it takes seconds
SMALLER = ["--limit-per-class", "40"]


@dataclass
class Block:
    line: int
    info: str
    body: str
    marker: tuple = None  # (kind, reason) or None


@dataclass
class PageState:
    env: dict
    run_enabled: bool  # run the runnable commands (subprocesses)
    activated: bool = False
    jobs: list = field(default_factory=list)  # config compositions, done at the page's end (compose_jobs)
    exported: dict = field(default_factory=dict)  # `export`ed variables: the environment of later commands


def user_pages():
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def shell_blocks(text):
    """The shell blocks of a page, each with the marker on the line before it (if any)."""
    lines = text.split("\n")
    out, fence, info, body, start, marker = [], None, "", [], 0, None
    for n, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, info, body, start = m.group(1), m.group(2).strip(), [], n + 1
            marker = None
            k = n - 2
            while k >= 0 and not lines[k].strip():
                k -= 1
            mm = MARKER.match(lines[k]) if k >= 0 else None
            if mm:
                marker = (mm.group("kind"), (mm.group("reason") or "").strip())
        elif fence is not None and m and m.group(1).startswith(fence[0]) and not m.group(2).strip():
            if info.split(" ")[0] in LANGUAGES:
                out.append(Block(start, info, "\n".join(body), marker))
            fence = None
        elif fence is not None:
            body.append(line)
    return out


def _logical_lines(block):
    """``(line number, text)`` of a block's commands: continuations joined, console prompts."""
    console = block.info.split(" ")[0] == "console"
    out, buf, first = [], [], None
    for k, line in enumerate(block.body.split("\n")):
        if console and not buf:
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if first is None:
            first = block.line + k
        if line.rstrip().endswith("\\"):
            buf.append(line.rstrip()[:-1])
            continue
        buf.append(line)
        out.append((first, " ".join(buf)))
        buf, first = [], None
    if buf:
        out.append((first, " ".join(buf)))
    return out


def _expand(token, env):
    def sub(m):
        name, default = m.group(1) or m.group(3), m.group(2)
        if name in env:
            return env[name]
        return default if default is not None else m.group(0)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", sub, token)


def _place(text):
    """Placeholders of a command line replaced; an undefined ``<...>`` is an error."""
    for k, v in ANGLE_PLACEHOLDERS.items():
        text = text.replace(k, v)
    text = re.sub(r"\$\([^)]*\)", "__COMMAND_OUTPUT__", text)
    bad = re.findall(r"(?<![<\w])<[A-Za-z0-9][^<>]*>", text)
    return text, bad


def split_commands(line):
    """A logical line's commands (split at ``&&``, ``||``, ``;``, ``|``), each a token list."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    out, cur = [], []
    for tok in lex:
        if tok and set(tok) <= set(";&|"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append(cur)
    return out


# --------------------------------------------------------------------------------------------
# our tools' argument parsers
# --------------------------------------------------------------------------------------------
class _Parsed(BaseException):
    def __init__(self, namespace, rest):
        super().__init__()
        self.namespace, self.rest = namespace, rest


class _ParseError(BaseException):
    pass


def console_scripts():
    text = (REPO / "setup.py").read_text()
    return {name: (mod, fn) for name, mod, fn in re.findall(r'"(swav-plugin-[\w-]+) = ([\w.]+):(\w+)"', text)}


#: tools that read their options without argparse: the function that parses them
OWN_PARSERS = {"vissl_swav_plugin.tools.knn_eval": "split_args"}


def parse_with_tool(entry, argv):
    """Call the tool's ``main(argv)`` and stop it right after argparse parsed ``argv``: returns
    ``(error or None, namespace)``."""
    mod, fn = entry
    if mod in OWN_PARSERS:
        parse = getattr(importlib.import_module(mod), OWN_PARSERS[mod])
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return None, parse(list(argv))
        except SystemExit as e:
            return (None if e.code in (0, None) else f"exited with {e.code}"), None
        except Exception as e:  # the tool's own usage error
            return f"{type(e).__name__}: {e}", None
    main = getattr(importlib.import_module(mod), fn)
    real_known = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = real_known(self, args, namespace)
        raise _Parsed(ns, rest)

    def parse_args(self, args=None, namespace=None):
        ns, rest = real_known(self, args, namespace)
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        raise _Parsed(ns, rest)

    def error(self, message):
        raise _ParseError(message)

    saved = (argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.parse_args,
             argparse.ArgumentParser.error)
    argparse.ArgumentParser.parse_known_args = parse_known_args
    argparse.ArgumentParser.parse_args = parse_args
    argparse.ArgumentParser.error = error
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(list(argv))
    except _Parsed as p:
        return None, p.namespace
    except _ParseError as e:
        return str(e), None
    except SystemExit as e:  # --help, or a tool's own exit before parsing
        return (None if e.code in (0, None) else f"exited with {e.code}"), None
    finally:
        (argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.parse_args,
         argparse.ArgumentParser.error) = saved
    return "its main() returned without parsing its arguments", None


_OVERRIDE = re.compile(r"^(?:[+~]{0,2})(?:config(?:[./][\w./\-\[\]]*)?|node_id|hydra[\w.]*)(?:=|$)")


def is_override(arg):
    return bool(_OVERRIDE.match(arg))


def config_overrides(args):
    return [a for a in args if is_override(a)]


def config_name_exists(name, cwd):
    """``config=NAME`` resolves: the working directory's configs, ours, then VISSL's
    (``vissl/NAME``: VISSL's only)."""
    roots = [Path(cwd) / "configs" / "config", REPO / "configs" / "config"]
    vissl_root = SITE / "configs" / "config"
    if name.startswith("vissl/"):
        return (vissl_root / f"{name[6:]}.yaml").is_file()
    return any((r / f"{name}.yaml").is_file() for r in roots + [vissl_root])


# --------------------------------------------------------------------------------------------
# the checker
# --------------------------------------------------------------------------------------------
def setup_world(root):
    """The generated data behind the placeholder paths (once per session)."""
    import numpy as np
    from PIL import Image

    root = Path(root)
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 127, np.uint8)).save(buf, format="PNG")
    png = buf.getvalue()
    for rel, n in IMAGE_FOLDERS.items():
        for i in range(n):
            d = root / rel / f"class{i % 2}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i}.png").write_bytes(png)
    return root


def make_user_images(cwd):
    for name in USER_IMAGES:
        # 350 images: the documented batches (2 x 64, 1 x 256) fit in the 80% kept for training
        make_image_folder(Path(cwd) / name, classes=5, per_class=70, size=32)


def _map_paths(token, world):
    for prefix, rel in PLACEHOLDERS.items():
        token = token.replace(prefix, f"{world}/{rel}")
    return token


def check_page(text, page, world=None, cwd=None, compose=True, run=True):
    """Errors (``page:line: ...``) of one page's shell blocks.  ``world``: the placeholder data
    root (:func:`setup_world`); ``cwd``: the page's working directory; ``compose`` / ``run``:
    compose the configs (in this process) / run the runnable commands (processes)."""
    errors, state = [], PageState(env={"SITE": str(SITE), "HOME": os.environ.get("HOME", "/root")}, run_enabled=run)
    world = Path(world) if world else Path("/nonexistent-world")
    cwd = Path(cwd) if cwd else REPO
    for block in shell_blocks(text):
        if block.marker:
            kind, reason = block.marker
            if kind != "skip":
                errors.append(f"{page}:{block.line}: unknown docs-test marker '{kind}' (only 'skip (reason)')")
            elif not reason:
                errors.append(f"{page}:{block.line}: docs-test skip marker without a reason")
            continue
        for n, line in _logical_lines(block):
            line, bad = _place(line)
            if bad:
                errors.append(f"{page}:{n}: undefined placeholder(s) {bad}: define them in doc_commands")
                continue
            try:
                cmds = split_commands(line)
            except ValueError as e:
                errors.append(f"{page}:{n}: cannot parse '{line}': {e}")
                continue
            for argv in cmds:
                argv = [_map_paths(_expand(a, state.env), world) for a in argv]
                errors += [f"{page}:{n}: {e}" for e in _check_command(argv, f"{page}:{n}", state, cwd)]
    if compose and state.jobs:
        errors += compose_jobs(state.jobs, cwd, state.exported)
    return errors


def _assignments(argv, env):
    k = 0
    while k < len(argv) and re.match(r"^[A-Za-z_]\w*=", argv[k]):
        name, value = argv[k].split("=", 1)
        env[name] = value
        k += 1
    return argv[k:]


def _check_command(argv, where, state, cwd):
    """Errors of one command; ``where`` (``page:line``) names the config compositions it queues."""
    argv = _assignments(list(argv), state.env)
    if not argv:
        return []
    prog, args = argv[0], argv[1:]
    if prog == "export":
        before = dict(state.env)
        _assignments(args, state.env)
        state.exported.update({k: v for k, v in state.env.items() if before.get(k) != v})
        return []
    if prog in ("source", "."):
        if args and (args[0] == ".venv/bin/activate" or args[0].endswith("/.venv/bin/activate")):
            state.activated = True
            return []
        return [f"`{prog} {' '.join(args)}`: only `source .venv/bin/activate` is known"]
    if prog.startswith(".venv/bin/"):
        prog = prog[len(".venv/bin/"):]
        via_path = True
    else:
        via_path = False
    venv_prog = prog.startswith("swav-plugin-") or prog in VENV_PROGRAMS
    if venv_prog and not via_path and not state.activated:
        return [f"`{prog}` before `source .venv/bin/activate`: `make venv` installs it in .venv/bin only "
                "(activate first, as the README's quick start does, or call .venv/bin/" + prog + ")"]
    if prog.startswith("swav-plugin-"):
        return _check_ours(where, prog, args, state, cwd)
    if prog in ("python", "python3", "python3.11"):
        return _check_python(where, args, state, cwd)
    if prog == "torchrun":
        return _check_torchrun(where, args, state, cwd)
    if prog == "make":
        targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))
        wanted = [a for a in args if not a.startswith("-") and "=" not in a]
        return [f"make has no target '{t}'" for t in wanted if t not in targets]
    if prog in VENV_PROGRAMS:
        return [] if (VENV_BIN / prog).exists() else [f"`{prog}` is not in .venv/bin"]
    if prog == "bash" and args and args[0].endswith(".sh"):
        return [] if (REPO / args[0]).is_file() else [f"no script {args[0]}"]
    if prog in SYSTEM:
        return []
    return [f"unknown program `{prog}` (not a console script of setup.py, not in .venv/bin, "
            "not a known system command)"]


def _help(args):
    return any(a in ("-h", "--help") for a in args)


def _check_ours(where, prog, args, state, cwd):
    scripts = console_scripts()
    if prog not in scripts:
        return [f"`{prog}` is not a console script of setup.py"]
    if _help(args):
        return _run([str(VENV_BIN / prog), *args], cwd, state)
    if prog == "swav-plugin-train":
        bad = [a for a in args if not is_override(a)]
        if bad:
            return [f"swav-plugin-train takes Hydra overrides only, not {bad}"]
        return _queue_config(where, args, state, cwd, launch=True)
    error, _ = parse_with_tool(scripts[prog], args)
    if error:
        return [f"{prog}: {error}"]
    errors = []
    overrides = config_overrides(args)
    if overrides:
        errors += _queue_config(where, overrides, state, cwd, launch=False)
    if prog in RUNNABLE:
        errors += _maybe_run(prog, args, state, cwd)
    return errors


def _maybe_run(prog, args, state, cwd):
    flag = RUNNABLE[prog]
    if flag is None:
        source = next((a for a in args if not a.startswith("-")), None)
    else:
        source = args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None
    extra = []
    if prog == "swav-plugin-prepare-data" and source is None and "--limit-per-class" not in args:
        if FASHION_MNIST.is_dir():  # the default source, a few images per class
            source, extra = str(FASHION_MNIST), SMALLER
        else:  # no Debian package here: 10 generated classes stand in for it, under its catalog name
            source = str(make_image_folder(Path(cwd) / "fashion_mnist_standin", classes=10,
                                                   per_class=40, size=28))
            extra = ["--source", source, "--name", "fashion_mnist"]
    if source is None or not (Path(cwd) / source).exists():
        return []  # its input is the user's (not generated here): flags parsed, not run
    return _run([str(VENV_BIN / prog), *args, *extra], cwd, state)


def _run(argv, cwd, state, timeout=300):
    """Run a console script or script (a real process, as the user's shell runs it)."""
    if not state.run_enabled:
        return []
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **state.exported)
    proc = subprocess.run(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        return [f"`{' '.join(argv)}` failed (rc={proc.returncode}): {proc.stdout[-1500:]}"]
    return []


def _script_path(script, cwd):
    for base in (Path(cwd), REPO):
        p = base / script
        if p.is_file():
            return p
    p = Path(script)
    return p if p.is_absolute() and p.is_file() else None


def _check_python(where, args, state, cwd):
    if not args:
        return []
    if args[0] == "-m":
        if len(args) < 2:
            return ["`python -m` without a module"]
        mod = args[1]
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return [f"no module {mod}"]
        if mod == "torch.distributed.run":
            return _check_torchrun(where, args[2:], state, cwd)
        for name, entry in console_scripts().items():
            if entry[0] == mod:
                return _check_ours(where, name, args[2:], state, cwd)
        return []
    if args[0] == "-c":
        return []
    script = args[0]
    path = _script_path(script, cwd)
    if path is None:
        return [f"no script {script}"]
    rest = args[1:]
    if path.name == "run_distributed_engines.py":
        if _help(rest):
            return _run([sys.executable, str(path), *rest], cwd, state)
        bad = [a for a in rest if not is_override(a)]
        if bad:
            return [f"{script} takes Hydra overrides only, not {bad}"]
        return _queue_config(where, rest, state, cwd, launch=True)
    src = path.read_text()
    m = re.search(r"^from (vissl_swav_plugin[\w.]*) import (\w+)", src, re.M)
    if path.is_relative_to(REPO) and m and re.search(rf"\b{m.group(2)}\(", src):
        entry = (m.group(1), m.group(2))
        if _help(rest):
            return _run([sys.executable, str(path), *rest], cwd, state)
        error, _ = parse_with_tool(entry, rest)
        if error:
            return [f"{script}: {error}"]
    overrides = config_overrides(rest)
    if overrides and str(path).startswith(str(SITE)):
        return _queue_config(where, overrides, state, cwd, launch=False)
    return []


def _check_torchrun(where, args, state, cwd):
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def error(message):
        raise _ParseError(message)

    parser.error = error
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_args(args)
    except _ParseError as e:
        return [f"torchrun: {e}"]
    if not ns.module:
        return [] if _script_path(ns.training_script, cwd) else [f"torchrun: no script {ns.training_script}"]
    if importlib.util.find_spec(ns.training_script) is None:
        return [f"torchrun: no module {ns.training_script}"]
    if ns.training_script != "vissl_swav_plugin.tools.torchrun":
        return []
    nnodes = int(str(ns.nnodes).split(":")[-1])
    nproc = int(ns.nproc_per_node) if str(ns.nproc_per_node).isdigit() else None
    return _queue_config(where, ns.training_script_args, state, cwd, launch=True, world=(nnodes * nproc) if nproc else None)


def _queue_config(where, overrides, state, cwd, launch, world=None):
    names = [a.split("=", 1)[1] for a in overrides if a.startswith("config=")]
    if not names:
        return ["a config command without `config=NAME`"]
    errors = [f"config={n}: no such config (working directory, plugin or VISSL)" for n in names
              if not config_name_exists(n, cwd)]
    # a config group option without its file (+config/dataset_stats=NAME before the command that
    # writes it) fails when the job is composed: the plugin's UnknownConfigError, named with the line
    if not errors:
        state.jobs.append({"where": where, "overrides": list(overrides), "launch": launch,
                           "world": world})
    return errors


def compose_jobs(jobs, cwd, exported=None):
    """Compose every job's config in this process, in ``cwd`` (the page's working directory: its
    ./configs come first) with the page's exported variables (:func:`testkit.catalog_env`: VISSL reads
    an exported VISSL_DATASET_CATALOG_PATH at import, so its catalog is registered here), and run
    the launch checks where asked; returns errors."""
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    from vissl_swav_plugin.config.registries import run_launch_checks

    errors = []
    try:
        with contextlib.chdir(cwd), catalog_env(exported or {}):
            for job in jobs:
                overrides = [o for o in job["overrides"] if not o.startswith("node_id=")]
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        _, config = convert_to_attrdict(compose_hydra_configuration(overrides), dump_config=False)
                        if job["launch"]:
                            run_launch_checks(config)
                except (Exception, SystemExit) as e:  # Hydra raises many kinds
                    errors.append(f"{job['where']}: {type(e).__name__}: {str(e).strip()[:800]}")
                    continue
                world = config.DISTRIBUTED.NUM_NODES * config.DISTRIBUTED.NUM_PROC_PER_NODE
                if job.get("world") and job["world"] != world:
                    errors.append(f"{job['where']}: torchrun starts {job['world']} processes, the config has "
                                  f"{world} (DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE)")
    except Exception as e:  # the page's environment itself (a missing catalog fails VISSL's import)
        errors.append(f"composing the configs failed: {type(e).__name__}: {e}")
    return errors
