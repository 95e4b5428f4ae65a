"""The documentation is code: README.md and docs/ may name only what exists, and what they say of
the configs and the code must hold.  The measured tables, the config tables, the compat table and
the collapse message are not checked here: ``tools/doc_tables.py`` writes them from their sources
(cog blocks) and ``test_doc_tables.py`` checks them.

Each check is a function that takes the text (and what it is checked against) and returns a list
of errors, so that the planted tests at the end can feed it a wrong path, value, flag or one of the
old README's false claims and see it reported.  Nothing here starts a process: configs are read
as YAML, tools' options come from their argparse parsers (or their source).

What is checked (user pages: README.md and docs/*.md; all pages: also docs/experiments/*.md):

* every repository path, module and config name named in any page exists, and so does every
  repository path and ``vissl_swav_plugin.*`` module named in the code's comments and docstrings,
  the YAML configs, the Makefile, ``.importlinter`` and ``pytest.ini``;
* the keys-and-defaults tables of docs/configs.md equal the code's tables;
* the console-script table equals setup.py's entry points, and every ``swav-plugin-*`` named exists;
* every ``--flag`` named for a tool is one of that tool's options; every ``make`` target exists;
* user pages: a timing names its machine (CPU / GPU model) and date; run lengths in iterations
  come from the configs or the demo; on/off claims about a hook in a config hold; a command that
  sets ``AMP_DTYPE`` also turns ``USE_AMP`` on;
* no page explains anything by an issue number or a commit hash;
* README.md has at most ~300 lines.
"""
import ast
import importlib
import importlib.util
import inspect
import io
import math
import os
import re
import tokenize
import types
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from vissl_swav_plugin.config.yaml_files import shipped_config_files, shipped_config_names

REPO = next(p for p in Path(__file__).resolve().parents if (p / "setup.py").is_file())
DOCS = REPO / "docs"
CONFIGS = REPO / "configs" / "config"
REFERENCE = DOCS / "configs.md"
README_MAX_LINES = 300

#: top-level entries of the checkout that are not part of the repository
NOT_REPO = {".git", ".venv", "build", "dist", "data", "runs", "demo_output", "checkpoints", ".pytest_cache",
            "__pycache__", ".whl"}
#: what counts as naming a machine in a timing: a CPU or GPU model
MACHINES = re.compile(r"Intel Xeon|AMD EPYC|\b[VAH]100\b|\bH200\b|\bA10G?\b|\bL4\b|\bT4\b|RTX \d+")
DATE = re.compile(r"\b20\d\d\b|not recorded")


def user_docs():
    return [REPO / "README.md"] + sorted(DOCS.glob("*.md"))


def all_docs():
    return user_docs() + sorted((DOCS / "experiments").glob("*.md"))


def rel(path):
    return str(path.relative_to(REPO))


# --------------------------------------------------------------------------------------------
# markdown helpers
# --------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*(.*)$")
_EXTERNAL_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\((?:https?:|mailto:)[^)]*\)")
_URL = re.compile(r"https?://\S+")
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def split_fenced(text):
    """``(prose, blocks)``: the text with fenced blocks and comment lines (``<!-- ... -->``, e.g. a
    generated table's markers) blanked, line numbers kept, and the blocks as ``(info string, body,
    first line number)``."""
    prose, blocks, fence, info, body, start = [], [], None, "", [], 0
    for n, line in enumerate(text.split("\n"), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, info, body, start = m.group(1), m.group(2).strip(), [], n + 1
            prose.append("")
        elif fence is not None and m and m.group(1).startswith(fence[0]) and not m.group(2).strip():
            blocks.append((info, "\n".join(body), start))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append("" if re.match(r"^\s*<!--.*-->\s*$", line) else line)
    return "\n".join(prose), blocks


def paragraphs(prose):
    """``(first line number, text)`` of each paragraph; every table row is its own paragraph."""
    out, buf, start = [], [], 0
    for n, line in enumerate(prose.split("\n"), 1):
        if line.lstrip().startswith("|"):
            if buf:
                out.append((start, "\n".join(buf)))
                buf = []
            out.append((n, line))
        elif line.strip():
            if not buf:
                start = n
            buf.append(line)
        elif buf:
            out.append((start, "\n".join(buf)))
            buf = []
    if buf:
        out.append((start, "\n".join(buf)))
    return out


def drop_external_links(text):
    return _URL.sub(" ", _EXTERNAL_LINK.sub(" ", text))


def code_spans(text):
    return [m.group(2).strip() for m in _SPAN.finditer(text)]


def cells(row):
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def tables(text):
    """``(heading, header cells, [(line number, cells)])`` of every table (fenced blocks skipped)."""
    prose, _ = split_fenced(text)
    out, heading, current = [], "", None
    for n, line in enumerate(prose.split("\n"), 1):
        if line.startswith("#"):
            heading = line
        if line.lstrip().startswith("|"):
            row = cells(line)
            if current is None:
                current = (heading, [c.lower() for c in row], [])
                out.append(current)
            elif not all(set(c) <= set("-: ") for c in row):
                current[2].append((n, row))
        else:
            current = None
    return out


def first_span(cell):
    spans = code_spans(cell)
    return spans[0] if spans else None


def commands(text):
    """Shell commands of the fenced blocks (continuation lines joined) and the inline code spans,
    as ``(line number, command)``."""
    prose, blocks = split_fenced(drop_external_links(text))
    out = []
    for info, body, start in blocks:
        if info.split(" ")[0] not in ("", "bash", "sh", "shell", "console"):
            continue
        joined = re.sub(r"\\\n\s*", " ", body)
        for k, line in enumerate(joined.split("\n")):
            line = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
            if line.strip():
                out.append((start + k, line))
    for n, para in paragraphs(prose):
        for span in code_spans(para):
            out.append((n, span))
    return out


# --------------------------------------------------------------------------------------------
# what the docs are checked against
# --------------------------------------------------------------------------------------------
@lru_cache(None)
def top_level():
    return {p.name for p in REPO.iterdir()} - NOT_REPO - {p.name for p in REPO.glob("*.egg-info")}


@lru_cache(None)
def package_dirs():
    return {p.name for p in (REPO / "vissl_swav_plugin").iterdir() if p.is_dir() and not p.name.startswith("_")}


@lru_cache(None)
def basenames():
    """Names of every file and folder of the repository (ignored folders pruned)."""
    names = set()
    for _root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in NOT_REPO and not d.endswith(".egg-info")]
        names.update(dirs)
        names.update(files)
    return frozenset(names)


