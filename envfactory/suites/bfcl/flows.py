"""External check of the graph against BFCL's multi-turn ground truth.

Each ground-truth turn is replayed through our BFCL sessions (one per involved class, as
`envfactory.suites.bfcl` runs them). For every pair of consecutive calls in a turn, the pair is a
**data flow** when a value the first call returned (any scalar leaf of its result; booleans, null
and empty strings are not values) is an argument value (any scalar leaf) of the second. Recall is
the fraction of data-flow pairs whose (first tool → second tool) is a Tool_Depend edge of the graph,
counted over pair occurrences and over distinct tool pairs; the graph's **extra** edges are its
Tool_Depend edges between BFCL tools that no data-flow pair uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, Field

from envfactory.toolgraph.graph import ToolGraph


class Flow(BaseModel):
    """One ground-truth data flow: a value returned by `source` is an argument of the next call, `target`."""

    entry: str
    turn: int
    source: str  # "env.tool"
    target: str
    parameters: list[str]  # the target's arguments that carry a returned value


class FlowReport(BaseModel):
    consecutive_pairs: int  # consecutive call pairs in the ground-truth turns
    flow_pairs: int  # of them, pairs with a data flow
    covered: int  # data-flow pairs the graph has as an edge
    recall: float
    distinct_flows: int
    distinct_covered: int
    distinct_recall: float
    bfcl_edges: int  # Tool_Depend edges between BFCL tools
    extra_edges: int  # of them, used by no data flow
    missed: list[str] = Field(default_factory=list)  # distinct flows the graph lacks, most frequent first


def _leaves(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, bool) or value is None or value == "":
        return
    elif isinstance(value, int | float):
        yield ("number", round(float(value), 6))
    else:
        yield ("text", str(value))


def ground_truth_flows(category: str = "multi_turn_base") -> tuple[int, list[Flow]]:
    """(consecutive call pairs, data flows) of BFCL's ground truth for `category`."""
    from envfactory.env.session import Session
    from envfactory.suites import bfcl

    importable = {c for c in bfcl.SUITES_BY_CLASS if bfcl.class_importable(c)}
    pairs = 0
    flows: list[Flow] = []
    for entry in bfcl.load_entries(category):
        classes = [c for c in entry.involved_classes if c in importable]
        sessions = {c: Session.fork(bfcl.environment(c), entry.config_for(c)) for c in classes}
        for turn_no, turn in enumerate(entry.ground_truth):
            prev: tuple[str, set[tuple[str, Any]]] | None = None
            for text in turn:
                call = bfcl.parse_call(text)
                owner = bfcl.route(call.name, entry.involved_classes)
                if owner not in sessions:
                    prev = None
                    continue
                args = bfcl.environment(owner).call_arguments(call)
                rec = sessions[owner].call(call.name, args)
                tool = f"{bfcl.SUITES_BY_CLASS[owner].env}.{call.name}"
                if prev is not None:
                    pairs += 1
                    carried = sorted(k for k, v in args.items() if any(leaf in prev[1] for leaf in _leaves(v)))
                    if carried:
                        flows.append(
                            Flow(entry=entry.id, turn=turn_no, source=prev[0], target=tool, parameters=carried)
                        )
                prev = (tool, set(_leaves(rec.result)) if rec.ok else set())
    return pairs, flows


def flow_report(graph: ToolGraph, consecutive_pairs: int, flows: list[Flow]) -> FlowReport:
    """Recall of `flows` by the graph's Tool_Depend edges, and the graph's extra BFCL edges."""

    def has_edge(a: str, b: str) -> bool:
        return graph.g.has_edge(a, b) and graph.g.edges[a, b]["type"] == "Tool_Depend"

    counts = Counter((f.source, f.target) for f in flows)
    covered = sum(n for (a, b), n in counts.items() if has_edge(a, b))
    distinct_covered = sum(1 for a, b in counts if has_edge(a, b))
    bfcl_edges = [(a, b) for a, b, _ in graph.depend_edges() if a.startswith("bfcl_") and b.startswith("bfcl_")]
    return FlowReport(
        consecutive_pairs=consecutive_pairs,
        flow_pairs=len(flows),
        covered=covered,
        recall=covered / len(flows) if flows else 0.0,
        distinct_flows=len(counts),
        distinct_covered=distinct_covered,
        distinct_recall=distinct_covered / len(counts) if counts else 0.0,
        bfcl_edges=len(bfcl_edges),
        extra_edges=sum(1 for e in bfcl_edges if e not in counts),
        missed=[f"{a} → {b} ({n})" for (a, b), n in counts.most_common() if not has_edge(a, b)],
    )
