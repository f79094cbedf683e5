"""QueryGen: one sampled tool chain → one verified multi-turn `Conversation` (generator "llm").

    prepare → schema_generate → per turn: generate → refine? → solve ×k (Send) → select → filter?
            → advance → (generate | finish) → END

A checkpointed LangGraph state machine (EnvFactory section 3.4). `build(checkpointer)` is for the
CLI, the batch runner and tests (run with `durability="sync"`, so a killed process resumes mid-turn,
and after a crash in one solver branch only that branch re-runs); `graph` is the checkpointer-free
export for `langgraph.json`. Nodes are thin over the agents in `agents/` (query, solver, user,
select). Every failure is a state (`status: dropped` + `failure`) routed to END — a model's bad
answer never raises out of the graph; transport errors do propagate.

Input: `{"chain": ToolChain dump, "seed": int, "conversation_id": str}`, optionally
`"initial_state"` (+ `"core_ids"`) to skip the model in schema_generate. Output: `status`,
`failure`, and `conversation` (a `Conversation` dump) when kept.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict  # pydantic (Studio's JSON schemas) needs it below Python 3.12

from agents.common import AgentDeps
from agents.query import TurnQuery, generate, given_schema, prepare, refine, schema_generate, turns_of
from agents.solver import solve_branch
from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.querygen.records import (
    Branch,
    Preparation,
    QueryGenConfig,
    QueryGenError,
    SolveTask,
    TurnDraft,
    model_names,
    preset_config,
)
from envfactory.querygen.select import filter_branch, matcher_for, select_branch
from envfactory.tasks.episode import replay
from envfactory.tasks.models import (
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
from envfactory.tasks.template import answer_fact
from envfactory.tasks.verifier import admissible
from envfactory.toolgraph.sampler import ToolChain
from graphs.routing import ok_or_end
from graphs.running import run_or_resume

Status = Literal["running", "kept", "dropped"]


class QueryGenState(TypedDict, total=False):
    # input
    chain: dict[str, Any]  # ToolChain
    seed: int
    conversation_id: str
    initial_state: States | None  # given (optional), then Db⁰ as loaded
    core_ids: dict[str, dict[str, list[str]]] | None
    # run
    config: dict[str, Any]  # QueryGenConfig, fixed at prepare (a resumed run keeps it)
    status: Status
    failure: str | None
    preparation: dict[str, Any] | None  # Preparation
    turns: list[list[str]]
    schema: dict[str, Any] | None  # where Db⁰ came from and how many answers it took
    plan: list[dict[str, Any]]  # π*'s PlannedCalls
    plan_results: list[dict[str, Any]]  # π*'s ToolResults
    expected: list[States]  # π*'s state after each turn
    turn: int
    current: States  # the current turn's initial state
    draft: dict[str, Any] | None  # TurnDraft of the current turn
    branches: Annotated[list[dict[str, Any]], operator.add]  # every Branch of every turn
    selection: Annotated[list[dict[str, Any]], operator.add]  # every turn's Selection
    selected: dict[str, Any] | None  # the current turn's chosen Branch (filtered once filter ran)
    filtering: Annotated[list[dict[str, Any]], operator.add]  # FilterReports
    drafts: Annotated[list[dict[str, Any]], operator.add]  # finished turns' drafts (original + refined query)
    nodes: list[dict[str, Any]]  # finished turns (Node)
    # output
    conversation: dict[str, Any] | None  # Conversation


class QueryGenInput(TypedDict, total=False):
    """What a run starts from (Studio's input form): a chain, a seed, an id; optionally Db⁰ and its core ids."""

    chain: dict[str, Any]
    seed: int
    conversation_id: str
    initial_state: States | None
    core_ids: dict[str, dict[str, list[str]]] | None


class SolveInput(TypedDict):
    """The Send payload of one solver branch."""

    solve_task: dict[str, Any]  # SolveTask


@dataclass
class QueryGenContext:
    """Per-run configuration (the batch runner, the CLI, or `context` of a LangGraph SDK run).

    `preset` + `overrides` (QueryGenConfig fields) give the run's config; `seed` is used when the input
    has none; `pool` is the environment pool (default: the settings' pool)."""

    preset: str = "SFT_NON_CONV"
    overrides: dict[str, Any] = field(default_factory=dict)
    prompt_overrides: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    pool: Any = None  # an EnvPool (typed Any: Studio builds a JSON schema of the context)


_POOLS: dict[str, EnvPool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(runtime: Runtime[QueryGenContext]) -> EnvPool:
    ctx = runtime.context
    if ctx is not None and isinstance(ctx.pool, EnvPool):
        return ctx.pool
    settings = get_settings()
    key = f"{settings.envs_path}|{settings.bfcl}"
    with _POOLS_LOCK:  # solver branches run in threads
        if key not in _POOLS:
            _POOLS[key] = EnvPool(settings)
        return _POOLS[key]


def _deps(runtime: Runtime[QueryGenContext]) -> AgentDeps:
    ctx = runtime.context
    return AgentDeps(settings=get_settings(), prompt_overrides=dict(ctx.prompt_overrides) if ctx else {})


def _dropped(message: str) -> QueryGenState:
    return {"status": "dropped", "failure": message}


def _config(state: QueryGenState) -> QueryGenConfig:
    return QueryGenConfig.model_validate(state["config"])


def _chain(state: QueryGenState) -> ToolChain:
    chain = ToolChain.model_validate(state["chain"])
    return chain.model_copy(update={"turns": state["turns"]}) if state.get("turns") else chain


def _prep(state: QueryGenState) -> Preparation:
    return Preparation.model_validate(state["preparation"])


def _spans(turns: list[list[str]]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for turn in turns:
        spans.append((start, start + len(turn)))
        start += len(turn)
    return spans


def _turn_plan(state: QueryGenState, turn: int) -> list[PlannedCall]:
    start, end = _spans(state["turns"])[turn]
    return [PlannedCall.model_validate(p) for p in state["plan"][start:end]]


def _nodes(state: QueryGenState) -> list[Node]:
    return [Node.model_validate(n) for n in state.get("nodes") or []]


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


# ---- nodes ----------------------------------------------------------------------------------------


def node_prepare(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    ctx = runtime.context or QueryGenContext()
    config = preset_config(ctx.preset, ctx.overrides)
    seed = state.get("seed")
    seed = seed if seed is not None else (ctx.seed if ctx.seed is not None else 0)
    start: QueryGenState = {"config": _dump(config), "seed": seed, "status": "running", "failure": None}
    try:
        chain = ToolChain.model_validate(state.get("chain") or {})
        pool = _pool(runtime)
        for server in chain.servers:
            pool.get(server)
    except (ValidationError, EnvFactoryError) as e:
        return {**start, **_dropped(f"prepare: the chain cannot be used: {str(e).splitlines()[0]}")}
    answer = prepare(_deps(runtime), pool, chain, config)
    if not answer.ok or answer.value is None:
        return {**start, **_dropped(f"prepare: {answer.error}")}
    return {
        **start,
        "preparation": _dump(answer.value),
        "turns": turns_of(chain, answer.value, config),
        "turn": 0,
        "nodes": [],
    }


def node_schema_generate(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, chain, seed = _pool(runtime), _chain(state), state.get("seed", 0)
    given = state.get("initial_state")
    if given:
        outcome = given_schema(pool, chain, given, state.get("core_ids") or {}, seed)
    else:
        outcome = schema_generate(_deps(runtime), pool, chain, _prep(state), _config(state), seed)
    info = {"source": outcome.source, "attempts": outcome.attempts}
    if not outcome.ok or outcome.solved is None:
        return {**_dropped(f"schema_generate ({outcome.source}): {outcome.error}"), "schema": info}
    solved = outcome.solved
    return {
        "initial_state": outcome.states,
        "core_ids": outcome.core_ids,
        "schema": info,
        "plan": [_dump(p) for p in solved.planned],
        "plan_results": [_dump(r) for r in solved.results],
        "expected": solved.turn_final,
        "current": outcome.states,
    }


def _turn_goal(
    pool: EnvPool, state: QueryGenState, turn: int, planned: list[PlannedCall]
) -> tuple[States, ToolResult | None]:
    """The state this turn must reach from the *current* state (π*'s calls replayed there), and π*'s last
    result; π*'s own turn state when its calls do not replay (the conversation's ids diverged)."""
    again = replay(pool, [p.call for p in planned], state["current"], _chain(state).servers)
    if again.failures == 0:
        return again.final, again.results[-1] if again.results else None
    start, end = _spans(state["turns"])[turn]
    last = ToolResult.model_validate(state["plan_results"][end - 1]) if end > start else None
    return state["expected"][turn], last


def node_generate(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, turn = _pool(runtime), state["turn"]
    planned = _turn_plan(state, turn)
    expected, last = _turn_goal(pool, state, turn, planned)
    read_only = all(p.kind == "read" for p in planned)
    fact = answer_fact(last.result, planned[-1].call.arguments) if read_only and last is not None else None
    answer = generate(_deps(runtime), pool, _prep(state), planned, _nodes(state), turn, len(state["turns"]))
    if not answer.ok or answer.value is None:
        return _dropped(f"generate (turn {turn + 1}): {answer.error}")
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
    return {"draft": _dump(draft), "selected": None}


def node_refine(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    pool, draft = _pool(runtime), TurnDraft.model_validate(state["draft"])
    original = TurnQuery(subgoals=draft.subgoals, query=draft.query, user_intent=draft.user_intent)
    answer = refine(_deps(runtime), pool, _prep(state), _turn_plan(state, draft.turn), _nodes(state), original)
    if not answer.ok or answer.value is None:
        return _dropped(f"refine (turn {draft.turn + 1}): {answer.error}")
    r = answer.value
    refined = draft.model_copy(
        update={
            "query": r.query.strip(),
            "user_intent": r.user_intent.strip(),
            "refined": True,
            "transformations": r.transformations,
        }
    )
    return {"draft": _dump(refined)}


def node_solve(state: SolveInput, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """One pass@k branch; `state` is its Send payload, not the graph state."""
    task = SolveTask.model_validate(state["solve_task"])
    branch = solve_branch(_deps(runtime), _pool(runtime), task)
    return {"branches": [_dump(branch)]}


def _branches(state: QueryGenState, turn: int) -> list[Branch]:
    return [Branch.model_validate(b) for b in state.get("branches") or [] if b.get("turn") == turn]


def node_select(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    draft = TurnDraft.model_validate(state["draft"])
    branches = _branches(state, draft.turn)
    plan = _turn_plan(state, draft.turn)
    selection = select_branch(branches, draft, state["current"], plan, matcher_for(_pool(runtime)))
    update: QueryGenState = {"selection": [_dump(selection)]}
    if selection.selected is None:
        return {**update, **_dropped(f"select: {selection.failure}")}
    chosen = next(b for b in branches if b.branch == selection.selected)
    return {**update, "selected": _dump(chosen)}


def node_filter(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    branch = Branch.model_validate(state["selected"])
    filtered, report = filter_branch(_pool(runtime), branch, state["current"], _chain(state).servers)
    return {"selected": _dump(filtered), "filtering": [_dump(report)]}


def node_advance(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """The selected (and filtered) branch becomes the turn's node; its final state carries over."""
    draft = TurnDraft.model_validate(state["draft"])
    branch = Branch.model_validate(state["selected"])
    planned = _turn_plan(state, draft.turn)
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
        "nodes": [*(state.get("nodes") or []), _dump(node)],
        "drafts": [_dump(draft)],
        "current": branch.final,
        "turn": draft.turn + 1,
        "draft": None,
        "selected": None,
    }


def node_finish(state: QueryGenState, runtime: Runtime[QueryGenContext]) -> QueryGenState:
    """Assemble the Conversation and its task T = (x, v, Db⁰, π*); keep it only if the task is admissible."""
    chain, nodes, config = _chain(state), _nodes(state), _config(state)
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
        return _dropped(f"finish: {why}")
    prep = _prep(state)
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
            models=model_names(get_settings()),
        ),
    )
    return {"status": "kept", "conversation": _dump(conversation)}


# ---- routing --------------------------------------------------------------------------------------


def _fan_out(state: QueryGenState) -> list[Send]:
    config, draft, prep = _config(state), TurnDraft.model_validate(state["draft"]), _prep(state)
    chain = _chain(state)
    tasks = [
        SolveTask(
            turn=draft.turn,
            branch=i,
            seed=state.get("seed", 0),
            config=config,
            query=draft.query,
            user_intent=draft.user_intent,
            profile=prep.profile.model_dump(),
            scenario=prep.scenario,
            servers=chain.servers,
            initial=state["current"],
            expected=draft.expected,
            read_only=draft.read_only,
            raw_calls=_turn_plan(state, draft.turn),
            history=state.get("nodes") or [],
            user_tools=prep.user_tools,
        )
        for i in range(config.pass_k)
    ]
    return [Send("solve", {"solve_task": _dump(t)}) for t in tasks]


def after_generate(state: QueryGenState) -> str | list[Send]:
    if state.get("status") == "dropped":
        return END
    return "refine" if _config(state).enable_query_refinement else _fan_out(state)


def after_refine(state: QueryGenState) -> str | list[Send]:
    return END if state.get("status") == "dropped" else _fan_out(state)


def after_select(state: QueryGenState) -> str:
    if state.get("status") == "dropped":
        return END
    return "filter" if _config(state).enable_filtering else "advance"


def after_advance(state: QueryGenState) -> str:
    return "generate" if state["turn"] < len(state["turns"]) else "finish"


def build(checkpointer: BaseCheckpointSaver[Any] | None = None) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(QueryGenState, context_schema=QueryGenContext, input_schema=QueryGenInput)
    g.add_node("prepare", node_prepare)
    g.add_node("schema_generate", node_schema_generate)
    g.add_node("generate", node_generate)
    g.add_node("refine", node_refine)
    g.add_node("solve", node_solve)  # its input is the Send payload (SolveInput, from the signature)
    g.add_node("select", node_select)
    g.add_node("filter", node_filter)
    g.add_node("advance", node_advance)
    g.add_node("finish", node_finish)
    g.add_edge(START, "prepare")
    g.add_conditional_edges("prepare", ok_or_end("schema_generate", "dropped"), ["schema_generate", END])
    g.add_conditional_edges("schema_generate", ok_or_end("generate", "dropped"), ["generate", END])
    g.add_conditional_edges("generate", after_generate, ["refine", "solve", END])
    g.add_conditional_edges("refine", after_refine, ["solve", END])
    g.add_edge("solve", "select")
    g.add_conditional_edges("select", after_select, ["filter", "advance", END])
    g.add_edge("filter", "advance")
    g.add_conditional_edges("advance", after_advance, ["generate", "finish"])
    g.add_edge("finish", END)
    return g.compile(checkpointer=checkpointer, name="querygen")


# checkpointer-free, for langgraph.json (the dev server refuses graphs with their own)
graph = build()


# ---- one chain, for the batch runner ----------------------------------------------------------------


class QueryGenOutcome(BaseModel):
    """`kept` when the chain became a conversation; `failure` when it was dropped; neither when interrupted."""

    status: Literal["kept", "dropped", "interrupted"]
    kept: Conversation | None = None
    failure: str | None = None
    thread_id: str


def _outcome(values: dict[str, Any], thread_id: str) -> QueryGenOutcome:
    status = values.get("status")
    if status == "kept" and values.get("conversation"):
        conversation = Conversation.model_validate(values["conversation"])
        return QueryGenOutcome(status="kept", kept=conversation, thread_id=thread_id)
    if status == "dropped":
        return QueryGenOutcome(status="dropped", failure=values.get("failure") or "dropped", thread_id=thread_id)
    return QueryGenOutcome(status="interrupted", thread_id=thread_id)


def run_querygen(
    chain: ToolChain,
    *,
    seed: int,
    conversation_id: str,
    pool: EnvPool,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    thread_id: str | None = None,
    context: QueryGenContext | None = None,
    initial_state: States | None = None,
    core_ids: dict[str, dict[str, list[str]]] | None = None,
    max_concurrency: int | None = None,
    interrupt_before: list[str] | None = None,
) -> QueryGenOutcome:
    """Run QueryGen for one chain (sync, `durability="sync"`). With a checkpointer, calling again with the
    same `thread_id` (default: `conversation_id`) continues from the checkpoint; a finished thread just
    returns its outcome. `max_concurrency` bounds the solver branches running at once (1: in order)."""
    ctx = replace(context or QueryGenContext(), pool=pool)
    preset_config(ctx.preset, ctx.overrides)  # an unknown preset or bad override fails here, not mid-run
    thread = thread_id or conversation_id
    payload: dict[str, Any] = {
        "chain": chain.model_dump(mode="json"),
        "seed": seed,
        "conversation_id": conversation_id,
    }
    if initial_state is not None:
        payload.update(initial_state=initial_state, core_ids=core_ids or {})
    ran = run_or_resume(
        build(checkpointer),
        thread,
        payload,
        context=ctx,
        durable=checkpointer is not None,
        interrupt_before=interrupt_before,
        max_concurrency=max_concurrency,
    )
    return _outcome(ran.values, thread)


__all__ = [
    "QueryGenConfig",
    "QueryGenContext",
    "QueryGenError",
    "QueryGenInput",
    "QueryGenOutcome",
    "QueryGenState",
    "build",
    "graph",
    "run_querygen",
]
