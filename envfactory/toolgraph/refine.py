"""LLM logical refinement of one environment's dependencies (prompt `toolgraph/refine`).

Similarity misses logical dependencies (a login before a post, a parameter-less tool whose result
the next one needs) and adds spurious ones (two tools sharing a `status` field). The model proposes
additions and removals with a reason each; a change is applied only when it names existing tools of
that environment (and, for a removal, an existing edge). An added edge that names an existing output
of the source and input of the target also relates those parameters (source "llm"), so the sampler
can use it to satisfy that input; a parameter-less one only guides the successor walk.
"""

from __future__ import annotations

from typing import Literal

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.structured import ask_structured
from envfactory.llm.usage import UsageTracker
from envfactory.toolgraph.graph import ToolGraph

PROMPT = "toolgraph/refine"


class EdgeAdd(BaseModel):
    source: str
    target: str
    output: str | None = None
    input: str | None = None
    reason: str = ""


class EdgeRemove(BaseModel):
    source: str
    target: str
    reason: str = ""


class RefineAnswer(BaseModel):
    add: list[EdgeAdd] = Field(default_factory=list)
    remove: list[EdgeRemove] = Field(default_factory=list)


class RefineChange(BaseModel):
    """One proposed change and what became of it."""

    env: str
    action: Literal["add", "remove"]
    source: str
    target: str
    output: str | None = None
    input: str | None = None
    reason: str
    applied: bool
    note: str = ""  # why it was not applied, or what else was done


class RefineReport(BaseModel):
    env: str
    ok: bool
    changes: list[RefineChange] = Field(default_factory=list)
    error: str | None = None


def _describe(graph: ToolGraph, env: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    tools = []
    for t in graph.tools(env):
        d = graph.node(t)
        inputs = [
            {
                "name": graph.node(p)["name"],
                "type": graph.node(p)["json_type"],
                "required": graph.required(p),
                "user_provided": graph.user_provided(p),
            }
            for p in graph.inputs(t)
        ]
        outputs = [graph.node(p)["name"] for p in graph.outputs(t)]
        tools.append(
            {
                "name": d["name"],
                "kind": d["kind"],
                "description": d["description"],
                "inputs": inputs,
                "outputs": outputs,
            }
        )
    edges = [
        {"source": graph.node(a)["name"], "target": graph.node(b)["name"], "via": [v[:2] for v in d["via"]]}
        for a, b, d in graph.depend_edges(env)
    ]
    return tools, edges


def refine_env(
    graph: ToolGraph,
    env: str,
    env_description: str,
    *,
    model: BaseChatModel,
    library: PromptLibrary,
    retries: int,
    role: str,
    usage: UsageTracker | None = None,
) -> RefineReport:
    """Ask for and apply the refinement of `env`'s edges, in place."""
    tools, edges = _describe(graph, env)
    messages = library.get(PROMPT).render(environment=f"{env}: {env_description}", tools=tools, edges=edges)
    answer = ask_structured(model, messages, RefineAnswer, library=library, retries=retries, role=role, usage=usage)
    if not answer.ok or answer.value is None:
        return RefineReport(env=env, ok=False, error=answer.error)
    report = RefineReport(env=env, ok=True)

    def tool_id(name: str) -> str | None:
        tid = name if name.startswith(f"{env}.") else f"{env}.{name}"
        return tid if graph.is_tool(tid) and graph.env_of(tid) == env else None

    for r in answer.value.remove:
        a, b = tool_id(r.source), tool_id(r.target)
        change = RefineChange(
            env=env, action="remove", source=r.source, target=r.target, reason=r.reason, applied=False
        )
        if a is None or b is None:
            change.note = "names a tool the environment does not have"
        elif not graph.g.has_edge(a, b) or graph.g.edges[a, b]["type"] != "Tool_Depend":
            change.note = "no such edge"
        else:
            removed = graph.remove_depend(a, b)
            change.applied, change.note = True, f"removed with {removed} parameter relation(s)"
        report.changes.append(change)

    for e in answer.value.add:
        a, b = tool_id(e.source), tool_id(e.target)
        change = RefineChange(
            env=env, action="add", source=e.source, target=e.target, output=e.output, input=e.input,
            reason=e.reason, applied=False,
        )  # fmt: skip
        if a is None or b is None:
            change.note = "names a tool the environment does not have"
        elif a == b:
            change.note = "a tool cannot depend on itself"
        else:
            existed = graph.g.has_edge(a, b) and graph.g.edges[a, b]["type"] == "Tool_Depend"
            out_p = graph.output_named(a, e.output) if e.output else None
            in_p = graph.input_named(b, e.input) if e.input else None
            reason = e.reason or "LLM refinement"
            if out_p is not None and in_p is not None:
                graph.relate(out_p, in_p, score=1.0, found_by="llm", reason=reason)
                change.note = "with a parameter relation"
            else:
                graph.add_depend(a, b, score=1.0, found_by="llm", reason=reason)
                if e.output or e.input:
                    change.note = "parameter-less: the named output or input does not exist"
            if existed:
                change.note = "already an edge: the reason is recorded on it"
            change.applied = True
        report.changes.append(change)
    return report
