"""The reward's fast path (cached records and initial states, the replay memo by replayed calls, kept sessions
rolled back to a shared prefix, the state compared through what the calls touched) scores every completion
bit for bit like the straightforward computation: random completions — right calls, wrong arguments, extra
and repeated calls, unknown tools, malformed blocks — against records of the bundled environments."""

from __future__ import annotations

import gc
import json
import logging
import math
import sys
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.env.state import State
from envfactory.env.state_fields import touched_dump
from envfactory.records.episode import Episode
from envfactory.records.models import ToolCall
from envfactory.records.verifier import canonical
from envfactory.reward import CompositeReward, RewardSettings, apply_blanks, best_match, first_differences
from envfactory.reward.state_term import dump_delta, touched_equal
from envfactory.reward.tool_calls import parse_tool_calls
from tests.reward.test_scorer import BOOK, hermes, record

Step = tuple[str, str, dict[str, Any]]

CHAINS: list[tuple[list[Step], dict[int, list[str]]]] = [
    (
        [
            ("hotels", "search_hotels", {"city": "Lisbon"}),
            ("hotels", "book_room", BOOK),
            ("hotels", "modify_booking", {"booking_id": "BK-0002", "nights": 4}),
            ("hotels", "cancel_booking", {"booking_id": "BK-0001"}),
        ],
        {},
    ),
    (
        [
            ("flights", "search_flights", {"origin": "LIS", "destination": "MAD", "date": "2026-03-08"}),
            ("flights", "book_flight", {"flight_id": "FL-1001", "passenger_name": "Ana Costa"}),
            ("flights", "add_baggage", {"booking_id": "FB-0006", "bags": 2}),
        ],
        {},
    ),
    (
        [
            ("shop", "add_to_cart", {"customer_id": "CU-002", "product_id": "PR-1002", "quantity": 2}),
            ("shop", "checkout", {"customer_id": "CU-002"}),
        ],
        {},
    ),
    (
        [
            ("helpdesk", "search_customers", {"query": "Tom"}),
            (
                "helpdesk",
                "create_ticket",
                {"customer_id": "CU-002", "subject": "Invoice", "priority": "high", "description": "About March."},
            ),
            ("helpdesk", "assign_ticket", {"ticket_id": "TK-0007", "agent_id": "AG-02"}),
        ],
        {1: ["description"]},
    ),
    ([("banking", "transfer", {"from_account_id": "AC-1001", "payee_id": "PY-0002", "amount": 20.5})], {}),
    ([("papers", "delete_note", {"note_id": "NT-0001"})], {}),
    (
        [
            ("flights", "book_flight", {"flight_id": "FL-1003", "passenger_name": "Tom Becker"}),
            ("hotels", "book_room", {**BOOK, "guest_name": "Tom Becker"}),
        ],
        {},
    ),
    ([("hotels", "search_hotels", {"city": "Porto"}), ("hotels", "get_hotel", {"hotel_id": "HT-POR-01"})], {}),
]
IDS = ["BK-0001", "BK-0002", "BK-0003", "FB-0006", "FB-0001", "TK-0007", "TK-0001", "CU-002", "NT-0001", "PR-1002"]
MALFORMED = [
    "<tool_call>{'name': oops}</tool_call>",
    '<tool_call>{"name": "book_room", "arguments": {</tool_call>',
    "<tool_call></tool_call>",
    '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "book_room", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "search_hotels", "arguments": {"city": NaN}}</tool_call>',
]
VARIANTS = [
    RewardSettings(),
    RewardSettings(replay_reads=True, state_scope="all"),
    RewardSettings(memoize_replays=False, mask_masked_values=False),
    RewardSettings(max_calls=3),  # calls beyond the third counted, not kept: also when a block comes from the memo
]


