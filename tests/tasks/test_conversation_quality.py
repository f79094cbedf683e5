"""Offline conversations read like users and hold together: invariants over a batch on every native
environment (not the wording), the figures' definitions on crafted conversations, the writer's rules."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.records.episode import replay
from envfactory.records.models import (
    Binding,
    Conversation,
    Node,
    PlannedCall,
    Provenance,
    Step,
    Task,
    ToolCall,
    ToolResult,
)
from envfactory.records.spoken import renderings, say, unsayable
from envfactory.tasks.conversation import ConversationWriter, Turn, _fill, _once, fact_text, facts, resource_words
from envfactory.tasks.pi_star import is_identity
from envfactory.tasks.plan import SynthConfig, load_conversations, read_jsonl
from envfactory.tasks.quality import is_id_parameter, measure
from envfactory.tasks.run import run_batch
from envfactory.tasks.template import answer_fact
from tests.support.paths import ROOT

PROMPTS = ROOT / "prompts"


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Conversation], list[dict[str, Any]], EnvPool]:
    out = tmp_path_factory.mktemp("quality") / "run"
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path_factory.mktemp("data"))
    config = SynthConfig.model_validate({"T": 3, "S": 1, "D": 2, "seed": 0, "out": out, "plot": False})
    run_batch(config, settings, console=None)
    return load_conversations(out), read_jsonl(out / "dropped.jsonl"), EnvPool(settings)


def test_the_figures_meet_the_targets(batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool]) -> None:
    conversations, dropped, _ = batch
    figures = measure(conversations)
    assert figures.turns_per_conversation >= 3  # the paper's data: 4.82
    assert figures.incoherent_id_arguments == 0.0
    assert figures.requests_with_internal_id == 0.0
    assert figures.canned_answers == 0.0
    assert figures.answers_telling_bookkeeping == 0.0
    assert figures.distinct_answers > 0.8
    assert len(conversations) / (len(conversations) + len(dropped)) >= 0.75, [d["reason"] for d in dropped]


def test_no_conversation_asks_twice_for_the_same_write(
    batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool],
) -> None:
    """Chains joined into one conversation could repeat a write with the same arguments ("add a bag to FB-0002",
    then again; a compiled API's "set up a build job with ..." three times): a join that adds one is not taken."""
    conversations, _, _ = batch
    for conv in conversations:
        writes = [
            (p.call.server, p.call.name, json.dumps(p.call.arguments, sort_keys=True))
            for p in conv.task.solver
            if p.kind == "write"
        ]
        assert len(writes) == len(set(writes)), (conv.id, writes)


def test_every_turn_is_a_verified_task_of_its_own(
    batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool],
) -> None:
    conversations, _, pool = batch
    for conv in conversations:
        for node in conv.nodes:
            servers = node.mcp_servers
            executed = replay(pool, node.raw_tool_call, node.initial_scenario)
            assert executed.failures == 0
            assert {s: executed.final[s] for s in servers} == {s: node.final_scenario[s] for s in servers}
            results = [r for s in node.steps for r in s.results()]
            if any(pool.get(c.server).metadata.tool(c.name).kind == "write" for c in node.raw_tool_call):
                # v(Db before) = 0: the turn's goal does not hold before it
                assert {s: node.initial_scenario[s] for s in servers} != {s: node.final_scenario[s] for s in servers}
            else:  # a read-only turn is verified by what its answer states
                fact = answer_fact(results[-1].result, node.raw_tool_call[-1].arguments)
                assert fact is not None and say(fact[1]) in str(node.steps[-1].content), (node.query, node.steps[-1])


