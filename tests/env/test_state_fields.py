"""A state validated field by field (`FieldWise`) dumps exactly what validating the whole state dumps — the same
values in the same key order — or declines (None): random goal states reached by random calls on every bundled
native environment, then bent (a bad value, a missing or extra field, a record removed or moved, a field left
out), against `env.dump_state(env.new_state(goal))`."""

from __future__ import annotations

import copy
import random
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ConfigDict, Field, computed_field, field_validator, model_validator
from pydantic_core import to_json

from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.env.state import Record, State
from envfactory.env.state_fields import FieldWise
from envfactory.errors import ScenarioError

_BENDS = [
    "none", "bad value", "missing field", "extra field", "removed", "moved", "keys reversed", "top-level gone",
    "new record",
]  # fmt: skip


def _native(pool: EnvPool) -> list[str]:
    return [n for n in pool.names() if type(pool.get(n)) is Environment]


def _deep_order(value: Any) -> Any:
    """The keys of every dict, in order, nested: what equality of dicts does not see."""
    if isinstance(value, dict):
        return [(k, _deep_order(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_deep_order(v) for v in value]
    return value


def _reversed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed(v) for k, v in reversed(value.items())}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


def _bend(goal: dict[str, Any], how: str, rng: random.Random) -> dict[str, Any]:
    goal = copy.deepcopy(goal)
    colls = [k for k, v in goal.items() if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values())]
    if not colls or how == "none":
        return goal
    coll = goal[rng.choice(colls)]
    rid = rng.choice(list(coll))
    record = coll[rid]
    if how == "bad value" and isinstance(record, dict) and record:
        record[rng.choice(list(record))] = {"not": ["a", "value"]}
    elif how == "missing field" and isinstance(record, dict) and record:
        del record[rng.choice(list(record))]
    elif how == "extra field" and isinstance(record, dict):
        record["no_such_field"] = 1
    elif how == "removed":
        del coll[rid]
    elif how == "moved":
        coll[rid] = coll.pop(rid)
    elif how == "keys reversed":  # the same record, every dict in it in the reverse order (a dump keeps a dict's)
        coll[rid] = _reversed(record)
    elif how == "top-level gone":
        del goal[rng.choice(list(goal))]
    elif how == "new record":
        coll[rid + "-copy"] = copy.deepcopy(record)
    return goal


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_goal_validated_in_its_differences_dumps_as_the_whole(data: st.DataObject, pool: EnvPool) -> None:
    name = data.draw(st.sampled_from(_native(pool)))
    env = pool.get(name)
    parts = FieldWise.of(env.state_model)
    assert parts is not None, f"{name}: a bundled state model is plain data"
    scenario = data.draw(st.sampled_from(env.scenario_names()))
    known = env.dump_state(env.new_state(env.scenario(scenario)))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    session = Session(env, env.new_state(known))
    tools = env.metadata.tools
    for _ in range(data.draw(st.integers(0, 6))):  # random calls, mostly failing: what succeeds changes the state
        tool = rng.choice(tools)
        ids = [rid for v in known.values() if isinstance(v, dict) for rid in v]
        args = {p: rng.choice([*ids, "x", 1, 2.5, True]) for p in tool.parameters}
        session.call(tool.name, args)
    goal = _bend(session.dump(), data.draw(st.sampled_from(_BENDS)), rng)
    try:
        want: dict[str, Any] | None = env.dump_state(env.new_state(goal))
    except ScenarioError:
        want = None
    got = parts.dump(known, goal, "final_config")
    if want is None:
        assert got is None  # what does not validate whole does not validate in parts
    elif got is not None:
        assert got == want and _deep_order(got) == _deep_order(want)
    else:  # declined: only for a goal whose fields are not the known dump's fields
        assert goal.keys() != known.keys()


class _Booking(Record):
    guest: str
    nights: int = 1


class _Plain(State):
    bookings: dict[str, _Booking] = {}
    note: str = ""


class _Checked(_Plain):
    @field_validator("note")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.strip()


class _CrossField(_Plain):
    @model_validator(mode="after")
    def _agree(self) -> _CrossField:
        return self


class _Computed(_Plain):
    @computed_field  # type: ignore[prop-decorator]
    @property
    def count(self) -> int:
        return len(self.bookings)


class _PostInit(_Plain):
    def model_post_init(self, context: Any) -> None:
        self.note = self.note or "set after"


class _Strict(_Plain):
    model_config = {"strict": True}


class _LowerKeys(_Plain):  # validation rewrites dict keys too: a goal's "B1" is validated to "b1"
    model_config = ConfigDict(str_to_lower=True)


class _Aliased(State):  # validated by alias, dumped by name: a dump does not validate again
    seats: int = Field(default=0, alias="seatCount")


class _Nested(State):  # a model that refers to itself: a schema of definitions
    top: dict[str, int] = {}
    inner: _Nested | None = None


