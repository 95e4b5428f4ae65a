"""Public docstring coverage of the package (interrogate): modules, classes, functions and
methods whose names do not start with an underscore, ``__init__`` methods and nested
functions left out."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: the floor; the issue that set it asked for >= 90%
MINIMUM = 95.0


def _coverage(path):
    from interrogate import config, coverage

    conf = config.InterrogateConfig(ignore_init_method=True, ignore_init_module=True, ignore_private=True,
                                    ignore_semiprivate=True, ignore_nested_functions=True, ignore_magic=True)
    return coverage.InterrogateCoverage(paths=[str(path)], conf=conf).get_coverage()


def test_public_docstrings_cover_the_package():
    results = _coverage(REPO / "vissl_swav_plugin")
    assert results.total > 400
    assert results.perc_covered >= MINIMUM, f"{results.perc_covered:.1f}% < {MINIMUM}%"


def test_the_measure_sees_a_missing_docstring(tmp_path):
    (tmp_path / "m.py").write_text('"""A module."""\n\n\ndef f():\n    """Has one."""\n\n\ndef g():\n    pass\n')
    results = _coverage(tmp_path)
    assert (results.covered, results.total) == (2, 3)
