"""The composite reward and completion parsing, against real pool environments (no model)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from envfactory.env.pool import EnvPool
from envfactory.records.episode import replay
from envfactory.records.models import MaskSpec, States, ToolCall
from envfactory.records.verifier import canonical
from envfactory.reward import (
    CompositeReward,
    LinearSchedule,
    RewardSettings,
    ToolUseReward,
    best_match,
    composite_reward,
    fast_canonical,
    record_columns,
    same_value,
)
from envfactory.reward.matching import CallMatcher
from envfactory.reward.tool_calls import ToolIndex, parse_tool_calls

Call = tuple[str, dict[str, Any]]

BOOK = {"hotel_id": "HT-LIS-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2}
HOTEL_GT: list[Call] = [
    ("search_hotels", {"city": "Lisbon"}),
    ("book_room", BOOK),
    ("cancel_booking", {"booking_id": "BK-0002"}),
]


def record(
    pool: EnvPool, calls: list[tuple[str, str, dict[str, Any]]], masked: dict[int, list[str]] | None = None
) -> dict[str, str]:
    """An RL record in the reference's format (JSON strings), its final state from replaying `calls`."""
    servers = list(dict.fromkeys(s for s, _, _ in calls))
    initial: States = {s: pool.get(s).scenario("default") for s in servers}
    tool_calls = [
        ToolCall(server=s, name=n, arguments=a, masked_arguments=(masked or {}).get(i, []))
        for i, (s, n, a) in enumerate(calls)
    ]
    run = replay(pool, tool_calls, initial)
    assert all(r.ok for r in run.results), run.results
    gt = [{"name": c.name, "arguments": c.arguments, "masked_arguments": c.masked_arguments} for c in tool_calls]
    return {
        "ground_truth": json.dumps(gt),
        "initial_config": json.dumps(initial),
        "final_config": json.dumps(run.final),
        "mcp_servers": json.dumps(servers),
    }


def hermes(calls: list[Call], think: bool = True) -> str:
    blocks = "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>\n" for n, a in calls)
    return (
        "<think>\nThe user wants a room; <tool_call>{not a call}</tool_call> later.\n</think>\n" if think else ""
    ) + blocks


def openai_messages(calls: list[Call]) -> list[dict[str, Any]]:
    """TRL's conversational completion with its tool loop: one assistant message per call, tool results between."""
    out: list[dict[str, Any]] = []
    for i, (n, a) in enumerate(calls):
        args: Any = json.dumps(a) if i % 2 == 0 else a  # a JSON string or a dict: both occur
        fn = {"type": "function", "id": f"c{i}", "function": {"name": n, "arguments": args}}
        out.append({"role": "assistant", "content": "", "tool_calls": [fn]})
        out.append({"role": "tool", "name": n, "content": "{}"})
    out.append({"role": "assistant", "content": "Done: booked and cancelled."})
    return out


@pytest.fixture(scope="module")
def hotel(pool: EnvPool) -> dict[str, str]:
    return record(pool, [("hotels", n, a) for n, a in HOTEL_GT])


@pytest.fixture(scope="module")
def scorer(pool: EnvPool) -> CompositeReward:
    return CompositeReward(pool)


# ---- parsing ------------------------------------------------------------------------------------------


def test_parse_hermes_with_think_qualified_names_and_string_arguments() -> None:
    index = ToolIndex({"hotels": ["search_hotels", "book_room"], "flights": ["book_flight"]})
    text = (
        "</think>\n"  # Qwen3 opens <think> in the prompt: only the closing tag is in the completion
        '<tool_call>{"name": "hotels.search_hotels", "arguments": {"city": "Lisbon"}}</tool_call>'
        '<tool_call>\n{"name": "hotels__book_room", "arguments": "{\\"nights\\": 2}"}\n</tool_call>'
        '<tool_call>[{"name": "book_flight", "parameters": {"flight_id": "FL-1"}}]</tool_call>'
    )
    parsed = parse_tool_calls(text, index)
    assert [(c.server, c.name, c.arguments) for c in parsed.calls] == [
        ("hotels", "search_hotels", {"city": "Lisbon"}),
        ("hotels", "book_room", {"nights": 2}),
        ("flights", "book_flight", {"flight_id": "FL-1"}),
    ]
    assert parsed.unparseable == [] and parsed.formats == ["hermes"]


