"""EnvGen: search → code → test → (pass → register | errors, budget left → revise → test | budget spent → reject).

A checkpointed LangGraph state machine. `build(checkpointer)` is for the CLI and tests (SQLite by
default, run with `durability="sync"` so a killed process resumes mid-loop); `graph` is the
checkpointer-free export for `langgraph.json` / LangGraph Studio. Every node is a thin wrapper over
an agent in `agents/`; every failure is a state (`status: failed` + `failure`), routed to END.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from agents.code import generate_code, revise_code
from agents.common import AgentDeps
from agents.search import EnvGenRequest, search_environment
from agents.test import generate_scenarios, run_tests
from envfactory.config import Settings, get_settings
from envfactory.env.metadata import EnvMetadata, dump_metadata
from envfactory.env.pool import EnvPool
from envfactory.env.sandbox import SandboxUnavailable
from envfactory.envgen.checks import ErrorReport, TestScenario
from envfactory.envgen.health import HealthSettings, gate
from envfactory.envgen.registry import registry_lock
from envfactory.envgen.validate import sync_registry, validate_env
from envfactory.errors import EnvFactoryError
from graphs.routing import ok_or_end

Status = Literal["running", "registered", "rejected", "failed"]


class EnvGenState(TypedDict, total=False):
    request: dict[str, Any]  # EnvGenRequest
    metadata: dict[str, Any] | None  # EnvMetadata
    search: dict[str, Any] | None  # SearchReport
    code: str | None
    scenarios: list[dict[str, Any]]  # TestScenario, written once by the Test Agent, kept across revisions
    report: dict[str, Any] | None  # the latest ErrorReport
    reports: Annotated[list[dict[str, Any]], operator.add]  # every round's ErrorReport
    revision: int
    status: Status
    failure: str | None
    output: str | None  # where register / reject wrote the environment


@dataclass
class EnvGenContext:
    """Per-run configuration (CLI flags, or `context` of a LangGraph SDK run)."""

    prompt_overrides: dict[str, str] = field(default_factory=dict)
    revision_budget: int | None = None
    pass_threshold: float | None = None
    n_scenarios: int = 4


def _settings(ctx: EnvGenContext | None) -> Settings:
    settings = get_settings()
    if ctx is None:
        return settings
    update: dict[str, Any] = {}
    if ctx.revision_budget is not None:
        update["revision_budget"] = ctx.revision_budget
    if ctx.pass_threshold is not None:
        update["pass_threshold"] = ctx.pass_threshold
    return settings.model_copy(update=update)


def _deps(runtime: Runtime[EnvGenContext]) -> AgentDeps:
    ctx = runtime.context
    overrides = dict(ctx.prompt_overrides) if ctx else {}
    return AgentDeps(settings=_settings(ctx), prompt_overrides=overrides)


def _failed(message: str) -> EnvGenState:
    return {"status": "failed", "failure": message}


def _meta(state: EnvGenState) -> EnvMetadata:
    assert state.get("metadata") is not None
    return EnvMetadata.model_validate(state["metadata"])


# ---- nodes ----------------------------------------------------------------------------------
def node_search(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    request = EnvGenRequest.model_validate(state.get("request") or {})
    try:
        outcome = search_environment(_deps(runtime), request)
    except EnvFactoryError as e:  # a bad metadata/OpenAPI file: a recorded failure, not a crash
        return _failed(f"search: {e}")
    if not outcome.ok or outcome.metadata is None:
        return {**_failed(outcome.error or "search failed"), "search": outcome.report.model_dump(mode="json")}
    return {
        "metadata": outcome.metadata.model_dump(mode="json", exclude_none=True),
        "search": outcome.report.model_dump(mode="json"),
        "status": "running",
        "revision": 0,
    }


def node_code(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    result = generate_code(_deps(runtime), _meta(state))
    if not result.ok:
        return _failed(f"code: {result.error}")
    return {"code": result.value}


def node_test(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    deps = _deps(runtime)
    meta = _meta(state)
    update: EnvGenState = {}
    scenarios = [TestScenario.model_validate(s) for s in state.get("scenarios") or []]
    if not scenarios:
        n = runtime.context.n_scenarios if runtime.context else 4
        generated = generate_scenarios(deps, meta, n)
        if generated.value is None:
            return _failed(f"test: scenarios: {generated.error}")
        scenarios = generated.value.scenarios
        update["scenarios"] = [s.model_dump(mode="json") for s in scenarios]
    assert state.get("code") is not None
    try:
        report = run_tests(deps, state["code"] or "", meta, scenarios)
    except SandboxUnavailable as e:  # no OS sandbox here: untrusted code is not run at all
        return _failed(f"test: {e}")
    dumped = report.model_dump(mode="json")
    return {**update, "report": dumped, "reports": [dumped]}


def node_revise(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    report = ErrorReport.model_validate(state["report"])
    result = revise_code(_deps(runtime), _meta(state), state.get("code") or "", report)
    if not result.ok:
        return _failed(f"revise: {result.error}")
    return {"code": result.value, "revision": state.get("revision", 0) + 1}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")[:60] or "scenario"


def _write_env(folder: Path, state: EnvGenState, meta: EnvMetadata) -> None:
    (folder / "scenarios" / "tests").mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(state.get("code") or "", encoding="utf-8")
    dump_metadata(meta, folder / "metadata.json")
    scenarios = [TestScenario.model_validate(s) for s in state.get("scenarios") or []]
    for i, s in enumerate(scenarios):
        name = "default" if i == 0 else _slug(s.name)
        (folder / "scenarios" / f"{name}.json").write_text(json.dumps(s.initial_config, indent=2) + "\n")
        (folder / "scenarios" / "tests" / f"{_slug(s.name)}.json").write_text(s.model_dump_json(indent=2) + "\n")
    (folder / "envgen.json").write_text(
        json.dumps({"search": state.get("search"), "reports": state.get("reports", [])}, indent=2) + "\n"
    )


def node_register(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """Write `envs/<name>/`, load it as the pool would, validate, add it to the registry."""
    settings = _settings(runtime.context)
    meta = _meta(state)
    folder = settings.envs_path / meta.name
    # one registration at a time (threads of a batch, other processes): write, load, validate, list
    with registry_lock(settings.registry_file):
        if (folder / "env.py").exists() and not (folder / "envgen.json").exists():
            return _failed(f"register: {folder} holds a hand-written environment; not overwritten")
        _write_env(folder, state, meta)
        pool = EnvPool(settings)
        try:  # untrusted: loaded in the same OS sandbox it was judged in, never in this process
            pool.get(meta.name)
        except EnvFactoryError as e:
            return _failed(f"register: the written environment does not load: {e}")
        report = validate_env(pool, meta.name)
        gate(pool, report, HealthSettings(calls=settings.health_calls))  # unhealthy: not registered
        sync_registry(pool, [report])
    if not report.ok:
        return _failed(f"register: validation failed: {'; '.join(report.problems)}")
    return {"status": "registered", "output": str(folder)}


def node_reject(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """Keep the rejected environment with its reports for inspection (outside the pool)."""
    settings = _settings(runtime.context)
    meta = _meta(state)
    folder = settings.data_path / "rejected" / meta.name
    _write_env(folder, state, meta)
    return {"status": "rejected", "output": str(folder)}


# ---- routing --------------------------------------------------------------------------------
def after_test(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> str:
    if state.get("status") == "failed":
        return END
    settings = _settings(runtime.context)
    report = ErrorReport.model_validate(state["report"])
    if report.passed(settings.pass_threshold):
        return "register"
    if state.get("revision", 0) < settings.revision_budget:
        return "revise"
    return "reject"


def build(checkpointer: BaseCheckpointSaver[Any] | None = None) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(EnvGenState, context_schema=EnvGenContext)
    g.add_node("search", node_search)
    g.add_node("code", node_code)
    g.add_node("test", node_test)
    g.add_node("revise", node_revise)
    g.add_node("register", node_register)
    g.add_node("reject", node_reject)
    g.add_edge(START, "search")
    g.add_conditional_edges("search", ok_or_end("code", "failed"), ["code", END])
    g.add_conditional_edges("code", ok_or_end("test", "failed"), ["test", END])
    g.add_conditional_edges("test", after_test, ["register", "revise", "reject", END])
    g.add_conditional_edges("revise", ok_or_end("test", "failed"), ["test", END])
    g.add_edge("register", END)
    g.add_edge("reject", END)
    return g.compile(checkpointer=checkpointer, name="envgen")


# checkpointer-free, for langgraph.json (the dev server refuses graphs with their own)
graph = build()
