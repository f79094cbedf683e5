"""The state database `D`: a Pydantic model of collections keyed by id, with CRUD helpers.

Every write goes through `create` / `update` / `delete` / `set` (the SynthAPI discipline), which
append to a change log. The log gives a readable account of a call, lets a session roll back a
failed call in O(changes), and yields the call's structural diff without dumping the whole state.
"""

from __future__ import annotations

import copy
import json
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, cast
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from envfactory.env.diff import StateDiff, diff_into
from envfactory.errors import ConflictError, NotFoundError, ScenarioError, ToolError, first_error
from envfactory.inputs import read_json

R = TypeVar("R", bound=BaseModel)
S = TypeVar("S", bound="State")

Op = Literal["create", "update", "delete", "set", "counter"]

# A fixed epoch so that a state with no clock field of its own is still deterministic.
DEFAULT_CLOCK = datetime(2026, 1, 5, 9, 0, 0)


class Record(BaseModel):
    """Base for records stored in a collection; forbids unknown fields so typos fail loudly."""

    model_config = ConfigDict(extra="forbid")


class ChangeEntry(NamedTuple):
    """One low-level change: enough to describe it, diff it and undo it."""

    op: Op
    collection: str  # collection field name, or the top-level field for `set`
    key: str | None  # record id (None for `set`)
    before: Any  # the replaced object (a Record, a value) or None when absent
    after: Any
    position: int = -1  # for `delete`: where the record stood, so that undo keeps the order


class Change(BaseModel):
    """Public, readable form of a change-log entry (what a session records per call)."""

    op: Op
    collection: str
    id: str | None = None


_MISSING = object()
_IMMUTABLE = (str, int, float, bool, bytes, datetime, date, time, timedelta, Enum, Decimal, UUID)


def _dump_value(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, (dict, list, tuple)) or not isinstance(v, (str, int, float, bool, type(None))):
        # plain containers / datetimes: use pydantic's JSON conversion for exact parity with dump()
        from pydantic_core import to_jsonable_python

        return to_jsonable_python(v)
    return v


