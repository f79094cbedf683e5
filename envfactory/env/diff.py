"""Structural diff of two JSON state dumps: which paths were added, removed or changed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic_core import to_json


class StateDiff(BaseModel):
    """Paths use dots for object keys and `[i]` for list indices, e.g. `bookings.BK-0001.status`."""

    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def paths(self) -> set[str]:
        return set(self.added) | set(self.removed) | set(self.changed)

    def sorted(self) -> StateDiff:
        return StateDiff(added=sorted(self.added), removed=sorted(self.removed), changed=sorted(self.changed))


def _key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def diff_into(a: Any, b: Any, prefix: str, out: StateDiff) -> None:
    """Accumulate the differences between `a` and `b` (JSON values) under `prefix` into `out`."""
    if a is b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if same_document(a, b):  # an unchanged record, not walked leaf by leaf
            return
        for k, av in a.items():
            if k in b:
                diff_into(av, b[k], _key(prefix, str(k)), out)
            else:
                out.removed.append(_key(prefix, str(k)))
        for k in b:
            if k not in a:
                out.added.append(_key(prefix, str(k)))
        return
    if isinstance(a, list) and isinstance(b, list):
        common = min(len(a), len(b))
        for i in range(common):
            diff_into(a[i], b[i], f"{prefix}[{i}]", out)
        out.removed.extend(f"{prefix}[{i}]" for i in range(common, len(a)))
        out.added.extend(f"{prefix}[{i}]" for i in range(common, len(b)))
        return
    # bool is an int subclass: True == 1 must still count as a change of type
    if a != b or type(a) is not type(b):
        out.changed.append(prefix or "<root>")


def same_document(a: Any, b: Any) -> bool:
    """True only if `a` and `b` are one JSON document, so that no diff (`diff_into`) finds anything between them:
    equal as Python values (which tells a list from a tuple, and holds a NaN equal to itself only where both hold
    the same object, as the diff does) and as JSON text (which tells 1 from 1.0 and from true, as the diff does by
    type). False when either is not JSON data; the caller then compares the long way. At C speed: the diff skips
    an unchanged record with it instead of walking it leaf by leaf."""
    try:
        return bool(a == b) and to_json(a) == to_json(b)
    except Exception:  # not JSON data (a value to_json refuses, a comparison that raises): the long way
        return False


RUNTIME_PREFIX = "__"  # a dump's top-level key that carries runtime, not state (a seeded RNG's position)


def state_part(dump: dict[str, Any]) -> dict[str, Any]:
    """A dump without its runtime keys (`__random`): what state comparisons and diffs look at. A fork
    needs them to behave exactly like the session dumped; a verifier or a diff must not see them."""
    if not any(k.startswith(RUNTIME_PREFIX) for k in dump):
        return dump
    return {k: v for k, v in dump.items() if not k.startswith(RUNTIME_PREFIX)}


def diff_states(before: dict[str, Any], after: dict[str, Any]) -> StateDiff:
    """Diff two dumps of a whole state (their runtime keys left out)."""
    out = StateDiff()
    diff_into(state_part(before), state_part(after), "", out)
    return out.sorted()