class Reference(CompositeReward):
    """The reward computed the straightforward way: the record parsed anew for every completion, every write
    call replayed in a fresh `Episode` (no memo, no kept sessions), the final states dumped whole and put in
    the verifier's canonical form, the matches searched call by call."""

    def __init__(self, pool: EnvPool, settings: RewardSettings) -> None:
        super().__init__(pool, settings.model_copy(update={"cache_size": 0, "memoize_replays": False}))

    def normalize(self, call: ToolCall, *, strict: bool) -> dict[str, Any] | None:
        return self.matcher.normalize(call, strict=strict)

    def _match(self, t: Any, calls: list[ToolCall], keys: list[Any], failed: Any = ()) -> int:
        if not t.gt or not calls:
            return 0
        # every call run in order, reads too: a call the environment refuses matches only exactly
        episode = Episode(self.pool, {c.server: t.initial[c.server] for c in calls if c.server in t.initial})
        refused = {
            k
            for k, c in enumerate(calls)
            if c.server not in t.initial or not episode.call(c.server, c.name, c.arguments).ok
        }
        candidates = []
        for k, c in enumerate(calls):
            args = self.normalize(c, strict=True)
            same = self.matcher.exact_args if k in refused else self.matcher.same_args  # a refused write: exactly
            candidates.append(
                [
                    i
                    for i, g in enumerate(t.gt)
                    if (g.server, g.name) == (c.server, c.name)
                    and args is not None
                    and t.gt_args[i] is not None
                    and same(t.gt_args[i], g.masked_arguments, args)
                ]
            )
        return best_match(candidates, t.succ, self.settings.max_match_states)

    def _state(
        self, t: Any, calls: list[ToolCall], keys: list[Any], reasons: list[str]
    ) -> tuple[float | None, list[int]]:
        s = self.settings
        replayed = [
            (k, c)
            for k, c in enumerate(calls)
            if c.server in t.initial and (s.replay_reads or self._kind(c.server, c.name) != "read")
        ]
        episode = Episode(self.pool, {c.server: t.initial[c.server] for _, c in replayed})
        wrote: set[str] = set()
        failed: list[int] = []
        for k, c in enumerate(calls):
            if c.server not in t.initial:
                failed.append(k)
                if len(failed) <= 3:
                    reasons.append(f"call {k} {c.server or '?'}.{c.name}: no such environment in this task")
        for k, c in replayed:
            rec = episode.call(c.server, c.name, c.arguments)
            if not rec.ok:
                failed.append(k)
                if len(failed) <= 3 and rec.error is not None:
                    reasons.append(f"call {k} {c.qualified} failed: {rec.error.type}: {rec.error.message[:120]}")
            elif self._kind(c.server, c.name) == "write":
                wrote.add(c.server)
        equal = considered = 0
        for srv in t.servers:
            goal = t.goal_canon.get(srv)
            if goal is None:
                continue
            if srv in wrote:
                blank = t.blanks[srv]
                base = apply_blanks(t.initial[srv], blank)
                actual = canonical(base, apply_blanks(episode.sessions[srv].dump(), blank), s.mask)
                same, moved = actual == goal, actual != t.init_canon[srv]
                if not same:
                    paths = first_differences(goal, actual)
                    shown = ", ".join(paths[:3]) + (", …" if len(paths) > 3 else "")
                    reasons.append(f"state {srv}: differs at {shown}")
            else:
                same, moved = not t.goal_changed[srv], False
                if not same:
                    reasons.append(f"state {srv}: unchanged; the task changes {t.goal_summary(srv)}")
            if s.state_scope == "all" or t.goal_changed[srv] or moved:
                considered += 1
                equal += same
        return (equal / considered if considered else None), failed


@pytest.fixture(scope="module")
def records(pool: EnvPool) -> list[tuple[list[Step], dict[str, str]]]:
    return [(steps, record(pool, steps, masked)) for steps, masked in CHAINS]


@pytest.fixture(scope="module")
def scorers(pool: EnvPool) -> list[tuple[CompositeReward, Reference]]:
    """Fast scorers kept across examples: their caches, memos and kept sessions carry over, as in training."""
    return [(CompositeReward(pool, s), Reference(pool, s)) for s in VARIANTS]


def _mutated(value: Any, how: int) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return [value + 1, value - 1, str(value), float(value) + 0.5, None][how % 5]
    if isinstance(value, str):
        return [value + " Jr", "", IDS[how % len(IDS)], value.upper(), 7][how % 5]
    return None


