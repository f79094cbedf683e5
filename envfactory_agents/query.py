"""The query-writing agent of QueryGen: prepare, schema_generate, generate, refine (role "query").

- **prepare**: a user profile and a scenario for the chain; optionally a new turn split; which tools
  of the chain only the user can perform (for the conversational variant).
- **schema_generate**: the initial state of every involved environment, consistent with the scenario,
  shown a valid dump as the example. It must load into each environment and the privileged solver π*
  must be able to execute the chain on it; a load error or π*'s failure goes back to the model with
  the `common/repair` prompt (bounded), then becomes a recorded failure.
- **generate**: subgoal decomposition + goal articulation → the turn's query and user intent, from the
  turn's calls with their bound argument values.
- **refine**: implicit reference, action compression, ambiguity introduction, goal expansion.

Every answer is parsed into a Pydantic model; semantic checks (a state that does not load) re-ask the
same way parse errors do. Nothing here raises for a model's bad answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field, ValidationError

from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.llm.structured import Structured, expect_model
from envfactory.querygen.records import QUERY_ROLE, Preparation, QueryGenConfig
from envfactory.records.models import Node, PlannedCall, States
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.pi_star import CoreIds, PiStarOutcome, solve_chain
from envfactory.toolgraph.sampler import ToolChain
from envfactory_agents.common import AgentDeps

T = TypeVar("T", bound=BaseModel)


def ask_checked(
    deps: AgentDeps,
    messages: Sequence[BaseMessage],
    schema: type[T],
    check: Callable[[T], str | None] | None = None,
    *,
    retries: int | None = None,
) -> Structured[T]:
    """QueryGen's question: a JSON answer of `schema` that also passes `check` (its complaint goes back
    to the model like a parse error)."""
    return deps.ask(QUERY_ROLE, messages, expect_model(schema, check), retries=retries)


# ---- what the model is shown ------------------------------------------------------------------------


def environments_view(pool: EnvPool, servers: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in servers:
        meta = pool.get(name).metadata
        out.append({"name": name, "domain": meta.domain, "description": meta.description})
    return out


def chain_view(pool: EnvPool, chain: ToolChain) -> list[dict[str, Any]]:
    """The chain's tools in order, with their parameters and where each input comes from."""
    out = []
    for i, step in enumerate(chain.steps):
        env, name = step.tool.split(".", 1)
        spec = pool.get(env).metadata.tool(name)
        sources = {
            s.parameter: ("the user says it" if s.source == "user" else f"the result of call {(s.index or 0) + 1}")
            for s in step.inputs
        }
        params = {
            p: {
                "description": schema.get("description", ""),
                "required": p in spec.required,
                "from": sources.get(p, "optional; may be left out"),
            }
            for p, schema in spec.parameters.items()
        }
        out.append(
            {"call": i + 1, "tool": step.tool, "kind": spec.kind, "description": spec.description, "inputs": params}
        )
    return out


_SOURCE_WORDS = {
    "state": "the user knows it and says it",
    "generated": "the user knows it and says it",
    "repeated": "the user already said it earlier",
    "output": "comes from an earlier call's result; the user does not know it and refers to it implicitly",
}


def calls_view(pool: EnvPool, planned: list[PlannedCall]) -> list[dict[str, Any]]:
    """A turn's calls with their bound argument values and, per argument, how the user knows it."""
    out = []
    for p in planned:
        spec = pool.get(p.call.server).metadata.tool(p.call.name)
        how = {b.parameter: _SOURCE_WORDS[b.source] for b in p.bindings}
        out.append(
            {
                "tool": p.call.qualified,
                "kind": p.kind,
                "description": spec.description,
                "arguments": {k: {"value": v, "known": how.get(k, "")} for k, v in p.call.arguments.items()},
            }
        )
    return out


def history_view(nodes: list[Node]) -> str:
    """The conversation so far, as the user remembers it: their requests and the assistant's answers."""
    if not nodes:
        return "(this is the first turn)"
    lines = []
    for node in nodes:
        lines.append(f"Turn {node.index + 1}, user: {node.query}")
        answers = [s.content for s in node.steps if s.role == "assistant" and isinstance(s.content, str)]
        if answers:
            lines.append(f"Turn {node.index + 1}, assistant: {answers[-1]}")
    return "\n".join(lines)


# ---- prepare ----------------------------------------------------------------------------------------


def _normalize_user_tools(prep: Preparation, chain: ToolChain) -> tuple[list[str], str | None]:
    by_name: dict[str, list[str]] = {}
    for q in chain.tools:
        by_name.setdefault(q.split(".", 1)[1], []).append(q)
    out: list[str] = []
    for t in prep.user_tools:
        if t in chain.tools:
            out.append(t)
        elif len(by_name.get(t, [])) == 1:
            out.append(by_name[t][0])
        else:
            return [], f"user_tools names '{t}', which is not a tool of the chain ({', '.join(chain.tools)})"
    return list(dict.fromkeys(out)), None