def test_requests_carry_every_value_a_user_knows_and_no_id(
    batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool],
) -> None:
    conversations, _, _ = batch
    seen = 0
    for conv in conversations:
        earlier: set[str] = set()
        for node in conv.nodes:
            for call in node.raw_tool_call:
                for name, value in call.arguments.items():
                    if isinstance(value, dict | list) or is_identity(name):
                        continue
                    if is_id_parameter(name):
                        assert str(value) not in node.query or str(value) in earlier, (name, value, node.query)
                    else:
                        seen += 1
                        said = {r.lower() for r in renderings(value)}
                        assert any(r in node.query.lower() for r in said), (name, value, node.query)
            earlier |= {str(v) for r in (r for s in node.steps for r in s.results()) for v in _values(r.result)}
    assert seen > 50


def _values(result: Any) -> list[Any]:
    stack, out = [result], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            out.append(item)
    return out


# ---- the figures' definitions -------------------------------------------------------------------------


def _conversation(query: str, calls: list[tuple[ToolCall, Any]], answer: str) -> Conversation:
    steps = [Step(role="user", content=query)]
    for call, result in calls:
        steps.append(Step(role="tool_call", content=[call]))
        steps.append(
            Step(role="tool_result", content=[ToolResult(server=call.server, name=call.name, ok=True, result=result)])
        )
    steps.append(Step(role="assistant", content=answer))
    state = {"hotels": {"bookings": {"BK-0002": {"id": "BK-0002"}}, "hotels": {"HT-1": {"id": "HT-1"}}}}
    node = Node(index=0, query=query, steps=steps, mcp_servers=["hotels"], initial_scenario=state, final_scenario=state)
    task = Task(id="t", instruction=query, servers=["hotels"], initial_state=state, verifier={"goal": {}}, solver=[])
    return Conversation(
        id="c",
        servers=["hotels"],
        tools=[],
        nodes=[node],
        task=task,
        provenance=Provenance(generator="template", seed=0),
    )


def test_the_figures_catch_what_the_method_argues_against() -> None:
    listed = ToolCall(server="hotels", name="list_bookings", arguments={"guest_name": "Ana"})
    cancel = ToolCall(server="hotels", name="cancel_booking", arguments={"booking_id": "BK-0002"})
    bad = _conversation(
        "Cancel booking BK-0002.",
        [(listed, []), (cancel, {"id": "BK-0002", "status": "cancelled"})],
        "Done: I did cancel booking.",
    )
    figures = measure([bad])
    assert figures.requests_with_internal_id == 1.0  # the request spells out an id the user was never told
    assert figures.incoherent_id_arguments == 1.0  # BK-0002 came back from no earlier result ([] was all)
    assert figures.empty_then_more == 1
    assert figures.canned_answers == 1.0  # no value of the results in the answer
    good = _conversation(
        "Cancel my booking under Ana.",
        [(listed, [{"id": "BK-0002", "guest_name": "Ana"}]), (cancel, {"id": "BK-0002", "status": "cancelled"})],
        "Your booking BK-0002 is cancelled.",
    )
    figures = measure([good])
    assert (figures.requests_with_internal_id, figures.incoherent_id_arguments, figures.empty_then_more) == (0, 0, 0)
    assert figures.canned_answers == 0.0
    # a date reported the way users write it is a reported value, not a canned answer
    dated = [{"id": "BK-0002", "guest_name": "Ana", "check_in": "2026-01-10"}]
    for style in range(4):
        answer = f"I see one on {say('2026-01-10', style)}. Is that the one?"
        assert measure([_conversation("My booking under Ana?", [(listed, dated)], answer)]).canned_answers == 0.0
    # a response's bookkeeping told as a fact ("next page token political"), or a uuid said: counted
    page = {"items": [{"id": "EV-1", "status": "open"}], "nextPageToken": "political"}
    for answer, counted in (
        ("I found 1 event: status open, next page token political.", 1.0),
        ("I found 1 event, job 143066f1-b218-3705-3da8-39441b3cabda.", 0.0),  # not a value of the results
        ("I found 1 event: status open.", 0.0),
    ):
        paged = _conversation("My events?", [(listed, page)], answer)
        assert measure([paged]).answers_telling_bookkeeping == counted, answer
    job = {"id": "EV-1", "job": "143066f1-b218-3705-3da8-39441b3cabda"}
    said = _conversation("My job?", [(listed, job)], "Job 143066f1-b218-3705-3da8-39441b3cabda is open.")
    assert measure([said]).answers_telling_bookkeeping == 1.0


