"""The state database: load/dump, CRUD helpers and change log, structural diff, rollback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.env import ConflictError, NotFoundError, Record, State, ToolError, diff_states
from envfactory.errors import ScenarioError


class Item(Record):
    id: str
    name: str
    qty: int = 0
    tags: list[str] = []


class Shelf(State):
    items: dict[str, Item] = {}
    owner: str = "nobody"
    prefs: dict[str, int] = {}


def test_load_dump_roundtrip(tmp_path: Path) -> None:
    s = Shelf.load({"items": {"I-1": {"id": "I-1", "name": "pen", "qty": 2}}, "owner": "ana"})
    dump = s.dump()
    assert dump["items"]["I-1"] == {"id": "I-1", "name": "pen", "qty": 2, "tags": []}
    assert dump["clock"] == "2026-01-05T09:00:00"
    path = tmp_path / "s.json"
    s.dump_json(path)
    assert Shelf.load_json(path).dump() == dump
    assert json.loads(path.read_text()) == dump


def test_load_errors_name_source_and_path(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"cfg\.json: does not fit Shelf: at 'items\.I-1\.qty'"):
        Shelf.load({"items": {"I-1": {"id": "I-1", "name": "pen", "qty": "many"}}}, "cfg.json")
    with pytest.raises(ScenarioError, match="at 'colour'"):
        Shelf.load({"colour": "red"})
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ScenarioError, match="invalid JSON"):
        Shelf.load_json(bad)


def test_crud_and_change_log() -> None:
    s = Shelf()
    key = s.new_id("I")
    assert key == "I-0001" and s.new_id("I") == "I-0002"
    s.create("items", key, Item(id=key, name="pen"))
    s.update("items", key, qty=5)
    assert s.get("items", key).qty == 5
    assert [i.id for i in s.find("items", qty=5)] == [key]
    s.set("owner", "rui")
    s.delete("items", key)
    assert [(c.op, c.collection, c.id) for c in s.changes_since(0)] == [
        ("counter", "counters", "I"),
        ("counter", "counters", "I"),
        ("create", "items", key),
        ("update", "items", key),
        ("set", "owner", None),
        ("delete", "items", key),
    ]


def test_crud_errors() -> None:
    s = Shelf.load({"items": {"I-1": {"id": "I-1", "name": "pen"}}})
    with pytest.raises(NotFoundError, match="no item with id 'I-9'"):
        s.get("items", "I-9", "item")
    with pytest.raises(NotFoundError):
        s.update("items", "I-9", qty=1)
    with pytest.raises(NotFoundError):
        s.delete("items", "I-9")
    with pytest.raises(ConflictError, match="already has a record with id 'I-1'"):
        s.create("items", "I-1", Item(id="I-1", name="dup"))
    with pytest.raises(ToolError, match=r"invalid value for Item\.qty"):
        s.update("items", "I-1", qty="lots")
    with pytest.raises(AttributeError, match="no field 'colour'"):
        s.update("items", "I-1", colour="red")
    with pytest.raises(AttributeError, match="no collection 'owner'"):
        s.get("owner", "x")
    assert s.changes_since(0) == []  # nothing failed half-way into the log


def test_diff_states_paths() -> None:
    a = {"x": {"a": 1, "b": [1, 2, 3]}, "y": True, "z": "keep"}
    b = {"x": {"a": 2, "b": [1, 5], "c": None}, "y": 1, "z": "keep", "w": {}}
    d = diff_states(a, b)
    assert d.added == ["w", "x.c"]
    assert d.removed == ["x.b[2]"]
    assert d.changed == ["x.a", "x.b[1]", "y"]  # True -> 1 is a change of type
    assert diff_states(a, a).empty


# ---- property: the change-log diff equals the full-dump diff; rollback restores exactly -------
names = st.sampled_from(["pen", "ink", "cup", "lamp"])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), names),
        st.tuples(st.just("update"), st.integers(0, 5), st.integers(-3, 3)),
        st.tuples(st.just("tag"), st.integers(0, 5), names),
        st.tuples(st.just("delete"), st.integers(0, 5)),
        st.tuples(st.just("owner"), names),
        st.tuples(st.just("pref"), names, st.integers(0, 9)),
        st.tuples(st.just("clock"), st.integers(1, 90)),
    ),
    max_size=25,
)


def _apply(s: Shelf, op: tuple[Any, ...]) -> None:
    keys = sorted(s.items)
    if op[0] == "create":
        k = s.new_id("I")
        s.create("items", k, Item(id=k, name=op[1]))
    elif op[0] in ("update", "tag", "delete") and keys:
        k = keys[op[1] % len(keys)]
        if op[0] == "update":
            s.update("items", k, qty=s.items[k].qty + op[2])
        elif op[0] == "tag":
            s.update("items", k, tags=[*s.items[k].tags, op[2]])
        else:
            s.delete("items", k)
    elif op[0] == "owner":
        s.set("owner", op[1])
    elif op[0] == "pref":
        s.set("prefs", {**s.prefs, op[1]: op[2]})
    elif op[0] == "clock":
        s.advance_clock(minutes=op[1])


@settings(max_examples=150, deadline=None)
@given(before_ops=ops, ops=ops)
def test_change_log_diff_equals_full_diff_and_rollback_restores(before_ops: list[Any], ops: list[Any]) -> None:
    s = Shelf()
    for op in before_ops:
        _apply(s, op)
    before = s.dump()
    mark = s.log_mark()
    for op in ops:
        _apply(s, op)
    assert s.diff_since(mark) == diff_states(before, s.dump())
    s.rollback(mark)
    assert s.dump() == before
    assert s.log_mark() == mark


def test_rollback_of_a_delete_keeps_collection_order() -> None:
    s = Shelf.load({"items": {k: {"id": k, "name": k} for k in ("A", "B", "C")}})
    mark = s.log_mark()
    s.delete("items", "A")
    s.delete("items", "C")
    s.rollback(mark)
    assert list(s.items) == ["A", "B", "C"]


@settings(max_examples=150, deadline=None)
@given(before_ops=ops, ops=ops, cleared=st.booleans())
def test_the_logs_tail_stays_put_exactly_while_the_state_does(
    before_ops: list[Any], ops: list[Any], cleared: bool
) -> None:
    """`log_tail` (what π* keeps a session's dump by): the same after a rollback to where it was taken, as the
    state is; different after any change, even once the log was cleared and grew back to the same length."""
    s = Shelf()
    for op in before_ops:
        _apply(s, op)
    tail, dump = s.log_tail(), s.dump()
    mark = s.log_mark()
    for op in ops:
        _apply(s, op)
    moved = s.log_tail()
    assert (moved[0] == tail[0] and moved[1] is tail[1]) == (s.log_mark() == mark)
    s.rollback(mark)
    assert s.log_tail()[0] == tail[0] and s.log_tail()[1] is tail[1] and s.dump() == dump
    if cleared and tail[0]:
        s.clear_log()
        for i in range(tail[0]):
            s.set("owner", f"owner {i}")
        assert s.log_tail()[0] == tail[0] and s.log_tail()[1] is not tail[1]