def test_parse_openai_messages_plain_json_xml_and_mistral() -> None:
    index = ToolIndex({"hotels": ["search_hotels", "book_room"]})
    messages = openai_messages([("search_hotels", {"city": "Lisbon"}), ("book_room", {"nights": 2})])
    got = parse_tool_calls(messages, index)
    assert [(c.name, c.arguments, c.id) for c in got.calls] == [
        ("search_hotels", {"city": "Lisbon"}, "c0"),
        ("book_room", {"nights": 2}, "c1"),
    ]
    single = parse_tool_calls(messages[0], index)  # one message dict
    assert [c.name for c in single.calls] == ["search_hotels"]
    for text in (
        '{"name": "search_hotels", "arguments": {"city": "Lisbon"}}',
        '```json\n[{"name": "search_hotels", "arguments": {"city": "Lisbon"}}]\n```',
        'I will search.\n```json\n{"name": "search_hotels", "arguments": {"city": "Lisbon"}}\n```',
        '{"role": "assistant", "tool_calls": [{"function": {"name": "search_hotels", "arguments": {"city": "Lisbon"}}}]'
        "}",
        "<tool_call>\n<function=search_hotels>\n<parameter=city>\nLisbon\n</parameter>\n</function>\n</tool_call>",
        '[TOOL_CALLS][{"name": "search_hotels", "arguments": {"city": "Lisbon"}}]',
    ):
        parsed = parse_tool_calls(text, index)
        assert [(c.server, c.name, c.arguments) for c in parsed.calls] == [
            ("hotels", "search_hotels", {"city": "Lisbon"})
        ], text
        assert not parsed.unparseable, text
    typed = ToolIndex({"hotels": ["book_room"]}, string_params={("hotels", "book_room"): ["guest_name"]})
    xml = parse_tool_calls(
        "<tool_call><function=book_room><parameter=nights>2</parameter>"
        "<parameter=guest_name>\n007\n</parameter></function></tool_call>",
        typed,
    )
    assert xml.calls[0].arguments == {"nights": 2, "guest_name": "007"}  # JSON when it parses, text for strings


