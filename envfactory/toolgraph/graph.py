"""`ToolGraph`: Tool and Parameter nodes in one NetworkX DiGraph, and the queries the sampler asks.

Nodes (attribute `type`):

- `tool` — id `env.tool`; attributes env, name, description, kind (read/write), domain;
- `parameter` — id `env.tool:in:name` or `env.tool:out:name`; attributes direction, tool, env, name,
  aliases, json_type, description, origin, path, text (what was embedded); inputs also carry required,
  user_provided, user_provided_source (heuristic/llm) and user_provided_reason.

Edges (attribute `type`):

- `Tool_Input` — input parameter → its tool, with `required`;
- `Tool_Output` — tool → its output parameter;
- `Parameter_Relate` — output ↔ input parameter of two different tools whose similarity passed the
  threshold, that a schema rule relates (`schema_edges`) or that the LLM related: stored in both
  directions, `flow` true on output → input; attributes score, name_type, desc (0 for a schema
  relation, 1 for the LLM's), found_by (similarity/schema/llm), reason, and rule for a schema relation;
- `Tool_Depend` — tool → tool when some output of the first relates to an input of the second (or the
  LLM added the dependency); attributes via (list of [output, input, score]), score (best similarity),
  found_by (what first made it: similarity, else schema; llm when the LLM added it), reason, cross_env.

(Edge attributes avoid the names `source` and `target`: node-link JSON uses them for the endpoints.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel

from envfactory.config import ToolGraphSettings
from envfactory.toolgraph.params import ParamSpec, ToolSource

FoundBy = Literal["similarity", "schema", "llm"]
TOOL, PARAMETER = "tool", "parameter"
TOOL_INPUT, TOOL_OUTPUT = "Tool_Input", "Tool_Output"
PARAMETER_RELATE, TOOL_DEPEND = "Parameter_Relate", "Tool_Depend"
_DEFAULT_HOPS = int(ToolGraphSettings.model_fields["validate_hops"].default)


class GraphStats(BaseModel):
    """Counts of a graph (or of one environment's subgraph)."""

    envs: int
    tools: int
    read_tools: int
    write_tools: int
    inputs: int
    outputs: int
    user_provided: int
    internal: int
    parameter_relate: int  # output → input relations (each stored twice)
    tool_depend: int
    cross_env_depend: int
    llm_depend: int
    schema_depend: int = 0  # Tool_Depend edges only the schema rules found
    isolated_tools: int  # no Tool_Depend edge in or out
    unsatisfiable_tools: int  # a required internal input that no tool outputs


class ToolGraph:
    """The dependency tool graph. `g` is the plain NetworkX graph; everything here reads or edits it."""

    def __init__(self, g: nx.DiGraph | None = None, settings: ToolGraphSettings | None = None) -> None:
        self.g: nx.DiGraph = g if g is not None else nx.DiGraph()
        if settings is not None:
            self.g.graph["settings"] = settings.model_dump(mode="json")
        self._reach: dict[str, dict[str, tuple[str, int]]] = {}

    # ---- construction -----------------------------------------------------------------------------

    @property
    def settings(self) -> ToolGraphSettings:
        return ToolGraphSettings.model_validate(self.g.graph.get("settings", {}))

    def add_tool(self, source: ToolSource) -> str:
        tid = source.tool_id
        self.g.add_node(
            tid,
            type=TOOL,
            env=source.env,
            name=source.spec.name,
            description=source.spec.description,
            kind=source.spec.kind,
            domain=source.domain,
        )
        return tid

    def add_param(self, p: ParamSpec) -> str:
        pid = p.node_id
        self.g.add_node(pid, type=PARAMETER, text=p.text, **p.model_dump())
        if p.direction == "input":
            self.g.add_edge(pid, p.tool, type=TOOL_INPUT, required=p.required)
        else:
            self.g.add_edge(p.tool, pid, type=TOOL_OUTPUT)
        return pid

    def relate(
        self,
        out_pid: str,
        in_pid: str,
        *,
        score: float,
        name_type: float = 0.0,
        desc: float = 0.0,
        found_by: FoundBy = "similarity",
        reason: str = "",
        rule: str = "",
    ) -> None:
        """A Parameter_Relate pair (both directions) and the Tool_Depend edge it implies (`rule`: which
        schema rule found it, for `found_by="schema"`)."""
        attrs: dict[str, Any] = {
            "score": score, "name_type": name_type, "desc": desc, "found_by": found_by, "reason": reason,
        }  # fmt: skip
        if rule:
            attrs["rule"] = rule
        for a, b, flow in ((out_pid, in_pid, True), (in_pid, out_pid, False)):
            if self.g.has_edge(a, b):  # related again (the LLM confirming a rule's pair): the new say only
                self.g.edges[a, b].clear()
            self.g.add_edge(a, b, type=PARAMETER_RELATE, flow=flow, **attrs)
        a, b = self.g.nodes[out_pid]["tool"], self.g.nodes[in_pid]["tool"]
        via = [self.g.nodes[out_pid]["name"], self.g.nodes[in_pid]["name"], round(float(score), 4)]
        self.add_depend(a, b, via=[via], score=score, found_by=found_by, reason=reason)

    def add_depend(
        self,
        a: str,
        b: str,
        *,
        via: Sequence[Sequence[Any]] = (),
        score: float = 0.0,
        found_by: FoundBy = "similarity",
        reason: str = "",
    ) -> None:
        """Add (or extend) the Tool_Depend edge a → b."""
        self._reach.clear()
        data = self.g.get_edge_data(a, b)
        if data is None:
            self.g.add_edge(
                a,
                b,
                type=TOOL_DEPEND,
                via=[list(v) for v in via],
                score=float(score),
                found_by=found_by,
                reason=reason,
                cross_env=self.env_of(a) != self.env_of(b),
            )
            return
        data["via"].extend(list(v) for v in via if list(v) not in data["via"])
        data["score"] = max(float(data["score"]), float(score))
        if found_by == "llm" and reason:
            data["reason"] = reason
        if found_by == "llm" and data["found_by"] == "schema":
            data["found_by"] = "llm"  # no longer the rules' alone: the LLM asks for it too

    def changed(self) -> None:
        """Forget what was derived from the dependencies (call after editing `g` directly)."""
        self._reach.clear()

    def remove_depend(self, a: str, b: str) -> int:
        """Remove Tool_Depend a → b and every Parameter_Relate between a's outputs and b's inputs; the
        number of parameter relations removed."""
        self._reach.clear()
        if self.g.has_edge(a, b) and self.g.edges[a, b]["type"] == TOOL_DEPEND:
            self.g.remove_edge(a, b)
        removed = 0
        for o in self.outputs(a):
            for i in list(self.g.successors(o)):
                if self.g.nodes[i].get("tool") == b and self.g.edges[o, i]["type"] == PARAMETER_RELATE:
                    self.g.remove_edge(o, i)
                    self.g.remove_edge(i, o)
                    removed += 1
        return removed

    # ---- lookups ------------------------------------------------------------------------------------

    def is_tool(self, node: str) -> bool:
        return node in self.g and self.g.nodes[node].get("type") == TOOL

    def tools(self, env: str | None = None) -> list[str]:
        return sorted(
            n for n, d in self.g.nodes(data=True) if d.get("type") == TOOL and (env is None or d["env"] == env)
        )

    def envs(self) -> list[str]:
        return sorted({d["env"] for _, d in self.g.nodes(data=True) if d.get("type") == TOOL})

    def env_of(self, node: str) -> str:
        return str(self.g.nodes[node]["env"])

    def node(self, node: str) -> dict[str, Any]:
        return dict(self.g.nodes[node])

    def inputs(self, tool: str) -> list[str]:
        """Input parameter nodes of `tool`, in schema order."""
        return [p for p in self.g.predecessors(tool) if self.g.edges[p, tool]["type"] == TOOL_INPUT]

    def outputs(self, tool: str) -> list[str]:
        return [p for p in self.g.successors(tool) if self.g.edges[tool, p]["type"] == TOOL_OUTPUT]

    def input_named(self, tool: str, name: str) -> str | None:
        return next((p for p in self.inputs(tool) if self.g.nodes[p]["name"] == name), None)

    def output_named(self, tool: str, name: str) -> str | None:
        return next((p for p in self.outputs(tool) if self.g.nodes[p]["name"] == name), None)

    def required(self, param: str) -> bool:
        return bool(self.g.nodes[param].get("required", False))

    def user_provided(self, param: str) -> bool:
        return bool(self.g.nodes[param].get("user_provided", False))

    def related(self, param: str) -> list[str]:
        """Parameters related to `param` (outputs for an input, inputs for an output), sorted."""
        return sorted(n for n in self.g.successors(param) if self.g.edges[param, n]["type"] == PARAMETER_RELATE)

    def tools_that_output(self, param: str, target_tool: str | None = None) -> list[str]:
        """Tools with an output directly related to input `param` (never `target_tool` itself), sorted."""
        tools = {self.g.nodes[o]["tool"] for o in self.related(param)}
        tools.discard(target_tool or self.g.nodes[param]["tool"])
        return sorted(tools)

    def successor_tools(self, tool: str, exclude: Iterable[str] = ()) -> list[str]:
        skip = set(exclude)
        return sorted(
            n
            for n in self.g.successors(tool)
            if self.g.edges[tool, n]["type"] == TOOL_DEPEND and n not in skip and n != tool
        )

    def predecessor_tools(self, tool: str) -> list[str]:
        return sorted(n for n in self.g.predecessors(tool) if self.g.edges[n, tool]["type"] == TOOL_DEPEND)

    def depend_edges(self, env: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """Tool_Depend edges (of tools of `env` on both ends, when given), sorted."""
        out = [
            (a, b, d)
            for a, b, d in self.g.edges(data=True)
            if d["type"] == TOOL_DEPEND and (env is None or (self.env_of(a) == env and self.env_of(b) == env))
        ]
        return sorted(out, key=lambda e: (e[0], e[1]))

    # ---- satisfiability -------------------------------------------------------------------------------

    def producer_reach(self, param: str) -> dict[str, tuple[str, int]]:
        """Tools that produce input `param` directly or indirectly: tool → (its output node, hops).

        Directly: one of the tool's outputs relates to `param` (1 hop). Indirectly: through the
        Parameter_Relate relation taken as an equivalence of values, up to `validate_hops` hops
        (3: `param` ↔ an output ↔ another input ↔ this tool's output — the same value under another
        tool's input). Cached until the graph's dependencies change.
        """
        cached = self._reach.get(param)
        if cached is not None:
            return cached
        # read directly, not through `settings`: this runs for every input the sampler checks
        max_hops = int(self.g.graph.get("settings", {}).get("validate_hops", _DEFAULT_HOPS))
        own_tool = self.g.nodes[param]["tool"]
        reach: dict[str, tuple[str, int]] = {}
        seen = {param}
        frontier: deque[tuple[str, int]] = deque([(param, 0)])
        while frontier:
            node, hops = frontier.popleft()
            if hops >= max_hops:
                continue
            for nxt in self.related(node):
                if nxt in seen:
                    continue
                seen.add(nxt)
                data = self.g.nodes[nxt]
                if data["direction"] == "output" and data["tool"] != own_tool:
                    reach.setdefault(data["tool"], (nxt, hops + 1))
                frontier.append((nxt, hops + 1))
        self._reach[param] = reach
        return reach

    def validate_parameter(self, param: str, visited_tools: Iterable[str]) -> bool:
        """True if input `param` is user-provided or produced, directly or indirectly, by a visited tool."""
        if self.user_provided(param):
            return True
        reach = self.producer_reach(param)
        return any(t in reach for t in visited_tools)

    def provider(self, param: str, visited_tools: Sequence[str]) -> tuple[str, str] | None:
        """The visited tool that provides `param` and through which output: fewest hops first, then the
        latest visited (the freshest value); None when no visited tool produces it."""
        reach = self.producer_reach(param)
        best: tuple[int, int, str, str] | None = None
        for pos, tool in enumerate(visited_tools):
            if tool in reach:
                out, hops = reach[tool]
                key = (hops, -pos, tool, out)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[2], best[3])

    def unsatisfiable_inputs(self, tool: str) -> list[str]:
        """Required internal inputs of `tool` that no tool of the graph produces."""
        return [
            p
            for p in self.inputs(tool)
            if self.required(p) and not self.user_provided(p) and not self.producer_reach(p)
        ]

    # ---- views ----------------------------------------------------------------------------------------

    def subgraph(self, env: str) -> ToolGraph:
        """One environment's tools, their parameters and the edges among them (a copy)."""
        tools = set(self.tools(env))
        if not tools:
            raise KeyError(env)
        keep = {n for n, d in self.g.nodes(data=True) if n in tools or d.get("tool") in tools}
        # built node by node and edge by edge in this graph's order: a networkx subgraph *view* iterates
        # its node set, whose order changes with the process's hash seed, and the sampler's random
        # choices follow the order of inputs, so the same seed would give other chains in another process
        g = nx.DiGraph()
        g.graph = dict(self.g.graph)
        g.add_nodes_from((n, dict(d)) for n, d in self.g.nodes(data=True) if n in keep)
        g.add_edges_from((a, b, dict(d)) for a, b, d in self.g.edges(data=True) if a in keep and b in keep)
        return ToolGraph(g)

    def stats(self) -> GraphStats:
        tools = self.tools()
        params = [(n, d) for n, d in self.g.nodes(data=True) if d.get("type") == PARAMETER]
        inputs = [(n, d) for n, d in params if d["direction"] == "input"]
        depend = self.depend_edges()
        linked = {a for a, _, _ in depend} | {b for _, b, _ in depend}
        return GraphStats(
            envs=len(self.envs()),
            tools=len(tools),
            read_tools=sum(self.g.nodes[t]["kind"] == "read" for t in tools),
            write_tools=sum(self.g.nodes[t]["kind"] == "write" for t in tools),
            inputs=len(inputs),
            outputs=len(params) - len(inputs),
            user_provided=sum(bool(d.get("user_provided")) for _, d in inputs),
            internal=sum(not d.get("user_provided") for _, d in inputs),
            parameter_relate=sum(
                1 for _, _, d in self.g.edges(data=True) if d["type"] == PARAMETER_RELATE and d["flow"]
            ),
            tool_depend=len(depend),
            cross_env_depend=sum(bool(d["cross_env"]) for _, _, d in depend),
            llm_depend=sum(d["found_by"] == "llm" for _, _, d in depend),
            schema_depend=sum(d["found_by"] == "schema" for _, _, d in depend),
            isolated_tools=len(tools) - len(linked & set(tools)),
            unsatisfiable_tools=sum(bool(self.unsatisfiable_inputs(t)) for t in tools),
        )
