"""R_traj's matching: argument equality (`same_value`) and the largest one-to-one matching of predicted
to ground-truth calls that respects the ground truth's partial order (`best_match`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def same_value(a: Any, b: Any, *, case_sensitive: bool = False, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Argument equality: numbers with isclose (booleans are not numbers), strings stripped (and
    case-folded unless `case_sensitive`), lists in order, objects key by key (a missing key equals None)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, str) and isinstance(b, str):
        if case_sensitive:
            return a.strip() == b.strip()
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, dict) and isinstance(b, dict):
        return all(
            same_value(a.get(k), b.get(k), case_sensitive=case_sensitive, rel_tol=rel_tol, abs_tol=abs_tol)
            for k in a.keys() | b.keys()
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            same_value(x, y, case_sensitive=case_sensitive, rel_tol=rel_tol, abs_tol=abs_tol)
            for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)


def best_match(candidates: Sequence[Sequence[int]], successors: Sequence[int], beam: int = 512) -> int:
    """The largest number of one-to-one matches (prediction p → one of `candidates[p]`, ground-truth
    indices) such that no ground-truth pair i ≺ j (`successors[i]` has bit j) is matched in the
    opposite order. Exact unless more than `beam` matched-sets are alive at once."""
    states = {0}
    for cands in candidates:
        if not cands:
            continue
        grown = set(states)
        for m in states:
            for i in cands:
                bit = 1 << i
                if not m & bit and not m & successors[i]:
                    grown.add(m | bit)
        if len(grown) > beam:
            grown = set(sorted(grown, key=int.bit_count, reverse=True)[:beam])
        states = grown
    return max(m.bit_count() for m in states)
