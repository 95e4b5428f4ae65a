"""The documentation's generated tables (cog blocks calling ``tools/doc_tables.py``): every page of
README.md and docs/ is what cog generates from its records, configs and code now; a changed
record fails the check; every record, table, shipped config and compat module has its block or
its row; the hand-written columns come from docs/doc_tables.yaml, the figures from the sources."""
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from testkit import REPO, load_script

dt = load_script("tools/doc_tables.py")

#: ``t.emit("NAME", "ARG", ...)`` in a page's cog line
EMIT = re.compile(r'^<!-- \[\[\[cog import doc_tables as t; t\.emit\(("[^"]+"(?:, "[^"]+")*)\)\]\]\] -->$', re.M)


def emits():
    """``[(page, name, args)]`` of every block of the pages, read from the pages' text."""
    out = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for m in EMIT.finditer(page.read_text()):
            name, *args = re.findall(r'"([^"]+)"', m.group(1))
            out.append((page.relative_to(REPO).as_posix(), name, args))
    return out


def test_every_page_is_what_cog_generates(capsys):
    """cog --check over every page: a record, a config, a compat patch or docs/doc_tables.yaml
    that changed without the pages shows here as the difference."""
    status = dt.main(["--check"])
    assert status == 0, "the pages differ from their sources: run `.venv/bin/python tools/doc_tables.py`\n" + \
        capsys.readouterr().out


def test_every_cog_line_of_the_pages_calls_emit():
    """A block is one comment line calling ``t.emit`` (tests/unit/package/test_docs.py blanks such a line)."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for line in page.read_text().split("\n"):
            if "[[[cog" in line:
                assert EMIT.match(line), f"{page.relative_to(REPO)}: {line}"


def test_every_record_table_and_config_has_a_block():
    """A record is a block's argument, or one of the dated study's, which links it beside its tables
    (docs/experiments/benchmarks.md: its records never change, so its tables are plain text)."""
    found = emits()
    paths = {a for _, _, args in found for a in args if a.startswith("docs/experiments/")}
    records = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "experiments").rglob("*.json")}
    assert paths <= records, f"blocks name records that do not exist: {sorted(paths - records)}"
    study = (REPO / "docs/experiments/benchmarks.md").read_text()
    linked = {r for r in records if f"]({Path(r).name})" in study}
    assert records <= paths | linked, f"records no page shows: {sorted(records - paths - linked)}"
    assert {name for _, name, _ in found} == set(dt.TABLES)
    assert {args[0] for _, name, args in found if name == "figures"} == set(dt.data()["figures"]), \
        "a table of figures: in docs/doc_tables.yaml that no block shows, or a block naming none"
    configs = [args[0] for page, name, args in found if name == "config"]
    assert sorted(configs) == dt.shipped_configs() and len(set(configs)) == len(configs)


def _page(tmp_path, block):
    """A checkout in ``tmp_path`` holding README.md with ``block`` (a copied cog block) and
    docs/doc_tables.yaml."""
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / dt.DATA, tmp_path / dt.DATA)
    (tmp_path / "README.md").write_text("# x\n\n" + block + "\n")
    return tmp_path / "README.md"


def _block(page, name):
    text = (REPO / page).read_text()
    start = text.index(name)
    start = text.rindex("\n", 0, start) + 1
    end = text.index("<!-- [[[end]]] -->", start) + len("<!-- [[[end]]] -->")
    return text[start:end]


def test_a_changed_record_fails_the_check_and_the_rewrite_writes_it(tmp_path, monkeypatch, capsys):
    """The epoch-pause record with a pause of 9.87 s: --check exits 1 with the new figure in its
    difference, the rewrite writes it, and --check passes again."""
    name = "docs/experiments/epoch_pause_cpu_2026-11-26.json"
    page = _page(tmp_path, _block("docs/gpu.md", '"epoch_pause"'))
    rec = json.loads((REPO / name).read_text())
    rec["results"]["plugin"]["pause_s"] = 9.87
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(json.dumps(rec))
    monkeypatch.setattr(dt, "REPO", tmp_path)
    dt.record.cache_clear(), dt.data.cache_clear()
    try:
        assert dt.main(["--check"]) == 1
        assert "+| plugin (persistent workers) |" in capsys.readouterr().out
        assert "9.87 s" not in page.read_text()
        assert dt.main([]) == 0 and "| 43.84, 0.13, 0.08 s | 9.87 s |" in page.read_text()
        assert dt.main(["--check"]) == 0
    finally:
        dt.record.cache_clear(), dt.data.cache_clear()


def test_a_failing_block_exits_2(tmp_path, monkeypatch):
    _page(tmp_path, '<!-- [[[cog import doc_tables as t; t.emit("figures", "epoch_pause", "docs/experiments/no.json")]]] -->\n'
                    "<!-- [[[end]]] -->")
    monkeypatch.setattr(dt, "REPO", tmp_path)
    assert dt.main(["--check"]) == 2


# --------------------------------------------------------------------------------------------
# the hand-written columns (docs/doc_tables.yaml) and the sources' figures
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def configs(tmp_path):
    root = tmp_path / "config"
    shutil.copytree(dt.CONFIGS, root)
    return root


def test_a_config_table_takes_its_values_from_the_yaml(configs):
    """A warm-up start changed in the YAML changes the page's value; a key the YAML lacks is an error."""
    name, key = "pretrain/swav/swav_8node_resnet", "OPTIMIZER.param_schedulers.lr.schedulers.0.start_value"
    assert f"| `{key}` | `0.3` |" in dt.config(name, configs)
    path = configs / f"{name}.yaml"
    path.write_text(path.read_text().replace("start_value: 0.3\n", "start_value: 0.0\n", 1))
    assert f"| `{key}` | `0.0` |" in dt.config(name, configs)
    with pytest.raises(KeyError, match="OPTIMIZER.no_such_key is not in"):
        dt.config_value(name, "OPTIMIZER.no_such_key", configs)