@st.composite
def completions(draw: st.DrawFn, steps: list[Step], tools: dict[str, list[str]]) -> Any:
    calls: list[tuple[str, dict[str, Any]] | str] = []
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["right", "right", "wrong", "extra", "repeat", "bad", "unknown"]))
        server, name, args = steps[draw(st.integers(0, len(steps) - 1))]
        qualified = draw(st.booleans())
        tool = f"{server}.{name}" if qualified else name
        if kind == "right":
            calls.append((tool, dict(args)))
        elif kind == "wrong":
            changed = dict(args)
            key = draw(st.sampled_from([*sorted(args), "unknown_argument"]))
            how = draw(st.integers(0, 9))
            if key in changed and how == 9:
                del changed[key]
            else:
                changed[key] = _mutated(changed.get(key, 1), how)
            calls.append((tool, changed))
        elif kind == "extra":
            other = draw(st.sampled_from(tools[server]))
            calls.append((other, draw(st.sampled_from([{}, dict(args), {"booking_id": draw(st.sampled_from(IDS))}]))))
        elif kind == "repeat" and calls:
            calls.append(calls[-1])
        elif kind == "bad":
            calls.append(draw(st.sampled_from(MALFORMED)))
        else:
            calls.append(draw(st.sampled_from([("no_such_tool", {}), ("mars.launch", {"x": 1})])))
    if draw(st.booleans()):  # Hermes text
        parts = [c if isinstance(c, str) else _hermes(*c) for c in calls]
        return "<think>\nPlan.\n</think>\n" + "\n".join(parts)
    messages: list[dict[str, Any]] = []  # TRL's conversational form
    for i, c in enumerate(calls):
        if isinstance(c, str):
            messages.append({"role": "assistant", "content": c})
        else:
            fn = {"name": c[0], "arguments": json.dumps(c[1], allow_nan=True) if i % 2 else c[1]}
            messages.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": fn}]})
            messages.append({"role": "tool", "content": "{}"})
    return messages


def _hermes(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, allow_nan=True) + "\n</tool_call>"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fast_path_scores_like_the_straightforward_computation(
    data: st.DataObject,
    pool: EnvPool,
    records: list[tuple[list[Step], dict[str, str]]],
    scorers: list[tuple[CompositeReward, Reference]],
) -> None:
    steps, rec = data.draw(st.sampled_from(records))
    tools = {s: pool.get(s).metadata.tool_names for s, _, _ in steps}
    fast, reference = data.draw(st.sampled_from(scorers))
    completion = data.draw(completions(steps, tools))
    want = reference.score(completion, **rec)
    assert not any("internal error" in r for r in want.reasons), want.reasons
    for _ in range(2):  # a second time: from the memo and the kept sessions
        got = fast.score(completion, **rec)
        assert got.model_dump() == want.model_dump(), (completion, got.reasons, want.reasons)
        assert math.isfinite(got.reward)


BLOCKS = [  # <tool_call> blocks of every shape the parser reads, clean or not
    '{"name": "book_room", "arguments": {"hotel_id": "HT-LIS-01", "guest_name": "Ana", "check_in": "2026-03-02"}}',
    '{"name": "hotels.search_hotels", "arguments": {"city": "Lisbon"}}',
    '{"name": "search_hotels", "arguments": "{\\"city\\": \\"Porto\\"}"}',
    '[{"name": "get_hotel", "arguments": {"hotel_id": "HT-LIS-01"}}, {"name": "cancel_booking", "arguments": {}}]',
    '{"role": "assistant", "tool_calls": [{"function": {"name": "get_hotel", "arguments": {"hotel_id": "H"}}}]}',
    '{"function": {"name": "flights.book_flight", "arguments": {"flight_id": "FL-1001"}}, "id": "c1"}',
    '{"name": "no_such_tool", "arguments": {}}',
    '{"name": "hotels.launch", "arguments": {}}',
    '{"name": "get_hotel", "arguments": {"hotel_id": "HT-LIS-01"}} and then some words',
    '```json\n{"name": "get_hotel", "arguments": {"hotel_id": "HT-POR-01"}}\n```',
    "<function=get_hotel>\n<parameter=hotel_id>\nHT-LIS-01\n</parameter>\n</function>",
    "{'name': oops}",
    '{"name": 5, "arguments": {}}',
    '{"arguments": {"a": 1}}',
    "[]",
    "",
]


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(BLOCKS), max_size=6).map(
            lambda bs: "<think>x</think>" + "".join(f"<tool_call>\n{b}\n</tool_call>\n" for b in bs)
        ),
        min_size=1,
        max_size=6,
    ),
    max_calls=st.integers(1, 6),
)
def test_blocks_read_from_the_memo_parse_like_blocks_read_anew(
    texts: list[str], max_calls: int, records: list[tuple[list[Step], dict[str, str]]], pool: EnvPool
) -> None:
    """A completion parsed with the record's block memo (filled by the completions before it) reads exactly as
    parsed without one: its calls, problems, unreadable calls, formats and the calls beyond `max_calls`."""
    index = CompositeReward(pool).target(**records[0][1]).index  # hotels and its tools
    memo: dict[str, tuple[ToolCall, ...]] = {}
    for text in texts:
        want = parse_tool_calls(text, index, max_calls=max_calls)
        got = parse_tool_calls(text, index, max_calls=max_calls, memo=memo)
        assert got.model_dump() == want.model_dump(), text


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_comparing_what_the_calls_touched_equals_comparing_whole_dumps(
    data: st.DataObject, pool: EnvPool, records: list[tuple[list[Step], dict[str, str]]]
) -> None:
    steps, _ = data.draw(st.sampled_from(records))
    server = steps[0][0]
    env = pool.get(server)
    initial = env.dump_state(env.new_state(env.scenario("default")))
    own = [(n, a) for s, n, a in steps if s == server]
    others = [(n, {**a, k: _mutated(v, 2)}) for n, a in own for k, v in list(a.items())[:1]]
    goal_calls = data.draw(st.lists(st.sampled_from(own + others), max_size=4))
    actual_calls = data.draw(st.lists(st.sampled_from(own + others), max_size=4))
    goal = Session(env, env.new_state(initial))
    for name, args in goal_calls:
        goal.call(name, args)
    goal_dump = goal.dump()
    actual = Session(env, env.new_state(initial))
    for name, args in actual_calls:
        actual.call(name, args)
    verdict = touched_equal(actual.state, goal_dump, dump_delta(initial, goal_dump))
    assert verdict is None or verdict == (actual.dump() == goal_dump)
    partial, whole = touched_dump(actual.state, initial), actual.dump()  # dumped along what the calls touched
    assert partial == whole and partial is not None and list(partial) == list(whole)


