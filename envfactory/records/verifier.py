"""The state verifier v: final-state equivalence (with volatile fields masked) plus per-task assertions.

Tools are deterministic, so an agent that does what the privileged solver did reaches the very same
state. Masking is for what may legitimately differ: the ids of records created during the episode
(an agent that books the return flight before the outbound one swaps two generated ids), the
counters behind them, and any glob-listed paths (timestamps of imported environments).

A task is kept only if v(Db⁰) = 0 and v(Exec(π*, Db⁰)) = 1 (`admissible`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from envfactory.env.diff import diff_states, same_document, state_part
from envfactory.env.state_path import get_path
from envfactory.records.models import Assertion, MaskSpec, States, StateVerifier, Verdict
from envfactory.records.spoken import renderings

MASKED = "<masked>"
_MAX_REASONS = 8


def record_collections(dump: Mapping[str, Any]) -> list[str]:
    """Top-level fields that hold records keyed by id (dicts of dicts)."""
    return [k for k, v in dump.items() if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values())]


def new_ids(initial: Mapping[str, Any], final: Mapping[str, Any], colls: Iterable[str] | None = None) -> set[str]:
    """Ids of records in `final` that `initial` lacks (`colls`: `final`'s collections, when known)."""
    out: set[str] = set()
    for coll in record_collections(final) if colls is None else colls:
        before = initial.get(coll)
        known: dict[str, Any] = before if isinstance(before, dict) else {}
        out.update(k for k in final[coll] if k not in known)
    return out


def replace_ids(value: Any, ids: set[str]) -> Any:
    """`value` with every id in `ids` (as a string or a key) read as `<masked>`."""
    if isinstance(value, str):
        return MASKED if value in ids else value
    if isinstance(value, dict):
        return {(MASKED if k in ids else k): replace_ids(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_ids(v, ids) for v in value]
    return value


def _mask_paths(value: Any, patterns: list[str], prefix: str = "") -> Any:
    if not patterns:
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out[k] = MASKED if any(fnmatch.fnmatchcase(path, p) for p in patterns) else _mask_paths(v, patterns, path)
        return out
    if isinstance(value, list):
        return [_mask_paths(v, patterns, f"{prefix}[{i}]") for i, v in enumerate(value)]
    return value


def canonical(initial: dict[str, Any], final: dict[str, Any], mask: MaskSpec) -> dict[str, Any]:
    """`final` with its volatile parts masked, relative to the episode's `initial` state.

    Records created during the episode become a sorted list under `<collection>.<new>` (compared as a
    multiset, without their ids); references to their ids elsewhere read `<masked>`.
    """
    final = state_part(final)  # a dump's runtime keys (a seeded RNG's position) are no state to compare
    out = _mask_paths(final, mask.paths)
    if not mask.generated_ids:
        return dict(out)
    colls = record_collections(final)
    ids = new_ids(initial, final, colls)
    out = dict(out)
    out.pop("counters", None)  # they only feed the generated ids
    if not ids:  # no record created: nothing to mask or gather under `<new>` (read-only: shares `final`'s values)
        return out
    for coll in colls:
        records = out.get(coll)
        if not isinstance(records, dict):
            continue
        kept = {k: replace_ids(v, ids) for k, v in records.items() if k not in ids}
        created = [replace_ids(v, ids) for k, v in records.items() if k in ids]
        if len(created) > 1:  # (one: no sort key made)
            created.sort(key=json.dumps)
        if created:
            kept["<new>"] = created
        out[coll] = kept
    return {k: (v if k in colls else replace_ids(v, ids)) for k, v in out.items()}


def state_differences(
    initial: dict[str, Any], goal: dict[str, Any], actual: dict[str, Any], mask: MaskSpec
) -> list[str]:
    """Dotted paths where `actual` differs from `goal` once both are masked; empty when equivalent."""
    if same_document(goal, actual):  # masking the same document twice gives the same document: nothing to walk
        return []
    diff = diff_states(canonical(initial, goal, mask), canonical(initial, actual, mask))
    return (
        [f"missing {p}" for p in diff.removed]
        + [f"unexpected {p}" for p in diff.added]
        + [f"different {p}" for p in diff.changed]
    )


def answer_forms(value: Any) -> list[str]:
    """Ways a value may be written in an answer: `1250.5` also as `1,250.50` and `1250.50`; a date or time
    also the ways users write them (`2026-01-10T10:00:00Z` as "January 10, 2026 at 10 am")."""
    if isinstance(value, bool):
        return ["yes" if value else "no", str(value).lower()]
    if isinstance(value, int):
        try:
            forms = {str(value), f"{value:,}"}
        except ValueError:  # past Python's 4,300-digit limit: no answer states it
            return []
        with contextlib.suppress(OverflowError):  # (as a float: none past its range, `10**400`)
            forms |= {f"{value:.2f}", f"{value:,.2f}", f"{value:.1f}", f"{value:,.1f}"}
        return sorted(forms)
    if isinstance(value, float):
        forms = {f"{value}", f"{value:,}"}
        if value.is_integer():
            forms |= {str(int(value)), f"{int(value):,}"}
        forms |= {f"{value:.2f}", f"{value:,.2f}", f"{value:.1f}", f"{value:,.1f}"}
        return sorted(forms)
    return sorted({str(value), *renderings(str(value))})


def answer_states(answer: str, value: Any) -> bool:
    """Whether `answer` states `value` in one of its forms (`answer_forms`), not as a part of another number or
    word: `5` is not in `15`, `5.5` or `1,500`, `Ana` not in `Banana` (a substring test let a string of digits
    state every number). A number may touch letters (`20GB`, `10am`, `FY2026`, `5件`), a word any non-ASCII
    text (languages written without spaces)."""
    text = answer.lower()
    for form in answer_forms(value):
        f = form.lower()
        if not f or f not in text:  # (not there at all: no pattern to build)
            continue
        before = r"(?<![0-9])(?<![0-9][.,])" + (r"(?<![a-z])" if f[0].isascii() and f[0].isalpha() else "")
        after = r"(?![.,]?[0-9])" + (r"(?![a-z])" if f[-1].isascii() and f[-1].isalpha() else "")
        if re.search(before + re.escape(f) + after, text):
            return True
    return False


def answer_budget(reference: str, *, floor: int = 400, times: float = 3.0) -> int:
    """The longest answer a task takes (`Assertion.max_chars`): `times` its reference answer's length, at least
    `floor` characters. An answer that pastes every record it read (an RL policy's way to state any value) is
    no answer; the reference's own lists of three items fit many times over."""
    return max(floor, int(times * len(reference)))


def check_assertion(a: Assertion, states: States, answer: str | None) -> tuple[str, str] | None:
    """None when the assertion holds, else why not: in full (with the expected value, for logs) and as an agent
    may be told it (without: a verdict that named it would hand over the answer to a retry)."""
    if a.kind == "answer_contains":
        if not answer:
            return f"no final answer (expected one mentioning {a.value!r})", "no final answer"
        if a.max_chars is not None and len(answer) > a.max_chars:
            too_long = f"the answer is {len(answer)} characters long; this task takes at most {a.max_chars}"
            return too_long, too_long + ": state what was asked"
        if answer_states(answer, a.value):
            return None
        return f"the answer does not mention {a.value!r}", "the answer does not state what was asked"
    state = states.get(a.server or "")
    if state is None:
        return (f"no state for environment '{a.server}'",) * 2
    try:
        value = get_path(state, a.path or "")
    except KeyError:
        return None if a.kind == "state_absent" else (f"{a.server}: nothing at {a.path}",) * 2
    if a.kind == "state_absent":
        return (f"{a.server}: {a.path} should be absent",) * 2
    if value == a.value:
        return None
    return f"{a.server}: {a.path} is {value!r}, expected {a.value!r}", f"{a.server}: {a.path} is not as expected"


def verify(verifier: StateVerifier, initial: States, final: States, answer: str | None = None) -> Verdict:
    """v(final): every environment's final state equivalent to its goal, every assertion holding."""
    reasons: list[tuple[str, str]] = []  # (in full, as an agent may hear it); a state's difference names no value
    if verifier.check_state:
        for server, goal in verifier.goal.items():
            actual = final.get(server)
            if actual is None:
                reasons.append((f"{server}: no final state",) * 2)
                continue
            diffs = state_differences(initial.get(server, {}), goal, actual, verifier.mask)
            reasons.extend((f"{server}: {d}",) * 2 for d in diffs)
    for a in verifier.assertions:
        problem = check_assertion(a, final, answer)
        if problem is not None:
            reasons.append(problem)
    shown = reasons[:_MAX_REASONS]
    if len(reasons) > _MAX_REASONS:
        shown.append((f"... and {len(reasons) - _MAX_REASONS} more",) * 2)
    return Verdict(ok=not reasons, reasons=[full for full, _ in shown], public=[told for _, told in shown])


def admissible(verifier: StateVerifier, initial: States, solved: States, answer: str | None) -> tuple[bool, str | None]:
    """SynthAPI's filter: (kept, why not). v(Db⁰) must be 0 — the goal must not already hold — and
    v(Exec(π*, Db⁰)) must be 1."""
    if verify(verifier, initial, initial, None).ok:
        return False, "goal_already_holds: the initial state already satisfies the verifier"
    after = verify(verifier, initial, solved, answer)
    if not after.ok:
        return False, "unsolved: the privileged solver's final state fails the verifier: " + "; ".join(after.reasons)
    return True, None