def user_tools_problem(tools: list[str], chain: ToolChain, pool: EnvPool) -> str | None:
    """Why the chain's tools named as the user's own (qualified) leave no conversation to train on, else None: a read
    (the assistant can always look something up), or every tool of the chain (the assistant would do nothing)."""
    reads = [t for t in tools if pool.get(t.split(".", 1)[0]).metadata.tool(t.split(".", 1)[1]).kind == "read"]
    if reads:
        return f"user_tools names {', '.join(reads)}, a read: the assistant reads; name only what a human must do"
    if tools and set(tools) >= set(chain.tools):
        return "user_tools names every tool of the chain: the assistant would do nothing; most chains have none"
    return None


def prepare(deps: AgentDeps, pool: EnvPool, chain: ToolChain, config: QueryGenConfig) -> Structured[Preparation]:
    messages = deps.prompts.get("querygen/prepare").render(
        environments=environments_view(pool, chain.servers),
        tools=chain_view(pool, chain),
        turns=chain.turns,
        max_turn_tools=str(config.max_turn_tools),
    )

    def check(prep: Preparation) -> str | None:
        tools, problem = _normalize_user_tools(prep, chain)
        if problem:
            return problem
        problem = user_tools_problem(tools, chain, pool)
        if problem:
            return problem
        prep.user_tools = tools
        sizes = prep.turn_sizes
        bad = sizes is not None and (
            sum(sizes) != chain.length or any(not 1 <= s <= config.max_turn_tools for s in sizes)
        )
        if config.llm_turn_split and bad:
            return (
                f"turn_sizes {sizes} must be consecutive turn lengths of 1 to {config.max_turn_tools} tools "
                f"summing to the chain's {chain.length} tools (or null to keep the chain's own split)"
            )
        return None

    return ask_checked(deps, messages, Preparation, check)


def turns_of(chain: ToolChain, prep: Preparation, config: QueryGenConfig) -> list[list[str]]:
    """The turn split used: the LLM's when enabled and given, else the chain's own."""
    if not (config.llm_turn_split and prep.turn_sizes):
        return [list(t) for t in chain.turns]
    turns, start = [], 0
    for size in prep.turn_sizes:
        turns.append(chain.tools[start : start + size])
        start += size
    return turns


# ---- schema_generate ---------------------------------------------------------------------------------


class InitialStates(BaseModel):
    """schema_generate's answer: one state dump per environment and the ids the scenario is about."""

    states: dict[str, dict[str, Any]]
    core_ids: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, description="environment -> collection -> ids of the records the scenario is about"
    )


class SchemaOutcome(BaseModel):
    ok: bool
    states: States = Field(default_factory=dict)
    core_ids: CoreIds = Field(default_factory=dict)
    solved: PiStarOutcome | None = None
    error: str | None = None
    attempts: int = 0
    source: str = "llm"


def example_state(env: BaseEnvironment, seed: int) -> dict[str, Any]:
    """A valid dump to show the model: the offline generator's state when it can make one, else the
    environment's default scenario, else an empty state."""
    if isinstance(env, Environment):
        try:
            return dict(generate_initial_state(env, seed=seed, depth=1).config)
        except EnvFactoryError:  # the generator cannot fill this environment's state: fall back
            pass
    default = env.default_scenario()
    if default is not None:
        return env.scenario(default)
    return env.dump_state(env.new_state(None))


def _state_schema(env: BaseEnvironment) -> Any:
    model = getattr(env, "state_model", None)
    return model.model_json_schema() if model is not None and hasattr(model, "model_json_schema") else None


def load_states(pool: EnvPool, servers: list[str], states: dict[str, dict[str, Any]]) -> tuple[States, str | None]:
    """Each environment's config loaded and dumped back (normalized); or the first problem, in words."""
    missing = [s for s in servers if s not in states]
    extra = [s for s in states if s not in servers]
    if missing or extra:
        parts = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(extra)}" if extra else ""]
        return {}, f"states must have exactly the keys {servers}: " + "; ".join(p for p in parts if p)
    out: States = {}
    for name in servers:
        env = pool.get(name)
        try:
            out[name] = env.dump_state(env.new_state(states[name], f"the '{name}' state"))
        except Exception as e:  # the model's config: any failure to load is its error to fix
            return {}, f"{name}: {_all_errors(env, states[name]) or e}"
    return out, None