class State(BaseModel):
    """Base class of every environment's state model.

    Subclasses add collections such as `hotels: dict[str, Hotel] = {}` and scalar fields.
    `counters` feeds deterministic ids; `clock` is the environment's "now".
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    counters: dict[str, int] = Field(default_factory=dict, description="next-id counters per prefix")
    clock: datetime = Field(default=DEFAULT_CLOCK, description="the environment's current time")

    _log: list[ChangeEntry] = PrivateAttr(default_factory=list)

    def _entries(self) -> list[ChangeEntry]:
        """The change log (`_log`) read straight from pydantic's private storage: `self._log` goes through
        `BaseModel.__getattr__` (~1.8 µs a read), and every write and log mark reads it."""
        private = self.__pydantic_private__
        return private["_log"] if private is not None else self._log

    # ---- load / dump -------------------------------------------------------------------
    @classmethod
    def load(cls: type[S], data: dict[str, Any] | None = None, source: str = "<config>") -> S:
        """Build a state from a JSON-compatible dump (None or {} gives the defaults)."""
        try:
            return cls.model_validate(data or {})
        except ValidationError as e:
            loc, msg = first_error(e, "<root>")
            raise ScenarioError(f"{source}: does not fit {cls.__name__}: at '{loc}': {msg}") from None

    @classmethod
    def load_bytes(cls: type[S], data: bytes, source: str = "<config>") -> S:
        """Build a state from JSON bytes (the fast fork path: all-new objects, validated in Rust)."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as e:
            loc, msg = first_error(e, "<root>")
            raise ScenarioError(f"{source}: does not fit {cls.__name__}: at '{loc}': {msg}") from None

    @classmethod
    def load_json(cls: type[S], path: str | Path) -> S:
        p = Path(path)
        data = read_json(p, what="state file", error=ScenarioError)
        return cls.load(data, str(p))

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def fork_sharing_records(self: S) -> S:
        """A new state equal to this one: new dicts for its collections (and counters) holding the same record
        objects, immutable top-level values shared, any other deep-copied (~4 µs against ~15-40 for a state
        validated from JSON). The two stay apart as long as both are written through the CRUD helpers, which
        replace a record and never change one in place: the contract a session's diff and rollback rest on.
        For a template only the reward forks from (never handed to a tool itself)."""
        values: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, dict):
                values[name] = dict(value)
            elif value is None or isinstance(value, _IMMUTABLE):
                values[name] = value
            else:
                values[name] = copy.deepcopy(value)
        # the pydantic plugin types `model_construct` on the class it is written in (State), not on `S`
        return cast(S, type(self).model_construct(_fields_set=set(self.model_fields_set), **values))

    def dump_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.dump(), indent=2) + "\n", encoding="utf-8")

    # ---- ids and time ------------------------------------------------------------------
    def new_id(self, prefix: str, width: int = 4) -> str:
        """Next deterministic id for `prefix`, e.g. `BK-0001`."""
        old = self.counters.get(prefix)
        n = (old or 0) + 1
        self.counters[prefix] = n
        self._entries().append(ChangeEntry("counter", "counters", prefix, old, n))
        return f"{prefix}-{n:0{width}d}"

    def now(self) -> datetime:
        return self.clock

    def advance_clock(self, **delta: float) -> datetime:
        self.set("clock", self.clock + timedelta(**delta))
        return self.clock

    # ---- CRUD --------------------------------------------------------------------------
    def _collection(self, collection: str) -> dict[str, Any]:
        coll = getattr(self, collection, _MISSING)
        if not isinstance(coll, dict):
            raise AttributeError(f"{type(self).__name__} has no collection '{collection}'")
        return coll

    def get(self, collection: str, key: str, what: str | None = None) -> Any:
        """Read one record; an unknown id raises `NotFoundError` (a structured tool error)."""
        rec = self._collection(collection).get(key, _MISSING)
        if rec is _MISSING:
            raise NotFoundError(f"no {what or collection.rstrip('s')} with id '{key}'", collection=collection, id=key)
        return rec

    def exists(self, collection: str, key: str) -> bool:
        return key in self._collection(collection)

    def find(self, collection: str, **equals: Any) -> list[Any]:
        """Records whose fields equal the given values, in collection order (scenario order, then creation)."""
        coll = self._collection(collection)
        return [r for r in coll.values() if all(getattr(r, f) == v for f, v in equals.items())]

    def create(self, collection: str, key: str, record: R) -> R:
        """Insert a new record; an id already in use is a `ConflictError`, never a silent overwrite."""
        coll = self._collection(collection)
        if key in coll:
            raise ConflictError(f"{collection} already has a record with id '{key}'", collection=collection, id=key)
        coll[key] = record
        self._entries().append(ChangeEntry("create", collection, key, None, record))
        return record

    def update(self, collection: str, key: str, **fields: Any) -> Any:
        """Replace a record by a validated copy with `fields` changed (records are never mutated in place)."""
        coll = self._collection(collection)
        old = self.get(collection, key)
        model = type(old)
        unknown = [f for f in fields if f not in model.model_fields]
        if unknown:
            raise AttributeError(f"{model.__name__} has no field '{unknown[0]}'")
        try:
            new = model.model_validate({**dict(old), **fields})
        except ValidationError as e:
            loc, msg = first_error(e)
            raise ToolError(f"invalid value for {model.__name__}.{loc}: {msg}") from None
        coll[key] = new
        self._entries().append(ChangeEntry("update", collection, key, old, new))
        return new

    def delete(self, collection: str, key: str) -> Any:
        coll = self._collection(collection)
        old = self.get(collection, key)
        position = list(coll).index(key)
        del coll[key]
        self._entries().append(ChangeEntry("delete", collection, key, old, None, position))
        return old

    def set(self, field: str, value: Any) -> None:
        """Set a top-level field (a balance, a current directory...), logged like a record change."""
        if field not in type(self).model_fields:
            raise AttributeError(f"{type(self).__name__} has no field '{field}'")
        old = getattr(self, field)
        object.__setattr__(self, field, value)
        self._entries().append(ChangeEntry("set", field, None, old, value))

    # ---- change log --------------------------------------------------------------------
    def log_mark(self) -> int:
        return len(self._entries())

    def log_tail(self) -> tuple[int, ChangeEntry | None]:
        """The change log's length and last entry: both stay put only while the state does (a rolled-back call's
        entries leave the log; every new entry is a new object)."""
        log = self._entries()
        return len(log), log[-1] if log else None

    def log_since(self, mark: int) -> list[ChangeEntry]:
        return self._entries()[mark:]

    def rollback(self, mark: int) -> None:
        """Undo every change after `mark`, newest first."""
        log = self._entries()
        for e in reversed(log[mark:]):
            if e.op == "set":
                object.__setattr__(self, e.collection, e.before)
                continue
            coll = self._collection(e.collection)
            if e.before is None:
                coll.pop(e.key, None)
            elif e.op == "delete":  # back where it stood: tools that list records see the same order
                items = list(coll.items())
                items.insert(e.position, (e.key, e.before))
                coll.clear()
                coll.update(items)
            else:
                coll[e.key] = e.before
        del log[mark:]

    def diff_since(self, mark: int) -> StateDiff:
        """Structural diff of the state now against the state at `mark`, from the log alone.

        Equal to `diff_states(dump_at_mark, dump_now)` as long as every write used the CRUD helpers.
        """
        log = self._entries()
        if len(log) <= mark:  # nothing since (every read): no walk, no sort
            return StateDiff()
        first: dict[tuple[str, str | None], Any] = {}
        for e in log[mark:]:
            first.setdefault((e.collection, e.key), e.before)
        out = StateDiff()
        for (collection, key), before in first.items():
            if key is None:  # a top-level field
                diff_into(_dump_value(before), _dump_value(getattr(self, collection)), collection, out)
                continue
            coll = getattr(self, collection)
            path = f"{collection}.{key}"
            after = coll.get(key, _MISSING)
            if before is None and after is _MISSING:
                continue
            if before is None:
                out.added.append(path)
            elif after is _MISSING:
                out.removed.append(path)
            else:
                diff_into(_dump_value(before), _dump_value(after), path, out)
        out.added.sort()  # (in place: `out` is this call's own)
        out.removed.sort()
        out.changed.sort()
        return out

    def changes_since(self, mark: int) -> list[Change]:
        return [Change(op=e.op, collection=e.collection, id=e.key) for e in self._entries()[mark:]]

    def clear_log(self) -> None:
        self._entries().clear()