def test_the_configs_table_has_a_row_per_shipped_config(configs):
    """A config the data lacks gets a row at the end, one no longer shipped loses its row; batch
    and epochs come from the YAML, the rest from docs/doc_tables.yaml."""
    (configs / "pretrain/swav/swav_8node_resnet.yaml").rename(configs / "pretrain/swav/new_one.yaml")
    rows = [r.split(" | ") for r in dt.configs(configs).split("\n")[2:]]
    written = yaml.safe_load((REPO / "docs/doc_tables.yaml").read_text())["configs"]
    assert [r[0].strip("| `") for r in rows] == [n for n in written if n != "pretrain/swav/swav_8node_resnet"] + [
        "pretrain/swav/new_one"]
    assert rows[-1][1:] == ["", "", "64 × 64 = 4096", "800", " |"]
    queue = rows[0]
    assert queue[1] == written["pretrain/swav/swav_1node_resnet_queue"]["purpose"] and queue[3:5] == ["32 × 8 = 256", "200"]


def test_the_compat_table_lists_every_module_and_patch():
    """Every registered patch under its module, every compat module a row; no data row for a module
    that is gone."""
    rows = [r.strip("| ").split(" | ") for r in dt.compat_patches().split("\n")[2:]]
    by_module = dt.patches_by_module()
    assert {r[0].strip("`"): r[1] for r in rows if r[0].strip("`") in by_module} == {
        m: ", ".join(f"`{n}`" for n in names) for m, names in by_module.items()}
    files = {r[0].strip("`") for r in rows}
    compat = {p.name for p in (REPO / "vissl_swav_plugin" / "compat").glob("*.py")}
    assert compat - files == {"__init__.py", "engine.py"}
    written = yaml.safe_load((REPO / "docs/doc_tables.yaml").read_text())["compat"]
    assert set(written) <= files and all(r[2] for r in rows), "a compat module without its fix in docs/doc_tables.yaml"


def _flags(node, key):
    """Every value of ``key`` anywhere in a record."""
    if isinstance(node, dict):
        yield from ([node[key]] if key in node else [])
        for v in node.values():
            yield from _flags(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _flags(v, key)


def test_the_pages_show_no_dry_run_and_no_failed_check():
    """A record a page shows as measured figures is no dry run (gpu_check's ``--dry-run`` writes the
    same fields at tiny sizes) and holds no check that failed (``ok: false``); a planted one fails."""
    def bad(rec):
        return any(_flags(rec, "dry_run")) or not all(_flags(rec, "ok"))

    shown = sorted({a for _, _, args in emits() for a in args if a.endswith(".json")})
    assert shown and not [p for p in shown if bad(dt.record(p))]
    assert bad({"results": {}, "dry_run": True}) and bad({"check": {"ok": False}}) and not bad({"check": {"ok": True}})