def test_an_id_the_user_says_of_their_own_record_is_theirs_and_no_other() -> None:
    cancel = ToolCall(server="hotels", name="cancel_booking", arguments={"booking_id": "BK-0002"})
    done = {"id": "BK-0002", "status": "cancelled"}
    said = _conversation("Cancel my booking BK-0002.", [(cancel, done)], "BK-0002 is cancelled.")
    bare = measure([said])
    assert (bare.requests_with_internal_id, bare.incoherent_id_arguments) == (1.0, 1.0)  # nobody's words: a leak
    # the solver took it from the user's words (their own record, which no tool of the environment finds)
    planned = PlannedCall(call=cancel, bindings=[Binding(parameter="booking_id", source="state", value="BK-0002")])
    said.task.solver = [planned]
    own = measure([said])
    assert (own.requests_with_internal_id, own.requests_with_own_id, own.incoherent_id_arguments) == (0, 1.0, 0)
    # ... but only where a request says it
    said.nodes[0].query = "Cancel my booking."
    assert measure([said]).incoherent_id_arguments == 1.0


def test_a_number_is_an_id_only_where_a_call_passes_it_as_one() -> None:
    book = ToolCall(server="hotels", name="book_room", arguments={"hotel_id": "HT-1", "nights": 4})
    conv = _conversation("Book HT-1 for 4 nights.", [(book, {"id": "BK-0003", "nights": 4})], "BK-0003, 4 nights")
    conv.nodes[0].initial_scenario["hotels"]["rooms"] = {"4": {"id": 4}}  # a collection with integer ids
    assert measure([conv]).requests_with_internal_id == 1.0  # HT-1 is internal; "4" is a quantity here
    conv.nodes[0].query = "Book it for 4 nights."
    assert measure([conv]).requests_with_internal_id == 0.0


# ---- the writer's rules ------------------------------------------------------------------------------


def test_optional_segments_are_dropped_when_their_value_is_missing() -> None:
    template = "find a hotel in {city}[ under {max_price}][ with {min_stars} stars]"
    assert _fill(template, {"city": "Lisbon", "min_stars": "4"}) == "find a hotel in Lisbon with 4 stars"
    assert _fill(template, {"max_price": "100"}) is None  # a required value is missing: not this phrasing


def test_a_count_of_one_takes_its_noun_in_the_singular() -> None:
    """A request read "make BK-0003 1 nights instead"."""
    template = "make {booking_id} {nights} nights instead[ with {bags} bags]"
    assert (
        _fill(template, {"booking_id": "BK-0003", "nights": "1", "bags": "1"})
        == "make BK-0003 1 night instead with 1 bag"
    )
    assert _fill(template, {"booking_id": "BK-0003", "nights": "2"}) == "make BK-0003 2 nights instead"
    assert _fill("{n} status", {"n": "1"}) == "1 status"  # a word that only looks plural stays


def _cancel_one_of_two_look_alikes(**extra: Any) -> Turn:
    """Ana Costa has two bookings that differ only by date; the turn lists them and cancels the second."""
    twins = [
        {"id": f"BK-000{i}", "hotel_id": "HT-1", "guest_name": "Ana Costa", "check_in": day, "nights": 2, **extra}
        for i, day in ((1, "2026-03-01"), (2, "2026-04-10"))
    ]
    listed = PlannedCall(
        call=ToolCall(server="hotels", name="list_bookings", arguments={"guest_name": "Ana Costa"}),
        bindings=[Binding(parameter="guest_name", source="state", value="Ana Costa")],
        kind="read",
    )
    cancel = PlannedCall(
        call=ToolCall(server="hotels", name="cancel_booking", arguments={"booking_id": "BK-0002"}),
        bindings=[Binding(parameter="booking_id", source="output", value="BK-0002", path="[1].id", call=0)],
        kind="write",
    )
    results = [
        ToolResult(server="hotels", name="list_bookings", ok=True, result=twins),
        ToolResult(server="hotels", name="cancel_booking", ok=True, result={**twins[1], "status": "cancelled"}),
    ]
    return Turn(calls=[listed, cancel], results=results, start=0)


