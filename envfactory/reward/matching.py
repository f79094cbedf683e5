"""One rule for "the same call", and R_traj's matching.

`CallMatcher` is the rule, used by the reward (R_traj) and by QueryGen's select and filter alike, so
that a turn selection keeps scores 1.0 against its own ground truth and no turn scoring 1.0 is turned
away: the same tool; both calls' arguments **normalized by the tool's own validator** (types coerced
as the tool reads them, a missing optional argument equal to its default); the ground truth's masked
arguments (free text) not compared, only filled where the ground truth fills them; values equal by
`same_value` — numbers with `isclose`, booleans not numbers, strings stripped and case-folded (unless
`case_sensitive`), lists in order, objects key by key with a missing key equal to None. A predicted call
the tool would reject matches nothing, and the reward holds a call the environment refuses when run to
`exact_args` (no leniency for a refused call).

`best_match` is the largest one-to-one matching of predicted to ground-truth calls that respects the
ground truth's partial order."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python

if TYPE_CHECKING:
    from envfactory.env.environment import BaseEnvironment
    from envfactory.records.models import ToolCall


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


def _identical(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types all the way down: `True` is not `1`, `1.0` is not `1`."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def said_the_same(want: dict[str, Any], masked: Sequence[str], got: dict[str, Any]) -> bool:
    """A masked argument (free text: any wording will do) is filled wherever the ground truth fills it — leaving out a
    ticket's description, or giving "", is no other wording of it, and the state term cannot tell (it blanks the
    field)."""
    return all(_said(got.get(k)) for k in masked if _said(want.get(k)))


def _said(value: Any) -> bool:
    return value is not None and value not in ("", [], {}) and not (isinstance(value, str) and not value.strip())


class CallMatcher:
    """The rule for "the same call" (see the module's docstring); `env_of(server)` gives an environment or None."""

    def __init__(
        self,
        env_of: Callable[[str], BaseEnvironment | None],
        *,
        case_sensitive: bool = False,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
    ) -> None:
        self.env_of = env_of
        self.case_sensitive, self.rel_tol, self.abs_tol = case_sensitive, rel_tol, abs_tol

    def normalize(self, call: ToolCall, *, strict: bool) -> dict[str, Any] | None:
        """The call's arguments as the tool reads them (defaults filled, JSON-typed). A call the tool
        rejects gives None when `strict` (a prediction), else its raw arguments (a ground truth)."""
        env = self.env_of(call.server) if call.server else None
        binding = env.binding(call.name) if env is not None else None
        if binding is None:
            return None if strict else dict(call.arguments)
        try:
            parsed = to_jsonable_python(binding.parse_args(call.arguments))
        except Exception:  # ArgumentError, or anything a foreign binding raises
            return None if strict else dict(call.arguments)
        return parsed if isinstance(parsed, dict) else dict(call.arguments)

    def same_args(self, want: dict[str, Any], masked: Sequence[str], got: dict[str, Any]) -> bool:
        """Normalized ground-truth arguments `want` and predicted ones `got` agree: masked ones filled where the
        ground truth fills them (`said_the_same`), every other one equal."""
        return said_the_same(want, masked, got) and all(
            same_value(
                want.get(k), got.get(k), case_sensitive=self.case_sensitive, rel_tol=self.rel_tol, abs_tol=self.abs_tol
            )
            for k in want.keys() | got.keys()
            if k not in masked
        )

    def exact_args(self, want: dict[str, Any], masked: Sequence[str], got: dict[str, Any]) -> bool:
        """`got` repeats `want` exactly (masked ones as in `same_args`): equal as the tool reads them, without
        `same_value`'s leniency (case, surrounding spaces, `isclose`) — what a call the tool refused must do to keep
        its match."""
        return said_the_same(want, masked, got) and all(
            _identical(want.get(k), got.get(k)) for k in want.keys() | got.keys() if k not in masked
        )

    def same_call(self, truth: ToolCall, made: ToolCall) -> bool:
        """`made` does what the ground-truth call `truth` does."""
        if (truth.server, truth.name) != (made.server, made.name):
            return False
        got = self.normalize(made, strict=True)
        want = self.normalize(truth, strict=False)
        return got is not None and want is not None and self.same_args(want, truth.masked_arguments, got)


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
