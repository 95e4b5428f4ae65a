"""The wheel ships only vissl_swav_plugin (+ its start-up .pth and configs as data): the tests that start processes (VISSL's launcher, gloo workers, subprocesses).

The in-process tests are in ``tests/unit/package/test_packaging.py``.
"""
import ast
import configparser
import subprocess
import sys
import zipfile


from testkit import REPO


def wheel_modules(whl):
    """``{dotted module name: (source, is a package)}`` of the wheel's Python files."""
    out = {}
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.endswith(".py"):
                dotted = name[:-3].replace("/", ".")
                package = dotted.endswith(".__init__")
                out[dotted[:-len(".__init__")] if package else dotted] = (z.read(name).decode(), package)
    return out


def referenced_modules(name, modules):
    """The wheel's modules that module ``name`` imports (at any depth of its code, relative
    imports included, ``from package import submodule`` too) or names in a string (what
    ``importlib.import_module`` is given: the component and patch lists)."""
    source, is_package = modules[name]
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {m for m in found if m in modules}


#: modules users run by a command that is neither a console script nor the start-up hook
COMMAND_MODULES = {
    "vissl_swav_plugin.tools.torchrun": "torchrun ... -m vissl_swav_plugin.tools.torchrun (docs/launching.md)",
    "vissl_swav_plugin.tools.small_sets": "python tools/make_small_sets.py (docs/demo.md: the demo's other data sets)",
}


def test_every_module_in_the_wheel_is_reachable_from_the_entry_points(tmp_path):
    """The wheel holds the product only: every module is imported, directly or not, by the
    start-up hook (the .pth file's module, which registers the components), the package, or a
    console script. Tooling that only tests, benchmarks or docs use lives outside the package."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    (whl,) = tmp_path.glob("vissl_swav_plugin-*.whl")
    modules = wheel_modules(whl)
    with zipfile.ZipFile(whl) as z:
        pth = z.read("vissl_swav_plugin.pth").decode()
        entry_points = configparser.ConfigParser()
        entry_points.read_string(next(z.read(n).decode() for n in z.namelist() if n.endswith("entry_points.txt")))
    roots = {"vissl_swav_plugin"} | {m for m in modules if f'"{m}"' in pth}
    roots |= {value.split(":")[0].strip() for value in entry_points["console_scripts"].values()}
    roots |= set(COMMAND_MODULES)
    assert len(roots) > 3 and roots <= set(modules), roots
    reached, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        parents = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        todo.extend(parents | referenced_modules(name, modules))
    assert sorted(set(modules) - reached) == []


def test_wheel_contents(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    (whl,) = tmp_path.glob("vissl_swav_plugin-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"vissl_swav_plugin", "vissl_swav_plugin.pth", *[t for t in top if t.endswith(".dist-info")]}
    assert "vissl_swav_plugin/_configs/config/pretrain/swav/swav_8node_resnet.yaml" in names
    assert {"vissl_swav_plugin/compat/__init__.py", "vissl_swav_plugin/compat/engine.py"} <= set(names)
    pth = zipfile.ZipFile(whl).read("vissl_swav_plugin.pth").decode()
    assert pth == (REPO / "vissl_swav_plugin.pth").read_text()
