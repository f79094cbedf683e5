"""R_state's shortcuts: what one replay gave (`Replayed`, memoized per record by the replayed calls) and what
a completion's calls gave (`CallsOutcome`, memoized by all of them), and
the comparison of a native session's final state with the goal through what its calls touched
(`dump_delta`, `touched_equal`) instead of a full dump.

Both rest on the environment contract: every write goes through the state's CRUD helpers (`create`,
`update`, `delete`, `set`, `new_id`), which log it, and records are never changed in place — the same
contract a session's per-call diff (`State.diff_since`) and the reward's "reads cannot change a state"
rest on. Where the shortcut cannot tell (a top-level field set, a value that is neither a record nor a
plain scalar), it answers None and the caller dumps the whole state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from envfactory.env.state import State

if TYPE_CHECKING:
    from envfactory.env.session import Session

CallKey = tuple[str, str, bytes]  # (server, tool, arguments as JSON): equal keys, equal calls

WHOLE = None  # a top-level key whose whole value differs (not a keyed collection)
Delta = dict[str, frozenset[str] | None]  # top-level key -> the keys of it that differ, or WHOLE
_MISSING = object()
_PLAIN = (str, int, bool)  # values a JSON dump keeps as they are (floats: NaN / inf are not)


@dataclass(frozen=True)
class Replayed:
    """What replaying a record's replayed calls gave, independent of where they stood in the completion:
    per call (ok, "type: message" of its error), R_state (None: no relevant server) and the state's reasons."""

    outcomes: tuple[tuple[bool, str | None], ...]
    r_state: float | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class CallsOutcome:
    """What a completion's calls gave against a record, whatever else its text held (memoized per record by
    all its calls, in order): R_state (None: no relevant server), the failed calls' indices, the state's
    reasons, and M, the ground-truth calls matched."""

    r_state: float | None
    failed: tuple[int, ...]
    reasons: tuple[str, ...]
    matched: int


@dataclass
class LiveReplay:
    """A record's last replay, kept: its native sessions, and per call its key, its server and the log mark
    of that server's state before it. `rewind(keys)` rolls the sessions back to the longest prefix of
    calls shared with `keys` (each state's change log undoes calls exactly) and says how long it is."""

    sessions: dict[str, Session] = field(default_factory=dict)
    outcomes: list[tuple[bool, str | None]] = field(default_factory=list)
    keys: list[CallKey | None] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)

    def rewind(self, keys: list[CallKey | None]) -> int:
        n = 0
        for mine, theirs in zip(self.keys, keys, strict=False):
            if mine is None or mine != theirs:
                break
            n += 1
        rolled: set[str] = set()
        for server, mark in zip(self.servers[n:], self.marks[n:], strict=True):
            if server not in rolled:  # the first mark of a server after the prefix: its state then
                rolled.add(server)
                self.sessions[server].state.rollback(mark)
        del self.outcomes[n:], self.keys[n:], self.servers[n:], self.marks[n:]
        return n

    def push(self, key: CallKey | None, server: str, mark: int) -> None:
        self.keys.append(key)
        self.servers.append(server)
        self.marks.append(mark)


def dump_delta(initial: Mapping[str, Any], goal: Mapping[str, Any]) -> Delta:
    """Where two dumps of one state model differ: per top-level key, the differing keys of a dict
    (a collection of records, the counters), or WHOLE for any other differing value."""
    out: Delta = {}
    for key in [*initial, *(k for k in goal if k not in initial)]:
        a, b = initial.get(key, _MISSING), goal.get(key, _MISSING)
        if a is b or a == b:  # (`is` first: a goal dump shares what it did not change with the initial one)
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out[key] = frozenset(
                k for k in [*a, *b] if (x := a.get(k, _MISSING)) is not (y := b.get(k, _MISSING)) and x != y
            )
        else:
            out[key] = WHOLE
    return out


def touched_equal(state: State, goal: Mapping[str, Any], delta: Delta) -> bool | None:
    """Whether `state.dump() == goal`, for a state forked from the dump `goal` was diffed against
    (`delta = dump_delta(initial, goal)`), looking only at what the state's change log touched. None when
    it cannot tell cheaply (the caller dumps the whole state)."""
    touched: dict[str, set[str]] = {}
    for entry in state.log_since(0):
        if entry.key is None:  # a top-level field set: its dump is the state model's business
            return None
        touched.setdefault(entry.collection, set()).add(entry.key)
    for top, differing in delta.items():
        if differing is WHOLE or top not in touched or not differing <= touched[top]:
            return False  # a difference the calls did not touch (or cannot be read per key): not equal
    for top, keys in touched.items():
        coll = getattr(state, top, _MISSING)
        want = goal.get(top, _MISSING)
        if not isinstance(coll, dict) or not isinstance(want, dict):
            return None
        for key in keys:
            have, goal_value = coll.get(key, _MISSING), want.get(key, _MISSING)
            if have is _MISSING or goal_value is _MISSING:
                if have is not goal_value:
                    return False
            elif isinstance(have, BaseModel):
                if have.model_dump(mode="json") != goal_value:
                    return False
            elif type(have) in _PLAIN:
                if have != goal_value:
                    return False
            else:
                return None
    return True