def test_a_lookup_with_look_alike_candidates_is_told_apart(pool: EnvPool) -> None:
    meta = {"hotels": pool.get("hotels").metadata}
    for seed in range(5):
        writer = ConversationWriter(PROMPTS, meta, random.Random(seed))
        text = writer.request(_cancel_one_of_two_look_alikes(status="confirmed"))
        assert "Ana Costa" in text and any(r in text for r in renderings("2026-04-10"))  # what only the target has
        assert "BK-0002" not in text and "list" not in text.lower()


def test_ambiguity_leaves_the_choice_open_and_the_user_settles_it(pool: EnvPool) -> None:
    meta = {"hotels": pool.get("hotels").metadata}
    writer = ConversationWriter(PROMPTS, meta, random.Random(0), ambiguity=1.0)
    text = writer.request(_cancel_one_of_two_look_alikes())
    assert writer.clarification is not None
    after, question, reply = writer.clarification
    target, other = renderings("2026-04-10"), renderings("2026-03-01")
    assert after == 0  # asked once the lookup has shown the candidates
    assert "Ana Costa" in text and not any(r in text for r in target | other)  # the choice is left open
    assert any(r in question for r in target) and any(r in question for r in other)  # both offered
    assert any(r in reply for r in target) and not any(r in reply for r in other)  # the user picks the right one
    none = ConversationWriter(PROMPTS, meta, random.Random(0), ambiguity=0.0)
    none.request(_cancel_one_of_two_look_alikes())
    assert none.clarification is None


def _lisbon(hotels: list[dict[str, Any]], *later: tuple[PlannedCall, Any]) -> Turn:
    """A turn that searches hotels in Lisbon (finding `hotels`), then makes the `later` calls (with their results)."""
    search = PlannedCall(
        call=ToolCall(server="hotels", name="search_hotels", arguments={"city": "Lisbon"}),
        bindings=[Binding(parameter="city", source="state", value="Lisbon")],
        kind="read",
    )
    calls = [search, *(c for c, _ in later)]
    results = [
        ToolResult(server=c.call.server, name=c.call.name, ok=True, result=r) for c, r in [(search, hotels), *later]
    ]
    return Turn(calls=calls, results=results, start=0)


def _get_hotel(hotel_id: str, path: str, call: int) -> PlannedCall:
    return PlannedCall(
        call=ToolCall(server="hotels", name="get_hotel", arguments={"hotel_id": hotel_id}),
        bindings=[Binding(parameter="hotel_id", source="output", value=hotel_id, path=path, call=call)],
        kind="read",
    )


def test_the_question_follows_the_lookup_that_listed_the_look_alikes_not_a_later_call_of_one(pool: EnvPool) -> None:
    """search_hotels lists two hotels in Lisbon, check_availability takes one, get_hotel reads its id from the
    availability: the question was asked after check_availability (the call the id was read from), so the
    conversation checked a hotel before asking which one the user meant."""
    hotels = [
        {"id": "HT-LIS-01", "name": "Casa Rio", "city": "Lisbon", "stars": 3, "price_per_night": 90.0},
        {"id": "HT-LIS-02", "name": "Casa do Rio", "city": "Lisbon", "stars": 3, "price_per_night": 160.0},
    ]
    check = PlannedCall(
        call=ToolCall(
            server="hotels",
            name="check_availability",
            arguments={"hotel_id": "HT-LIS-02", "check_in": "2026-01-19", "nights": 2},
        ),
        bindings=[
            Binding(parameter="hotel_id", source="output", value="HT-LIS-02", path="[1].id", call=0),
            Binding(parameter="check_in", source="state", value="2026-01-19"),
            Binding(parameter="nights", source="state", value=2),
        ],
        kind="read",
    )
    availability = {"hotel_id": "HT-LIS-02", "check_in": "2026-01-19", "nights": 2, "rooms_free": 0}
    turn = _lisbon(
        hotels, (check, availability), (_get_hotel("HT-LIS-02", "hotel_id", 1), {**hotels[1], "rooms_total": 1})
    )
    meta = {"hotels": pool.get("hotels").metadata}
    asked = 0
    for seed in range(10):
        writer = ConversationWriter(PROMPTS, meta, random.Random(seed), ambiguity=1.0)
        writer.request(turn)
        if writer.clarification is not None:
            asked += 1
            assert writer.clarification[0] == 0, writer.clarification  # after search_hotels, before the check
    assert asked


