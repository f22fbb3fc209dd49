"""Threshold failures become a search for a small set of nodes to keep in fp32.

Over the ranked candidates (ranking.py), adaptive group testing: gallop from the front of the list
to the shortest prefix whose nodes, kept in fp32, pass; its last node is needed (the prefix without
it fails), so it joins the kept set, and the search repeats on the nodes ranked before it until the
kept set alone passes. With m needed nodes among the first k ranked, that is about 2·m·log2(k)
trials instead of one per node. Assuming keeping more nodes never hurts, the result is minimal:
dropping any one kept node fails (each was needed with a superset of the others). Bounded by trials
and seconds; on running out, the best passing set found so far is returned, marked not minimal.
Every result that passes contains the nodes proven needed so far, so a caller's `hopeless` test of
them (e.g. they already keep more weights in fp32 than a variant may) ends a search that cannot give
an acceptable set as soon as it is proven, instead of at the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

Trial = Callable[[list[str]], tuple[bool, str]]  # keep these nodes in fp32 -> (passed, detail)
Hopeless = Callable[[list[str]], "str | None"]  # nodes every passing result contains -> why none is acceptable


@dataclass
class SearchResult:
    passed: bool  # a passing set was found
    kept: list[str]
    trials: int
    seconds: float
    minimal: bool
    stopped: str | None = None  # why the search ended early, if it did
    log: list[dict] = field(default_factory=list)

    def figures(self) -> dict:
        return {"trials": self.trials, "seconds": round(self.seconds, 2), "minimal": self.minimal, "stopped": self.stopped, "kept": len(self.kept)}


class _Budget(Exception):
    pass


def search_keep_set(ranked: list[str], trial: Trial, max_trials: int = 40, max_seconds: float = 120.0, hopeless: Hopeless | None = None) -> SearchResult:
    """The smallest set of `ranked` nodes whose fp32 keeps `trial` passing. The caller knows that
    keeping nothing fails (that is why it searches). `hopeless(needed)`: a reason when any set
    containing the nodes proven needed is unacceptable; the search then fails with that reason."""
    start = time.perf_counter()
    log: list[dict] = []
    seen: dict[frozenset, bool] = {}

    def test(keep: list[str]) -> bool:
        key = frozenset(keep)
        if key in seen:
            return seen[key]
        if len(seen) >= max_trials:
            raise _Budget(f"trial budget ({max_trials}) spent")
        if time.perf_counter() - start > max_seconds:
            raise _Budget(f"time guard ({max_seconds:g} s) hit before the trial budget: this result depends on the machine's speed and the cache")
        passed, detail = trial(keep)
        seen[key] = passed
        log.append({"kept": len(keep), "passed": passed, "detail": detail})
        return passed

    def result(passed: bool, kept: list[str], minimal: bool, stopped: str | None = None) -> SearchResult:
        return SearchResult(passed, kept, len(seen), time.perf_counter() - start, minimal, stopped, log)

    fixed: list[str] = []
    pool = list(ranked)
    best: list[str] | None = None
    try:
        if not test(pool):
            return result(False, [], False, f"keeping all {len(pool)} ranked candidates in fp32 still misses a threshold")
        best = list(pool)
        known_pass = len(pool)  # fixed + pool[:known_pass] passes
        while True:
            if fixed and test(fixed):
                return result(True, fixed, True)
            low, step = 0, 1  # fixed + pool[:low] fails
            high = known_pass
            while step < high:
                if test(fixed + pool[:step]):
                    high = step
                    break
                low, step = step, step * 2
            while high - low > 1:
                middle = (low + high) // 2
                if test(fixed + pool[:middle]):
                    high = middle
                else:
                    low = middle
            best = fixed + pool[:high]
            fixed = fixed + [pool[high - 1]]
            why = hopeless(fixed) if hopeless else None
            if why:
                return result(False, [], False, why)
            pool = pool[: high - 1]
            known_pass = len(pool)
            if not pool:
                return result(True, fixed, True)
    except _Budget as budget:
        return result(best is not None, best or [], False, str(budget))
