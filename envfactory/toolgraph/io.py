"""Save and load the graph (JSON node-link with a format version) and export it as GraphML.

A saved file is `{"format": "envfactory-toolgraph", "format_version": N, "graph": <node-link data>}`.
Loading a file of another version fails with a message saying how to rebuild, instead of handing
the sampler a graph whose attributes mean something else.

A graph saved before the schema rules (`schema_edges`; no `schema_rules` in its graph attributes), or
with another version of them, is the same format: it loads, and gains the schema edges a fresh build
would add (the rules read only the parameter nodes it already has), unless its settings turn them off.
So a cached `<data dir>/toolgraph/graph.json` does not hide them.

A file is data from outside (hand-edited, from another version): every node and edge is checked for what the
graph's readers take from it (a tool's environment and kind, a parameter's tool and direction, an edge's type and
endpoints of the right kinds) before it is handed on — a missing `env` was a KeyError in `graph stats`, and an
edge to a node the file does not hold made an attribute-less node that `sample` and `show` then failed on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError

from envfactory.inputs import read_json, write_atomic
from envfactory.toolgraph.errors import ToolGraphError
from envfactory.toolgraph.graph import (
    PARAMETER,
    PARAMETER_RELATE,
    TOOL,
    TOOL_DEPEND,
    TOOL_INPUT,
    TOOL_OUTPUT,
    FoundBy,
    ToolGraph,
)
from envfactory.toolgraph.schema_edges import add_schema_edges, schema_edges_stale

FORMAT = "envfactory-toolgraph"
FORMAT_VERSION = 1
MAX_GRAPH_BYTES = 1024**3  # node-link JSON of every tool with its schema and edges: can outgrow the 64 MB default


def graph_to_data(graph: ToolGraph) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "graph": nx.node_link_data(graph.g, edges="edges"),
    }


class _Shape(BaseModel):
    """What a node or edge must hold; the rest of its attributes pass as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


class _Tool(_Shape):
    type: Literal["tool"]
    env: StrictStr
    name: StrictStr
    kind: Literal["read", "write"]


class _Parameter(_Shape):
    type: Literal["parameter"]
    tool: StrictStr
    env: StrictStr
    name: StrictStr
    direction: Literal["input", "output"]


class _Depend(_Shape):
    type: Literal["Tool_Depend"]
    cross_env: StrictBool
    via: list[list[Any]]
    score: float
    found_by: FoundBy


class _Relate(_Shape):
    type: Literal["Parameter_Relate"]
    flow: StrictBool
    found_by: FoundBy


_NODES: dict[str, type[BaseModel]] = {TOOL: _Tool, PARAMETER: _Parameter}
# an edge's type, the kinds of node at its ends (tail, head), and what else it must hold
_EDGES: dict[str, tuple[str, str, type[BaseModel] | None]] = {
    TOOL_INPUT: (PARAMETER, TOOL, None),
    TOOL_OUTPUT: (TOOL, PARAMETER, None),
    PARAMETER_RELATE: (PARAMETER, PARAMETER, _Relate),
    TOOL_DEPEND: (TOOL, TOOL, _Depend),
}


def _check_shape(g: nx.DiGraph, source: str) -> None:
    """Every node and edge holds what the graph's readers take from it (see the module)."""

    def bad(what: str, e: ValidationError | None = None) -> ToolGraphError:
        why = f": {e.errors()[0]['loc'][0]} {e.errors()[0]['msg'].lower()}" if e is not None else ""
        return ToolGraphError(f"{source}: malformed graph data: {what}{why}; rebuild it with `envfactory graph build`")

    kinds: dict[Any, str] = {}
    for n, d in g.nodes(data=True):
        model: type[BaseModel] | None = _NODES.get(str(d.get("type")))
        if model is None:
            raise bad(f"node {str(n)[:80]!r} is neither a tool nor a parameter (an edge to a node the file lacks?)")
        try:
            model.model_validate(d)
        except ValidationError as e:
            raise bad(f"node {str(n)[:80]!r}", e) from None
        kinds[n] = d["type"]
    for n, d in g.nodes(data=True):
        if kinds[n] == PARAMETER and kinds.get(d["tool"]) != TOOL:
            raise bad(f"parameter {str(n)[:80]!r} belongs to {str(d['tool'])[:80]!r}, which is no tool of the graph")
    for a, b, d in g.edges(data=True):
        shape = _EDGES.get(str(d.get("type")))
        where = f"edge {str(a)[:60]!r} -> {str(b)[:60]!r}"
        if shape is None:
            raise bad(f"{where} has no known type")
        if (kinds[a], kinds[b]) != shape[:2]:
            raise bad(f"{where}: a {d['type']} edge goes from a {shape[0]} to a {shape[1]}")
        if shape[2] is not None:
            try:
                shape[2].model_validate(d)
            except ValidationError as e:
                raise bad(where, e) from None


def graph_from_data(data: Any, source: str = "<data>") -> ToolGraph:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ToolGraphError(f'{source}: not a tool graph file (no "format": "{FORMAT}")')
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ToolGraphError(
            f"{source}: tool graph format version {version!r}, but this envfactory reads version "
            f"{FORMAT_VERSION}: rebuild it with `envfactory graph build`"
        )
    try:
        g = nx.node_link_graph(data["graph"], directed=True, multigraph=False, edges="edges")
    except (KeyError, TypeError, nx.NetworkXError) as e:
        raise ToolGraphError(f"{source}: malformed graph data: {type(e).__name__}: {e}") from None
    _check_shape(g, source)
    graph = ToolGraph(nx.DiGraph(g))
    try:
        if schema_edges_stale(graph):
            add_schema_edges(graph)
            graph.g.graph["settings"] = {**graph.g.graph.get("settings", {}), "schema_edges": True}
    except (KeyError, TypeError, ValueError) as e:
        raise ToolGraphError(f"{source}: malformed graph data: {type(e).__name__}: {e}") from None
    return graph


def save_graph(graph: ToolGraph, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # a reader never sees half a file; two runs building the same graph at once each write their own temporary
    write_atomic(p, json.dumps(graph_to_data(graph), separators=(",", ":")), error=ToolGraphError)
    return p


def load_graph(path: str | Path) -> ToolGraph:
    p = Path(path)
    if not p.exists():
        raise ToolGraphError(f"{p}: no tool graph here: build one with `envfactory graph build`")
    # a pool of hundreds of environments: tens of millions of values (bounded by the bytes, JSON has no aliases)
    data = read_json(p, max_bytes=MAX_GRAPH_BYTES, what="tool graph", max_nodes=MAX_GRAPH_BYTES, error=ToolGraphError)
    return graph_from_data(data, str(p))


def _graphml_value(value: Any) -> str | int | float | bool:
    """GraphML holds scalars only: lists and dicts become JSON text, None the empty string."""
    if isinstance(value, bool | int | float | str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


def export_graphml(graph: ToolGraph, path: str | Path) -> Path:
    """GraphML (for Gephi, yEd, Cytoscape): every attribute kept, `user_provided` included."""
    g = nx.DiGraph()
    g.graph.update(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "embedding_model": graph.g.graph.get("embedding_model", ""),
        }
    )
    for n, d in graph.g.nodes(data=True):
        g.add_node(n, **{k: _graphml_value(v) for k, v in d.items()})
    for a, b, d in graph.g.edges(data=True):
        g.add_edge(a, b, **{k: _graphml_value(v) for k, v in d.items()})
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    nx.write_graphml(g, p)
    return p
