"""π* on compiled environments whose records are filed under others (`/boards/{board}/lists/{list}/cards/{card}`),
or in a namespace no resource of the spec owns (Google Tasks' `/lists/{tasklist}/tasks/{task}`, whose task lists
live under `/users/@me/lists`: the compiler makes `tasklist` a scope every task record carries).

The property: every call π* makes names records that sit where its path says — each parent under the one before
it, the record acted on under the last parent and in the scopes the call names, a parent in those scopes too —
both as the health gate's writes_reachable solver runs it (ids from the state) and as synthesis runs it (ids found
by lookups); and the gate's solver reaches every write. The specs are random: depth, names, id parameters written
`{cardId}` or `{card}`, the top resource filed apart (a scope) or not.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envfactory.compiler.build import write_compiled
from envfactory.compiler.compile import compile_spec
from envfactory.compiler.scenarios import generate_scenarios
from envfactory.config import Settings
from envfactory.env.compiled import CompiledEnvironment, CompiledPlan, Operation
from envfactory.env.pool import EnvPool
from envfactory.records.episode import Episode
from envfactory.records.models import PlannedCall
from envfactory.tasks.offline import initial_states
from envfactory.tasks.pi_star import PiStarOutcome, PiStarSettings, solve_chain
from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain
from tests.chains import chain

ROOT = Path(__file__).resolve().parent.parent
NAME = "nested"
NOUNS = ["boards", "lists", "cards", "projects", "suites", "cases", "folders", "notes", "teams", "sprints"]
MISPLACED = ("filed elsewhere", "does not belong")  # the environment's words for a record named in the wrong place


def nested_spec(names: list[str], params: list[str], detached: bool) -> dict[str, Any]:
    """An OpenAPI document: each resource listed, created and read under the one before it; the innermost also
    updated and deleted. `detached`: the top resource's own paths are elsewhere (its id is a namespace below)."""

    def record(noun: str) -> dict[str, Any]:
        title = {"type": "string", "description": f"The title of the {noun}."}
        return {"type": "object", "properties": {"id": {"type": "string"}, "title": title}, "required": ["title"]}

    def ok(schema: dict[str, Any]) -> dict[str, Any]:
        return {"200": {"description": "ok", "content": {"application/json": {"schema": schema}}}}

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    paths: dict[str, Any] = {}
    prefix = ""
    for depth, (plural, param) in enumerate(zip(names, params, strict=True)):
        noun, one = plural[:-1], record(plural[:-1])
        base = f"/users/me/{plural}" if depth == 0 and detached else f"{prefix}/{plural}"
        paths[base] = {
            "get": {
                "operationId": f"list_{plural}",
                "summary": f"Lists the {plural}",
                "responses": ok({"type": "array", "items": one}),
            },
            "post": {
                "operationId": f"create_{noun}",
                "summary": f"Adds a {noun}",
                "requestBody": body(one),
                "responses": ok(one),
            },
        }
        item: dict[str, Any] = {
            "get": {"operationId": f"get_{noun}", "summary": f"Returns a {noun}", "responses": ok(one)}
        }
        if depth == len(names) - 1:
            item["patch"] = {
                "operationId": f"rename_{noun}",
                "summary": f"Renames a {noun}",
                "requestBody": body(one),
                "responses": ok(one),
            }
            item["delete"] = {
                "operationId": f"delete_{noun}",
                "summary": f"Deletes a {noun}",
                "responses": {"204": {"description": "gone"}},
            }
        paths[f"{base}/{{{param}}}"] = item
        prefix = f"/{plural}/{{{param}}}" if depth == 0 and detached else f"{base}/{{{param}}}"
    return {"openapi": "3.0.0", "info": {"title": "Nested", "version": "1"}, "paths": paths}


class Shape(NamedTuple):
    """A nested spec's shape, drawn (a failing example prints as this, not as the whole plan)."""

    names: list[str]
    params: list[str]
    detached: bool

    def plan(self) -> CompiledPlan:
        spec = nested_spec(self.names, self.params, self.detached)
        plan, _ = compile_spec(spec, name=NAME, domain="utilities", source="test")
        return plan


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    depth = draw(st.integers(2, 3))
    names = draw(st.lists(st.sampled_from(NOUNS), min_size=depth, max_size=depth, unique=True))
    params = [n[:-1] + ("Id" if draw(st.booleans()) else "") for n in names]
    return Shape(names, params, draw(st.booleans()))