def test_a_record_an_earlier_lookup_found_among_look_alikes_is_named_with_what_only_it_has(pool: EnvPool) -> None:
    """ "Freeze the card of the account "Cynthia Holland"": she has three accounts (one in GBP), the chain froze the
    card of the GBP one, and nothing in the request said which: SFT learnt to guess, the reward scored the other
    account's card as wrong."""
    accounts = [
        {"id": f"AC-000{i}", "owner": "Cynthia Holland", "type": "checking", "currency": cur, "status": "open"}
        for i, cur in ((1, "EUR"), (2, "GBP"), (3, "EUR"))
    ]
    card = {"id": "CD-0002", "account_id": "AC-0002", "kind": "credit", "last4": "8411", "status": "active"}
    calls = [
        PlannedCall(
            call=ToolCall(server="banking", name="list_accounts", arguments={"owner": "Cynthia Holland"}),
            bindings=[Binding(parameter="owner", source="state", value="Cynthia Holland")],
            kind="read",
        ),
        PlannedCall(
            call=ToolCall(server="banking", name="list_cards", arguments={"account_id": "AC-0002"}),
            bindings=[Binding(parameter="account_id", source="output", value="AC-0002", path="[1].id", call=0)],
            kind="read",
        ),
        PlannedCall(
            call=ToolCall(server="banking", name="freeze_card", arguments={"card_id": "CD-0002", "reason": "lost"}),
            bindings=[
                Binding(parameter="card_id", source="output", value="CD-0002", path="[0].id", call=1),
                Binding(parameter="reason", source="generated", value="lost"),
            ],
            kind="write",
        ),
    ]
    results = [
        ToolResult(server="banking", name="list_accounts", ok=True, result=accounts),
        ToolResult(server="banking", name="list_cards", ok=True, result=[card]),
        ToolResult(server="banking", name="freeze_card", ok=True, result={**card, "status": "frozen"}),
    ]
    meta = {"banking": pool.get("banking").metadata}
    for seed in range(10):
        writer = ConversationWriter(PROMPTS, meta, random.Random(seed), ambiguity=0.0)
        text = writer.request(Turn(calls=calls, results=results, start=0))
        assert "Cynthia Holland" in text and "GBP" in text, text
        assert "AC-0002" not in text and "CD-0002" not in text


def test_a_look_alike_read_whole_is_still_told_apart(pool: EnvPool) -> None:
    """A get returns the whole record, so every field of it is 'read back': excluding them all left "Tell me about
    "Casa Rio" in Lisbon" where two hotels have that name (a reviewer's case). What it reads back tells it apart
    only where nothing else does: here, all there is."""
    hotels = [
        {"id": "HT-LIS-01", "name": "Casa Rio", "city": "Lisbon", "stars": 3, "price_per_night": 90.0},
        {"id": "HT-LIS-02", "name": "Casa Rio", "city": "Lisbon", "stars": 4, "price_per_night": 160.0},
    ]
    turn = _lisbon(hotels, (_get_hotel("HT-LIS-02", "[1].id", 0), {**hotels[1], "rooms_total": 5}))
    meta = {"hotels": pool.get("hotels").metadata}
    for seed in range(4):
        text = ConversationWriter(PROMPTS, meta, random.Random(seed), ambiguity=0.0).request(turn)
        assert "Casa Rio" in text and ("160" in text or "4" in text), text


