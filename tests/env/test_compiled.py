"""A compiled plan read from a folder (`env.compiled.load_plan`): a `compiled.json` edited by hand — a field of a
tool or a resource changed, a required argument made optional — is refused when it loads, with the problem named,
or every call runs without failing inside the interpreter (its schema checks' calls, and every tool called with
arguments of their types)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.compiler.scenarios import generate_scenarios
from envfactory.env.compiled import CompiledEnvironment, interpreter_problems, load_plan
from envfactory.envgen.checks import schema_checks
from envfactory.errors import EnvLoadError
from envfactory.tasks.compiled_state import ScenarioGenerationError
from tests.graphs.test_envgen_draft import _FIELDS, _ODD, _PLAN, _RFIELDS

_DATA = _PLAN.model_dump(mode="json")
_RESOURCES = [r["name"] for r in _DATA["resources"]]
_RECORD_FIELDS = sorted({f for r in _DATA["resources"] for f in r["record_schema"]["properties"]})


# a field's or an argument's schema as a person might leave it: fine, a typo, a value of the wrong type, elsewhere
_SCHEMAS: list[Any] = [
    True,
    "string",
    {"type": "integer"},
    {"type": "string", "maxLength": 5},
    {"type": "strin"},
    {"type": "string", "minLength": "x"},
    {"type": "number", "minimum": "0"},
    {"type": "string", "required": [{}]},
    {"$ref": "https://example.com/schemas/task"},
    {"$ref": "#/$defs/missing"},
]
_LONG = 10**5000  # past Python's 4,300 digits a str() refuses


@st.composite
def edited(draw: st.DrawFn) -> dict[str, Any]:
    """The draft plan with one to three edits a person might make: a tool's field pointed at another of its
    arguments, at another resource or record field, or at something odd; a resource's field likewise; a required
    argument made optional."""
    data = copy.deepcopy(_DATA)
    ops, res = data["operations"], data["resources"]
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["tool", "tool", "resource", "record", "argument", "optional"]))
        if what == "tool":
            op = ops[draw(st.integers(0, len(ops) - 1))]
            arg = st.sampled_from(sorted(op["spec"]["input_schema"].get("properties", {})) or ["x"])
            field = draw(st.sampled_from(_FIELDS))
            plausible = {
                "resource": st.sampled_from(_RESOURCES),
                "semantics": st.sampled_from(["read", "list", "create", "update", "upsert", "delete", "transition"]),
                "id_param": arg,
                "limit_param": arg,
                "parents": st.lists(st.tuples(arg, st.sampled_from(_RESOURCES)).map(list), max_size=2),
                "scopes": st.lists(st.tuples(arg, st.sampled_from(_RECORD_FIELDS)).map(list), max_size=2),
                "fields": st.dictionaries(arg, st.sampled_from(_RECORD_FIELDS), max_size=3),
                "status_field": st.sampled_from(_RECORD_FIELDS),
                "target": st.sampled_from(["completed", "needsAction", "archived"]),
            }[field]
            op[field] = draw(plausible | st.sampled_from(_ODD))
        elif what == "resource":
            r = res[draw(st.integers(0, len(res) - 1))]
            field = draw(st.sampled_from(_RFIELDS))
            plausible = {
                "parent": st.sampled_from([*_RESOURCES, None]),
                "parent_field": st.sampled_from(_RECORD_FIELDS),
                "scope_fields": st.lists(st.sampled_from(_RECORD_FIELDS), max_size=2),
                "id_field": st.sampled_from(_RECORD_FIELDS),
                "id_type": st.sampled_from(["string", "integer"]),
                "id_prefix": st.sampled_from(["TAS", "LIS", "TK2", "bad prefix"]),
                "name": st.sampled_from([*_RESOURCES, "tasks2", "9tasks"]),
            }[field]
            r[field] = draw(plausible | st.sampled_from(_ODD))
        elif what == "record":  # a record field's schema replaced, the id's or the status's among them
            props = res[draw(st.integers(0, len(res) - 1))]["record_schema"]["properties"]
            props[draw(st.sampled_from(sorted(props)))] = draw(st.sampled_from(_SCHEMAS))
        elif what == "argument":  # an argument's schema replaced: a typo, a value of the wrong type, a reference
            props = ops[draw(st.integers(0, len(ops) - 1))]["spec"]["input_schema"].get("properties", {})
            if props:
                props[draw(st.sampled_from(sorted(props)))] = draw(st.sampled_from(_SCHEMAS))
        else:
            schema = ops[draw(st.integers(0, len(ops) - 1))]["spec"]["input_schema"]
            required = schema.get("required", [])
            if required:
                required.remove(draw(st.sampled_from(required)))
    return data


def _value(draw: st.DrawFn, schema: dict[str, Any], ids: list[str]) -> Any:
    """A value of the argument's type: an id of the state, a number, an odd string..."""
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
    if kind == "integer":
        return draw(st.sampled_from([0, 1, 3, -2, 10**6, _LONG, 2.0]))  # (2.0: an integer to JSON Schema)
    if kind == "number":
        return draw(st.sampled_from([0.5, 2.0, -1.0]))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "array":
        return []
    if kind == "object":
        return {}
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return draw(st.sampled_from(enum))
    return draw(st.sampled_from([*ids[:5], "abc", "", "7", "Rex\ud800"]))  # (a lone surrogate, as the server keeps)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited(), st.data())
