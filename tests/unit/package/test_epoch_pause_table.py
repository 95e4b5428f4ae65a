"""docs/gpu.md's epoch-pause table is generated from its record
(``benchmarks/bench_epoch_pause.py --write-doc RECORD``): regenerating it changes nothing."""
import importlib.util
import re

from testkit import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_epoch_pause", REPO / "benchmarks" / "bench_epoch_pause.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_epoch_pause_table_is_the_one_its_record_generates(tmp_path, monkeypatch):
    bench = _bench()
    doc = (REPO / bench.DOC).read_text()
    records = re.findall(re.escape(bench.BEGIN).replace(re.escape("{record}"), "(.+?)"), doc)
    assert records, f"{bench.DOC}: no generated epoch-pause table"
    copy = tmp_path / "doc.md"
    copy.write_text(doc)
    monkeypatch.chdir(REPO)  # the markers name the record relative to the repository
    for record in records:
        bench.write_doc(record, copy)
    assert copy.read_text() == doc, f"{bench.DOC} differs from what {records} generate: run --write-doc"