def _at(result: Any, path: str) -> Any:
    """The value at a binding's path inside a result (`[0].id`, `author_ids[1]`, `.` for the result itself)."""
    node = result
    for part in re.findall(r"\[(\d+)\]|([^.\[\]]+)", path):
        index, key = part
        node = node[int(index)] if index else node[key]
    return node


def test_every_output_binding_points_at_its_value(
    batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool],
) -> None:
    """What the solver says it took from an earlier call is there: the claimed call's result holds the
    argument's value at the claimed path (lookups inserted before a chain step shift the call numbers)."""
    conversations, _, _ = batch
    checked = 0
    for conv in conversations:
        results = {
            r.call_id: r
            for node in conv.nodes
            for step in node.steps
            if step.role == "tool_result" and isinstance(step.content, list)
            for r in step.content
            if isinstance(r, ToolResult)
        }
        for planned in conv.task.solver:
            for b in planned.bindings:
                if b.source != "output" or b.call is None or f"call_{b.call}" not in results:
                    continue
                source = results[f"call_{b.call}"]
                assert source.ok, (conv.id, planned.call.name, b)
                where = f"{conv.id}: {planned.call.name}.{b.parameter} from call {b.call} at {b.path}"
                assert _at(source.result, b.path or ".") == b.value == planned.call.arguments[b.parameter], where
                checked += 1
    assert checked > 50


_FIELD = st.from_regex(r"[a-z][a-zA-Z_]{0,14}", fullmatch=True)
_BOOKKEEPING_NAMES = [
    *["nextPageToken", "etag", "selfLink", "@odata.nextLink", "NextToken", "Marker", "cursor", "NextKeyMarker"],
    "LastEvaluatedKey",
]
_OPAQUE_VALUES = ["143066f1-b218-3705-3da8-39441b3cabda", "da39a3ee5e6b4b0d3255bfef95601890afd80709", "tasks#task"]


def test_what_no_user_says_and_what_they_do() -> None:
    assert all(unsayable(v) for v in _OPAQUE_VALUES)
    said = ["order#123", "#general", "C#", "#ff0000", "123456789012345678901234567890123", "BK-0002", "Lisbon"]
    assert not any(unsayable(v) for v in said)


@hyp_settings(max_examples=300, deadline=None)
@given(
    plain=st.dictionaries(_FIELD, st.one_of(st.integers(), st.text(max_size=12), st.booleans()), max_size=6),
    noise=st.lists(st.sampled_from(_BOOKKEEPING_NAMES), max_size=4, unique=True),
    opaque=st.lists(st.sampled_from(_OPAQUE_VALUES), max_size=3),
    items=st.integers(min_value=1, max_value=4),
)
def test_an_answer_never_tells_a_responses_bookkeeping_or_an_opaque_value(
    plain: dict[str, Any], noise: list[str], opaque: list[str], items: int
) -> None:
    """The review of data made from compiled environments found answers saying "next page token political",
    "etag 2", a job's uuid, and "error events 1": a record's facts leave out page tokens, etags, self links and
    values no one says, and a list of unnamed items is told by its count ("error events: 2")."""
    record: dict[str, Any] = {"id": "EV-0001", **plain}
    record.update({name: "political" for name in noise})
    record.update({f"opaque_{i}": value for i, value in enumerate(opaque)})
    record["errorEvents"] = [{"at": i} for i in range(items)]
    told = facts(record, limit=len(record))
    assert not {k for k, _ in told} & set(noise)
    assert not any(unsayable(v) for _, v in told)
    said = dict(told)
    if "errorEvents" in said:
        text = fact_text("errorEvents", said["errorEvents"])
        assert text == f"error events: {items}"  # (a rule-made singular reads worse: "1 cach", "1 movy")
    fact = answer_fact(record, {})
    assert fact is None or (fact[0] not in noise and not unsayable(fact[1]))


