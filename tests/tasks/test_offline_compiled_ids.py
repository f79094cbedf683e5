"""Ids in conversations over compiled environments: found by lookups through the parents a record is filed
under, or, where no tool of the environment finds a record, said by its owner; requests worded from the spec.

A small library API (written here as an OpenAPI document, compiled like any spec): branches with loans filed
under them (list branches, then a branch's loans, then one loan), support tickets reachable only by their id
(get and withdraw: a user knows their own ticket's number), and racks filed in a workspace that has no
operations of its own (a scope, like an Azure resource group).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.compiler.build import write_compiled
from envfactory.compiler.compile import compile_spec
from envfactory.compiler.scenarios import generate_scenarios
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.records.models import Conversation
from envfactory.records.verifier import answer_forms
from envfactory.tasks.conversation import imperative, noun_phrase, record_noun
from envfactory.tasks.offline import initial_states, synthesize_offline
from envfactory.tasks.pi_star import solve_chain
from envfactory.tasks.quality import measure
from envfactory.tasks.values import pattern_value
from tests.support.chains import chain
from tests.support.paths import ROOT
from tests.tasks.test_offline import check_conversation


def _library() -> dict[str, Any]:
    branch = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "name": {"type": "string", "description": "The name of the branch."},
            "city": {"type": "string"},
        },
        "required": ["name"],
    }
    loan = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "title": {"type": "string", "description": "The title of the borrowed book."},
            "dueDate": {"type": "string", "format": "date", "description": "The date the book is due back."},
            "status": {"type": "string", "enum": ["open", "returned", "lost"]},
        },
        "required": ["title"],
    }
    ticket = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "subject": {"type": "string"},
            "status": {"type": "string", "enum": ["open", "closed"]},
        },
    }

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def ok(schema: dict[str, Any]) -> dict[str, Any]:
        return {"200": {"description": "ok", "content": {"application/json": {"schema": schema}}}}

    def op(op_id: str, summary: str, **more: Any) -> dict[str, Any]:
        return {"operationId": op_id, "summary": summary, **more}

    rack = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "label": {"type": "string"},
            "floor": {"type": "integer", "minimum": 0, "maximum": 5},
        },
        "required": ["label"],
    }
    gone = {"204": {"description": "gone"}}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Library", "version": "1"},
        "paths": {
            "/branches": {
                "get": op("listBranches", "Lists the branches", responses=ok({"type": "array", "items": branch})),
                "post": op("createBranch", "Opens a branch", requestBody=body(branch), responses=ok(branch)),
            },
            "/branches/{branchId}": {"get": op("getBranch", "Returns a branch", responses=ok(branch))},
            "/branches/{branchId}/loans": {
                "get": op("listLoans", "Lists the loans of a branch", responses=ok({"type": "array", "items": loan})),
                "post": op("createLoan", "Lends a book", requestBody=body(loan), responses=ok(loan)),
            },
            "/branches/{branchId}/loans/{loanId}": {
                "get": op("getLoan", "How long is the loan still running?", responses=ok(loan)),
                "delete": op("deleteLoan", "Deletes a loan", responses=gone),
            },
            "/workspaces/{workspaceName}/racks": {
                "get": op("listRacks", "Lists the racks", responses=ok({"type": "array", "items": rack})),
                "post": op("createRack", "Adds a rack", requestBody=body(rack), responses=ok(rack)),
            },
            "/workspaces/{workspaceName}/racks/{rackId}": {
                "get": op("getRack", "Returns a rack", responses=ok(rack)),
                "patch": op("updateRack", "Moves a rack", requestBody=body(rack), responses=ok(rack)),
            },
            "/tickets/{ticketId}": {
                "get": op("getTicket", "Returns a support ticket", responses=ok(ticket)),
                "delete": op("deleteTicket", "Withdraws a support ticket", responses=gone),
            },
        },
    }


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> EnvPool:
    plan, _ = compile_spec(_library(), name="library", domain="utilities", source="test")
    compiled = tmp_path_factory.mktemp("compiled")
    write_compiled(compiled / "library", plan, generate_scenarios(plan))
    settings_ = Settings(root=ROOT, envs_dir=tmp_path_factory.mktemp("envs"), compiled_dir=compiled, bfcl=False)
    return EnvPool(settings_)


def _synth(pool: EnvPool, tools: list[str], seed: int) -> Conversation:
    unit = chain([(f"library.{t}", []) for t in tools], turns=[1] * len(tools))
    out = synthesize_offline(pool, unit, key=f"k{seed}", seed=seed, depth=2, prompts_dir=ROOT / "prompts")
    assert out.conversation is not None, out.dropped
    check_conversation(pool, out.conversation)
    return out.conversation


def test_a_record_no_tool_finds_is_the_users_own_and_they_say_its_id(pool: EnvPool) -> None:
    conv = _synth(pool, ["get_ticket", "delete_ticket"], seed=3)
    said = [b for p in conv.task.solver for b in p.bindings if b.parameter == "ticket_id"]
    assert said and said[0].source == "state"  # no list of tickets: the owner names theirs
    ticket = str(said[0].value)
    assert ticket in conv.nodes[0].initial_scenario["library"]["tickets"]
    assert ticket in conv.nodes[0].query  # ... in the request that needs it
    figures = measure([conv])
    assert figures.incoherent_id_arguments == 0  # an id the user said is no incoherent argument
    assert figures.requests_with_internal_id == 0 and figures.requests_with_own_id > 0


def test_a_record_filed_under_another_is_found_by_listing_its_parent_first(pool: EnvPool) -> None:
    conv = _synth(pool, ["get_loan"], seed=5)
    calls = [p.call for p in conv.task.solver]
    assert [c.name for c in calls] == ["list_branches", "list_loans", "get_loan"]
    assert all(b.source == "output" for p in conv.task.solver for b in p.bindings if b.parameter.endswith("_id"))
    state = conv.nodes[0].initial_scenario["library"]
    loan, branch = calls[2].arguments["loan_id"], calls[2].arguments["branch_id"]
    assert state["loans"][loan]["branch_id"] == branch == calls[1].arguments["branch_id"]
    assert loan not in conv.nodes[0].query and branch not in conv.nodes[0].query  # found, not said
    assert measure([conv]).incoherent_id_arguments == 0


def test_a_record_in_a_namespace_is_named_in_its_own(pool: EnvPool) -> None:
    conv = _synth(pool, ["get_rack", "update_rack", "get_rack"], seed=11)
    state = conv.nodes[0].initial_scenario["library"]
    calls = [p.call for p in conv.task.solver]
    for call in calls:
        if "rack_id" in call.arguments and call.arguments["rack_id"] in state["racks"]:
            assert call.arguments["workspace_name"] == state["racks"][call.arguments["rack_id"]]["workspace_name"]
    workspace = calls[0].arguments["workspace_name"]
    assert workspace in conv.nodes[0].query  # said where the user first needs it; later turns may leave it out
    assert measure([conv]).incoherent_id_arguments == 0


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6))
def test_every_id_names_a_record_filed_where_the_call_says(pool: EnvPool, seed: int) -> None:
    unit = chain([("library.get_loan", []), ("library.delete_loan", []), ("library.get_ticket", [])], turns=[1, 1, 1])
    initial, core = initial_states(pool, unit.servers, seed, 2)
    outcome = solve_chain(pool, unit, initial, core, seed=seed)
    assert outcome.ok, outcome.failure
    seen: set[str] = set()
    state = initial["library"]
    for planned, result in zip(outcome.planned, outcome.results, strict=True):
        args = planned.call.arguments
        if "loan_id" in args:  # the loan exists and is the branch's
            assert state["loans"][args["loan_id"]]["branch_id"] == args["branch_id"]
        for b in planned.bindings:
            if b.parameter.endswith("_id"):
                # from an earlier result, or (a ticket: no tool lists them) the user's own, from the state
                assert str(b.value) in seen if b.source == "output" else b.parameter == "ticket_id"
        seen |= {str(v) for v in _scalars(result.result)}


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [value]


def test_requests_are_worded_from_the_spec(pool: EnvPool) -> None:
    requests = [n.query for seed in range(6) for n in _synth(pool, ["create_loan"], seed=seed).nodes]
    assert not any("{" in r or "}" in r for r in requests)
    # the parameters' own descriptions name the values in some requests ("the title of the borrowed book")
    assert any("title of the borrowed book" in r or "date the book is due back" in r for r in requests)


@pytest.mark.parametrize(
    ("description", "wanted"),
    [
        ("How old is the person in the image?", "find out how old is the person in the image"),
        ("Cancels the support plan of type {type}", "cancel the support plan of type type"),
        ("Is the name available?", None),
    ],
)
def test_a_question_or_a_templated_summary_becomes_a_request(description: str, wanted: str | None) -> None:
    assert imperative(description, "") == wanted


@pytest.mark.parametrize(
    ("description", "wanted"),
    [
        ("The email address of the user.", "email address of the user"),
        ("The ARN of the detector to update.", "ARN of the detector to update"),
        ("the workspace's id", None),  # an id the compiler described
        ("Whether the flag is set.", None),  # a sentence, no name for a value
        ("Specifies the maximum number of results to return in each page of the listing.", None),
    ],
)
def test_a_parameter_description_names_its_value(description: str, wanted: str | None) -> None:
    assert noun_phrase(description) == wanted


def test_a_resource_named_after_an_action_is_called_by_its_noun() -> None:
    assert [record_noun(x) for x in ("delete site", "list pipelines", "deregister application", "order")] == [
        "site",
        "pipelines",
        "application",
        "order",
    ]


def test_a_date_stated_as_users_write_it_verifies() -> None:
    forms = answer_forms("2026-01-09T18:00:00Z")
    assert "January 9, 2026 at 6 pm" in forms and "2026-01-09T18:00:00Z" in forms


_PATTERNS = [r"[^:]*:[^:]*:analyzer/.{1,255}", r"^arn:aws:[a-z-]+:\d{12}:key/[^\s]+$", r"[\S\s]*x", r"^[^a-z]+\W$"]


def test_pattern_values_match_and_read_as_typed() -> None:
    import random

    for pattern in _PATTERNS:
        for seed in range(20):
            value = pattern_value(random.Random(seed), pattern)
            assert value is not None and len(value) < 120
            assert all(c.isalnum() or c in "-_:/. " for c in value), value


@pytest.mark.timeout(60)
def test_a_pattern_value_is_made_in_bounded_time_and_size_or_not_at_all() -> None:
    """An environment's patterns reach the value maker unfiltered (EnvGen metadata; the compiler's filter may miss
    one): `(a|a){40}$x` backtracked 2^40 steps when a made value was checked, `x{30000000}` made 30 MB values."""
    import random

    assert pattern_value(random.Random(0), "^(a|a){40}$x") is None  # cannot be told in time: no value fits
    assert pattern_value(random.Random(0), "^x{30000000}$") is None  # longer than any value we keep
    assert pattern_value(random.Random(0), "^x{300}$") == "x" * 300
    for seed in range(5):  # nested repeats the shortest match does not bound: what is kept stays within the limit
        made = pattern_value(random.Random(seed), "((?:x{9999})y){0,1000}")
        assert made is None or len(made) <= 10_000


def test_pattern_values_are_the_same_in_every_process() -> None:
    """rstr draws a negated class from a set (its order is salted per process): ours does not."""
    script = (
        "import random; from envfactory.tasks.values import pattern_value; "
        f"print([pattern_value(random.Random(s), p) for p in {_PATTERNS!r} for s in range(5)])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(h), "PYTHONPATH": str(ROOT)},
        ).stdout
        for h in (1, 2, 3)
    }
    assert len(outs) == 1