def test_completions_that_differ_only_in_their_reads_share_one_replay(
    pool: EnvPool, records: list[tuple[list[Step], dict[str, str]]]
) -> None:
    steps, rec = records[0]  # hotels: search, book, modify, cancel
    gt = [(name, args) for _, name, args in steps]
    scorer = CompositeReward(pool)
    results = [
        scorer.score(hermes(gt), **rec),
        scorer.score(hermes([*gt, ("get_hotel", {"hotel_id": "HT-POR-01"})]), **rec),  # an extra read
        scorer.score(hermes([gt[1], gt[0], *gt[2:]]), **rec),  # the read moved after the first write
    ]
    target = scorer.target(**rec)
    assert len(target.replays) == 1 and {r.r_state for r in results} == {1.0}
    shorter = scorer.score(hermes(gt[:-1]), **rec)  # a new replay: the kept sessions rolled back one call
    assert len(target.replays) == 2 and shorter.r_state == 0.0
    assert target.live is not None and [k[1] for k in target.live.keys if k] == ["book_room", "modify_booking"]


def test_a_scorer_and_its_records_are_freed_without_the_cyclic_collector(
    pool: EnvPool, records: list[tuple[list[Step], dict[str, str]]]
) -> None:
    """No reference cycle keeps a dropped scorer, its records, memos and kept sessions alive until a full
    collection (a trainer's GC pauses grew with every such scorer: ~3,800 objects a scorer)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        scorer = CompositeReward(pool)
        for steps, rec in records:
            calls = [(name, args) for _, name, args in steps]
            for completion in (hermes(calls), hermes(calls[:-1]), ""):
                scorer.score(completion, **rec)
        del scorer
        gc.collect()
        kept = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    ours = {"CompositeReward", "Target", "Session", "LiveReplay", "Replayed", "CallMatcher", "ToolIndex"}
    assert not ours & kept.keys(), kept.most_common(8)


def test_a_tool_that_changes_a_record_in_place_is_caught_and_forks_go_back_to_json(
    pool: EnvPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Replays fork from a template sharing its records: a tool changing a record in place (against the contract)
    would change it for every later fork. The scorer looks at its templates again (here at every fork) and drops
    a changed one, saying so."""
    cancel = [("hotels", "cancel_booking", {"booking_id": "BK-0001"})]
    modify = [("hotels", "modify_booking", {"booking_id": "BK-0001", "nights": 4})]
    first, second = record(pool, cancel), record(pool, modify)

    def update_in_place(self: State, collection: str, key: str, **fields: Any) -> Any:
        old = self.get(collection, key)
        for name, value in fields.items():
            object.__setattr__(old, name, value)  # what the contract forbids: the record itself changed
        return old

    monkeypatch.setattr("envfactory.reward.scorer._CHECK_EVERY", 1)
    scorer = CompositeReward(pool)
    monkeypatch.setattr(State, "update", update_in_place)
    with caplog.at_level(logging.WARNING, logger="envfactory.reward"):
        scorer.score(hermes([(n, a) for _, n, a in cancel]), **first)
        assert not caplog.records  # the template was intact when this replay forked from it
        scorer.score(hermes([(n, a) for _, n, a in modify]), **second)  # the next fork finds it changed
    assert any("changed a record in place" in r.getMessage() for r in caplog.records), caplog.text
    assert len(scorer._spoiled) == 1