def _all_errors(env: BaseEnvironment, config: dict[str, Any]) -> str | None:
    """Every validation error of a native state (loading reports only the first), for the model to fix at once."""
    if not isinstance(env, Environment):
        return None
    try:
        env.state_model.model_validate(config)
    except ValidationError as e:
        lines = [f"- at '{'.'.join(str(p) for p in err['loc'])}': {err['msg']}" for err in e.errors()[:10]]
        more = f"\n- ... and {e.error_count() - 10} more" if e.error_count() > 10 else ""
        return (
            f"the state does not fit {env.state_model.__name__} ({e.error_count()} errors):\n" + "\n".join(lines) + more
        )
    return None


def check_initial(
    pool: EnvPool, chain: ToolChain, states: dict[str, dict[str, Any]], core: CoreIds, seed: int
) -> tuple[States, PiStarOutcome | None, str | None]:
    """Load every state, then let π* execute the chain on it."""
    loaded, problem = load_states(pool, chain.servers, states)
    if problem:
        return {}, None, problem
    solved = solve_chain(pool, chain, loaded, core, seed=seed)
    if not solved.ok:
        return (
            loaded,
            solved,
            (
                f"the states load, but the chain cannot be executed on them ({solved.failure}); add or change "
                "records so that every call of the chain has what it needs"
            ),
        )
    return loaded, solved, None


def schema_generate(
    deps: AgentDeps,
    pool: EnvPool,
    chain: ToolChain,
    prep: Preparation,
    config: QueryGenConfig,
    seed: int,
) -> SchemaOutcome:
    envs = {name: pool.get(name) for name in chain.servers}
    messages = deps.prompts.get("querygen/schema").render(
        scenario=prep.scenario,
        profile=prep.profile,
        environments=[
            {**view, "state_schema": _state_schema(envs[view["name"]])}
            for view in environments_view(pool, chain.servers)
        ],
        tools=chain_view(pool, chain),
        examples={name: example_state(env, seed) for name, env in envs.items()},
    )
    found: dict[str, Any] = {}

    def check(answer: InitialStates) -> str | None:
        loaded, solved, problem = check_initial(pool, chain, answer.states, answer.core_ids, seed)
        found.update(states=loaded, solved=solved, core=answer.core_ids)
        return problem

    answer = ask_checked(deps, messages, InitialStates, check, retries=config.schema_retries)
    if not answer.ok:
        return SchemaOutcome(ok=False, error=answer.error, attempts=answer.attempts)
    return SchemaOutcome(
        ok=True, states=found["states"], core_ids=found["core"], solved=found["solved"], attempts=answer.attempts
    )


def given_schema(pool: EnvPool, chain: ToolChain, states: States, core: CoreIds, seed: int) -> SchemaOutcome:
    """A precomputed initial state (e.g. the offline generator's): checked and solved the same way, no model."""
    loaded, solved, problem = check_initial(pool, chain, states, core, seed)
    if problem:
        return SchemaOutcome(ok=False, error=problem, source="given")
    return SchemaOutcome(ok=True, states=loaded, core_ids=core, solved=solved, source="given")


# ---- generate and refine ---------------------------------------------------------------------------


class TurnQuery(BaseModel):
    """generate's answer: the subgoals of the turn, then the user's request and intent."""

    subgoals: list[str] = Field(default_factory=list)
    query: str = Field(min_length=1)
    user_intent: str = Field(min_length=1)


class RefinedQuery(BaseModel):
    """refine's answer: which transformations were applied, and the refined request and intent."""

    transformations: list[str] = Field(default_factory=list)
    query: str = Field(min_length=1)
    user_intent: str = Field(min_length=1)


def generate(
    deps: AgentDeps,
    pool: EnvPool,
    prep: Preparation,
    planned: list[PlannedCall],
    history: list[Node],
    turn: int,
    n_turns: int,
) -> Structured[TurnQuery]:
    messages = deps.prompts.get("querygen/generate").render(
        profile=prep.profile,
        scenario=prep.scenario,
        history=history_view(history),
        turn=f"{turn + 1} of {n_turns}",
        calls=calls_view(pool, planned),
    )
    return ask_checked(deps, messages, TurnQuery, lambda q: None if q.query.strip() else "the query is empty")


def refine(
    deps: AgentDeps,
    pool: EnvPool,
    prep: Preparation,
    planned: list[PlannedCall],
    history: list[Node],
    draft: TurnQuery,
) -> Structured[RefinedQuery]:
    messages = deps.prompts.get("querygen/refine").render(
        profile=prep.profile,
        history=history_view(history),
        query=draft.query,
        user_intent=draft.user_intent,
        calls=calls_view(pool, planned),
    )
    return ask_checked(deps, messages, RefinedQuery, lambda q: None if q.query.strip() else "the query is empty")
