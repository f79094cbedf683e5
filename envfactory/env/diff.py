"""Structural diff of two JSON state dumps: which paths were added, removed or changed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
