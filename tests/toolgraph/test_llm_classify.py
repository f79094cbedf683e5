"""LLM classification and logical refinement, driven by the scripted model (real embeddings, hotels only)."""

from __future__ import annotations

import json

import pytest

from envfactory.env.pool import EnvPool
from envfactory.llm.embeddings import Embedder
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.llm.structured import parse_reply
from envfactory.llm.usage import UsageTracker
from envfactory.toolgraph import ToolGraphError, ToolGraphSettings, ToolSource, build_tool_graph, env_sources
from envfactory.toolgraph.build import CLASSIFY_PHASE, EMBED_PHASE, REFINE_PHASE
from envfactory.toolgraph.llm_classify import UserProvidedAnswer
from envfactory.toolgraph.refine import RefineAnswer
from tests.support.embeddings import packaged_embedder
from tests.support.paths import ROOT, TEST_DATA

DATA = TEST_DATA / "toolgraph"


@pytest.fixture(scope="module")
def library() -> PromptLibrary:
    return PromptLibrary(ROOT / "prompts")


@pytest.fixture(scope="module")
def hotels(pool: EnvPool) -> list[ToolSource]:
    return env_sources(pool.get("hotels"))


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return packaged_embedder()


def script() -> dict[str, list[str]]:
    return json.loads((DATA / "hotels_script.json").read_text())


def test_prompts_load_and_render(library: PromptLibrary) -> None:
    up = library.get("toolgraph/user_provided")
    assert set(up.variables) == {"environment", "parameters"}
    refine = library.get("toolgraph/refine")
    assert set(refine.variables) == {"environment", "tools", "edges"}
    messages = refine.render(environment="hotels: x", tools=[{"name": "a"}], edges=[])
    assert messages[0].additional_kwargs["prompt"] == "toolgraph/refine"
    # the scripted answers are valid against the answer models the code parses into
    s = script()
    assert parse_reply(s["toolgraph/user_provided"][0], UserProvidedAnswer)[0] is None  # prose: re-asked
    assert parse_reply(s["toolgraph/user_provided"][1], UserProvidedAnswer)[0] is not None  # fenced JSON
    assert parse_reply(s["toolgraph/refine"][0], RefineAnswer)[0] is not None


def test_llm_classification_and_refinement(
    hotels: list[ToolSource], embedder: Embedder, library: PromptLibrary
) -> None:
    baseline, _ = build_tool_graph(hotels, embedder, ToolGraphSettings())
    assert baseline.g.has_edge("hotels.cancel_booking", "hotels.book_room")  # to be pruned
    assert not baseline.g.has_edge("hotels.search_hotels", "hotels.list_bookings")  # to be added
    # a schema rule relates the two `city` parameters already; the LLM's addition makes it its own
    assert baseline.g.edges["hotels.get_hotel", "hotels.search_hotels"]["found_by"] == "schema"

    model = ScriptedChatModel(script=script())
    usage = UsageTracker()
    graph, report = build_tool_graph(
        hotels, embedder, ToolGraphSettings(), model=model, library=library, retries=2, usage=usage
    )
    [row] = usage.report()  # the build's two asks, under the role it asks as: classification needed a repair
    assert (row.role, row.structured, row.repaired, row.unanswered, row.unreadable) == ("search", 2, 1, 0, 1)

    # classification: the first answer is not JSON, the repair re-ask gets a valid one
    (cls,) = report.classification
    assert cls.ok and cls.decided == 2 and cls.ignored == ["book_room.no_such_param"] and cls.changed == 1
    guest = graph.node("hotels.book_room:in:guest_name")
    assert guest["user_provided"] is False and guest["user_provided_source"] == "llm"
    assert guest["user_provided_reason"] == "the guest is the logged-in account holder"
    city = graph.node("hotels.search_hotels:in:city")
    assert city["user_provided"] and city["user_provided_source"] == "llm"
    untouched = graph.node("hotels.cancel_booking:in:booking_id")
    assert untouched["user_provided_source"] == "heuristic"  # the model said nothing about it
    classify_calls = [c for c in model.calls if c.prompt == "toolgraph/user_provided"]
    assert len(classify_calls) == 2 and "book_room" in str(classify_calls[0].messages[-1].content)

    # refinement: one call per environment, with the current edges in the prompt
    (ref,) = report.refinement
    assert ref.ok
    applied = {(c.action, c.source, c.target): c for c in ref.changes}
    assert applied[("remove", "cancel_booking", "book_room")].applied
    assert not graph.g.has_edge("hotels.cancel_booking", "hotels.book_room")
    related = {graph.node(i)["tool"] for o in graph.outputs("hotels.cancel_booking") for i in graph.related(o)}
    assert "hotels.book_room" not in related  # its parameter relations went with it

    added = graph.g.edges["hotels.search_hotels", "hotels.list_bookings"]
    assert added["found_by"] == "llm" and not added["via"]
    assert added["reason"] == "users check their stays after searching"
    with_param = graph.g.edges["hotels.get_hotel", "hotels.search_hotels"]
    assert with_param["found_by"] == "llm" and with_param["via"][0][:2] == ["city", "city"]
    relate = graph.g.edges["hotels.get_hotel:out:city", "hotels.search_hotels:in:city"]
    assert relate["type"] == "Parameter_Relate" and relate["found_by"] == "llm" and "rule" not in relate

    rejected = {(c.action, c.source, c.target): c.note for c in ref.changes if not c.applied}
    assert rejected == {
        ("remove", "search_hotels", "cancel_booking"): "no such edge",
        ("add", "flights.get_flight", "book_room"): "names a tool the environment does not have",
        ("add", "get_hotel", "get_hotel"): "a tool cannot depend on itself",
    }
    assert graph.stats().llm_depend == 2
    assert model.remaining() == {"toolgraph/user_provided": 0, "toolgraph/refine": 0}


def test_unparseable_answers_fall_back_to_the_heuristic(
    hotels: list[ToolSource], embedder: Embedder, library: PromptLibrary
) -> None:
    model = ScriptedChatModel(
        script={"toolgraph/user_provided": ["no", "still no", "nope"], "toolgraph/refine": ["?", "??", "???"]}
    )
    seen: list[tuple[str, int, int]] = []
    graph, report = build_tool_graph(
        hotels, embedder, ToolGraphSettings(), model=model, library=library, retries=2,
        progress=lambda phase, done, total: seen.append((phase, done, total)),
    )  # fmt: skip
    # the bars: each LLM phase shows before its first (slow) call and ends complete; embedding ends complete
    phases = list(dict.fromkeys(phase for phase, _, _ in seen))
    assert phases == [EMBED_PHASE, CLASSIFY_PHASE, REFINE_PHASE]
    assert [(d, t) for p, d, t in seen if p == CLASSIFY_PHASE] == [(0, 1), (1, 1)]
    assert [(d, t) for p, d, t in seen if p == REFINE_PHASE] == [(0, 1), (1, 1)]
    assert [s for s in seen if s[0] == EMBED_PHASE][-1][1:] == (report.texts_needed, report.texts_needed)
    assert not report.classification[0].ok and report.classification[0].kept_heuristic == 16
    assert not report.refinement[0].ok and report.refinement[0].error
    assert all(d.get("user_provided_source") in (None, "heuristic") for _, d in graph.g.nodes(data=True))
    assert graph.stats().llm_depend == 0


def test_a_model_needs_the_prompts(hotels: list[ToolSource], embedder: Embedder) -> None:
    with pytest.raises(ToolGraphError, match="prompt library"):
        build_tool_graph(hotels, embedder, model=ScriptedChatModel(script=[]))
