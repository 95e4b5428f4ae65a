"""The one alternation loop (``vissl_swav_plugin/utils/alternation.py``) against candidates that
log their calls: the order they run in, what is kept after the warm-up, and the early stop
(``--amp auto``'s time budget)."""
import pytest

from vissl_swav_plugin.utils.alternation import SCHEDULES, alternate, round_order


class Calls:
    """Candidates that log their calls and return the call's number."""

    def __init__(self, names):
        self.log = []
        self.fns = {n: (lambda n=n: self._call(n)) for n in names}

    def _call(self, name):
        self.log.append(name)
        return len(self.log)


def test_mirror_alternation_runs_a_b_then_b_a_and_drops_the_warmup():
    c = Calls("ABC")
    out = alternate(c.fns, rounds=3, warmup=1)
    assert "".join(c.log) == "ABC" "CBA" "ABC" "CBA"
    # the first (warm-up) round is dropped: what each call returned in rounds 1..3
    assert out == {"A": [6, 7, 12], "B": [5, 8, 11], "C": [4, 9, 10]}


def test_rotated_alternation_starts_each_round_one_further():
    c = Calls("ABCD")
    alternate(c.fns, rounds=5, schedule="rotate")
    assert "".join(c.log) == "ABCD" "BCDA" "CDAB" "DABC" "ABCD"
    assert round_order("AB", 7, "rotate") == ["B", "A"]
    with pytest.raises(ValueError, match="schedule"):
        round_order("AB", 0, "random")


def test_every_candidate_runs_once_per_round_whatever_the_count():
    for n in range(1, 6):
        names = [f"c{i}" for i in range(n)]
        for schedule in SCHEDULES:
            c = Calls(names)
            out = alternate(c.fns, rounds=4, warmup=2, schedule=schedule)
            assert all(sorted(c.log[r * n:(r + 1) * n]) == names for r in range(6))
            assert all(len(v) == 4 for v in out.values())


def test_stop_ends_the_alternation_after_a_kept_round():
    c = Calls("AB")
    seen = []
    out = alternate(c.fns, rounds=10, warmup=1, stop=lambda kept: seen.append(kept) or kept == 3)
    assert "".join(c.log) == "AB" "BA" "AB" "BA"  # the warm-up round, then three kept rounds
    assert seen == [1, 2, 3]  # asked after each kept round only, never after the warm-up
    assert out == {"A": [4, 5, 8], "B": [3, 6, 7]}
