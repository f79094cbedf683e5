"""EnvGen's wiring: the routing after a test round, `build`, and `graph` for Studio."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from envfactory.envgen.checks import ErrorReport
from graphs.envgen.nodes import node_code, node_register, node_reject, node_revise, node_search, node_test
from graphs.envgen.state import EnvGenContext, EnvGenState, settings_of
from graphs.routing import ok_or_end


def after_test(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> str:
    if state.get("status") == "failed":
        return END
    settings = settings_of(runtime.context)
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
