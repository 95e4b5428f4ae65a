"""The suite collects on a clean clone: pytest imports test files by basename (``tests/`` is no
package, VISSL owns the name), so two test files of one name stop the whole collection."""
from collections import defaultdict

from testkit import REPO


def test_every_test_file_has_a_basename_of_its_own():
    by_name = defaultdict(list)
    for path in (REPO / "tests").rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in by_name.items() if len(p) > 1}