def test_an_edited_plan_is_refused_when_it_loads_or_runs_every_call(data: dict[str, Any], calls: st.DataObject) -> None:
    try:
        plan = load_plan(data, "compiled.json")
    except EnvLoadError as e:
        assert str(e).startswith("compiled.json: ") and len(str(e).splitlines()) == 1
        return
    env = CompiledEnvironment(plan)
    try:
        state = generate_scenarios(plan)["default"]
    except ScenarioGenerationError:
        return  # the gate refuses it: no initial state
    steps = [(s.tool, s.args) for scenario in schema_checks(env.metadata, state) for s in scenario.steps]
    ids = sorted({str(k) for name in _RESOURCES for k in (state.get(name) or {})})
    for spec in env.metadata.tools:  # and every tool with arguments of their types, optional ones or not
        props = spec.parameters
        chosen = calls.draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        args = {p: _value(calls.draw, props[p], ids) for p in dict.fromkeys([*spec.required, *chosen])}
        steps.append((spec.name, args))
    session = env.session(state)
    for tool, args in steps:
        record = session.call(tool, args)
        assert record.error is None or record.error.type != "internal_error", (tool, args, record.error)
    env.new_state(env.dump_state(session.state), "its dump")  # what the calls left loads back: fork(dump(s))


def test_what_the_interpreter_needs_is_named_when_the_plan_loads() -> None:
    assert interpreter_problems(_PLAN) == [] and load_plan(copy.deepcopy(_DATA), "x") == _PLAN
    data = copy.deepcopy(_DATA)
    listing = next(o for o in data["operations"] if o["spec"]["name"] == "tasks_tasks_list")
    listing["limit_param"] = "tasklist"  # a string argument read as the page size
    data["resources"][0]["id_prefix"] = "bad prefix"
    with pytest.raises(EnvLoadError) as e:
        load_plan(data, "envs/tasks/compiled.json")
    assert str(e.value).startswith("envs/tasks/compiled.json: the plan cannot be interpreted: resource '")
    assert "must be 1-10 capital letters or digits, a letter first (and 1 more)" in str(e.value)
    data["resources"][0]["id_prefix"] = _DATA["resources"][0]["id_prefix"]
    odd = copy.deepcopy(_DATA)  # a schema that is not an object where the id's is read: named, not a crash
    first = odd["resources"][0]
    first["record_schema"]["properties"][first["id_field"]] = True
    with pytest.raises(EnvLoadError) as e:
        load_plan(odd, "compiled.json")
    assert f"resource '{first['name']}': the schema of its field '{first['id_field']}' must be a JSON object" in str(
        e.value
    )
    with pytest.raises(EnvLoadError, match="tool 'tasks_tasks_list': the paging argument 'tasklist' must be of type"):
        load_plan(data, "compiled.json")


def test_a_schema_records_or_arguments_cannot_be_checked_with_is_named_when_the_plan_loads() -> None:
    first = _DATA["resources"][0]
    field = next(f for f in first["record_schema"]["properties"] if f != first["id_field"])
    for bad, said in [
        ({"type": "strin"}, "'strin' is not valid under any of the given schemas"),
        ({"type": "string", "minLength": "x"}, "'x' is not of type 'integer'"),
        ({"$ref": "https://example.com/schemas/task"}, "references are not supported"),
    ]:
        data = copy.deepcopy(_DATA)
        data["resources"][0]["record_schema"]["properties"][field] = bad
        with pytest.raises(EnvLoadError, match=f"resource '{first['name']}': record_schema is not a JSON Schema"):
            load_plan(data, "compiled.json")
        with pytest.raises(EnvLoadError) as refused:
            load_plan(data, "compiled.json")
        assert said in str(refused.value)
    data = copy.deepcopy(_DATA)
    op = next(o for o in data["operations"] if o["spec"]["input_schema"].get("properties"))
    arg = sorted(op["spec"]["input_schema"]["properties"])[0]
    op["spec"]["input_schema"]["properties"][arg] = {"type": "string", "maxLength": "9"}
    with pytest.raises(EnvLoadError, match=f"tool '{op['spec']['name']}': its input_schema is not a JSON Schema"):
        load_plan(data, "compiled.json")
    data = copy.deepcopy(_DATA)  # a schema that validates any value without raising loads
    data["resources"][0]["record_schema"]["properties"][field] = {"type": ["string", "null"], "x-note": "kept"}
    assert load_plan(data, "compiled.json").resources[0].record_schema["properties"][field]["x-note"] == "kept"