# runs of markup a collapsing policy repeats, at the parser's whole budget (max_chars, 200k characters): each is
# read in linear time (a run of "<function=" took ~73 s when a name could run on to the next "<")
HOSTILE_RUNS = [
    "<function=",
    "<parameter=",
    "<tool_call><function=",
    "<function=x><parameter=",
    "<function=" + "x" * 300,
    "<parameter=x>",
    "<tool_call>",
    "```",
    "```json\n{",
    '{"name": ',
    "<think>",
    "[TOOL_CALLS][",
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", HOSTILE_RUNS)
def test_a_run_of_markup_at_the_whole_budget_parses_in_linear_time(unit: str) -> None:
    index = ToolIndex({"hotels": ["search_hotels", "book_room"]})
    for text in (unit * (200_000 // len(unit) + 1), "<function=x>" + unit * (200_000 // len(unit))):
        parsed = parse_tool_calls(text, index)
        assert len(parsed.calls) <= 64 and parsed.error is None


def test_parse_reports_unparseable_blocks_and_answers_without_calls() -> None:
    text = (
        '<tool_call>{"name": "search_hotels", "arguments": {"city": "Lisbon"}}</tool_call>'
        "<tool_call>{name: search_hotels}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "book_room", "arguments": "{broken"}</tool_call>'
        '<tool_call>{"name": "book_room", "arguments": [1, 2]}</tool_call>'
        '<tool_call>{"name": "book_room", "arguments": {"nights": 2}}'  # truncated before </tool_call>: still read
    )
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.calls] == ["search_hotels", "book_room"]
    reasons = [b.reason for b in parsed.unparseable]
    assert len(reasons) == 4
    assert "invalid JSON" in reasons[0] and "no tool name" in reasons[1]
    assert "not valid JSON" in reasons[2] and "must be a JSON object" in reasons[3]
    assert any("not closed" in p for p in parsed.problems)
    answer = parse_tool_calls("The cheapest hotel in Lisbon is Alfama Lodge at 85 EUR a night.")
    assert answer.calls == [] and answer.unparseable == [] and not answer.attempted
    assert parse_tool_calls("<think>still thinking <tool_call>").calls == []


def test_parse_never_raises_on_garbage() -> None:
    circular: list[Any] = []
    circular.append(circular)
    junk: list[Any] = [
        None,
        42,
        3.5,
        object(),
        b"\xff\xfe<tool_call>",
        [[[["x"]]]],
        [1, None, {"role": "assistant", "tool_calls": "nope"}],
        {"name": 7},
        {1: 2},
        {"role": "assistant", "content": {"weird": True}},
        {"name": "t", "arguments": {1: "non-string key"}},
        {"name": "t", "arguments": {"f": float("nan"), "o": object()}},
        circular,
        "[" * 100_000,
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '{"name": "t", "arguments": ' + "[" * 50 + "]" * 50 + "}",
        "<tool_call>" * 5000,
        "x" * 1_000_000,
    ]
    for value in junk:
        parsed = parse_tool_calls(value)
        assert isinstance(parsed.calls, list)
    assert parse_tool_calls(None).error and parse_tool_calls(42).error
    deep = parse_tool_calls('{"name": "t", "arguments": {"a": ' + "[" * 50 + "]" * 50 + "}}")
    assert deep.calls == [] and "deeper" in deep.unparseable[0].reason
    many = parse_tool_calls(hermes([("t", {})] * 70, think=False), max_calls=64)
    assert len(many.calls) == 64 and many.dropped == 6 and many.n_calls == 70


def test_tool_index_resolution() -> None:
    index = ToolIndex({"hotels": ["cancel_booking", "book_room"], "bfcl_travel": ["cancel_booking"]})
    assert index.resolve("cancel_booking")[:2] == ("hotels", "cancel_booking")  # ambiguous: mcp_servers order
    assert index.resolve("cancel_booking")[2] is not None
    index.preferred = {"cancel_booking": "bfcl_travel"}  # the ground truth used it there
    assert index.resolve("cancel_booking") == ("bfcl_travel", "cancel_booking", None)
    assert index.resolve("hotels.cancel_booking") == ("hotels", "cancel_booking", None)
    assert index.resolve("book_room", "hotels") == ("hotels", "book_room", None)
    assert index.resolve("hotels.fly")[:2] == ("hotels", "fly")
    assert index.resolve("teleport")[:2] == ("", "teleport")


# ---- the order-tolerant match --------------------------------------------------------------------------


def test_best_match_respects_only_conflicting_pairs() -> None:
    # gt 0 ≺ 1 (conflict), 2 independent; predictions: [1, 0, 2]
    assert best_match([[1], [0], [2]], [0b010, 0, 0]) == 2  # 0 and 1 crossed: one of them is lost
    assert best_match([[1], [0], [2]], [0, 0, 0]) == 3  # no conflicts: any order
    assert best_match([[0, 1], [0, 1]], [0b10, 0]) == 2  # identical calls: the assignment that keeps order
    assert best_match([], []) == 0
    assert best_match([[0]] * 40, [0]) == 1


def test_same_value_rules() -> None:
    assert same_value(150, 150.0000001) and not same_value(150, 151)
    assert not same_value(True, 1) and same_value(None, None) and not same_value(None, 0)
    assert same_value(" Lisbon", "lisbon") and not same_value("Lisbon", "lisbon", case_sensitive=True)
    assert same_value({"a": [1, {"b": "X"}]}, {"a": [1.0, {"b": "x"}], "c": None})
    assert not same_value([1, 2], [2, 1])


def test_exact_arguments_have_no_leniency_at_all() -> None:
    """What a refused call must repeat: stricter than `same_args` everywhere (`True == 1` in Python)."""
    m = CallMatcher(lambda server: None)
    for want, got in [
        ({"f": 1}, {"f": True}),
        ({"f": [0]}, {"f": [False]}),
        ({"n": 1}, {"n": 1.0}),
        ({"s": "Lisbon"}, {"s": "lisbon"}),
        ({"s": "x"}, {"s": " x"}),
        ({"d": {"a": 1}}, {"d": {"a": 1, "b": 2}}),
    ]:
        assert not m.exact_args(want, [], got), (want, got)
    assert m.exact_args({"d": {"a": [1, "x"]}, "t": "free"}, ["t"], {"d": {"a": [1, "x"]}, "t": "other words"})


# ---- the composite reward on real environments -----------------------------------------------------------


def test_ground_truth_scores_one_in_every_format(scorer: CompositeReward, hotel: dict[str, str]) -> None:
    qualified = [(f"hotels.{n}", a) for n, a in HOTEL_GT]
    for completion in (
        hermes(HOTEL_GT),
        hermes(qualified),
        openai_messages(HOTEL_GT),
        json.dumps([{"name": n, "arguments": a} for n, a in HOTEL_GT]),
    ):
        result = scorer.score(completion, **hotel)
        assert result.reward == 1.0, result
        assert (result.r_traj, result.r_state, result.p_length, result.matched) == (1.0, 1.0, 0, 3)


def test_ordering_ground_truth_redundant_wrong_argument_empty(scorer: CompositeReward, hotel: dict[str, str]) -> None:
    wrong = [HOTEL_GT[0], ("book_room", {**BOOK, "nights": 3}), HOTEL_GT[2]]
    redundant = [*HOTEL_GT, ("get_booking", {"booking_id": "BK-0002"})]
    truth = scorer.score(hermes(HOTEL_GT), **hotel)
    extra = scorer.score(hermes(redundant), **hotel)
    bad_arg = scorer.score(hermes(wrong), **hotel)
    empty = scorer.score("", **hotel)
    assert truth.reward == 1.0 > extra.reward > bad_arg.reward > empty.reward == 0.0
    assert extra.r_state == 1.0 and extra.p_length == 1 and extra.length_penalty == pytest.approx(0.05)
    assert extra.r_traj == pytest.approx(6 / 7)  # F1: precision 3/4, recall 1
    assert bad_arg.r_traj == pytest.approx(2 / 3) and bad_arg.r_state == 0.0  # partial, not all-or-nothing
    assert any("nights" in r for r in bad_arg.reasons), bad_arg.reasons
    assert empty.r_traj == 0.0 and any("unchanged" in r for r in empty.reasons)


def test_unparseable_scores_zero_with_a_reason_and_partial_costs_a_format_penalty(
    scorer: CompositeReward, hotel: dict[str, str]
) -> None:
    result = scorer.score("<tool_call>{'name': 'search_hotels'}</tool_call>", **hotel)
    assert result.reward == 0.0 and result.n_unparseable == 1
    assert result.reasons[0].startswith("unparseable:") and "invalid JSON" in result.reasons[0]
    mixed = hermes(HOTEL_GT) + "<tool_call>{oops}</tool_call>"
    partial = scorer.score(mixed, **hotel)
    assert partial.format_penalty == pytest.approx(0.05) and partial.reward == pytest.approx(0.95)
    many_bad = hermes(HOTEL_GT) + "<tool_call>{oops}</tool_call>" * 30
    assert scorer.score(many_bad, **hotel).format_penalty == pytest.approx(0.5)  # capped


def test_garbage_completions_and_records_never_raise(scorer: CompositeReward, hotel: dict[str, str]) -> None:
    for junk in (None, 42, 1.5, object(), [None, 3], {"x": {"y": []}}, "[" * 200_000, "z" * 500_000, [[[[[]]]]]):
        result = scorer.score(junk, **hotel)
        assert 0.0 <= result.reward <= 1.0
    assert scorer.score(None, **hotel).reasons == ["unparseable: no completion (None)"]
    broken = {**hotel, "ground_truth": "[{not json"}
    result = scorer.score(hermes(HOTEL_GT), **broken)
    assert result.reward == 0.0 and result.reasons[0].startswith("record:")
    wrong_shape = {**hotel, "initial_config": json.dumps({"hotels": {"hotels": "not records"}})}
    assert scorer.score(hermes(HOTEL_GT), **wrong_shape).reasons[0].startswith("record:")
    odd = scorer.score(hermes([("teleport", {}), ("flights.book_flight", {"flight_id": "FL-1001"})]), **hotel)
    assert odd.n_failed == 2 and odd.reward == 0.0  # unknown tool / environment outside the task: failed calls
    assert any("no such environment" in r for r in odd.reasons)


def test_parsed_objects_equal_json_strings(pool: EnvPool, hotel: dict[str, str]) -> None:
    parsed = {k: json.loads(v) for k, v in hotel.items()}
    parsed["ground_truth"] = [ToolCall(server="hotels", name=n, arguments=a) for n, a in HOTEL_GT]
    completion = hermes([HOTEL_GT[0], ("book_room", {**BOOK, "nights": 3})])
    a = composite_reward(completion, **hotel, pool=pool)
    b = composite_reward(completion, **parsed, pool=pool)
    assert a == b and 0 < a.reward < 1


def test_r_traj_edge_cases(pool: EnvPool, scorer: CompositeReward) -> None:
    reads = record(
        pool, [("hotels", "search_hotels", {"city": "Lisbon"}), ("hotels", "get_hotel", {"hotel_id": "HT-POR-01"})]
    )
    swapped = scorer.score(
        hermes([("get_hotel", {"hotel_id": "HT-POR-01"}), ("search_hotels", {"city": "Lisbon"})]), **reads
    )
    assert swapped.reward == 1.0  # independent reads: any order
    nothing = scorer.score("", **reads)
    assert nothing.r_traj == 0.0 and nothing.reward == 0.0  # read-only turn: doing nothing earns no state credit
    published = CompositeReward(pool, RewardSettings(state_scope="all")).score("", **reads)
    assert published.reward == 0.5  # the published rule: every unchanged server counts as equal
    empty_gt = {**reads, "ground_truth": "[]", "final_config": reads["initial_config"]}
    assert scorer.score("No call is needed.", **empty_gt).reward == 1.0
    assert scorer.score(hermes([("search_hotels", {"city": "Lisbon"})]), **empty_gt).r_traj == 0.0

    book_then_modify = [
        ("hotels", "book_room", BOOK),
        ("hotels", "modify_booking", {"booking_id": "BK-0002", "nights": 4}),
    ]
    writes = record(pool, book_then_modify)
    flipped = scorer.score(hermes([(n, a) for _, n, a in reversed(book_then_modify)]), **writes)
    assert flipped.r_traj == pytest.approx(0.5) and flipped.reward < 1.0  # dependent writes: order matters
    assert flipped.n_failed == 1  # modify before the booking exists


def test_argument_normalization_defaults_numbers_and_case(pool: EnvPool, scorer: CompositeReward) -> None:
    rec = record(pool, [("hotels", "search_hotels", {"city": "Lisbon", "max_price": 150})])
    for args in ({"city": "lisbon", "max_price": 150.0000001}, {"city": "Lisbon", "max_price": 150, "min_stars": None}):
        assert scorer.score(hermes([("search_hotels", args)]), **rec).r_traj == 1.0, args
    assert scorer.score(hermes([("search_hotels", {"city": "Lisbon", "max_price": 151})]), **rec).r_traj == 0.0
    # an omitted optional argument equals its default (flights: cabin="economy")
    flight = record(pool, [("flights", "book_flight", {"flight_id": "FL-1001", "passenger_name": "Ana Costa"})])
    explicit = {"flight_id": "FL-1001", "passenger_name": "Ana Costa", "cabin": "economy"}
    assert scorer.score(hermes([("book_flight", explicit)]), **flight).reward == 1.0
    # arguments the tool rejects match nothing (a string for an integer)
    rejected = scorer.score(hermes([("search_hotels", {"city": "Lisbon", "max_price": "150"})]), **rec)
    assert rejected.r_traj == 0.0 and rejected.n_failed == 0  # reads are not replayed: they cannot change state
    replaying = CompositeReward(pool, RewardSettings(replay_reads=True))
    again = replaying.score(hermes([("search_hotels", {"city": "Lisbon", "max_price": "150"})]), **rec)
    assert again.n_failed == 1 and any("invalid_arguments" in r for r in again.reasons)
    assert again.reward == rejected.reward


def test_a_write_the_environment_refuses_keeps_a_match_only_by_repeating_it_exactly(
    pool: EnvPool, scorer: CompositeReward
) -> None:
    """The matcher's leniency (case, spaces, isclose) earned full trajectory credit for a write the tool refused: a
    lower-cased hotel id (not_found) scored 0.9 at α = 0.9, above an honest partial answer (0.6)."""
    rec = record(pool, [("hotels", "search_hotels", {"city": "Lisbon"}), ("hotels", "book_room", BOOK)])
    search = ("search_hotels", {"city": "Lisbon"})
    for hotel_id in ("ht-lis-01", " HT-LIS-01 "):
        sloppy = scorer.score(hermes([search, ("book_room", {**BOOK, "hotel_id": hotel_id})]), **rec)
        assert (sloppy.matched, sloppy.n_failed, sloppy.r_state) == (1, 1, 0.0), sloppy.reasons
        partial = scorer.score(hermes([search]), **rec)
        assert sloppy.reward < partial.reward  # the search alone, and nothing refused, is the better answer
    accepted = scorer.score(hermes([search, ("book_room", {**BOOK, "guest_name": "ana costa"})]), **rec)
    assert accepted.matched == 2 and accepted.n_failed == 0  # the tool took it: leniency stands (the state judges)
    money = record(
        pool, [("banking", "transfer", {"from_account_id": "AC-1001", "payee_id": "PY-0002", "amount": 20.5})]
    )
    close = scorer.score(
        hermes([("transfer", {"from_account_id": "AC-1001", "payee_id": "PY-0002", "amount": 20.50001})]), **money
    )
    assert (close.matched, close.n_failed) == (0, 1), close.reasons  # isclose, but refused: two decimals at most
    # a read the tool refuses, matched only leniently: no credit either (a read-only turn scored 1.0 with it)
    look = record(pool, [("hotels", "get_hotel", {"hotel_id": "HT-LIS-01"})])
    sloppy_read = scorer.score(hermes([("get_hotel", {"hotel_id": "ht-lis-01"})]), **look)
    assert sloppy_read.matched == 0 and sloppy_read.reward == 0.0, sloppy_read
    assert scorer.score(hermes([("get_hotel", {"hotel_id": "HT-LIS-01"})]), **look).reward == 1.0
    # a refused write that repeats the ground truth exactly keeps its match (it failed for an earlier missing call)
    trip = [("flights", "book_flight", {"flight_id": "FL-1001", "passenger_name": "Ana Costa"})]
    flight = record(pool, [*trip, ("flights", "add_baggage", {"booking_id": "FB-0006", "bags": 1})])
    alone = scorer.score(hermes([("add_baggage", {"booking_id": "FB-0006", "bags": 1})]), **flight)
    assert (alone.matched, alone.n_failed) == (1, 1), alone.reasons


def test_masked_arguments_in_both_terms(pool: EnvPool, scorer: CompositeReward) -> None:
    args = {
        "customer_id": "CU-002",
        "subject": "Printer offline",
        "priority": "high",
        "description": "It shows error 42.",
    }
    rec = record(pool, [("helpdesk", "create_ticket", args)], masked={0: ["description"]})
    reworded = {**args, "description": "Since Monday the printer reports E42 and prints nothing."}
    result = scorer.score(hermes([("create_ticket", reworded)]), **rec)
    assert (result.r_traj, result.r_state, result.reward) == (1.0, 1.0, 1.0)
    strict = CompositeReward(pool, RewardSettings(mask_masked_values=False)).score(
        hermes([("create_ticket", reworded)]), **rec
    )
    assert strict.r_traj == 1.0 and strict.r_state == 0.0 and strict.reward == 0.5
    unmasked = scorer.score(hermes([("create_ticket", {**args, "subject": "Scanner offline"})]), **rec)
    assert unmasked.r_traj == 0.0 and unmasked.r_state == 0.0
    # another wording costs nothing, but none at all is no wording: left out, empty or blank, the call matches nothing
    for unsaid in (
        {k: v for k, v in args.items() if k != "description"},
        {**args, "description": ""},
        {**args, "description": "  "},
    ):
        skipped = scorer.score(hermes([("create_ticket", unsaid)]), **rec)
        assert skipped.r_traj == 0.0 and skipped.reward < result.reward, unsaid


def test_multi_server_turn(pool: EnvPool, scorer: CompositeReward) -> None:
    hotel_book = ("hotels", "book_room", BOOK)
    flight_book = ("flights", "book_flight", {"flight_id": "FL-1001", "passenger_name": "Ana Costa"})
    rec = record(pool, [flight_book, hotel_book])
    swapped = scorer.score(hermes([("book_room", BOOK), ("flights__book_flight", flight_book[2])]), **rec)
    assert swapped.reward == 1.0  # writes on different servers are independent
    wrong_flight = {"flight_id": "FL-1003", "passenger_name": "Ana Costa"}
    half = scorer.score(hermes([("book_flight", wrong_flight), ("book_room", BOOK)]), **rec)
    assert half.r_state == 0.5 and half.r_traj == 0.5 and half.reward == pytest.approx(0.5)
    assert any(r.startswith("state flights") for r in half.reasons)
    # a third, untouched server in mcp_servers earns nothing by default, counts under the published rule
    bank = pool.get("banking").scenario("default")
    three = {
        "ground_truth": rec["ground_truth"],
        "initial_config": json.dumps({**json.loads(rec["initial_config"]), "banking": bank}),
        "final_config": json.dumps({**json.loads(rec["final_config"]), "banking": bank}),
        "mcp_servers": json.dumps(["flights", "hotels", "banking"]),
    }
    only_hotel = hermes([("book_room", BOOK)])
    assert scorer.score(only_hotel, **three).r_state == 0.5
    unscored = {**three, "final_config": rec["final_config"]}  # banking has no final state: noted, not scored
    assert any("banking: no final state" in r for r in scorer.score(only_hotel, **unscored).reasons)
    assert CompositeReward(pool, RewardSettings(state_scope="all")).score(only_hotel, **three).r_state == pytest.approx(
        2 / 3
    )


def test_length_penalty_is_capped_and_reward_clipped(scorer: CompositeReward, hotel: dict[str, str]) -> None:
    spam = [*HOTEL_GT, *[("search_hotels", {"city": "Porto"})] * 30]
    result = scorer.score(hermes(spam), **hotel)
    assert result.p_length == 30 and result.length_penalty == pytest.approx(0.5) and result.reward >= 0.0
    hard = CompositeReward(scorer.pool, RewardSettings(gamma=1.0, length_penalty_cap=5.0))
    assert hard.score(hermes(spam), **hotel).reward == 0.0  # clipped, not negative


def test_alpha_schedule() -> None:
    sched = LinearSchedule()
    assert sched.value(0, 100) == pytest.approx(0.9) and sched.value(50, 100) == pytest.approx(0.5)
    assert sched.value(200, 100) == pytest.approx(0.1) and sched.value(5) == pytest.approx(0.9)
    settings = RewardSettings(alpha_schedule=LinearSchedule(steps=10))
    assert settings.alpha_at(None) == 0.5 and settings.alpha_at(10) == pytest.approx(0.1)


def test_fast_canonical_equals_the_verifiers(pool: EnvPool) -> None:
    chains: list[list[tuple[str, str, dict[str, Any]]]] = [
        [("hotels", "book_room", BOOK), ("hotels", "book_room", {**BOOK, "hotel_id": "HT-POR-01"})],
        [
            ("hotels", "modify_booking", {"booking_id": "BK-0001", "nights": 2}),
            ("hotels", "cancel_booking", {"booking_id": "BK-0001"}),
        ],
        [
            ("helpdesk", "create_ticket", {"customer_id": "CU-002", "subject": "Help"}),
            ("helpdesk", "add_comment", {"ticket_id": "TK-0007", "text": "More."}),
        ],
        [
            ("papers", "create_reading_list", {"name": "Thesis"}),
            ("papers", "add_to_reading_list", {"list_id": "RL-0003", "paper_id": "PAP-001"}),
        ],
        [
            (
                "calendar",
                "create_event",
                {"title": "Sync", "organizer": "ana@acme.io", "start": "2026-03-12T10:00:00", "duration_minutes": 30},
            ),
            ("calendar", "book_meeting_room", {"event_id": "EV-0007", "room_id": "RM-A1"}),
        ],
        [
            ("shop", "add_to_cart", {"customer_id": "CU-002", "product_id": "PR-1002"}),
            ("shop", "checkout", {"customer_id": "CU-002"}),
        ],
        [("papers", "delete_note", {"note_id": "NT-0001"})],
        [],
    ]
    masks = [MaskSpec(), MaskSpec(paths=["*.status"]), MaskSpec(generated_ids=False)]
    for steps in chains:
        for server in {s for s, _, _ in steps} or {"hotels"}:
            initial = pool.get(server).scenario("default")
            calls = [ToolCall(server=s, name=n, arguments=a) for s, n, a in steps if s == server]
            final = replay(pool, calls, {server: initial}).final[server]
            for mask in masks:
                assert fast_canonical(initial, final, mask) == canonical(initial, final, mask)
    # a generated id already named in the initial state (a dangling reference): the verifier's own path
    init = {"counters": {"X": 1}, "items": {"A": {"id": "A", "ref": "X-2"}}, "note": "X-2"}
    final = {
        "counters": {"X": 2},
        "items": {"A": {"id": "A", "ref": "X-2"}, "X-2": {"id": "X-2", "of": "A"}},
        "note": "X-2",
    }
    assert fast_canonical(init, final, MaskSpec()) == canonical(init, final, MaskSpec())


def test_completions_with_the_same_calls_share_one_replay(pool: EnvPool, hotel: dict[str, str]) -> None:
    scorer = CompositeReward(pool)
    plain = scorer.score(hermes(HOTEL_GT), **hotel)
    qualified = scorer.score(openai_messages([(f"hotels__{n}", a) for n, a in HOTEL_GT]), **hotel)
    target = scorer.target(hotel["ground_truth"], hotel["initial_config"], hotel["final_config"], hotel["mcp_servers"])
    assert len(target.replays) == 1 and plain == qualified
    wrong = hermes([HOTEL_GT[0], ("book_room", {**BOOK, "nights": 3}), HOTEL_GT[2]])
    unmemoized = CompositeReward(pool, RewardSettings(memoize_replays=False))
    assert scorer.score(wrong, **hotel) == scorer.score(wrong, **hotel) == unmemoized.score(wrong, **hotel)
    assert len(target.replays) == 2


# ---- TRL ------------------------------------------------------------------------------------------------


def test_trl_reward_function_with_flat_and_nested_columns(pool: EnvPool, hotel: dict[str, str]) -> None:
    reward = ToolUseReward(pool, RewardSettings(alpha_schedule=LinearSchedule(start=0.9, end=0.1)))
    assert reward.__name__ == "tool_use_reward"
    completions = [
        [{"role": "assistant", "content": hermes(HOTEL_GT)}],
        [{"role": "assistant", "content": ""}],
        [{"role": "assistant", "content": "<tool_call>{broken</tool_call>"}],
        None,
    ]
    n = len(completions)
    metrics: dict[str, float] = {}
    extra: dict[str, list[Any]] = {}
    columns = {k: [v] * n for k, v in hotel.items()}
    state = SimpleNamespace(global_step=0, max_steps=100)
    out = reward(
        prompts=[[{"role": "user", "content": "Book and cancel."}]] * n,
        completions=completions,
        completion_ids=[[1]] * n,
        trainer_state=state,
        log_metric=metrics.__setitem__,
        log_extra=extra.__setitem__,
        **columns,
    )
    assert out == [1.0, 0.0, 0.0, 0.0] and all(isinstance(x, float) for x in out)
    assert reward.last_results[0].alpha == pytest.approx(0.9)
    assert reward.last_results[2].reasons[0].startswith("unparseable")
    assert metrics["tool_use_reward/r_traj"] == pytest.approx(0.25) and len(extra["tool_use_reward_why"]) == n

    nested = {
        "reward_model": [{"style": "rule", "ground_truth": hotel["ground_truth"]}] * n,
        "extra_info": [{"mcp_factory_kwargs": {k: hotel[k] for k in ("mcp_servers", "initial_config", "final_config")}}]
        * n,
    }
    assert reward([""] * n, completions, **nested) == [1.0, 0.0, 0.0, 0.0]
    # the nested columns saved as JSON text read the same; a flat column's null leaves its row to them
    as_text = {k: [json.dumps(v) for v in col] for k, col in nested.items()}
    assert reward([""] * n, completions, **as_text) == [1.0, 0.0, 0.0, 0.0]
    search_only = [hermes(HOTEL_GT[:1])] * 2
    gaps = {**nested, "final_config": [None, hotel["final_config"]]}
    nested_only = reward([""] * 2, search_only, **{k: v[:2] for k, v in nested.items()})
    assert reward([""] * 2, search_only, **{k: v[:2] for k, v in gaps.items()}) == nested_only
    assert nested_only[0] < 0.5  # judged on the state too (a null had hidden it: scored on the trajectory alone)
    nulls = {**hotel, "final_config": [None, None]}  # a column of nulls: rows without it, not a missing column
    scored = reward([""] * 2, search_only, **{k: v if isinstance(v, list) else [v] * 2 for k, v in nulls.items()})
    assert scored[0] == scored[1] > nested_only[0]  # no final state to judge: the trajectory alone (it raised)
    broken = {**as_text, "extra_info": ["{not json", *as_text["extra_info"][1:]]}  # one unreadable cell
    got = reward([""] * n, completions, **broken)  # the step goes on: that row has no record to score against
    assert got == [0.0, 0.0, 0.0, 0.0] and any("no environment" in r for r in reward.last_results[0].reasons)
    with pytest.raises(ValueError, match="ground_truth"):
        reward(["p"], ["c"], other=[1])
    with pytest.raises(ValueError, match="one value per completion"):
        record_columns({"ground_truth": ["x"]}, 2)

    clone = pickle.loads(pickle.dumps(reward))  # TRL's async worker pickles reward functions
    assert clone.__name__ == reward.__name__ and clone(
        [""], [hermes(HOTEL_GT)], **{k: [v] for k, v in hotel.items()}
    ) == [1.0]


def test_trl_grpo_calls_the_reward_function(pool: EnvPool, hotel: dict[str, str]) -> None:
    """Through GRPOTrainer's own reward step (its dataset columns, trainer_state, log hooks), no model."""
    trl = pytest.importorskip("trl")
    calculate = getattr(trl.GRPOTrainer, "_calculate_rewards", None)
    if calculate is None:
        pytest.skip("this TRL has no GRPOTrainer._calculate_rewards")
    reward = ToolUseReward(pool)
    extra: dict[str, list[Any]] = {}
    metrics: dict[str, float] = {}
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device="cpu", is_main_process=True),
        args=SimpleNamespace(report_to=[]),
        reward_funcs=[reward],
        reward_processing_classes=[None],
        reward_func_names=[reward.__name__],
        state=SimpleNamespace(global_step=3, max_steps=10),
        environments=None,
        _log_completion_extra=lambda column, values: extra.setdefault(column, []).extend(values),
        _log_metric=metrics.__setitem__,
    )
    prompt = [{"role": "user", "content": "Book a room in Lisbon for Ana Costa, then cancel it."}]
    inputs = [{"prompt": prompt, **hotel} for _ in range(3)]
    completions = [
        [{"role": "assistant", "content": hermes(HOTEL_GT)}],
        [{"role": "assistant", "content": ""}],
        [{"role": "assistant", "content": "<tool_call>{x</tool_call>"}],
    ]
    rewards = calculate(trainer, inputs, [prompt] * 3, completions, [[1]] * 3)
    assert rewards[:, 0].tolist() == [1.0, 0.0, 0.0]
    assert metrics[f"{reward.__name__}/unparseable"] == pytest.approx(1 / 3)
    assert extra[f"{reward.__name__}_why"][2].startswith("unparseable")


def test_a_record_without_a_goal_state_is_logged_once_per_server(
    pool: EnvPool, hotel: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose final state is null loses its state term (the documented rule: scored on its calls), which a
    broken export did silently: a wrong argument scored 0.5 where it scores ~0.25 with the state term."""
    scorer = CompositeReward(pool)
    wrong = hermes([(n, {**a, "guest_name": "Nobody"} if "guest_name" in a else a) for n, a in HOTEL_GT])
    full = scorer.score(wrong, **hotel)
    with caplog.at_level("WARNING", logger="envfactory.reward"):
        for goal in ("null", "{}"):
            bare = scorer.score(wrong, **{**hotel, "final_config": goal})
            assert bare.reward > full.reward and any("hotels: no final state" in r for r in bare.reasons)
    said = [r for r in caplog.records if "no final state for 'hotels'" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
