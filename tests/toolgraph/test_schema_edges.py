"""Schema-derived dependency edges (`envfactory.toolgraph.schema_edges`).

The rules on small hand-made schemas (no similarity edge can form there: the embedder gives every text
its own orthogonal direction), the graph's marks and settings, the upgrade of a graph saved before the
rules, and the recall of BFCL's ground-truth data flows on the real pool graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envfactory.env.metadata import ToolSpec
from envfactory.llm.embeddings import EmbeddingCache
from envfactory.suites.bfcl.flows import Flow, flow_report, ground_truth_flows
from envfactory.toolgraph import (
    ToolGraph,
    ToolGraphSettings,
    ToolSource,
    TopologySampler,
    build_tool_graph,
    input_params,
    load_graph,
    output_params,
    save_graph,
)
from envfactory.toolgraph.io import graph_to_data
from envfactory.toolgraph.schema_edges import (
    SCHEMA_RULES_VERSION,
    add_schema_edges,
    flows_into,
    remove_schema_edges,
    schema_pairs,
)

TARGET_RECALL = 0.8


class OrthogonalEmbedder:
    """Every distinct text its own axis: description cosines are 0, so no pair reaches the similarity
    threshold (0.6 · name/type at most) and every edge of these graphs is a schema edge."""

    model_name = "orthogonal"

    def __init__(self) -> None:
        self.axes: dict[str, int] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        for t in texts:
            self.axes.setdefault(t, len(self.axes))
        out = np.zeros((len(texts), 4096), dtype=np.float32)
        for r, t in enumerate(texts):
            out[r, self.axes[t]] = 1.0
        return out


def obj(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def s(description: str = "", **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **kw}


def num(description: str = "") -> dict[str, Any]:
    return {"type": "number", "description": description}


def tool(
    env: str,
    name: str,
    inputs: dict[str, dict[str, Any]] | None = None,
    output: dict[str, Any] | None = None,
    *,
    required: Sequence[str] | None = None,
    description: str = "",
    kind: str = "read",
) -> ToolSource:
    inputs = inputs or {}
    spec = ToolSpec(
        name=name,
        description=description or name.replace("_", " "),
        kind=kind,  # type: ignore[arg-type]
        input_schema={"type": "object", "properties": inputs, "required": list(required or inputs)},
        output_schema=output,
    )
    return ToolSource(env=env, spec=spec)


def pairs_of(sources: Sequence[ToolSource]) -> set[tuple[str, str, str, str, str]]:
    """(output tool, output, input tool, input, rule) of every pair the rules find."""
    outs = [p for src in sources for p in output_params(src)]
    ins = [p for src in sources for p in input_params(src)]
    names = {src.tool_id: src.spec.name for src in sources}
    descriptions = {src.tool_id: src.spec.description for src in sources}
    return {
        (outs[x.out_idx].tool, outs[x.out_idx].name, ins[x.in_idx].tool, ins[x.in_idx].name, x.rule)
        for x in schema_pairs(outs, ins, names, descriptions)
    }


def linked(found: set[tuple[str, str, str, str, str]], out_tool: str, in_tool: str) -> set[tuple[str, str, str]]:
    return {(o, i, r) for a, o, b, i, r in found if a == out_tool and b == in_tool}


# ---- the rules on hand-made schemas ---------------------------------------------------------------------

BOOKING = {
    "title": "Booking",
    "type": "object",
    "properties": {"id": {"type": "string"}, "status": {"type": "string"}, "paid": {"type": "boolean"}},
}


def test_an_id_input_takes_the_id_of_the_record_a_tool_returns() -> None:
    found = pairs_of(
        [
            tool("t", "create_booking", {"guest": s("the guest")}, BOOKING, kind="write"),
            tool("t", "cancel_booking", {"booking_id": s("booking to cancel")}, obj(status=s())),
            tool("t", "get_order", {"order_ref": s()}, obj(id={"type": "string"})),  # an Order (the tool's noun)
            tool("t", "refund", {"order_id": s()}, obj(ok={"type": "boolean"})),
            tool("t", "ship", {"id": s("what to ship")}, obj(done={"type": "boolean"})),  # plain id of... a ship
            tool("t", "delete_order", {"id": s("the order")}, None),  # a plain `id` of a tool about orders
        ]
    )
    assert linked(found, "t.create_booking", "t.cancel_booking") == {("booking_id", "booking_id", "record_id")}
    assert ("order_id", "order_id", "record_id") in linked(found, "t.get_order", "t.refund")
    assert linked(found, "t.get_order", "t.delete_order") == {("order_id", "id", "record_id")}
    assert not linked(found, "t.get_order", "t.ship")  # `ship(id)` is about ships, not orders
    # the booking's `status` is no value any input takes: a generic name links nothing
    assert not {f for f in found if f[1] == "status"}


def test_a_list_output_feeds_an_input_taking_one_of_its_items() -> None:
    hotel = {"type": "object", "properties": {"id": {"type": "string"}, "city": {"type": "string"}}}
    found = pairs_of(
        [
            tool(
                "t",
                "search_hotels",
                {"city": s("city")},
                {"type": "array", "items": {"$ref": "#/$defs/HotelSummary"}, "$defs": {"HotelSummary": hotel}},
            ),
            tool("t", "book_room", {"hotel_id": s("the hotel")}, None, kind="write"),
            tool("t", "list_papers", {}, obj(paper_ids={"type": "array", "items": {"type": "string"}})),
            tool("t", "get_paper", {"paper_id": s("a paper")}, obj(title=s())),
            tool(
                "t",
                "get_available_stocks",
                {"sector": s("sector")},
                obj(stock_list={"type": "array", "items": {"type": "string"}, "description": "List of stock symbols"}),
            ),
            tool("t", "get_stock_info", {"symbol": s("Symbol that identifies the stock")}, obj(price=num("price"))),
            tool("t", "add_to_watchlist", {"stock": s("the stock to add")}, None, kind="write"),
        ]
    )
    assert linked(found, "t.search_hotels", "t.book_room") == {("hotel_id", "hotel_id", "record_id")}
    assert linked(found, "t.list_papers", "t.get_paper") == {("paper_ids", "paper_id", "record_id")}
    assert linked(found, "t.get_available_stocks", "t.get_stock_info") == {("stock_list", "symbol", "list_item")}
    assert linked(found, "t.get_available_stocks", "t.add_to_watchlist") == {("stock_list", "stock", "list_item")}


def test_no_edge_between_incompatible_types() -> None:
    found = pairs_of(
        [
            tool("t", "place_order", {"symbol": s()}, obj(order_id={"type": "integer"}, flag={"type": "boolean"})),
            tool("t", "cancel_order", {"order_id": s("the order")}, None),  # a string id: not the integer one
            tool("t", "get_order", {"order_id": {"type": "integer"}}, obj(total=num())),
            tool("t", "toggle", {"flag": {"type": "boolean"}}, None),  # a flag is never a value passed on
            tool("t", "describe", {}, obj(order=obj(id={"type": "integer"}))),
            tool("t", "price_in", {"price": {"type": "integer"}}, obj(price=num("a price"))),  # number → integer
        ]
    )
    assert not linked(found, "t.place_order", "t.cancel_order")
    assert linked(found, "t.place_order", "t.get_order") == {("order_id", "order_id", "record_id")}
    assert not linked(found, "t.place_order", "t.toggle")
    assert linked(found, "t.describe", "t.get_order") == {("order_id", "order_id", "record_id")}  # a nested id
    assert not linked(found, "t.price_in", "t.price_in")  # never a tool with itself
    assert flows_into("integer", "number") and not flows_into("number", "integer")
    assert flows_into("array<string>", "string") and flows_into("string", "array<string>")
    assert not flows_into("string", "integer") and not flows_into("object", "string")
    assert not flows_into("boolean", "boolean") and flows_into("any", "integer")


def test_values_the_schemas_name_flow_by_name_description_and_kind() -> None:
    found = pairs_of(
        [
            tool("v", "get_zipcode_based_on_city", {"city": s("The name of the city.")}, obj(zipcode=s("The zipcode"))),
            tool("v", "estimate_distance", {"cityA": s("The zipcode of the first city.")}, obj(distance=num())),
            tool("v", "find_nearest_tire_shop", {}, obj(shopLocation=s("The location of the nearest tire shop."))),
            tool("v", "set_navigation", {"destination": s("The destination to navigate.")}, obj(status=s())),
            tool("v", "fill_tank", {"liters": num("liters to add")}, obj(fuelLevel=num("The fuel level in gallons."))),
            tool("v", "gallon_to_liter", {"gallon": num("The amount of gallon to convert.")}, obj(liter=num())),
            tool("v", "liter_to_gallon", {"liter": num("The amount of liter to convert.")}, obj(gallon=num())),
            tool(
                "v",
                "compute_exchange_rate",
                {"value": num("The value to convert")},
                obj(exchanged_value=num("The value after the exchange")),
                description="Compute the exchange rate between two currencies",
            ),
            tool("v", "set_budget_limit", {"budget_limit": num("The budget limit in USD")}, None, kind="write"),
            tool("v", "get_stock_info", {"symbol": s("symbol")}, obj(price=num("Current price of the stock."))),
            tool("v", "place_order", {"price": num("Price to order at.")}, None, kind="write"),
            tool("v", "search", {"max_price": num("Maximum price")}, None),  # a bound: the user's constraint
            tool("w", "other_env_navigation", {"destination": s("where to go")}, None),
        ]
    )
    assert linked(found, "v.get_zipcode_based_on_city", "v.estimate_distance") == {("zipcode", "cityA", "mention")}
    assert linked(found, "v.find_nearest_tire_shop", "v.set_navigation") == {("shopLocation", "destination", "kind")}
    assert linked(found, "v.fill_tank", "v.gallon_to_liter") == {("fuelLevel", "gallon", "kind")}
    assert not linked(found, "v.fill_tank", "v.liter_to_gallon")  # gallons are no liters
    assert linked(found, "v.compute_exchange_rate", "v.set_budget_limit") == {
        ("exchanged_value", "budget_limit", "kind")
    }
    assert linked(found, "v.get_stock_info", "v.place_order") == {("price", "price", "same_name")}
    assert not {f for f in found if f[2] == "v.search"}
    assert not {f for f in found if f[2].startswith("w.")}  # never across environments


# ---- in the graph ---------------------------------------------------------------------------------------


def shop_sources() -> list[ToolSource]:
    order = {"title": "Order", "type": "object", "properties": {"id": {"type": "string"}, "total": num()}}
    return [
        tool("shop", "list_products", {"query": s("what to search")}, obj(product_ids={"type": "array"})),
        tool("shop", "checkout", {"product_id": s("the product")}, order, kind="write"),
        tool("shop", "get_order", {"order_id": s("the order")}, order),
        tool("shop", "cancel_order", {"order_id": s("the order")}, obj(refund=num("refund in USD")), kind="write"),
        tool("shop", "top_up", {"budget": num("The budget to add")}, None, kind="write"),
    ]


def test_schema_edges_are_marked_counted_and_can_be_turned_off() -> None:
    graph, report = build_tool_graph(shop_sources(), OrthogonalEmbedder(), ToolGraphSettings())
    assert report.relations == 0  # nothing similar enough: every edge below is the schemas'
    edge = graph.g.edges["shop.checkout", "shop.cancel_order"]
    assert edge["type"] == "Tool_Depend" and edge["found_by"] == "schema"
    assert edge["via"][0][:2] == ["order_id", "order_id"]
    relate = graph.g.edges["shop.checkout:out:order_id", "shop.cancel_order:in:order_id"]
    assert relate["found_by"] == "schema" and relate["rule"] == "record_id" and relate["reason"].startswith("schema")
    assert graph.g.has_edge("shop.list_products", "shop.checkout")  # product_ids → product_id
    assert graph.g.has_edge("shop.cancel_order", "shop.top_up")  # a refund (money) → a budget
    stats = graph.stats()
    assert stats.schema_depend == report.schema_depend == stats.tool_depend > 0
    assert stats.parameter_relate == report.schema_relations
    assert graph.g.graph["schema_rules"] == SCHEMA_RULES_VERSION

    off, off_report = build_tool_graph(shop_sources(), OrthogonalEmbedder(), ToolGraphSettings(schema_edges=False))
    assert off.stats().tool_depend == 0 and off_report.schema_relations == 0
    assert "schema_rules" not in off.g.graph

    # the sampler walks them, and an internal id comes from the tool that makes it
    chains = TopologySampler(graph).sample(30, (2, 4), seed=0)
    assert chains
    for chain in chains:
        for k, step in enumerate(chain.steps):
            for param in graph.inputs(step.tool):
                if graph.required(param) and not graph.user_provided(param):
                    src = next(x for x in step.inputs if x.parameter == graph.node(param)["name"])
                    assert src.source == "tool" and src.index is not None and src.index < k


def test_removing_and_adding_again_gives_the_same_graph() -> None:
    graph, _ = build_tool_graph(shop_sources(), OrthogonalEmbedder(), ToolGraphSettings())
    before = {(a, b): dict(d) for a, b, d in graph.g.edges(data=True)}
    removed = remove_schema_edges(graph)
    assert removed > 0 and graph.stats().tool_depend == 0
    add_schema_edges(graph)
    assert {(a, b): dict(d) for a, b, d in graph.g.edges(data=True)} == before


def test_a_graph_saved_before_the_rules_loads_with_them(tmp_path: Path) -> None:
    graph, _ = build_tool_graph(shop_sources(), OrthogonalEmbedder(), ToolGraphSettings())
    old = ToolGraph(graph.g.copy())
    remove_schema_edges(old)  # what the build made before: no schema edges, no `schema_rules`, no setting
    data = graph_to_data(old)
    data["graph"]["graph"]["settings"].pop("schema_edges")
    (tmp_path / "old.json").write_text(json.dumps(data))
    loaded = load_graph(tmp_path / "old.json")
    assert {(a, b): d for a, b, d in loaded.g.edges(data=True)} == {(a, b): d for a, b, d in graph.g.edges(data=True)}
    assert loaded.settings.schema_edges and loaded.g.graph["schema_rules"] == SCHEMA_RULES_VERSION
    # a graph built without them stays without them
    off, _ = build_tool_graph(shop_sources(), OrthogonalEmbedder(), ToolGraphSettings(schema_edges=False))
    assert load_graph(save_graph(off, tmp_path / "off.json")).stats().tool_depend == 0
    # and a current one loads as it was saved
    same = load_graph(save_graph(graph, tmp_path / "new.json"))
    assert {(a, b): d for a, b, d in same.g.edges(data=True)} == {(a, b): d for a, b, d in graph.g.edges(data=True)}


# ---- BFCL's ground truth ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_flows() -> tuple[int, list[Flow]]:
    pytest.importorskip("bfcl_eval")
    return ground_truth_flows("multi_turn_base")


def test_bfcl_ground_truth_recall_with_schema_edges(
    graph: ToolGraph, sources: list[ToolSource], cache: EmbeddingCache, bfcl_flows: tuple[int, list[Flow]]
) -> None:
    pairs, flows = bfcl_flows
    with_schema = flow_report(graph, pairs, flows)
    similarity_only, _ = build_tool_graph(sources, cache, ToolGraphSettings(schema_edges=False))
    without = flow_report(similarity_only, pairs, flows)
    assert with_schema.recall >= TARGET_RECALL, with_schema
    assert with_schema.distinct_recall >= TARGET_RECALL, with_schema
    assert without.recall < with_schema.recall and without.distinct_recall < with_schema.distinct_recall
    # the schema edges add to the extra edges too, but the similarity's stay what they were
    assert with_schema.bfcl_edges > without.bfcl_edges and with_schema.extra_edges >= without.extra_edges
    for a, b in [
        ("bfcl_vehicle.get_zipcode_based_on_city", "bfcl_vehicle.estimate_distance"),  # "the zipcode of ..."
        ("bfcl_trading.get_stock_info", "bfcl_trading.place_order"),  # price → price
        ("bfcl_vehicle.find_nearest_tire_shop", "bfcl_vehicle.set_navigation"),  # a place
        ("bfcl_travel.compute_exchange_rate", "bfcl_travel.set_budget_limit"),  # money
    ]:
        assert not similarity_only.g.has_edge(a, b)
        assert graph.g.edges[a, b]["found_by"] == "schema"
