"""EnvGen's graph state and context, and the readers the nodes share."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from langgraph.runtime import Runtime
from typing_extensions import TypedDict  # pydantic (Studio's JSON schemas) needs it below Python 3.12

from envfactory.config import Settings, get_settings
from envfactory.env.metadata import EnvMetadata
from envfactory_agents.common import AgentDeps

Status = Literal["running", "registered", "rejected", "failed"]


class EnvGenState(TypedDict, total=False):
    request: dict[str, Any]  # EnvGenRequest
    metadata: dict[str, Any] | None  # EnvMetadata
    search: dict[str, Any] | None  # SearchReport
    code: str | None
    plan: dict[str, Any] | None  # CompiledPlan: the candidate, when the Code Agent revises a compiled draft
    draft: dict[str, Any] | None  # Draft.record(): the spec's compiled draft (or why none), the gate's verdict on it
    scenarios: list[dict[str, Any]]  # TestScenario, written once by the Test Agent, kept across revisions
    report: dict[str, Any] | None  # the latest ErrorReport
    reports: Annotated[list[dict[str, Any]], operator.add]  # every round's ErrorReport
    revision: int
    status: Status
    failure: str | None
    output: str | None  # where register / reject wrote the environment
    # the run's options as `envgen run` was given them (RunOptions): kept with the thread so that `envgen resume`
    # goes on as the run started (the context is not checkpointed); no node reads it
    options: dict[str, Any] | None


@dataclass
class EnvGenContext:
    """Per-run configuration (CLI flags, or `context` of a LangGraph SDK run)."""

    prompt_overrides: dict[str, str] = field(default_factory=dict)
    revision_budget: int | None = None
    pass_threshold: float | None = None
    n_scenarios: int = 4
    draft: bool = True  # a spec that compiles (corpus entry, OpenAPI file): revise its compiled plan, write no code
    settings: Any = None  # Settings (typed Any: Studio builds a JSON schema of the context); default: the process's


def settings_of(ctx: EnvGenContext | None) -> Settings:
    """The run's settings (the context's, else the process's) with the context's budget and threshold."""
    if ctx is None:
        return get_settings()
    settings = ctx.settings if isinstance(ctx.settings, Settings) else get_settings()
    update: dict[str, Any] = {}
    if ctx.revision_budget is not None:
        update["revision_budget"] = ctx.revision_budget
    if ctx.pass_threshold is not None:
        update["pass_threshold"] = ctx.pass_threshold
    return settings.model_copy(update=update)


def deps_of(runtime: Runtime[EnvGenContext]) -> AgentDeps:
    ctx = runtime.context
    overrides = dict(ctx.prompt_overrides) if ctx else {}
    return AgentDeps(settings=settings_of(ctx), prompt_overrides=overrides)


def failed(message: str) -> EnvGenState:
    return {"status": "failed", "failure": message}


def meta_of(state: EnvGenState) -> EnvMetadata:
    assert state.get("metadata") is not None
    return EnvMetadata.model_validate(state["metadata"])