def test_a_found_list_agrees_with_its_count() -> None:
    """ "There are 1 correction", "2 statisticses": the count and the noun agree, in every list answer's wording."""
    meta: dict[str, Any] = {}
    one, two = [{"id": "X-1", "name": "First"}], [{"id": "X-1", "name": "A"}, {"id": "X-2", "name": "B"}]
    for seed in range(30):
        writer = ConversationWriter(PROMPTS, meta, random.Random(seed))
        for tool, result, wanted in (
            ("list_entities", one, r"\b1 entity\b"),
            ("list_entities", two, r"\b2 entities\b"),
            ("list_statistics", two, r"\b2 statistics\b"),
        ):
            call = PlannedCall(call=ToolCall(server="x", name=tool, arguments={}), kind="read")
            text = writer._report(call, ToolResult(server="x", name=tool, ok=True, result=result), {}, None)
            assert re.search(wanted, text) and "are 1 " not in text, text


def test_no_wording_makes_a_plural_by_appending_to_a_placeholder() -> None:
    """`one of my {noun}s` said "historys" and "addresss": a plural is `plural()`'s (a `{nouns}` placeholder), never
    letters glued to a placeholder in a template."""
    glued = [
        (path.name, m.group(0))
        for path in sorted(PROMPTS.rglob("*.yaml"))
        for m in re.finditer(r"\{[a-z_]+\}[a-z]", path.read_text(encoding="utf-8"))
    ]
    assert not glued, glued


def test_what_tells_a_record_apart_is_what_a_user_would_say() -> None:
    """ "the collection (the one with status code 2)": a response envelope's status code, a page token or a uuid is no
    detail a user picks a record out by; a field they would say is."""
    uuid_ = "3f2a8c1e-9b7d-4e6f-a1c2-0d9e8f7a6b5c"
    a = {"id": "CO-1", "status_code": 2, "etag": "x1", "ref": uuid_, "colour": "red"}
    b = {"id": "CO-2", "status_code": 200, "etag": "x2", "ref": "0" + uuid_[1:], "colour": "red"}
    assert ConversationWriter._distinguishing(a, [a, b]) is None
    assert ConversationWriter._distinguishing({**a, "colour": "blue"}, [{**a, "colour": "blue"}, b]) == (
        "colour",
        "blue",
    )


def test_free_text_picks_a_record_out_only_where_nothing_shorter_does() -> None:
    """ "the transaction (with message Seem reach glass own ten child continue property box form final.)": a field of
    free text is the last a record is told apart by, used only where no other field does it."""
    a = {"id": "TR-1", "message": "Seem reach glass own ten child continue.", "tier": "gold"}
    b = {"id": "TR-2", "message": "Blue they view other whole feel evening.", "tier": "silver"}
    assert ConversationWriter._distinguishing(a, [a, b]) == ("tier", "gold")
    alike = {**b, "tier": "gold"}
    assert ConversationWriter._distinguishing(a, [a, alike]) == ("message", a["message"])


@given(
    names=st.lists(
        st.from_regex(r"[a-z]{3,8}-[a-z]{3,8}-[0-9]{1,2}", fullmatch=True), min_size=1, max_size=3, unique=True
    ),
    nouns=st.lists(st.sampled_from(["history", "execution", "step", "deployment", "project"]), min_size=3, max_size=3),
)
def test_a_request_names_each_record_once(names: list[str], nouns: list[str]) -> None:
    """A record's reference that a longer one (or what is said already) holds is not said again: "the "X" history in
    my execution of the history "X" of the history "X"" said the history three times."""
    refs = [f'the "{n}" {noun}' for n, noun in zip(names, nouns, strict=False)]
    nested = [f"my {nouns[-1]} of {ref}" for ref in refs]
    kept = _once([*refs, *nested, *refs])
    for name in names:
        assert sum(f'"{name}"' in phrase for phrase in kept) == 1
    assert _once(refs, said=" ".join(refs)) == []
    assert _once(["in Lisbon", "on 2026-03-12", "in Lisbon"]) == ["in Lisbon", "on 2026-03-12"]