@pytest.mark.parametrize(
    "model", [_Checked, _CrossField, _Computed, _PostInit, _Strict, _LowerKeys, _Aliased, _Nested, Record]
)
def test_a_model_with_code_or_renames_of_its_own_is_validated_whole(model: type[Any]) -> None:
    assert FieldWise.of(model) is None


def test_a_plain_model_is_validated_in_its_collections_records() -> None:
    parts = FieldWise.of(_Plain)
    assert parts is not None and parts.keyed == {"bookings", "counters"}
    known = _Plain.model_validate({"bookings": {"B1": {"guest": "Ana"}, "B2": {"guest": "Rui"}}}).dump()
    goal = {**known, "bookings": {"B2": {"guest": "Rui", "nights": 3}, "B3": {"guest": "Eva"}}, "note": "n"}
    got = parts.dump(known, goal, "goal")
    assert got == _Plain.model_validate(goal).dump()
    assert list(got["bookings"]) == ["B2", "B3"] and got["clock"] == datetime(2026, 1, 5, 9).isoformat()
    assert parts.dump(known, {**goal, "bookings": {"B3": {"nights": 2}}}, "goal") is None  # no guest: invalid


def test_a_record_whose_dicts_changed_order_dumps_in_the_new_order(pool: EnvPool) -> None:
    """Every record of every scenario of every bundled native environment, its dicts reversed: `==` cannot see
    it, a dump keeps it."""
    reordered = 0
    for name in _native(pool):
        env = pool.get(name)
        parts = FieldWise.of(env.state_model)
        assert parts is not None
        for scenario in env.scenario_names():
            known = env.dump_state(env.new_state(env.scenario(scenario)))
            for coll in parts.keyed:
                for rid, record in known[coll].items():
                    goal = {**known, coll: {**known[coll], rid: _reversed(record)}}
                    want = env.dump_state(env.new_state(goal))
                    got = parts.dump(known, goal, "goal")
                    assert got is not None and _deep_order(got) == _deep_order(want), (name, coll, rid)
                    reordered += _deep_order(want) != _deep_order(known)
    assert reordered, "no record held a dict: the case is not exercised"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sessions_forked_sharing_records_behave_as_forks_from_json(data: st.DataObject, pool: EnvPool) -> None:
    """`State.fork_sharing_records` (how the reward forks): the same results and final state as a state validated
    from the dump's JSON, call after call, and the template never changes — on every bundled native environment,
    random calls (most of them failing, so undone), i.e. no tool changes a record in place."""
    name = data.draw(st.sampled_from(_native(pool)))
    env = pool.get(name)
    dump = env.dump_state(env.new_state(env.scenario(data.draw(st.sampled_from(env.scenario_names())))))
    template = env.state_model.load_bytes(to_json(dump))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    ids = [rid for v in dump.values() if isinstance(v, dict) for rid in v]
    calls = []
    for _ in range(data.draw(st.integers(1, 8))):
        tool = rng.choice(env.metadata.tools)
        calls.append((tool.name, {p: rng.choice([*ids, "x", 1, 2, 2.5, True]) for p in tool.parameters}))
    for traced in (True, False):
        shared = Session(env, template.fork_sharing_records(), traced=traced)
        fresh = Session(env, env.state_model.load_bytes(to_json(dump)), traced=traced)
        for tool_name, args in calls:
            a, b = shared.call(tool_name, args), fresh.call(tool_name, args)
            assert (a.ok, a.result, a.error) == (b.ok, b.result, b.error), (name, tool_name, args)
        assert shared.dump() == fresh.dump()
        assert template.dump() == dump, f"{name}: a call changed the template it was forked from"


class _Reading(Record):
    value: int | float = 0  # a union keeps the input's JSON type: 1 and 1.0 dump apart
    extra: Any = None
    count: int = 0  # an int field makes 1, 1.0 and true the same 1
    on: bool = False


class _Meter(State):
    readings: dict[str, _Reading] = {}
    level: int | float = 0


@pytest.mark.parametrize(
    ("field", "known", "goal"),
    [("value", 1, 1.0), ("value", 1.0, 1), ("extra", 1, True), ("extra", {"a": 1, "b": 2}, {"b": 2, "a": 1}),
     ("count", 1, 1.0), ("count", 1, True), ("on", True, 1), ("on", True, 1.0)],
)  # fmt: skip
def test_values_equal_under_python_but_not_as_json_dump_as_validating_whole(field: str, known: Any, goal: Any) -> None:
    parts = FieldWise.of(_Meter)
    assert parts is not None and parts.ordered == {"readings", "level"}
    base = _Meter.model_validate({"readings": {"R1": {field: known}}, "level": known if field == "value" else 0})
    dumped = base.dump()
    bent = {**dumped, "readings": {"R1": {**dumped["readings"]["R1"], field: goal}}}
    if field == "value":
        bent["level"] = goal
    want = _Meter.model_validate_json(to_json(bent)).dump()
    got = parts.dump(dumped, bent, "goal")
    assert got is not None and to_json(got) == to_json(want)
