"""Candidates run in alternation: the one loop of the benchmarks' harness
(``benchmarks/benchmarking.py``) and of ``--amp auto``'s timing
(:func:`vissl_swav_plugin.utils.amp_measure.time_alternating`).

Each round runs every candidate once, the order mirrored (``A B C``, ``C B A``, ``A B C`` ...) or
rotated (``A B C``, ``B C A``, ``C A B`` ...) from one round to the next, so that a change of
machine load falls on all of them alike; the first ``warmup`` rounds are run and dropped.
"""
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

SCHEDULES = ("mirror", "rotate")


def round_order(names: Sequence[str], r: int, schedule: str = "mirror") -> List[str]:
    """The order in which round ``r`` (0-based) runs ``names``: ``mirror`` reverses every other
    round, ``rotate`` starts round ``r`` at ``names[r % len(names)]``."""
    names = list(names)
    if schedule == "mirror":
        return names if r % 2 == 0 else names[::-1]
    if schedule == "rotate":
        k = r % len(names) if names else 0
        return names[k:] + names[:k]
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def alternate(candidates: Mapping[str, Callable[[], Any]], rounds: int, warmup: int = 0,
              schedule: str = "mirror", stop: Optional[Callable[[int], bool]] = None) -> Dict[str, List[Any]]:
    """Run ``candidates`` (name -> callable of no argument) in ``warmup + rounds`` alternated rounds
    (:func:`round_order`); ``{name: [what its call returned, one per kept round]}``, the
    ``warmup`` rounds dropped.  A callable returns its own measurement (ms, images/s, a tuple).

    ``stop``: called after each kept round with the number of kept rounds so far; when it returns
    True the alternation ends there (a time budget: ``--amp auto``)."""
    out: Dict[str, List[Any]] = {name: [] for name in candidates}
    for r in range(warmup + rounds):
        for name in round_order(list(candidates), r, schedule):
            value = candidates[name]()
            if r >= warmup:
                out[name].append(value)
        if r >= warmup and stop is not None and stop(r + 1 - warmup):
            break
    return out