def test_a_record_is_not_taken_for_another_of_the_same_name() -> None:
    """A project "sales" is not named by a dataset "sales" (a reviewer's cases: the parent a lookup found dropped out
    of the request, which nothing put back)."""
    assert _once(['the project "sales"'], said='get the dataset "sales"') == ['the project "sales"']
    both = ['the project "sales" in Lisbon', 'the dataset "sales" of my account']
    assert _once(both) == both
    assert _once(['matching "Lisbon"', 'of the city "Lisbon"']) == ['matching "Lisbon"', 'of the city "Lisbon"']


def test_a_summary_calls_the_apis_records_what_a_user_calls_them() -> None:
    """ "list Steps for a given Execution", "create a PerfSampleSeries": the words that name the API's records are
    said in lower case; other capitalized words are a name (a product, a brand) and stay, a run of them whole."""
    nouns = frozenset({"step", "execution", "perf sample series", "deployment"})
    assert resource_words("list Steps for a given Execution", nouns) == "list steps for a given execution"
    assert resource_words("create a PerfSampleSeries", nouns) == "create a perf sample series"
    assert resource_words("list types for Deployment Manager", nouns) == "list types for Deployment Manager"
    assert resource_words("send events to Amazon Web Services", nouns) == "send events to Amazon Web Services"
    assert resource_words("list Steps", frozenset()) == "list Steps"


def test_a_request_refers_to_each_earlier_record_its_own_way(pool: EnvPool) -> None:
    """Two records of earlier turns in one request are not both "that ... again" ("in that history again for that
    execution again"): each way of referring back is used once per request."""
    meta = {"papers": pool.get("papers").metadata}
    drop = PlannedCall(
        call=ToolCall(
            server="papers", name="remove_from_reading_list", arguments={"list_id": "RL-1", "paper_id": "P-1"}
        ),
        bindings=[
            Binding(parameter="list_id", source="output", value="RL-1", path="id", call=0),
            Binding(parameter="paper_id", source="output", value="P-1", path="id", call=1),
        ],
        kind="write",
    )
    turn = Turn(calls=[drop], results=[ToolResult(server="papers", name="remove_from_reading_list", ok=True)], start=2)
    wording = yaml.safe_load((PROMPTS / "template/conversation/en.yaml").read_text())
    forms = sorted(wording["earlier_reference"], key=len)
    for seed in range(40):
        text = ConversationWriter(PROMPTS, meta, random.Random(seed)).request(turn)
        used = []
        for form in reversed(forms):  # the longest first: "that {noun} again" before "that {noun}"
            pattern = re.escape(form).replace(re.escape("{noun}"), r"(?:reading list|list|paper)")
            used += [form] * len(re.findall(pattern, text, flags=re.IGNORECASE))
            text = re.sub(pattern, "#", text, flags=re.IGNORECASE)
        assert len(used) == 2 and len(set(used)) == 2, (seed, used)


def test_a_clarifying_question_comes_before_any_call_takes_the_record_it_asks_about(
    batch: tuple[list[Conversation], list[dict[str, Any]], EnvPool],
) -> None:
    """The question followed the call the goal's id was read from, which can come after the lookup that listed the
    look-alikes: "which hotel do you mean?" asked after checking one hotel's availability (7 of 21 clarifying turns
    of a T=40 run). It follows the lookup now, and no call before it takes any of the records it lists."""
    from tests.tasks.test_offline import check_clarification

    conversations, _, _ = batch
    asked = 0
    for conv in conversations:
        for node in conv.nodes:
            roles = [s.role for s in node.steps]
            inner = roles[1:-1]
            if "assistant" in inner:
                asked += 1
                check_clarification(node.steps[1 : inner.index("assistant") + 1])
    assert asked > 0  # the batch has clarifications to look at