def test_an_update_may_not_rewrite_where_its_record_is_filed() -> None:
    data = copy.deepcopy(_DATA)
    update = next(o for o in data["operations"] if o["semantics"] in ("update", "upsert"))
    r = next(r for r in data["resources"] if r["name"] == update["resource"])
    arg = next(a for a in update["spec"]["input_schema"]["properties"] if a != update["id_param"])
    update["fields"][arg] = r["id_field"]
    with pytest.raises(EnvLoadError, match=f"fields maps '{arg}' to '{r['id_field']}', the field that files"):
        load_plan(data, "compiled.json")
    data = copy.deepcopy(_DATA)
    transition = next(o for o in data["operations"] if o["semantics"] == "update")  # made a transition...
    r = next(r for r in data["resources"] if r["name"] == transition["resource"])
    transition.update(semantics="transition", fields={}, status_field=r["id_field"], target="X")  # ...of the id
    with pytest.raises(EnvLoadError, match=r"a transition's status_field .* is the field that files"):
        load_plan(data, "compiled.json")
    data = copy.deepcopy(_DATA)
    data["resources"][0]["scope_fields"] = [data["resources"][0]["id_field"]]
    with pytest.raises(EnvLoadError, match=r"its id field '.*' cannot be a scope field"):
        load_plan(data, "compiled.json")
    data = copy.deepcopy(_DATA)
    child, parent = data["resources"][-1], data["resources"][0]
    child["parent"], child["parent_field"] = parent["name"], child["id_field"]
    with pytest.raises(EnvLoadError, match=r"its parent_field .* is its id field or a scope field too"):
        load_plan(data, "compiled.json")


def test_arguments_no_state_can_hold_are_invalid_arguments_not_internal_errors() -> None:
    env = CompiledEnvironment(_PLAN)
    state = generate_scenarios(_PLAN)["default"]
    for spec in env.metadata.tools:
        texts = [p for p, schema in spec.parameters.items() if schema.get("type") == "string" and "enum" not in schema]
        numbers = [p for p, schema in spec.parameters.items() if schema.get("type") == "integer"]
        for arg, value in [*((p, "Rex\ud800") for p in texts), *((p, _LONG) for p in numbers)]:
            args = {p: "x" for p in spec.required if spec.parameters[p].get("type") == "string"}
            args[arg] = value
            record = env.session(state).call(spec.name, args)
            assert record.error is not None and record.error.type == "invalid_arguments", (spec.name, arg, record.error)


def test_an_integer_id_written_as_a_float_names_the_same_record() -> None:
    from envfactory.compiler.compile import compile_spec
    from tests.compiler.test_compile import _spec

    plan, _ = compile_spec(_spec(), name="shop", domain="commerce", source="t")
    env = CompiledEnvironment(plan)
    state = generate_scenarios(plan)["default"]
    reads = [
        (o, r)
        for o in plan.operations
        for r in plan.resources
        if o.semantics == "read" and o.resource == r.name and r.id_type == "integer" and state[r.name]
    ]
    assert reads, "the shop spec has a resource with integer ids"
    for op, r in reads:
        key = int(next(iter(state[r.name])))
        args = {a: (key if a == op.id_param else next(iter(state[p]))) for a, p in [(op.id_param, r.name), *op.parents]}
        found = env.session(state).call(op.spec.name, args)
        assert found.ok, found.error
        as_float = env.session(state).call(op.spec.name, {**args, op.id_param: float(key)})  # JSON Schema: an integer
        assert as_float.ok and as_float.result == found.result, as_float.error
        floated = copy.deepcopy(state)  # a record that holds its id as 7.0 (an upsert's, a hand-written state's)
        floated[r.name][str(key)][r.id_field] = float(key)
        assert env.session(env.new_state(floated)).call(op.spec.name, args).ok