def misplaced(env: CompiledEnvironment, op: Operation, args: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """What the call's arguments name that does not sit where its path says (empty: all in place). Read from the
    plan, apart from π*'s own check: each parent exists under the one before it and in the call's scopes, the
    record acted on (unless made by the call) under the last parent and in the call's scopes."""
    out: list[str] = []

    def check(arg: str, resource: str, before: tuple[str, str] | None) -> None:
        record = state.get(resource, {}).get(str(args[arg]))
        if record is None:
            out.append(f"{arg}={args[arg]!r}: no such {resource}")
            return
        r = env.resources[resource]
        under = before is not None and r.parent == before[1] and r.parent_field is not None
        if under and before is not None and str(record.get(r.parent_field)) != str(args[before[0]]):
            out.append(f"{arg}={args[arg]!r} is under {record.get(r.parent_field)!r}, not {args[before[0]]!r}")
        for scope_arg, field in op.scopes:
            if field in record and str(record[field]) != str(args.get(scope_arg)):
                out.append(f"{arg}={args[arg]!r} is in {field} {record[field]!r}, not {args.get(scope_arg)!r}")

    before: tuple[str, str] | None = None
    for arg, resource in op.parents:
        check(arg, resource, before)
        before = (arg, resource)
    if op.id_param is not None and op.semantics not in ("create", "upsert"):
        check(op.id_param, op.resource, before)
    return out


def several_path_ids(plan: CompiledPlan) -> list[Operation]:
    """Operations whose path names more than one record or namespace (a parent and the record, a scope...)."""
    return [o for o in plan.operations if len(o.parents) + len(o.scopes) + (o.id_param is not None) >= 2]


def assert_in_place(pool: EnvPool, initial: dict[str, Any], planned: list[PlannedCall]) -> None:
    """Replays π*'s calls: before each, every record it names sits where its path says."""
    env = pool.get(NAME)
    assert isinstance(env, CompiledEnvironment)
    episode = Episode(pool, {NAME: initial}, [NAME])
    for p in planned:
        op = env.tools[p.call.name].op
        state = episode.session(NAME).dump()
        assert misplaced(env, op, p.call.arguments, state) == [], (p.call.name, p.call.arguments, p.bindings)
        assert episode.call(NAME, p.call.name, p.call.arguments).ok


def assert_no_misplaced_failure(outcome: PiStarOutcome) -> None:
    assert not any(m in (outcome.failure or "") for m in MISPLACED), outcome.failure


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(), st.integers(0, 10**6))
@example(Shape(["tasklists", "tasks"], ["tasklist", "task"], detached=True), 0)  # Google Tasks' shape
@example(Shape(["boards", "lists", "cards"], ["boardId", "list", "card"], detached=True), 0)  # a scope 3 deep
def test_every_id_pi_star_binds_sits_under_the_parents_bound_with_it(shape: Shape, seed: int) -> None:
    plan = shape.plan()
    ops = several_path_ids(plan)
    assert ops  # every drawn spec files a record under another, or in a namespace
    with tempfile.TemporaryDirectory() as folder:
        scenarios = generate_scenarios(plan)
        write_compiled(Path(folder) / "compiled" / NAME, plan, scenarios)
        config = Settings(root=ROOT, envs_dir=Path(folder) / "envs", compiled_dir=Path(folder) / "compiled", bfcl=False)
        pool = EnvPool(config)
        gate = PiStarSettings(ids_from_state=True, target_plans=4)
        for op in ops:
            qualified = f"{NAME}.{op.spec.name}"
            # as the health gate runs it: the tool alone, every input the user's, ids from the state
            inputs = [
                InputSource(parameter=p, required=p in op.spec.required, source="user") for p in op.spec.parameters
            ]
            alone = ToolChain(
                tools=[qualified], servers=[NAME], turns=[[qualified]], seed=seed, target_length=1,
                steps=[ChainStep(tool=qualified, inputs=inputs)],
            )  # fmt: skip
            reached = False
            for state in scenarios.values():
                outcome = solve_chain(pool, alone, {NAME: state}, seed=seed, settings=gate)
                assert_no_misplaced_failure(outcome)
                if outcome.ok:
                    assert_in_place(pool, state, outcome.planned)
                    reached = True
            assert reached or op.spec.kind != "write", f"{op.spec.name} never succeeded from a shipped scenario"
            # as synthesis runs it: ids found by lookups (list the parents, then their records)
            initial, core = initial_states(pool, [NAME], seed, 2)
            outcome = solve_chain(pool, chain([(qualified, [])]), initial, core, seed=seed)
            assert_no_misplaced_failure(outcome)
            if outcome.ok:
                assert_in_place(pool, initial[NAME], outcome.planned)