@lru_cache(None)
def vissl_configs():
    import vissl

    return Path(vissl.__file__).resolve().parent.parent / "configs" / "config"


@lru_cache(None)
def yaml_config(name, root=None):
    root = Path(root) if root else CONFIGS
    return yaml.safe_load((root / f"{name}.yaml").read_text())["config"]


def shipped_configs(root=CONFIGS):
    return shipped_config_names(root=root)


def config_by_name(name, root=CONFIGS):
    """The shipped config called ``name`` (a path under configs/config, or a file stem)."""
    names = shipped_configs(root)
    if name in names:
        return name
    hits = [n for n in names if n.rsplit("/", 1)[-1] == name]
    return hits[0] if len(hits) == 1 else None


_MISSING = object()


def lookup(cfg, path):
    node = cfg
    for part in path.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return _MISSING
    return node


def _norm(v):
    if isinstance(v, str):
        s = v.strip()
        if s in ("None", "null", "~"):
            return None
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
        try:
            return float(s)
        except ValueError:
            return s
    if isinstance(v, tuple):
        return list(v)
    return v


def same(a, b):
    """``a`` (a value as the docs write it) equals ``b`` (the YAML's or the code's)."""
    a, b = _norm(a), _norm(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def doc_value(span):
    try:
        return yaml.safe_load(span)
    except yaml.YAMLError:
        return span


@lru_cache(None)
def console_scripts(setup_text=None):
    """``{name: "module:function"}`` of setup.py's ``CONSOLE_SCRIPTS``."""
    tree = ast.parse(setup_text or (REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CONSOLE_SCRIPTS" for t in node.targets):
            entries = ast.literal_eval(node.value)
            return dict(tuple(s.strip() for s in e.split("=", 1)) for e in entries)
    raise AssertionError("no CONSOLE_SCRIPTS in setup.py")


@lru_cache(None)
def make_targets():
    return set(re.findall(r"^([\w.-]+)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


@lru_cache(None)
def module_names(modname):
    """Names defined at the top level of a module of ours (functions, classes, assignments, imports)."""
    mod = importlib.util.find_spec(modname)
    if mod is None or not mod.origin or not mod.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(mod.origin).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if Path(mod.origin).name == "__init__.py":
        names |= {p.stem for p in Path(mod.origin).parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    return names


# --------------------------------------------------------------------------------------------
# checks: paths, modules, configs
# --------------------------------------------------------------------------------------------
_WORD_SPLIT = re.compile(r"[\s=,;()\[\]'\"|`]+")
_BARE_EXT = (".py", ".md", ".yaml", ".yml", ".sh")
_MODULE = re.compile(r"^vissl_swav_plugin(?:\.[A-Za-z_]\w*)+$")


def _exists(path):
    if any(c in path for c in "*?"):
        return any(REPO.glob(path))
    return (REPO / path).exists()


def path_errors(token, doc_dir, bare=True):
    """What is wrong with ``token`` as a repository path or module (an empty list: nothing, or not
    a path).  ``bare=False`` (the code's comments and docstrings): only a path under a top-level
    entry of the repository (or ``.venv/``) and a ``vissl_swav_plugin.*`` module count; a bare file
    name or a path relative to a package folder may be VISSL's or torch's there."""
    token = token.rstrip(".,:;")
    if token.startswith("./"):
        return []  # the user's working directory, not the repository
    if not token or token[0] in "$~+-/#@%" or "..." in token:
        return []
    if _MODULE.match(token) and not (REPO / token).exists():
        parts = token.split(".")
        for k in range(len(parts), 0, -1):
            name = ".".join(parts[:k])
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, AttributeError, ValueError):
                spec = None
            if spec is not None:
                if k < len(parts) and parts[k] not in (module_names(name) or set()):
                    return [f"`{token}`: {name} has no {parts[k]}"]
                return []
        return [f"`{token}`: no such module"]
    first = token.split("/")[0]
    if "/" in token:
        if first == ".venv":
            return [] if not (REPO / ".venv").exists() or _exists(token) else [f"`{token}`: no such file"]
        if first in top_level():
            return [] if _exists(token) else [f"`{token}`: no such file or folder in the repository"]
        if bare and first in package_dirs() and (token.endswith("/") or Path(token).suffix):
            return [] if _exists(f"vissl_swav_plugin/{token}") else [f"`{token}`: no such file in vissl_swav_plugin/"]
        return []
    if bare and token.endswith(_BARE_EXT) and re.match(r"^[\w.*-]+$", token):
        return [] if token in basenames() else [f"`{token}`: no file of that name in the repository"]
    return []


def heading_anchors(text):
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    prose, _ = split_fenced(text)
    return {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
            for h in prose.split("\n") if re.match(r"^#{1,6} ", h)}


def check_paths(text, doc_path):
    """Every repository path (links, code spans, commands), module and file named exists."""
    errors = []
    doc_dir = Path(doc_path).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc_dir / file).resolve() if file else Path(doc_path).resolve()
        if not path.exists():
            errors.append(f"link ({target}): no such file")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path.read_text()):
            errors.append(f"link ({target}): no such heading in {path.name}")
    prose, blocks = split_fenced(drop_external_links(text))
    for t in code_spans(prose) + [body for _, body, _ in blocks]:
        errors += word_errors(t, doc_dir)
    return sorted(set(errors))


_FROM_IMPORT = re.compile(r"\bfrom\s+(vissl_swav_plugin(?:\.\w+)*)\s+import\s+"
                          r"(\w+(?:\s+as\s+\w+)?(?:\s*,\s*\w+(?:\s+as\s+\w+)?)*)")
#: a path in VISSL's repository, named as VISSL's (``VISSL's tests/utils.py``)
_VISSLS = re.compile(r"(?=\bVISSL(?: v[\d.]+)?'s\W+([\w./-]+))")


@lru_cache(None)
def vissl_tools():
    """The scripts of VISSL's ``tools`` (its wheel installs them as a top-level package, next to
    ``vissl``): ``tools/nearest_neighbor_test.py`` is VISSL's where we have no such file."""
    spec = importlib.util.find_spec("tools")
    return frozenset(p.name for p in Path(spec.origin).parent.glob("*.py")) if spec and spec.origin else frozenset()


def word_errors(text, doc_dir, bare=True):
    """:func:`path_errors` of every word of ``text`` and of every ``from vissl_swav_plugin... import
    name``.  Left out: a word with ``<>{}$*`` (a placeholder, `<method>.py`, `{train,val}`, or a
    variable); with ``bare=False`` (the code) also a path named as VISSL's and a ``tools/`` script
    that VISSL's ``tools`` has and we have not."""
    errors = []
    for m in _FROM_IMPORT.finditer(text):
        for name in re.split(r"\s*,\s*", m.group(2)):
            errors += path_errors(f"{m.group(1)}.{name.split()[0]}", doc_dir, bare)
    skip = set() if bare else {m.group(1).rstrip(".,:;") for m in _VISSLS.finditer(text)}
    for word in _WORD_SPLIT.split(text):
        if any(c in word for c in "<>{}$*"):
            continue
        for token in word.split(":"):
            token = token.rstrip(".,:;")
            if token in skip or (not bare and token.startswith("tools/") and token[6:] in vissl_tools()):
                continue
            errors += path_errors(token, doc_dir, bare)
    return errors


# The stale-path check of the code reads what CODE_DIRS and CONFIG_FILES name.  What it leaves out
# (its false-positive rules, these only):
# * a bare file name (`compat.py`) and a path inside a package folder (`utils/hooks.py`): VISSL and
#   torch have files of those names;
# * a placeholder or a variable (a word with <>{}$*), a path with `...`, a `./` path (the user's
#   directory), a path under a folder the repository ignores (`runs/`, `data/`, ...: NOT_REPO);
# * a path right after the word "VISSL's" and a `tools/` script that VISSL's installed `tools` has.
#: Python files whose comments and docstrings the stale-path check reads (other strings are code)
CODE_DIRS = ("vissl_swav_plugin", "tools", "benchmarks", "tests")
#: files it reads whole, besides configs/**/*.yaml
CONFIG_FILES = ("Makefile", ".importlinter", "pytest.ini")


def python_prose(source):
    """``[(line, text)]`` of a Python source's comments and docstrings (module, class, function)."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                out += [(first.lineno + k, line) for k, line in enumerate(first.value.value.split("\n"))]
    return sorted(out)


def code_texts():
    """The files the stale-path check reads besides the pages: every ``.py`` of :data:`CODE_DIRS`
    (its comments and docstrings), the shipped configs (``configs/config/**/*.yaml``) and :data:`CONFIG_FILES` (whole)."""
    files = [p for d in CODE_DIRS for p in sorted((REPO / d).rglob("*.py"))]
    files += shipped_config_files() + [REPO / n for n in CONFIG_FILES]
    return [p for p in files if not set(p.relative_to(REPO).parts) & NOT_REPO]


def check_code_paths(path, text=None):
    """Every repository path (``tools/<name>.py``, ``docs/...``) and ``vissl_swav_plugin.*`` module that
    a code file names in its comments and docstrings (a config file: anywhere) exists."""
    text = Path(path).read_text() if text is None else text
    parts = python_prose(text) if str(path).endswith(".py") else list(enumerate(text.split("\n"), 1))
    return sorted({f"line {n}: {e}" for n, t in parts for e in word_errors(t, REPO, bare=False)})


_CONFIG_NAME = re.compile(r"(?<![\w/.+-])(vissl/)?((?:pretrain|benchmark|test)/[\w*./-]*\w)")


def check_config_names(text, root=CONFIGS):
    """Every config named (``config=NAME``, ``pretrain/...``, ``vissl/NAME``) exists: ours or
    VISSL's; ``vissl/NAME`` must be one of VISSL's."""
    errors = []
    for m in _CONFIG_NAME.finditer(drop_external_links(text)):
        vissl_only, name = m.group(1), m.group(2)
        roots = [vissl_configs()] if vissl_only else [Path(root), vissl_configs()]
        found = any(any(r.glob(f"{name}.yaml")) or (r / name).is_dir() for r in roots)
        if not found:
            errors.append(f"config {m.group(0)}: no such config" + (" in VISSL" if vissl_only else ""))
    return sorted(set(errors))


def check_make_targets(text, targets=None):
    targets = make_targets() if targets is None else targets
    errors = []
    for n, cmd in commands(text):
        for target in re.findall(r"(?:^|[\s;&(])make\s+([a-z][\w-]*)", cmd):
            if target not in targets:
                errors.append(f"line {n}: `make {target}`: no such target in the Makefile")
    return sorted(set(errors))


# --------------------------------------------------------------------------------------------
# checks: the config reference
# --------------------------------------------------------------------------------------------
def _signature_defaults(fn, skip=("self", "model_config")):
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in skip]
    known = {p.name for p in params}
    return known, {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _memory_bank_base_defaults():
    """The defaults the memory-bank losses' base reads (``self._get("key", default)`` calls)."""
    from vissl_swav_plugin.losses import clustering_config, memory_bank_loss

    out = {}
    for mod in (clustering_config, memory_bank_loss):
        for node in ast.walk(ast.parse(Path(mod.__file__).read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                    and node.func.attr in ("_get", "_positive", "_at_least", "_choice", "_flag", "_int_list")
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)):
                out.setdefault(node.args[0].value, eval(ast.unparse(node.args[1]), vars(mod)))  # noqa: S307
    return out


def _clustering_table(loss_cls):
    base = _memory_bank_base_defaults()
    known = (set(loss_cls.BASE_CONFIG_KEYS) | set(loss_cls.DEFAULTS)) - {"name"}
    return known, {**{k: v for k, v in base.items() if k in known}, **loss_cls.DEFAULTS}


def _swav_table():
    from vissl_swav_plugin.losses import swav_config as s

    return set(s.REQUIRED_KEYS) | set(s.DEFAULTS) | {"queue"}, dict(s.DEFAULTS)


def _queue_table():
    from vissl_swav_plugin.losses import swav_config as s

    return set(s.QUEUE_DEFAULTS), dict(s.QUEUE_DEFAULTS)


def _hook_table(module):
    mod = importlib.import_module(f"vissl_swav_plugin.hooks.{module}")
    return set(mod.DEFAULTS), dict(mod.DEFAULTS)


def _dc_table():
    from vissl_swav_plugin.losses.deepcluster_v2 import DeepClusterV2PluginLoss

    return _clustering_table(DeepClusterV2PluginLoss)


def _sela_table():
    from vissl_swav_plugin.losses.sela_v2 import SeLaV2PluginLoss

    return _clustering_table(SeLaV2PluginLoss)


def _multicrop_table():
    from vissl_swav_plugin.transforms.multicrop import MultiCropPlugin
    from vissl_swav_plugin.transforms.multicrop_config import KNOWN_KEYS

    known, defaults = _signature_defaults(MultiCropPlugin.__init__)
    assert known == set(KNOWN_KEYS), "multicrop_plugin: its signature and KNOWN_KEYS differ"
    return known, defaults


def _head_table():
    from vissl_swav_plugin.models.heads import SwAVPluginHead

    return _signature_defaults(SwAVPluginHead.__init__)


def _trunk_table():
    from vissl_swav_plugin.models import trunks

    return set(trunks.DEFAULTS), dict(trunks.DEFAULTS)


#: the blocks whose keys-and-defaults tables the reference holds, and where the code keeps them
DEFAULT_TABLES = {
    "LOSS.swav_plugin_loss": _swav_table,
    "LOSS.swav_plugin_loss.queue": _queue_table,
    "LOSS.deepclusterv2_plugin_loss": _dc_table,
    "LOSS.selav2_plugin_loss": _sela_table,
    "HOOKS.COLLAPSE_DETECTOR": lambda: _hook_table("collapse"),
    "HOOKS.PROGRESS": lambda: _hook_table("progress"),
    "HOOKS.ONLINE_KNN": lambda: _hook_table("online_knn"),
    "HOOKS.PRECISE_BN": lambda: _hook_table("precise_bn"),
    "multicrop_plugin": _multicrop_table,
    "swav_plugin_head": _head_table,
    "MODEL.TRUNK.RESNET_SMALL_PLUGIN": _trunk_table,
}


def check_default_tables(reference_text, tables_of=None):
    """Each ``| key | default |`` table lists exactly its block's keys, with the code's defaults
    (a default in backticks is compared; words such as *required* or *inferred* are not)."""
    tables_of = DEFAULT_TABLES if tables_of is None else tables_of
    errors, seen = [], set()
    for heading, header, rows in tables(reference_text):
        if header[:2] != ["key", "default"]:
            continue
        block = next((s for s in code_spans(heading) if s in tables_of), None)
        if block is None:
            errors.append(f"defaults table under {heading!r}: the heading names no known block")
            continue
        seen.add(block)
        known, defaults = tables_of[block]()
        listed = set()
        for n, row in rows:
            key = first_span(row[0])
            listed.add(key)
            if key not in known:
                errors.append(f"line {n}: {block}.{key}: no such key in the code")
                continue
            span = first_span(row[1])
            if span is not None:
                if key not in defaults:
                    errors.append(f"line {n}: {block}.{key} has no default in the code, the docs say {span}")
                elif not same(doc_value(span), defaults[key]):
                    errors.append(f"line {n}: {block}.{key}: the default is {defaults[key]!r}, the docs say {span}")
        for key in sorted(known - listed):
            errors.append(f"{block}.{key}: a key of the code missing from the docs' table")
    for block in sorted(set(tables_of) - seen):
        errors.append(f"{block}: no keys-and-defaults table in the reference")
    return errors


# --------------------------------------------------------------------------------------------
# checks: console scripts, compat, tools' flags
# --------------------------------------------------------------------------------------------
def check_console_scripts(text, scripts=None, need_table=True):
    """The README's script table equals setup.py's entry points; every script named exists."""
    scripts = console_scripts() if scripts is None else scripts
    errors = []
    table = {}
    for _heading, header, rows in tables(text):
        if header[:1] == ["script"]:
            for _n, row in rows:
                name = first_span(row[0])
                entry = next((s for c in row[1:] for s in code_spans(c) if re.match(r"^[\w.]+:\w+$", s)), None)
                table[name] = entry
    if need_table:
        if table != scripts:
            errors.append(f"console-script table {table} differs from setup.py {scripts}")
    for name in set(re.findall(r"\bswav-plugin-[a-z0-9][\w-]*[a-z0-9]", text)):
        if name not in scripts:
            errors.append(f"{name}: no such console script in setup.py")
    return sorted(errors)


def _parser_flags(parser):
    return {s for a in parser._actions for s in a.option_strings}


def _source_flags(source):
    return {n.value for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.match(r"^--?[a-z][\w-]*$", n.value)}


@lru_cache(None)
def module_flags(modname):
    mod = importlib.import_module(modname)
    flags = _source_flags(Path(mod.__file__).read_text()) | {"--help", "-h"}
    for candidate in [mod] + [v for v in vars(mod).values()
                              if isinstance(v, types.ModuleType) and v.__name__.startswith("vissl_swav_plugin")]:
        build = getattr(candidate, "build_parser", None)
        if callable(build):
            flags |= _parser_flags(build())
    return frozenset(flags)


@lru_cache(None)
def tool_flags(tool):
    """The options of a tool named in the docs (a console script, ``tools/<name>.py``,
    ``benchmarks/<name>.py`` or ``-m module``), or None if it is not one of ours."""
    if tool.startswith("swav-plugin-"):
        entry = console_scripts().get(tool)
        return module_flags(entry.split(":")[0]) if entry else None
    if tool.startswith("vissl_swav_plugin."):
        return module_flags(tool)
    path = REPO / tool
    if not path.is_file():
        return None
    source = path.read_text()
    m = re.search(r"^from (vissl_swav_plugin[\w.]*) import main\b", source, re.M)
    return module_flags(m.group(1)) if m else frozenset(_source_flags(source) | {"--help", "-h"})


_TOOL = re.compile(r"(?:^|(?<=[\s`(]))(?:\./)?((?:tools|benchmarks)/[\w-]+\.py|swav-plugin-[a-z0-9][\w-]*[a-z0-9]|"
                   r"(?<=-m )vissl_swav_plugin(?:\.\w+)+)")


def check_tool_flags(text, prose_flags=True):
    """Every ``--flag`` given to one of our tools in a command is one of its options; in user
    pages also a bare ``--flag`` in prose must be an option of a tool named in its section (or,
    if the section names none, in the page)."""
    errors = []
    for n, cmd in commands(text):
        for segment in re.split(r"&&|;|\|(?!\|)|\$\(", cmd):
            m = _TOOL.search(segment)
            if not m:
                continue
            flags = tool_flags(m.group(1))
            if flags is None:
                continue
            for flag in re.findall(r"(?<![\w=-])(--[a-z][\w-]*)", segment[m.end():]):
                if flag not in flags:
                    errors.append(f"line {n}: {m.group(1)} has no option {flag}")
    if prose_flags:
        prose, _ = split_fenced(drop_external_links(text))
        sections = re.split(r"(?m)^(?=#)", prose)
        page_tools = {t for t in _TOOL.findall(prose) if tool_flags(t) is not None}
        offset = 0
        for section in sections:
            tools = {t for t in _TOOL.findall(section) if tool_flags(t) is not None} or page_tools
            for m in _SPAN.finditer(section):
                span = m.group(2).strip()
                flag = re.match(r"--[a-z][\w-]*", span)
                if flag and not _TOOL.search(span) and tools and not any(flag.group(0) in tool_flags(t) for t in tools):
                    n = prose[:offset + m.start()].count("\n") + 1
                    errors.append(f"line {n}: `{span}`: no option of {sorted(tools)}")
            offset += len(section)
    return sorted(set(errors))


# --------------------------------------------------------------------------------------------
# checks: claims in user pages
# --------------------------------------------------------------------------------------------
_DURATION = r"\d[\d.,:]*(?:\s*[-–]\s*\d[\d.,]*)?\s*(?:s|sec|seconds?|min|minutes?|h|hours?)\b"
_TIMING = re.compile(r"(?:took|takes|take|taking|ran in|runs in|lasted|lasts|about|around|approximately|~|≈)"
                     rf"\s*~?\s*{_DURATION}", re.I)


def check_timings(text):
    """A timing (``took 164 s``, ``about 15 min``, a duration in a table with a time column) names
    the machine's CPU or GPU model and a date (or says that the date was not recorded)."""
    prose, _ = split_fenced(text)
    errors = []
    time_headers = {}
    for _heading, header, rows in tables(text):
        if any(re.search(r"time|training|date", h) for h in header):
            for n, _row in rows:
                time_headers[n] = " ".join(header)
    for n, para in paragraphs(prose):
        found = _TIMING.findall(para)
        if n in time_headers:
            found += re.findall(_DURATION, para)
        if not found:
            continue
        context = para + " " + time_headers.get(n, "")
        if not MACHINES.search(context) or not DATE.search(context):
            errors.append(f"line {n}: '{found[0].strip()}' names no machine (CPU/GPU model) and date")
    return errors


@lru_cache(None)
def run_lengths():
    """Iteration counts the docs may state: every integer of the shipped YAMLs, the demo's
    budgets, freezes and iterations per epoch."""
    from vissl_swav_plugin.demo.cli import MODES

    found = set()

    def walk(v):
        if isinstance(v, bool):
            return
        if isinstance(v, int):
            found.add(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for name in shipped_configs():
        walk(yaml_config(name))
    for mode in MODES.values():
        per_epoch = mode["train_per_class"] * 10 // (mode["batch"] * 2)
        found |= {mode["iters"], mode["freeze"], per_epoch}
    return frozenset(found)


def check_iteration_counts(text, allowed=None):
    """A run length in iterations (300 or more, not an estimate) comes from the configs or the demo."""
    allowed = run_lengths() if allowed is None else allowed
    prose, _ = split_fenced(text)
    errors = []
    for m in re.finditer(r"(?<![\w.,~])(\d{1,3}(?:,\d{3})+|\d+)\s+(?:iterations|it)\b", prose):
        before = prose[max(0, m.start() - 8):m.start()]
        value = int(m.group(1).replace(",", ""))
        if value >= 300 and "about" not in before and "~" not in before and value not in allowed:
            errors.append(f"line {prose[:m.start()].count(chr(10)) + 1}: '{m.group(0)}' is no run length "
                          "of the configs or the demo")
    return errors


def _hook_enabled(config, block):
    value = lookup(yaml_config(config), f"HOOKS.{block}.ENABLED")
    if value is _MISSING:
        module = {"PRECISE_BN": "precise_bn", "ONLINE_KNN": "online_knn", "PROGRESS": "progress",
                  "COLLAPSE_DETECTOR": "collapse"}.get(block)
        value = _hook_table(module)[1]["ENABLED"] if module else None
    return value


def check_config_claims(text, root=CONFIGS):
    """``"`KEY: VALUE` in `CONFIG`"`` holds, and so does "on / off in `CONFIG`" in a paragraph
    about exactly one hook block (``HOOKS.X``)."""
    prose, _ = split_fenced(text)
    errors = []
    for n, para in paragraphs(prose):
        flat = " ".join(para.split())
        for key, value, name in re.findall(r"`([A-Z][\w.]*):\s*([^`]+)`\s+in\s+`([\w/]+)`", flat):
            config = config_by_name(name, root)
            if config is None:
                errors.append(f"line {n}: `{name}`: no such shipped config")
            elif not same(doc_value(value), lookup(yaml_config(config, str(root)), key)):
                errors.append(f"line {n}: {key} is {lookup(yaml_config(config, str(root)), key)!r} in {config}, "
                              f"the docs say {value}")
        blocks = set(re.findall(r"HOOKS\.([A-Z_]+)", flat))
        for state, name in re.findall(r"\b(on|off)\s+in\s+`([\w/]+)`", flat):
            config = config_by_name(name, root)
            if config is None or len(blocks) != 1:
                continue
            block = blocks.pop()
            blocks.add(block)
            enabled = _hook_enabled(config, block)
            if enabled is not None and enabled != (state == "on"):
                errors.append(f"line {n}: HOOKS.{block} is {'on' if enabled else 'off'} in {config}, "
                              f"the docs say {state}")
    return errors


def check_amp_commands(text, root=CONFIGS):
    """A command that sets ``AMP_DTYPE`` runs with ``USE_AMP`` true (else it is fp32)."""
    errors = []
    for n, cmd in commands(text):
        m = re.search(r"config=([\w/]+)", cmd)
        if not m or "AMP_DTYPE=" not in cmd:
            continue
        name = config_by_name(m.group(1), root)
        use = re.search(r"config\.MODEL\.AMP_PARAMS\.USE_AMP=(\w+)", cmd)
        if use:
            on = use.group(1).lower() == "true"
        elif name:
            on = lookup(yaml_config(name, str(root)), "MODEL.AMP_PARAMS.USE_AMP") is True
        else:
            continue
        if not on:
            errors.append(f"line {n}: sets AMP_DTYPE but USE_AMP is off for {m.group(1)}: the run is fp32")
    return errors


_ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+|(?<![\w/])#\d+\b|\b[Ss]ession\s+\d+\b")
_HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


def check_no_issue_refs(text):
    """No page explains anything by an issue number, a work session or a commit hash."""
    clean = drop_external_links(text)
    return ([f"'{m.group(0)}': an issue / session number" for m in _ISSUE.finditer(clean)]
            + [f"'{m.group(0)}': a commit hash" for m in _HASH.finditer(clean)])


# --------------------------------------------------------------------------------------------
# the real documentation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("doc", all_docs(), ids=rel)
def test_named_paths_modules_configs_and_targets_exist(doc):
    text = doc.read_text()
    errors = check_paths(text, doc) + check_config_names(text) + check_make_targets(text)
    assert not errors, f"{rel(doc)}:\n" + "\n".join(errors)


@pytest.mark.parametrize("path", code_texts(), ids=rel)
def test_paths_named_in_the_code_and_configs_exist(path):
    errors = check_code_paths(path)
    assert not errors, f"{rel(path)}:\n" + "\n".join(errors)


@pytest.mark.parametrize("doc", all_docs(), ids=rel)
def test_console_scripts_and_flags(doc):
    text = doc.read_text()
    errors = (check_console_scripts(text, need_table=doc == REPO / "README.md")
              + check_tool_flags(text, prose_flags=doc in user_docs()) + check_no_issue_refs(text))
    assert not errors, f"{rel(doc)}:\n" + "\n".join(errors)


@pytest.mark.parametrize("doc", user_docs(), ids=rel)
def test_user_page_claims(doc):
    text = doc.read_text()
    errors = (check_timings(text) + check_iteration_counts(text) + check_config_claims(text)
              + check_amp_commands(text))
    assert not errors, f"{rel(doc)}:\n" + "\n".join(errors)


def test_the_keys_and_defaults_tables_equal_the_code():
    errors = check_default_tables(REFERENCE.read_text())
    assert not errors, "\n".join(errors)


def test_readme_is_short():
    n = len((REPO / "README.md").read_text().split("\n"))
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"


# --------------------------------------------------------------------------------------------
# planted errors: each check reports what it must
# --------------------------------------------------------------------------------------------
def test_plant_a_wrong_path(tmp_path):
    doc = tmp_path / "README.md"
    text = (REPO / "README.md").read_text().replace("tools/install_env.sh", "tools/install_environment.sh")
    assert any("install_environment" in e for e in check_paths(text, REPO / "README.md"))
    assert any("nope" in e for e in check_paths("see [x](docs/nope.md)", REPO / "README.md"))
    assert any("heading" in e for e in check_paths("[x](docs/configs.md#no-such-part)", REPO / "README.md"))
    assert check_paths("`vissl_swav_plugin.utils.sinkhorn.sinkhorn_knop`", doc)
    assert check_paths("`vissl_swav_plugin/hooks/no_such_hook.py`", doc)
    assert check_paths("`tools/small_sets.py` writes the two other small image sets", doc)  # the old README
    assert check_paths("needs two NumPy 2.4 shims of `compat.py`", doc)  # a bare name: no such file anywhere
    assert not check_paths("`vissl_swav_plugin.utils.sinkhorn.sinkhorn_knopp` `./configs/x.yaml`", doc)


def test_plant_a_wrong_path_in_the_code():
    """In comments and docstrings a repository path or a module must exist; a bare name, a path
    of a package folder, a placeholder or a path outside the repository is not checked."""
    source = ('"""Example::\n\n    >>> from vissl_swav_plugin import distributed as D\n"""\n'
              "# also checked by tests/unit/test_layers.py\n"
              "x = 'tools/not_checked.py'  # a string that is not a docstring is code\n")
    errors = check_code_paths("m.py", source)
    assert any("line 3" in e and "vissl_swav_plugin.distributed" in e for e in errors), errors
    assert any("line 5" in e and "tests/unit/test_layers.py" in e for e in errors), errors
    assert {e.split(":")[0] for e in errors} == {"line 3", "line 5"}, errors
    fine = ("# vissl/utils/checkpoint.py, utils/hooks.py, compat.py, tools/<name>.py, runs/x/y.txt, ./configs/x.yaml,\n"
            "# tests/unit/package/test_layers.py, vissl_swav_plugin.utils.distributed.rank, VISSL's tests/utils.py,\n"
            "# tools/nearest_neighbor_test.py (VISSL's tools), from vissl_swav_plugin.utils import distributed as D.\n")
    assert not check_code_paths("m.py", fine)
    assert check_code_paths("Makefile", "lint:\n\t# see tests/unit/test_layers.py\n")


def test_plant_a_wrong_config_name():
    assert check_config_names("config=pretrain/swav/swav_9node_resnet")
    assert check_config_names("`config=vissl/pretrain/swav/swav_fashion_mnist_cpu`")  # ours only
    assert not check_config_names("config=vissl/pretrain/swav/swav_8node_resnet")


def test_plant_a_wrong_default():
    text = REFERENCE.read_text()
    wrong = text.replace("| `PATIENCE_ITERS` | `100` |", "| `PATIENCE_ITERS` | `50` |")
    assert any("PATIENCE_ITERS" in e for e in check_default_tables(wrong))
    wrong = text.replace("| `use_before_full` | `False` |", "")
    assert any("use_before_full" in e for e in check_default_tables(wrong))


def test_plant_a_wrong_flag():
    assert check_tool_flags("```bash\npython tools/demo.py --colour-strength 0.25\n```")
    assert check_tool_flags("`swav-plugin-knn --top-k 20`")
    assert check_tool_flags("Run `python tools/demo.py`; `--colour-strength 0.25` weakens it.")
    assert check_tool_flags("`.venv/bin/python benchmarks/bench_sinkhorn.py --repeat 15`")
    assert not check_tool_flags("```bash\npython tools/demo.py --quick --color-strength 0.25 \\\n  --seed 1\n```")


def test_plant_a_wrong_console_script_and_make_target():
    readme = (REPO / "README.md").read_text()
    wrong = readme.replace("vissl_swav_plugin.tools.knn_eval:main", "vissl_swav_plugin.tools.knn:main")
    assert check_console_scripts(wrong)
    assert check_console_scripts("`swav-plugin-evaluate`", need_table=False)
    assert check_make_targets("`make tests`")


def test_plant_issue_numbers_and_commit_hashes():
    assert check_no_issue_refs("as issue 15 showed")
    assert check_no_issue_refs("run from the code of 0768d5e")
    assert check_no_issue_refs("see #62")
    assert not check_no_issue_refs("[swav#62](https://github.com/facebookresearch/swav/issues/62), 1e-6, 2026-11-24")


# the old README's false claims that a check (not a generated table) catches ---------------
def test_plant_a_hook_said_off_in_a_config_where_it_is_on():
    old = ("It is off by default, as in the reference implementation, and also off in `swav_fashion_mnist_cpu`\n"
           "(the full demo). `HOOKS.PRECISE_BN` re-estimates the statistics.")
    assert check_config_claims(old)
    assert check_config_claims("`HOOKS.PRECISE_BN.ENABLED: False` in `swav_fashion_mnist_cpu`")
    assert not check_config_claims("`HOOKS.PRECISE_BN.ENABLED: True` in `swav_fashion_mnist_cpu`")


def test_plant_a_run_length_of_no_config():
    assert check_iteration_counts("The full recipe (`make demo`: 1248 iterations, frozen 100, temperature 0.1)")
    assert not check_iteration_counts("18 epochs (1404 iterations of batch 2 x 64)")


def test_plant_timings_without_machine_or_date():
    assert check_timings("It writes the full 60,000 + 10,000 images; that took 164 s on the 2-core machine.")
    assert check_timings("The full dataset takes ~20 s; re-running with the same arguments is a no-op.")
    assert check_timings("`make demo` takes about 13-15 min for the demo plus the install.")
    assert not check_timings("It took 164 s on an Intel Xeon 2-core (2026-11-23).")
    assert not check_timings("`make demo` took 12 min 18 s on an Intel Xeon 2-core (2026-11-24).")


def test_plant_amp_dtype_without_use_amp():
    old = ("```bash\nswav-plugin-train config=pretrain/swav/swav_fashion_mnist_cpu \\\n"
           "    config.MACHINE.DEVICE=gpu config.MODEL.AMP_PARAMS.AMP_DTYPE=float16 \\\n"
           "    config.CHECKPOINT.DIR=runs/mine_gpu\n```")
    assert check_amp_commands(old)
    fixed = old.replace("AMP_DTYPE=float16", "AMP_DTYPE=float16 config.MODEL.AMP_PARAMS.USE_AMP=True")
    assert not check_amp_commands(fixed)
