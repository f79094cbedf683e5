"""QueryGen's graph state, its input and context, and the readers the nodes share."""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from langgraph.runtime import Runtime
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic (Studio's JSON schemas) needs it below Python 3.12

from envfactory.config import Settings, get_settings
from envfactory.env.pool import EnvPool
from envfactory.querygen.records import Preparation, QueryGenConfig
from envfactory.records.models import Node, PlannedCall, States
from envfactory.toolgraph.sampler import ToolChain
from envfactory_agents.common import AgentDeps

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
    settings: Any = None  # Settings (typed Any, as `pool`); default: read from the environment once per run


def settings_of(runtime: Runtime[QueryGenContext]) -> Settings:
    """The run's settings: the context's, else the process's (a Studio run without a context)."""
    ctx = runtime.context
    return ctx.settings if ctx is not None and isinstance(ctx.settings, Settings) else get_settings()


# Studio and SDK runs carry no pool in their context: one pool per settings, shared by the process
# (solver branches run in threads, hence the lock). The CLI and the batch runner pass theirs.
_POOLS: dict[str, EnvPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_of(runtime: Runtime[QueryGenContext]) -> EnvPool:
    ctx = runtime.context
    if ctx is not None and isinstance(ctx.pool, EnvPool):
        return ctx.pool
    settings = settings_of(runtime)
    key = f"{settings.envs_path}|{settings.bfcl}"
    with _POOLS_LOCK:  # solver branches run in threads
        if key not in _POOLS:
            _POOLS[key] = EnvPool(settings)
        return _POOLS[key]


def deps_of(runtime: Runtime[QueryGenContext]) -> AgentDeps:
    ctx = runtime.context
    return AgentDeps(settings=settings_of(runtime), prompt_overrides=dict(ctx.prompt_overrides) if ctx else {})


def dropped(message: str) -> QueryGenState:
    return {"status": "dropped", "failure": message}


def config_of(state: QueryGenState) -> QueryGenConfig:
    return QueryGenConfig.model_validate(state["config"])


def chain_of(state: QueryGenState) -> ToolChain:
    chain = ToolChain.model_validate(state["chain"])
    return chain.model_copy(update={"turns": state["turns"]}) if state.get("turns") else chain


def prep_of(state: QueryGenState) -> Preparation:
    return Preparation.model_validate(state["preparation"])


def spans(turns: list[list[str]]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for turn in turns:
        spans.append((start, start + len(turn)))
        start += len(turn)
    return spans


def turn_plan(state: QueryGenState, turn: int) -> list[PlannedCall]:
    start, end = spans(state["turns"])[turn]
    return [PlannedCall.model_validate(p) for p in state["plan"][start:end]]


def nodes_of(state: QueryGenState) -> list[Node]:
    return [Node.model_validate(n) for n in state.get("nodes") or []]


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
