"""QueryGen's nodes: each a thin step over the agents (`envfactory_agents/`) and QueryGen's model-free parts."""

from __future__ import annotations

from langgraph.runtime import Runtime
from pydantic import ValidationError

from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.querygen.records import Branch, SolveTask, TurnDraft, model_names, preset_config
from envfactory.querygen.select import filter_branch, matcher_for, select_branch
from envfactory.records.episode import replay
from envfactory.records.models import (
    Assertion,
    Conversation,
    Node,
    PlannedCall,
    Provenance,
    States,
    StateVerifier,
    Task,
    ToolResult,
    UserToolCall,
)
from envfactory.records.verifier import admissible
from envfactory.tasks.template import answer_fact
from envfactory.toolgraph.sampler import ToolChain
from envfactory_agents.query import TurnQuery, generate, given_schema, prepare, refine, schema_generate, turns_of
from envfactory_agents.solver import solve_branch
from graphs.querygen.state import (
    QueryGenContext,
    QueryGenState,
    SolveInput,
    chain_of,
    config_of,
    deps_of,
    dropped,
    dump,
    nodes_of,
    pool_of,
    prep_of,
    settings_of,
    spans,
    turn_plan,
)


def node_prepare(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    ctx = runtime.context or QueryGenContext()
    config = preset_config(ctx.preset, ctx.overrides)
    seed = state.get("seed")
    seed = seed if seed is not None else (ctx.seed if ctx.seed is not None else 0)
    start: QueryGenState = {"config": dump(config), "seed": seed, "status": "running", "failure": None}
    try:
        chain = ToolChain.model_validate(state.get("chain") or {})
        pool = pool_of(runtime)
        for server in chain.servers:
            pool.get(server)
    except (ValidationError, EnvFactoryError) as e:
        return {**start, **dropped(f"prepare: the chain cannot be used: {str(e).splitlines()[0]}")}
    answer = prepare(deps_of(runtime), pool, chain, config)
    if not answer.ok or answer.value is None:
        return {**start, **dropped(f"prepare: {answer.error}")}
    return {
        **start,
        "preparation": dump(answer.value),
        "turns": turns_of(chain, answer.value, config),
        "turn": 0,
        "nodes": [],
    }


def node_schema_generate(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, chain, seed = pool_of(runtime), chain_of(state), state.get("seed", 0)
    given = state.get("initial_state")
    if given:
        outcome = given_schema(pool, chain, given, state.get("core_ids") or {}, seed)
    else:
        outcome = schema_generate(deps_of(runtime), pool, chain, prep_of(state), config_of(state), seed)
    info = {"source": outcome.source, "attempts": outcome.attempts}
    if not outcome.ok or outcome.solved is None:
        return {**dropped(f"schema_generate ({outcome.source}): {outcome.error}"), "schema": info}
    solved = outcome.solved
    return {
        "initial_state": outcome.states,
        "core_ids": outcome.core_ids,
        "schema": info,
        "plan": [dump(p) for p in solved.planned],
        "plan_results": [dump(r) for r in solved.results],
        "expected": solved.turn_final,
        "current": outcome.states,
    }


def _turn_goal(
    pool: EnvPool, state: QueryGenState, turn: int, planned: list[PlannedCall]
) -> tuple[States, ToolResult | None]:
    """The state this turn must reach from the *current* state (π*'s calls replayed there), and π*'s last
    result; π*'s own turn state when its calls do not replay (the conversation's ids diverged)."""
    again = replay(pool, [p.call for p in planned], state["current"], chain_of(state).servers)
    if again.failures == 0:
        return again.final, again.results[-1] if again.results else None
    start, end = spans(state["turns"])[turn]
    last = ToolResult.model_validate(state["plan_results"][end - 1]) if end > start else None
    return state["expected"][turn], last


def node_generate(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, turn = pool_of(runtime), state["turn"]
    planned = turn_plan(state, turn)
    expected, last = _turn_goal(pool, state, turn, planned)
    read_only = all(p.kind == "read" for p in planned)
    fact = answer_fact(last.result, planned[-1].call.arguments) if read_only and last is not None else None
    answer = generate(deps_of(runtime), pool, prep_of(state), planned, nodes_of(state), turn, len(state["turns"]))
    if not answer.ok or answer.value is None:
        return dropped(f"generate (turn {turn + 1}): {answer.error}")
    q = answer.value
    last_turn = turn == len(state["turns"]) - 1
    reads_only = all(PlannedCall.model_validate(p).kind == "read" for p in state["plan"])
    draft = TurnDraft(
        turn=turn,
        subgoals=q.subgoals,
        query=q.query.strip(),
        user_intent=q.user_intent.strip(),
        original_query=q.query.strip(),
        original_intent=q.user_intent.strip(),
        expected=expected,
        read_only=read_only,
        fact=fact,
        answer_required=last_turn and reads_only and fact is not None,
    )
    return {"draft": dump(draft), "selected": None}


def node_refine(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, draft = pool_of(runtime), TurnDraft.model_validate(state["draft"])
    original = TurnQuery(subgoals=draft.subgoals, query=draft.query, user_intent=draft.user_intent)
    answer = refine(deps_of(runtime), pool, prep_of(state), turn_plan(state, draft.turn), nodes_of(state), original)
    if not answer.ok or answer.value is None:
        return dropped(f"refine (turn {draft.turn + 1}): {answer.error}")
    r = answer.value
    refined = draft.model_copy(
        update={
            "query": r.query.strip(),
            "user_intent": r.user_intent.strip(),
            "refined": True,
            "transformations": r.transformations,
        }
    )
    return {"draft": dump(refined)}


def node_solve(state: SolveInput, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """One pass@k branch; `state` is its Send payload, not the graph state."""
    task = SolveTask.model_validate(state["solve_task"])
    branch = solve_branch(deps_of(runtime), pool_of(runtime), task)
    return {"branches": [dump(branch)]}


def _branches(state: QueryGenState, turn: int) -> list[Branch]:
    return [Branch.model_validate(b) for b in state.get("branches") or [] if b.get("turn") == turn]


def node_select(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    draft = TurnDraft.model_validate(state["draft"])
    branches = _branches(state, draft.turn)
    plan = turn_plan(state, draft.turn)
    selection = select_branch(branches, draft, state["current"], plan, matcher_for(pool_of(runtime)))
    update: QueryGenState = {"selection": [dump(selection)]}
    if selection.selected is None:
        return {**update, **dropped(f"select: {selection.failure}")}
    chosen = next(b for b in branches if b.branch == selection.selected)
    return {**update, "selected": dump(chosen)}


def node_filter(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    branch = Branch.model_validate(state["selected"])
    filtered, report = filter_branch(pool_of(runtime), branch, state["current"], chain_of(state).servers)
    return {"selected": dump(filtered), "filtering": [dump(report)]}


def node_advance(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """The selected (and filtered) branch becomes the turn's node; its final state carries over."""
    draft = TurnDraft.model_validate(state["draft"])
    branch = Branch.model_validate(state["selected"])
    planned = turn_plan(state, draft.turn)
    node = Node(
        index=draft.turn,
        query=draft.query,
        user_intent=draft.user_intent,
        steps=branch.steps,
        mcp_servers=list(dict.fromkeys(p.call.server for p in planned)),
        initial_scenario=state["current"],
        final_scenario=branch.final,
        raw_tool_call=[p.call for p in planned],
        generator="llm",
        refined=draft.refined,
        original_query=draft.original_query if draft.refined else None,
        user_calls=[UserToolCall(after_step=u.step, call=u.call, result=u.result) for u in branch.user_calls],
    )
    return {
        "nodes": [*(state.get("nodes") or []), dump(node)],
        "drafts": [dump(draft)],
        "current": branch.final,
        "turn": draft.turn + 1,
        "draft": None,
        "selected": None,
    }


def node_finish(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """Assemble the Conversation and its task T = (x, v, Db⁰, π*); keep it only if the task is admissible."""
    chain, nodes, config = chain_of(state), nodes_of(state), config_of(state)
    initial: States = state["initial_state"] or {}
    final = nodes[-1].final_scenario
    plan = [PlannedCall.model_validate(p) for p in state["plan"]]
    last_answer = next((str(s.content) for s in reversed(nodes[-1].steps) if s.role == "assistant" and s.content), "")
    assertions: list[Assertion] = []
    if not any(p.kind == "write" for p in plan):
        draft = TurnDraft.model_validate(state["drafts"][-1])
        if draft.fact is not None:
            assertions.append(Assertion(kind="answer_contains", value=draft.fact[1]))
    verifier = StateVerifier(goal={s: final[s] for s in chain.servers}, assertions=assertions)
    ok, why = admissible(verifier, initial, final, last_answer)
    if not ok:
        return dropped(f"finish: {why}")
    prep = prep_of(state)
    conversation = Conversation(
        id=state["conversation_id"],
        servers=chain.servers,
        tools=chain.tools,
        profile={**prep.profile.model_dump(), "scenario": prep.scenario, "user_tools": prep.user_tools},
        nodes=nodes,
        task=Task(
            id=state["conversation_id"],
            instruction="\n".join(n.query for n in nodes),
            servers=chain.servers,
            initial_state=initial,
            verifier=verifier,
            solver=plan,
        ),
        provenance=Provenance(
            generator="llm",
            preset=config.preset,
            seed=state.get("seed", 0),
            chain_seed=chain.seed,
            models=model_names(settings_of(runtime)),
        ),
    )
    return {"status": "kept", "conversation": dump(conversation)}