def test_completions_with_the_same_calls_share_their_terms_and_blocks(
    pool: EnvPool, records: list[tuple[list[Step], dict[str, str]]]
) -> None:
    steps, rec = records[0]
    gt = [(name, args) for _, name, args in steps]
    scorer = CompositeReward(pool)
    results = [
        scorer.score(hermes(gt), **rec),
        scorer.score(hermes(gt, think=False), **rec),  # other text around the same blocks
        scorer.score(hermes([(f"hotels.{n}", a) for n, a in gt]), **rec),  # qualified names: other blocks
    ]
    target = scorer.target(**rec)
    assert len(target.outcomes) == 1 and len(target.blocks) == 2 * len(gt)
    assert {r.reward for r in results} == {1.0}
    wrong = scorer.score(hermes([*gt[:-1], (gt[-1][0], {"booking_id": "BK-0003"})]), **rec)
    assert len(target.outcomes) == 2 and len(target.blocks) == 2 * len(gt) + 1 and wrong.reward < 1.0
    long = scorer.score(hermes([*gt, ("search_hotels", {"city": "x" * 20_000})]), **rec)  # 20 kB of arguments
    assert len(target.outcomes) == 2 and long.n_pred == len(gt) + 1  # scored, its calls not kept as a key
    off = CompositeReward(pool, RewardSettings(memoize_replays=False))
    off.score(hermes(gt), **rec)
    assert not off.target(**rec).outcomes and not off.target(**rec).blocks


def test_threads_scoring_one_record_past_its_memos_get_the_rewards_one_thread_gets(
    pool: EnvPool, records: list[tuple[list[Step], dict[str, str]]]
) -> None:
    """TRL may score a batch from several threads: records, replays and call outcomes let go beyond their bounds
    while other threads read and add to them must neither raise (a reward of 0, "internal error") nor mix up."""
    steps, rec = records[0]
    gt = [(name, args) for _, name, args in steps]
    completions = [hermes([*gt[:-1], (gt[-2][0], {**gt[-2][1], "nights": 1 + k % 90})]) for k in range(1440)]
    other = records[1][1]  # a second record: with cache_size 1 the two evict each other
    want = [CompositeReward(pool).score(c, **rec).model_dump() for c in completions[:90]]
    scorer = CompositeReward(pool, RewardSettings(cache_size=1))
    got: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change places every few bytecodes
    try:

        def work(n: int) -> None:
            got[n] = []
            for k in range(n, len(completions), 6):
                scorer.score(hermes(gt), **other)
                got[n].append((k, scorer.score(completions[k], **rec).model_dump()))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    results = [r for rs in got.values() for r in rs]
    assert len(results) == len(completions)
    for k, result in results:
        assert result == want[k % 90], result["reasons"]


def test_a_block_nested_deeply_is_read_every_time(
    records: list[tuple[list[Step], dict[str, str]]], pool: EnvPool
) -> None:
    """JSON nested near the recursion limit decodes or not by the caller's stack depth (a message's text sits deeper
    than a plain string): such a block's reading is not remembered for another place."""
    index = CompositeReward(pool).target(**records[0][1]).index
    deep = '{"name": "get_hotel", "arguments": {"hotel_id": "H"}, "note": ' + "[" * 900 + "]" * 900 + "}"
    shallow = '{"name": "get_hotel", "arguments": {"hotel_id": "H"}, "note": ' + "[" * 60 + "]" * 60 + "}"
    memo: dict[str, tuple[ToolCall, ...]] = {}
    for body in (deep, shallow):
        parse_tool_calls(f"<tool_call>{body}</tool_call>", index, memo=memo)
    assert list(memo) == [shallow]
