"""The sampler's invariant, checked with hypothesis over random synthetic pools and seeds.

Pools are random environments of random tools whose parameter names come from a small vocabulary
(so ids, cycles, parameter-less tools, unsatisfiable inputs and cross-environment matches all
occur). They go through the real build pipeline with a deterministic bag-of-words embedder (the
invariant is about the sampler, not about semantics), and some `user_provided` flags are then
flipped at random to reach graphs no heuristic would produce.

INVARIANT: in every sampled chain, every required input of every tool is user-provided or produced
(directly or indirectly, as `validate_parameter` defines it) by an earlier tool of the chain, and
the chain's record names that earlier tool.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.env.metadata import ToolSpec
from envfactory.toolgraph import ToolChain, ToolGraph, ToolGraphSettings, ToolSource, TopologySampler, build_tool_graph
from envfactory.toolgraph.sampler import split_turns


class HashEmbedder:
    """Deterministic bag-of-words vectors: texts sharing words are similar. Fast, no model."""

    model_name = "hash-bow-64"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[r, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


NAMES = ["city", "date", "hotel_id", "booking_id", "user_id", "name", "amount", "token", "status", "query", "symbol"]
TYPES = {"amount": "number", "date": "string"}
RECORDS = ["Hotel", "Booking", "User", "Order", None]


@st.composite
def tool_specs(draw: st.DrawFn, name: str) -> tuple[ToolSpec, str | None]:
    inputs = draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
    required = [n for n in inputs if draw(st.booleans())]
    outputs = draw(st.lists(st.sampled_from([*NAMES, "id"]), max_size=4, unique=True))
    props = {n: {"type": TYPES.get(n, "string"), "description": f"the {n.replace('_', ' ')}"} for n in inputs}
    out_schema: dict[str, Any] | None = None
    if outputs or draw(st.booleans()):
        out_schema = {"type": "object", "properties": {n: {"type": TYPES.get(n, "string")} for n in outputs}}
    spec = ToolSpec(
        name=name,
        description=f"tool {name}",
        kind=draw(st.sampled_from(["read", "write"])),
        input_schema={"type": "object", "properties": props, "required": required},
        output_schema=out_schema,
    )
    return spec, draw(st.sampled_from(RECORDS))


@st.composite
def pools(draw: st.DrawFn) -> list[ToolSource]:
    sources: list[ToolSource] = []
    for e in range(draw(st.integers(1, 4))):
        for t in range(draw(st.integers(1, 7))):
            spec, ret = draw(tool_specs(f"t{t}"))
            sources.append(ToolSource(env=f"env{e}", spec=spec, return_type=ret))
    return sources


def build(sources: list[ToolSource], threshold: float = 0.8) -> ToolGraph:
    graph, _ = build_tool_graph(sources, HashEmbedder(), ToolGraphSettings(build_edge_threshold=threshold))
    return graph


def check_invariant(graph: ToolGraph, chain: ToolChain, length: tuple[int, int]) -> None:
    assert length[0] <= chain.length <= length[1]
    assert len(set(chain.tools)) == chain.length, "a tool appears twice"
    assert len(chain.servers) <= graph.settings.max_servers
    assert chain.servers == list(dict.fromkeys(graph.env_of(t) for t in chain.tools))
    assert [t for turn in chain.turns for t in turn] == chain.tools
    assert all(1 <= len(turn) <= 5 for turn in chain.turns)
    assert [s.tool for s in chain.steps] == chain.tools
    for k, (tool, step) in enumerate(zip(chain.tools, chain.steps, strict=True)):
        earlier = chain.tools[:k]
        recorded = {s.parameter: s for s in step.inputs}
        for param in graph.inputs(tool):
            if not graph.required(param):
                continue
            name = graph.node(param)["name"]
            assert graph.validate_parameter(param, earlier), f"{tool}.{name} is not satisfied by {earlier}"
            src = recorded[name]
            if graph.user_provided(param):
                assert src.source == "user"
            else:
                assert src.source == "tool" and src.tool in earlier and src.index is not None
                assert src.index < k and chain.tools[src.index] == src.tool
                assert src.tool in graph.producer_reach(param)
                assert graph.output_named(src.tool, src.output or "") is not None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=pools(),
    seed=st.integers(0, 2**32),
    lo=st.integers(1, 4),
    extra=st.integers(0, 4),
    flips=st.lists(st.integers(0, 10_000), max_size=6),
    hops=st.integers(1, 3),
    max_depth=st.integers(0, 3),
)
def test_every_required_input_is_satisfied(
    pool: list[ToolSource], seed: int, lo: int, extra: int, flips: list[int], hops: int, max_depth: int
) -> None:
    graph = build(pool)
    graph.g.graph["settings"].update(validate_hops=hops, max_depth=max_depth)
    inputs = sorted(n for n, d in graph.g.nodes(data=True) if d.get("direction") == "input")
    for f in flips:  # reach graphs no heuristic would produce: internal inputs with or without producers
        if inputs:
            node = graph.g.nodes[inputs[f % len(inputs)]]
            node["user_provided"] = not node["user_provided"]
    graph._reach.clear()
    length = (lo, lo + extra)
    chains = TopologySampler(graph).sample(8, length, seed=seed)
    for chain in chains:
        check_invariant(graph, chain, length)
    assert chains == TopologySampler(graph).sample(8, length, seed=seed)  # reproducible


@settings(max_examples=40, deadline=None)
@given(pool=pools(), seed=st.integers(0, 2**32))
def test_chain_seed_reproduces_the_chain(pool: list[ToolSource], seed: int) -> None:
    graph = build(pool)
    sampler = TopologySampler(graph)
    for chain in sampler.sample(5, (1, 6), seed=seed):
        assert sampler.sample_chain(chain.seed, (1, 6)) == chain


def test_unsatisfiable_tool_is_never_added() -> None:
    """`needs` requires an internal token nothing produces: no chain may contain it."""
    specs = [
        ToolSpec(
            name="needs",
            description="needs a token",
            kind="write",
            input_schema={"type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]},
        ),
        ToolSpec(
            name="free",
            description="free",
            kind="read",
            input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            output_schema={"type": "object", "properties": {"token": {"type": "string"}}},
        ),
    ]
    graph = build([ToolSource(env="e", spec=s) for s in specs])
    graph.remove_depend("e.free", "e.needs")  # now nothing outputs the token for `needs`
    graph.g.nodes["e.needs:in:token"]["user_provided"] = False
    chains = TopologySampler(graph).sample(50, (1, 2), seed=1)
    assert chains and all("e.needs" not in c.tools for c in chains)


def test_priors_are_resolved_first() -> None:
    """get(hotel_id) needs search's hotel_id: a chain starting at get must put search before it."""
    search = ToolSpec(
        name="search",
        description="search hotels",
        kind="read",
        input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        output_schema={"type": "array", "items": {"$ref": "#/$defs/Hotel"}, "$defs": {"Hotel": {
            "type": "object", "properties": {"id": {"type": "string"}, "city": {"type": "string"}}}}},
    )  # fmt: skip
    get = ToolSpec(
        name="get",
        description="get a hotel",
        kind="read",
        input_schema={
            "type": "object",
            "properties": {"hotel_id": {"type": "string", "description": "id of the hotel"}},
            "required": ["hotel_id"],
        },
        output_schema={"type": "object", "properties": {"name": {"type": "string"}}},
    )
    graph = build([ToolSource(env="h", spec=search), ToolSource(env="h", spec=get)])
    assert not graph.user_provided("h.get:in:hotel_id")
    chains = TopologySampler(graph).sample(30, (2, 2), seed=0)
    assert chains and all(c.tools == ["h.search", "h.get"] for c in chains)
    src = chains[0].steps[1].inputs[0]
    assert (src.source, src.tool, src.output, src.index) == ("tool", "h.search", "hotel_id", 0)


def test_server_limit() -> None:
    """Tools chained across five environments through a shared city: never more than 3 servers."""
    sources = []
    for e in range(5):
        sources.append(
            ToolSource(
                env=f"e{e}",
                spec=ToolSpec(
                    name="find",
                    description="find things in a city",
                    kind="read",
                    input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                    output_schema={"type": "object", "properties": {"city": {"type": "string"}}},
                ),
            )
        )
    graph, _ = build_tool_graph(sources, HashEmbedder(), ToolGraphSettings(cross_env_top_k=10))
    chains = TopologySampler(graph).sample(30, (3, 5), seed=2)
    assert chains and all(len(c.servers) <= 3 and c.length <= 3 for c in chains)
    assert any(c.length == 3 for c in chains)


@pytest.mark.parametrize("n", [1, 5, 13])
def test_split_turns(n: int) -> None:
    tools = [f"t{i}" for i in range(n)]
    for seed in range(20):
        turns = split_turns(tools, random.Random(seed))
        assert [t for turn in turns for t in turn] == tools and all(1 <= len(turn) <= 5 for turn in turns)
