"""The QueryGen graph end to end: a scripted model for every LLM node, the real hotels environment,
a real SQLite checkpointer on disk.

Solver branches of one turn pull from one scripted list ("solver/solve"). Where the test needs a
given branch to get given answers, the run uses `max_concurrency=1`: LangGraph then runs the Send
branches one after another in branch order, so branch 0 consumes its answers first. The test of a
turn no branch solves runs its branches concurrently: every interleaving of its answers fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from envfactory.env.pool import EnvPool
from envfactory.llm.scripted import ScriptExhaustedError, reset_scripted_models
from envfactory.querygen.records import PRESETS, QueryGenError, preset_config
from envfactory.querygen.select import filter_branch
from envfactory.records.episode import replay
from envfactory.records.models import Conversation, StateVerifier
from envfactory.records.verifier import state_differences, verify
from envfactory_agents.common import reset_model_cache
from graphs.querygen import QueryGenContext, build, run_querygen
from tests.support.querygen import (
    CORE,
    LLM_STATE,
    PREPARE,
    SEED,
    Plan,
    bad_state,
    base_script,
    call,
    hotels_chain,
    model_calls,
    pi_star,
    prepare_answer,
    run,
    schema_answer,
    setup,
    sqlite_saver,
    state_of,
    text_of,
    turn1_ok,
    turn2_ok,
)
from tests.support.studio import langgraph_dev


@pytest.fixture
def plan(pool: EnvPool) -> Plan:
    return pi_star(pool)


def _roles(node: Any) -> list[str]:
    return [s.role for s in node.steps]


def _kept(outcome: Any) -> Conversation:
    assert outcome.status == "kept", outcome.failure
    assert outcome.kept is not None
    return outcome.kept


# ---- the whole graph --------------------------------------------------------------------------------


def test_two_turn_chain_becomes_a_verified_conversation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    pool = setup(tmp_path, monkeypatch, base_script(plan))
    db = tmp_path / "checkpoints.sqlite"
    conv = _kept(run(pool, db))
    assert db.is_file() and db.stat().st_size > 0

    first, second = conv.nodes
    # the turns' raw calls are π*'s, with their bound values
    assert [(c.name, c.arguments) for c in first.raw_tool_call] == [
        ("search_hotels", plan.search),
        ("book_room", plan.book),
    ]
    assert [(c.name, c.arguments) for c in second.raw_tool_call] == [("cancel_booking", {"booking_id": "BK-0002"})]
    # steps: the user's (refined) query, the calls with their real results, the answer
    assert _roles(first) == ["user", "tool_call", "tool_result", "tool_call", "tool_result", "assistant"]
    assert first.steps[0].content == first.query and first.refined and first.generator == "llm"
    booked = first.steps[4].results()[0]
    assert booked.ok and booked.result["id"] == "BK-0002" and booked.result["hotel_id"] == "HT-LIS-01"
    assert _roles(second) == ["user", "tool_call", "tool_result", "assistant"]
    # states: Db⁰ is the model's state, loaded; turn 2 starts where turn 1 ended
    loaded = pool.get("hotels").dump_state(pool.get("hotels").new_state(LLM_STATE))
    assert first.initial_scenario == {"hotels": loaded} == conv.task.initial_state
    assert first.final_scenario["hotels"]["bookings"]["BK-0002"]["status"] == "confirmed"
    assert second.initial_scenario == first.final_scenario
    assert second.final_scenario["hotels"]["bookings"]["BK-0002"]["status"] == "cancelled"
    assert first.mcp_servers == second.mcp_servers == ["hotels"]
    # the task: v accepts the final state, not Db⁰; π*'s own plan replays to a state it accepts too
    task = conv.task
    assert verify(task.verifier, task.initial_state, second.final_scenario).ok
    assert not verify(task.verifier, task.initial_state, task.initial_state).ok
    executed = replay(pool, [p.call for p in task.solver], task.initial_state)
    assert verify(task.verifier, task.initial_state, executed.final).ok
    assert task.instruction == f"{first.query}\n{second.query}"
    assert conv.provenance.generator == "llm" and conv.provenance.preset == "SFT_NON_CONV"
    assert conv.provenance.chain_seed == 7 and set(conv.provenance.models) == {"query", "solver", "user"}
    assert conv.profile["name"] == "Ana Costa" and conv.profile["scenario"]
    # the generate prompt was given the turn's calls with their bound values, and the history
    gen1, gen2 = (text_of(c) for c in model_calls("querygen/generate"))
    assert plan.book["guest_name"] in gen1 and plan.book["check_in"] in gen1 and "first turn" in gen1
    assert "cancel_booking" in gen2 and first.query in gen2
    # the solver saw the environment's tools (bound) and, in turn 2, turn 1's messages
    solver_calls = model_calls("solver/solve")
    assert {"search_hotels", "book_room", "cancel_booking"} <= set(solver_calls[0].tools)
    assert first.query in text_of(solver_calls[-1]) and "BK-0002" in text_of(solver_calls[-1])
    # the checkpoint on disk holds the finished run
    values, nxt = state_of(db)
    assert nxt == () and values["status"] == "kept"
    assert Conversation.model_validate(values["conversation"]) == conv


def test_refine_on_keeps_the_original_and_refine_off_never_calls_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    pool = setup(tmp_path, monkeypatch, base_script(plan))
    db = tmp_path / "on.sqlite"
    conv = _kept(run(pool, db, preset="SFT_NON_CONV"))
    assert len(model_calls("querygen/refine")) == 2
    assert all(n.refined for n in conv.nodes)
    assert conv.nodes[1].query == "Ugh, plans changed - scrap that reservation please."
    drafts = state_of(db)[0]["drafts"]
    assert drafts[1]["original_query"] == "My meeting was cancelled, please cancel that booking."
    assert conv.nodes[1].original_query == drafts[1]["original_query"]  # kept in the record too
    assert drafts[1]["transformations"] == ["implicit_reference"]

    script = base_script(plan)
    del script["querygen/refine"]  # a call to it would exhaust the script
    pool = setup(tmp_path / "off", monkeypatch, script)
    conv = _kept(run(pool, tmp_path / "off.sqlite", preset="RL_NON_CONV"))
    assert model_calls("querygen/refine") == []
    assert not any(n.refined for n in conv.nodes)
    assert conv.nodes[1].query == "My meeting was cancelled, please cancel that booking."
    assert conv.provenance.preset == "RL_NON_CONV"


def test_pass_at_k_selects_the_branch_that_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    wrong = [call("search_hotels", plan.search), call("book_room", plan.wrong_book), "Booked Alfama Lodge."]
    script = base_script(plan, {"solver/solve": [*wrong, *turn1_ok(plan), *turn2_ok(plan), *turn2_ok(plan)]})
    pool = setup(tmp_path, monkeypatch, script)
    db = tmp_path / "cp.sqlite"
    conv = _kept(run(pool, db, pass_k=2))
    values, _ = state_of(db)
    turn1, turn2 = values["selection"]
    bad, good = turn1["reports"]
    assert turn1["selected"] == 1 and not bad["verified"] and good["verified"]
    assert any("bookings" in r for r in bad["reasons"])
    assert good["matched"] == 2 and bad["matched"] == 1
    assert turn2["selected"] == 0  # both verify and match fully: the lowest branch wins the tie
    booked = conv.nodes[0].steps[4].results()[0].result
    assert booked["hotel_id"] == "HT-LIS-01"
    assert len([b for b in values["branches"] if b["turn"] == 0]) == 2
    # each branch acted in its own episode: the wrong branch's booking is in its state only
    finals = {b["branch"]: b["final"]["hotels"]["bookings"]["BK-0002"]["hotel_id"] for b in values["branches"][:2]}
    assert finals == {0: "HT-LIS-02", 1: "HT-LIS-01"}


def test_no_branch_verifies_is_dropped_with_every_branch_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    # two concurrent branches share these answers in any order; no interleaving books the right hotel
    answers = [call("search_hotels", plan.search)] * 2 + [call("book_room", plan.wrong_book)] * 2 + ["Done."] * 2
    pool = setup(tmp_path, monkeypatch, base_script(plan, {"solver/solve": answers}))
    outcome = run(pool, tmp_path / "cp.sqlite", pass_k=2, max_concurrency=None)
    assert outcome.status == "dropped" and outcome.kept is None
    assert outcome.failure is not None and outcome.failure.startswith("select: turn 1: no branch verifies")
    assert "branch 0:" in outcome.failure and "branch 1:" in outcome.failure
    values, nxt = state_of(tmp_path / "cp.sqlite")
    assert nxt == () and values["status"] == "dropped" and values.get("conversation") is None
    assert model_calls("querygen/generate") and len(model_calls("querygen/generate")) == 1  # turn 2 never began


def test_simulated_user_answers_a_clarification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    question = "Happy to help! Which city should I look in?"
    solver = [question, *turn1_ok(plan), *turn2_ok(plan)]
    script = base_script(plan, {"solver/solve_conv": solver, "user/reply": ["Lisbon, please."]})
    del script["solver/solve"]
    pool = setup(tmp_path, monkeypatch, script)
    conv = _kept(run(pool, tmp_path / "cp.sqlite", preset="SFT_CONV"))
    first = conv.nodes[0]
    assert _roles(first) == [
        "user",
        "assistant",
        "user",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "assistant",
    ]
    assert first.steps[1].content == question and first.steps[2].content == "Lisbon, please."
    (asked,) = model_calls("user/reply")
    prompt = text_of(asked)
    assert question in prompt and "Ana Costa" in prompt and first.query in prompt
    # the solver got the user's answer before acting; the conversational preset has its own solver prompt
    solver_calls = model_calls("solver/solve_conv")
    assert "Lisbon, please." in text_of(solver_calls[1])
    assert "ask the user" in text_of(solver_calls[0])
    assert model_calls("solver/solve") == []


def test_simulated_user_performs_a_user_side_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    ask = "I can't cancel it myself - could you cancel booking BK-0002 in your account?"
    solver = [*turn1_ok(plan), ask, "Thanks - the booking is cancelled now."]
    user = [{"content": "", "tool_calls": [{"name": "cancel_booking", "args": plan.cancel}]}, "Done, I cancelled it."]
    script = base_script(
        plan,
        {"querygen/prepare": [prepare_answer(["cancel_booking"])], "solver/solve_conv": solver, "user/reply": user},
    )
    del script["solver/solve"]
    pool = setup(tmp_path, monkeypatch, script)
    db = tmp_path / "cp.sqlite"
    conv = _kept(run(pool, db, preset="SFT_CONV"))
    assert conv.profile["user_tools"] == ["hotels.cancel_booking"]
    second = conv.nodes[1]
    assert _roles(second) == ["user", "assistant", "user", "assistant"]
    assert second.final_scenario["hotels"]["bookings"]["BK-0002"]["status"] == "cancelled"
    # the agent was never given the user-side tool; the simulated user was given only that one
    turn2_solver = model_calls("solver/solve_conv")[3]
    assert "cancel_booking" not in turn2_solver.tools and "book_room" in turn2_solver.tools
    assert model_calls("user/reply")[0].tools == ["cancel_booking"]
    branch = next(b for b in state_of(db)[0]["branches"] if b["turn"] == 1)
    (performed,) = branch["user_calls"]
    assert performed["call"]["name"] == "cancel_booking" and performed["result"]["ok"] and performed["step"] == 2
    # the record keeps the user's action: the assistant's calls plus it replay to the turn's final state
    (recorded,) = second.user_calls
    assert (recorded.after_step, recorded.call.name) == (2, "cancel_booking")


def test_schema_generate_retries_with_the_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    script = base_script(plan, {"querygen/schema": [schema_answer(bad_state()), schema_answer()]})
    pool = setup(tmp_path, monkeypatch, script)
    db = tmp_path / "cp.sqlite"
    _kept(run(pool, db))
    first, retry = (text_of(c) for c in model_calls("querygen/schema"))
    assert '"price_per_night"' in first and '"counters"' in first  # a valid dump was shown as the example
    # every validation error went back, not just the first
    assert "at 'hotels.HT-LIS-02.stars': Field required" in retry
    assert "at 'hotels.HT-LIS-02.stars_count': Extra inputs are not permitted" in retry
    assert "could not be used" in retry  # through the common/repair prompt
    assert state_of(db)[0]["schema"] == {"source": "llm", "attempts": 2}


def test_schema_generate_gives_up_after_bounded_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    script = base_script(plan, {"querygen/schema": [schema_answer(bad_state())] * 2})
    pool = setup(tmp_path, monkeypatch, script)
    outcome = run(pool, tmp_path / "cp.sqlite", schema_retries=1)
    assert outcome.status == "dropped"
    assert outcome.failure is not None and outcome.failure.startswith("schema_generate (llm): hotels:")
    assert "HT-LIS-02.stars_count" in outcome.failure and "2 errors" in outcome.failure


def test_schema_generate_rejects_a_state_the_chain_cannot_run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    empty = {"clock": "2026-01-05T09:00:00", "hotels": {}, "bookings": {}}  # loads, but nothing to book
    script = base_script(plan, {"querygen/schema": [schema_answer(empty), schema_answer()]})
    pool = setup(tmp_path, monkeypatch, script)
    _kept(run(pool, tmp_path / "cp.sqlite"))
    retry = text_of(model_calls("querygen/schema")[1])
    # the empty state gives the search nothing to find: the booking's hotel id comes from no result
    assert "cannot be executed" in retry and ("unsolvable" in retry or "incoherent" in retry)


def test_filter_drops_a_failed_call_and_a_repeated_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    turn1 = [
        call("search_hotels", plan.search),
        call("search_hotels", plan.search),  # the same read again: redundant
        call("book_room", {**plan.book, "nights": 0}, text="Booking it now."),  # fails: nights out of range
        call("book_room", plan.book),
        "Booked Casa do Rio: BK-0002.",
    ]
    pool = setup(tmp_path, monkeypatch, base_script(plan, {"solver/solve": [*turn1, *turn2_ok(plan)]}))
    db = tmp_path / "cp.sqlite"
    conv = _kept(run(pool, db, preset="RL_NON_CONV"))
    values, _ = state_of(db)
    raw = next(b for b in values["branches"] if b["turn"] == 0)
    assert len(raw["steps"]) == 11  # user, 4 × (call, result), the words before the failed call, answer
    first = conv.nodes[0]
    assert _roles(first) == ["user", "tool_call", "tool_result", "tool_call", "tool_result", "assistant"]
    assert [c.name for c in first.tool_calls()] == ["search_hotels", "book_room"]
    assert first.tool_calls()[1].arguments == plan.book
    report = values["filtering"][0]
    assert report == {
        "turn": 0,
        "dropped_failed": 1,
        "dropped_duplicates": 1,
        "kept_filtered": True,
        "reason": None,
    }
    # the replayed final state is the unfiltered branch's, and the kept results are the replayed ones
    mask = StateVerifier(goal={}).mask
    assert (
        state_differences(
            first.initial_scenario["hotels"], raw["final"]["hotels"], first.final_scenario["hotels"], mask
        )
        == []
    )
    again = replay(pool, first.tool_calls(), first.initial_scenario)
    assert [r.result for r in again.results] == [r.result for s in first.steps for r in s.results()]
    assert all(r.ok for s in first.steps for r in s.results())


def test_filter_keeps_the_steps_when_the_replay_differs(pool: EnvPool, plan: Plan) -> None:
    from envfactory.querygen.records import Branch
    from envfactory.records.models import Step, ToolCall, ToolResult

    env = pool.get("hotels")
    initial = {"hotels": env.dump_state(env.new_state(LLM_STATE))}
    book = ToolCall(server="hotels", name="book_room", arguments=plan.book, id="c1")
    done = replay(pool, [book], initial)
    # a branch whose recorded final state is not what its calls give (e.g. edited in a checkpoint)
    tampered = json.loads(json.dumps(done.final))
    tampered["hotels"]["bookings"]["BK-0002"]["nights"] = 9
    branch = Branch(
        turn=0,
        branch=0,
        steps=[
            Step(role="user", content="book it"),
            Step(role="tool_call", content=[book]),
            Step(role="tool_result", content=[ToolResult(server="hotels", name="book_room", ok=True, call_id="c1")]),
            Step(role="assistant", content="ok"),
        ],
        final=tampered,
    )
    kept, report = filter_branch(pool, branch, initial, ["hotels"])
    assert kept is branch and not report.kept_filtered
    assert report.reason is not None and "nights" in report.reason


# ---- checkpoints --------------------------------------------------------------------------------


def test_interrupt_before_select_and_resume_from_disk_in_a_new_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    pool = setup(tmp_path, monkeypatch, base_script(plan))
    db = tmp_path / "cp.sqlite"
    paused = run(pool, db, interrupt_before=["select"])
    assert paused.status == "interrupted" and paused.kept is None and paused.failure is None
    values, nxt = state_of(db)
    assert nxt == ("select",) and values["status"] == "running"
    assert len(values["branches"]) == 1 and values["branches"][0]["answer"] == "Booked Casa do Rio: BK-0002."
    # a new checkpointer connection and a new graph object over the same file finish the run; the
    # solver branch is not re-run (its scripted answers would be exhausted: the script holds one set)
    conv = _kept(run(pool, db))
    assert [n.index for n in conv.nodes] == [0, 1]
    assert len(model_calls("solver/solve")) == 5
    assert run(pool, db).kept == conv  # a finished thread returns its outcome without running again


def test_run_querygen_without_a_checkpointer_and_with_a_given_initial_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    script = base_script(plan)
    del script["querygen/schema"]  # a given initial state needs no model
    pool = setup(tmp_path, monkeypatch, script)
    outcome = run_querygen(
        hotels_chain(),
        seed=SEED,
        conversation_id="given",
        pool=pool,
        checkpointer=None,
        context=QueryGenContext(preset="SFT_NON_CONV", overrides={"pass_k": 1}),
        initial_state={"hotels": LLM_STATE},
        core_ids=CORE,
        max_concurrency=1,
    )
    conv = _kept(outcome)
    assert conv.id == "given" and model_calls("querygen/schema") == []


def test_prepare_failure_is_recorded_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    pool = setup(tmp_path, monkeypatch, base_script(plan, {"querygen/prepare": ["no", "nope", "never"]}))
    outcome = run(pool, tmp_path / "cp.sqlite")
    assert outcome.status == "dropped" and outcome.failure is not None and outcome.failure.startswith("prepare:")


def test_prepare_rejects_unknown_user_tools_and_bad_turn_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    bad_tool = prepare_answer(["wire_money"])
    bad_split = json.dumps({**json.loads(PREPARE), "turn_sizes": [2, 2]})
    good_split = json.dumps({**json.loads(PREPARE), "turn_sizes": [1, 2]})
    script = base_script(
        plan,
        {
            "querygen/prepare": [bad_tool, bad_split, good_split],
            "solver/solve": [
                call("search_hotels", plan.search),
                "Casa do Rio and Alfama Lodge are in Lisbon.",
                call("book_room", plan.book),
                call("cancel_booking", plan.cancel),
                "Booked and cancelled.",
            ],
        },
    )
    pool = setup(tmp_path, monkeypatch, script)
    db = tmp_path / "cp.sqlite"
    conv = _kept(run(pool, db, llm_turn_split=True))
    _, retry1, retry2 = (text_of(c) for c in model_calls("querygen/prepare"))
    assert "wire_money" in retry1 and "turn_sizes [2, 2]" in retry2
    assert state_of(db)[0]["turns"] == [["hotels.search_hotels"], ["hotels.book_room", "hotels.cancel_booking"]]
    assert [len(n.raw_tool_call) for n in conv.nodes] == [1, 2]
    assert conv.nodes[0].final_scenario == conv.nodes[0].initial_scenario  # a read-only first turn


def test_prepare_refuses_user_tools_that_leave_the_assistant_nothing_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    """SFT_CONV kept a conversation whose user did every call (the model named every tool of the chain, a search
    among them, as the user's own): no assistant call to train on. A read, or the whole chain, is re-asked."""
    from envfactory.toolgraph.sampler import ChainStep, ToolChain
    from envfactory_agents.query import user_tools_problem

    script = base_script(plan, {"querygen/prepare": [prepare_answer(["search_hotels"]), PREPARE]})
    pool = setup(tmp_path, monkeypatch, script)
    conv = _kept(run(pool, tmp_path / "cp.sqlite"))
    _, retry = (text_of(c) for c in model_calls("querygen/prepare"))
    assert "user_tools names hotels.search_hotels, a read" in retry, retry
    assert conv.profile["user_tools"] == []
    both = ["hotels.book_room", "hotels.cancel_booking"]
    steps = [ChainStep(tool=t, inputs=[]) for t in both]
    writes = ToolChain(tools=both, servers=["hotels"], turns=[both], seed=0, target_length=2, steps=steps)
    assert "every tool of the chain" in (user_tools_problem(list(writes.tools), writes, pool) or "")
    assert user_tools_problem(["hotels.cancel_booking"], writes, pool) is None


# ---- configuration ------------------------------------------------------------------------------


def test_presets_follow_the_reference() -> None:
    sft, conv, rl = PRESETS["SFT_NON_CONV"], PRESETS["SFT_CONV"], PRESETS["RL_NON_CONV"]
    assert (sft.pass_k, sft.max_solve_iterations) == (4, 8)
    assert sft.enable_query_refinement and not sft.enable_user_interaction and sft.enable_filtering
    assert conv.enable_query_refinement and conv.enable_user_interaction and conv.user_tools_on
    assert conv.enable_filtering
    assert not rl.enable_query_refinement and not rl.enable_user_interaction and rl.enable_filtering
    assert preset_config("RL_NON_CONV", {"pass_k": 2}).pass_k == 2
    with pytest.raises(QueryGenError, match="unknown QueryGen preset"):
        preset_config("SFT")
    with pytest.raises(QueryGenError, match="pass_k"):
        preset_config("SFT_CONV", {"pass_k": 0})
    with pytest.raises(QueryGenError, match="no_such_field"):
        preset_config("SFT_CONV", {"no_such_field": 1})


def test_the_step_budget_bounds_a_branch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    looping = [call("search_hotels", plan.search)] * 2
    pool = setup(tmp_path, monkeypatch, base_script(plan, {"solver/solve": looping}))
    outcome = run(pool, tmp_path / "cp.sqlite", max_solve_iterations=2)
    assert outcome.status == "dropped"
    assert outcome.failure is not None and "no final answer within 2 model steps" in outcome.failure


def test_tool_names_shared_by_two_environments_are_prefixed(pool: EnvPool) -> None:
    from envfactory.env.metadata import EnvMetadata
    from envfactory.eval.toolset import Toolset

    hotels = pool.get("hotels").metadata
    # a second environment with a tool of the same name (the bundled pool has no such pair)
    inns = hotels.model_copy(update={"name": "inns", "tools": [hotels.tool("get_booking"), hotels.tool("book_room")]})

    class TwoEnvs:
        def get(self, name: str) -> Any:
            meta: EnvMetadata = {"hotels": hotels, "inns": inns}[name]
            return type("Env", (), {"metadata": meta})()

    tools = Toolset(TwoEnvs(), ["hotels", "inns"])  # type: ignore[arg-type]
    assert {"hotels__book_room", "inns__book_room", "hotels__get_booking", "inns__get_booking"} <= set(tools.targets)
    assert "book_room" not in tools.targets and "search_hotels" in tools.targets
    assert tools.targets["inns__book_room"] == ("inns", "book_room")
    assert tools.exposed("inns", "book_room") == "inns__book_room"
    assert len(tools.specs) == len(tools.targets) == len(hotels.tools) + 2


def test_an_error_mid_run_propagates_and_the_run_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    # the script ends after turn 1's solver answers: turn 2's solver call fails like a dead LLM server
    script = base_script(plan, {"solver/solve": turn1_ok(plan)})
    pool = setup(tmp_path, monkeypatch, script)
    db = tmp_path / "cp.sqlite"
    with pytest.raises(ScriptExhaustedError):
        run(pool, db)
    values, nxt = state_of(db)
    assert nxt == ("solve",) and values["turn"] == 1 and len(values["nodes"]) == 1
    # the server is back (a new script holding only what is left): the same thread finishes the run
    # without re-running anything that had finished — any other model call would find no answer
    (tmp_path / "script.yaml").write_text(yaml.safe_dump({"solver/solve": turn2_ok(plan)}))
    reset_model_cache()
    reset_scripted_models()
    conv = _kept(run(pool, db))
    assert [n.index for n in conv.nodes] == [0, 1]
    assert conv.nodes[1].final_scenario["hotels"]["bookings"]["BK-0002"]["status"] == "cancelled"


def test_the_graph_takes_its_preset_from_a_plain_dict_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    script = base_script(plan)
    del script["querygen/refine"]
    setup(tmp_path, monkeypatch, script)  # no pool given: the graph uses the settings' pool
    with sqlite_saver(tmp_path / "cp.sqlite") as saver:
        graph = build(saver)
        cfg: Any = {"configurable": {"thread_id": "studio"}, "max_concurrency": 1}
        payload = {"chain": hotels_chain().model_dump(mode="json"), "seed": SEED, "conversation_id": "studio"}
        context = {"preset": "RL_NON_CONV", "overrides": {"pass_k": 1}}
        graph.invoke(payload, cfg, context=context, durability="sync")
        values = graph.get_state(cfg).values
    assert values["status"] == "kept", values.get("failure")
    assert values["config"]["preset"] == "RL_NON_CONV" and values["config"]["pass_k"] == 1


def test_a_read_only_turn_needs_the_read_or_its_fact_in_the_answer(pool: EnvPool, plan: Plan) -> None:
    from envfactory.querygen.records import Branch, TurnDraft
    from envfactory.querygen.select import judge, matcher_for
    from envfactory.records.models import Step, ToolCall

    env = pool.get("hotels")
    initial = {"hotels": env.dump_state(env.new_state(LLM_STATE))}
    search = plan.calls[0]
    draft = TurnDraft(
        turn=0,
        query="q",
        user_intent="i",
        original_query="q",
        original_intent="i",
        expected=initial,
        read_only=True,
        fact=("price_per_night", 120.0),
    )
    done = replay(pool, [search.call], initial)
    made = [Step(role="tool_call", content=[search.call]), Step(role="tool_result", content=done.results)]
    other = ToolCall(server="hotels", name="search_hotels", arguments={"city": "Porto"})
    elsewhere = replay(pool, [other], initial)
    wrong = [Step(role="tool_call", content=[other]), Step(role="tool_result", content=elsewhere.results)]

    def branch(steps: list[Step], answer: str) -> Branch:
        return Branch(turn=0, branch=0, steps=[Step(role="user", content="q"), *steps], final=initial, answer=answer)

    assert judge(branch(made, "Two hotels."), draft, initial, [search], matcher_for(pool)).verified  # the read itself
    assert judge(
        branch(wrong, "Casa do Rio is 120 a night."), draft, initial, [search], matcher_for(pool)
    ).verified  # the fact
    missed = judge(branch(wrong, "Ribeira Inn."), draft, initial, [search], matcher_for(pool))
    assert not missed.verified and "price_per_night" in missed.reasons[0]
    # the last turn of a chain of reads: the answer itself must report the fact (the task checks it)
    final_turn = draft.model_copy(update={"answer_required": True})
    assert not judge(branch(made, "Two hotels."), final_turn, initial, [search], matcher_for(pool)).verified
    assert judge(
        branch(made, "The first is 120.00 per night."), final_turn, initial, [search], matcher_for(pool)
    ).verified


async def test_studio_runs_interrupts_and_resumes_querygen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: Plan
) -> None:
    from langgraph_sdk import get_client

    script = base_script(plan)
    del script["querygen/refine"]
    setup(tmp_path, monkeypatch, script)
    context = {"preset": "RL_NON_CONV", "overrides": {"pass_k": 1}}
    payload = {"chain": hotels_chain().model_dump(mode="json"), "seed": SEED, "conversation_id": "studio"}
    with langgraph_dev(tmp_path, "querygen") as url:
        client = get_client(url=url)
        thread = (await client.threads.create())["thread_id"]
        await client.runs.wait(thread, "querygen", input=payload, context=context, interrupt_before=["select"])
        state = await client.threads.get_state(thread)
        assert state["next"] == ["select"] and state["values"]["branches"][0]["answer"]
        await client.runs.wait(thread, "querygen", input=None, context=context)
        values = (await client.threads.get_state(thread))["values"]
    assert values["status"] == "kept", values.get("failure")
    assert Conversation.model_validate(values["conversation"]).provenance.preset == "RL_NON_CONV"
