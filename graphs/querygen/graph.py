"""QueryGen's wiring: the fan-out to k solver branches, the routing, `build`, and `graph` for Studio."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from envfactory.querygen.records import SolveTask, TurnDraft
from graphs.querygen.nodes import (
    node_advance,
    node_filter,
    node_finish,
    node_generate,
    node_prepare,
    node_refine,
    node_schema_generate,
    node_select,
    node_solve,
)
from graphs.querygen.state import (
    QueryGenContext,
    QueryGenInput,
    QueryGenState,
    chain_of,
    config_of,
    dump,
    prep_of,
    turn_plan,
)
from graphs.routing import ok_or_end


def _fan_out(state: QueryGenState) -> list[Send]:
    config, draft, prep = config_of(state), TurnDraft.model_validate(state["draft"]), prep_of(state)
    chain = chain_of(state)
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
            raw_calls=turn_plan(state, draft.turn),
            history=state.get("nodes") or [],
            user_tools=prep.user_tools,
        )
        for i in range(config.pass_k)
    ]
    return [Send("solve", {"solve_task": dump(t)}) for t in tasks]


def after_generate(state: QueryGenState) -> str | list[Send]:
    if state.get("status") == "dropped":
        return END
    return "refine" if config_of(state).enable_query_refinement else _fan_out(state)


def after_refine(state: QueryGenState) -> str | list[Send]:
    return END if state.get("status") == "dropped" else _fan_out(state)


def after_select(state: QueryGenState) -> str:
    if state.get("status") == "dropped":
        return END
    return "filter" if config_of(state).enable_filtering else "advance"


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
