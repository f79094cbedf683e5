"""Fair shares of a server's call threads (`envfactory.serve.fair`): who gets a slot next, and who leaves the loop.

No test here times anything: the limiter measures what a call held through a timer the test advances by
hand, and the assertions are on the order calls get their slots in.
"""

from __future__ import annotations

import asyncio
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.serve.answers import response_body, tool_result
from envfactory.serve.fair import FairLimiter, OffLoop


class Session:
    """Stands for an MCP session: the limiter keys its sessions weakly on an object."""


class Timer:
    """The seconds a call held its slot, as the test says: advanced by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    """Let every task that can run do so (they only wait on each other: no clock involved)."""
    for _ in range(50):
        await asyncio.sleep(0)


# ---- the bound: a quiet session's call waits only for the calls holding a slot ---------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(1, 3),
    warm=st.lists(st.lists(st.floats(0.001, 5.0), min_size=1, max_size=3), min_size=1, max_size=8),
    backlog=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 10_000), min_size=8, max_size=8),
    quiet_used=st.booleans(),
)
def test_a_quiet_sessions_call_goes_before_every_waiting_call_of_sessions_that_used_more(
    tokens: int, warm: list[list[float]], backlog: int, sizes: list[int], quiet_used: bool
) -> None:
    """Busy sessions that have each used the threads before keep `backlog` calls each waiting, of any size;
    a quiet session (new, or one that used less than the clock) then asks: its call gets the next free slot,
    ahead of all of them, however many there are."""

    async def scenario() -> list[str]:
        timer = Timer()
        limiter = FairLimiter("app", tokens, timer=timer)
        busy = [Session() for _ in warm]
        quiet = Session()
        granted: list[str] = []
        if quiet_used:  # it had the thread once, long ago: its share was used before the others' calls
            async with limiter.slot(quiet):
                timer.now += 0.0005
        for costs, key in zip(warm, busy, strict=True):
            for cost in costs:
                async with limiter.slot(key):
                    timer.now += cost
        release = asyncio.Event()

        async def call(key: Session, label: str, size: int) -> None:
            async with limiter.slot(key, size):
                granted.append(label)
                await release.wait()

        holders = [asyncio.create_task(call(Session(), f"holder-{i}", 0)) for i in range(tokens)]
        await _settle()
        assert limiter.borrowed == tokens
        flood = [
            asyncio.create_task(call(key, f"busy-{i}", sizes[i])) for i, key in enumerate(busy) for _ in range(backlog)
        ]
        await _settle()
        late = asyncio.create_task(call(quiet, "quiet", 0))
        await _settle()
        assert limiter.waiting == len(flood) + 1
        release.set()
        await asyncio.gather(*holders, *flood, late)
        assert limiter.borrowed == 0 and limiter.waiting == 0
        return granted

    granted = asyncio.run(scenario())
    assert granted[:tokens] == [f"holder-{i}" for i in range(tokens)]
    assert granted[tokens] == "quiet", granted  # the first slot freed after it came
    assert len(granted) == tokens + 1 + len(warm) * backlog  # and every busy call still ran


def test_a_burst_of_new_sessions_does_not_go_ahead_of_a_known_cheap_session() -> None:
    """Twenty sessions' first calls come at once (each a large request: loading a state), then a known session's
    cheap call: the newcomers come in as if each had just had a call as long as the longest of late, so the
    known session, which used less, gets the next slot."""

    async def scenario() -> list[str]:
        timer = Timer()
        limiter = FairLimiter("app", 1, timer=timer)
        known = Session()
        for cost in (0.004, 0.001, 0.002):  # its calls so far
            async with limiter.slot(known, 150):
                timer.now += cost
        granted: list[str] = []
        release = asyncio.Event()

        async def call(key: Session, label: str, size: int, first: bool) -> None:
            async with limiter.slot(key, size, first=first):
                granted.append(label)
                await release.wait()
                timer.now += 0.03

        newcomers = [asyncio.create_task(call(Session(), f"new-{i}", 250_000, True)) for i in range(20)]
        await _settle()
        mine = asyncio.create_task(call(known, "known", 150, False))
        await _settle()
        release.set()
        await asyncio.gather(*newcomers, mine)
        return granted

    granted = asyncio.run(scenario())
    assert granted[:2] == ["new-0", "known"], granted  # new-0 found the slot free


# ---- the share: sessions that keep calling get equal slot time, whatever their calls cost ------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(costs=st.lists(st.floats(0.01, 2.0), min_size=2, max_size=6), horizon=st.floats(5.0, 60.0))
def test_sessions_that_keep_calling_get_equal_slot_time_whatever_their_calls_cost(
    costs: list[float], horizon: float
) -> None:
    """Each session always has a call waiting; one slot. Up to any moment, two sessions' slot time differs by at
    most two calls of each (start-time fair queueing's bound is one of each when costs are known in advance; here
    a session's next call is expected to cost what its last did, and its first nothing), where first come, first
    served gives each session slot time in proportion to what its calls cost."""

    async def scenario() -> list[float]:
        timer = Timer()
        limiter = FairLimiter("app", 1, timer=timer)
        keys = [Session() for _ in costs]
        served = [0.0] * len(costs)
        worst = 0.0

        async def session(i: int) -> None:
            nonlocal worst
            while timer.now < horizon:
                async with limiter.slot(keys[i]):
                    if timer.now < horizon:  # every session is still calling: measured
                        served[i] += costs[i]
                        worst = max(worst, max(served) - min(served))
                    timer.now += costs[i]
                    await asyncio.sleep(0)

        # two callers per session: while one call of it holds the slot the next waits (always backlogged)
        await asyncio.gather(*(session(i) for i in range(len(costs)) for _ in range(2)))
        return [worst]

    [worst] = asyncio.run(scenario())
    two_largest = sum(sorted(costs)[-2:])
    assert worst <= 2 * two_largest + 1e-9, (worst, costs)


# ---- a slot is never lost or lent twice ---------------------------------------------------------------------


def test_a_cancelled_call_gives_back_its_place_and_a_slot_handed_to_it_goes_on() -> None:
    async def scenario() -> list[str]:
        limiter = FairLimiter("app", 1)
        granted: list[str] = []
        release = {name: asyncio.Event() for name in "abcd"}
        tasks: dict[str, asyncio.Task[None]] = {}

        async def call(name: str) -> None:
            async with limiter.slot(Session()):
                granted.append(name)
                await release[name].wait()
            if name == "a":  # the slot was just handed to c: c is cancelled before it could run
                tasks["c"].cancel()

        tasks["a"] = asyncio.create_task(call("a"))
        await _settle()
        for name in "bcd":
            tasks[name] = asyncio.create_task(call(name))
        await _settle()
        tasks["b"].cancel()  # waiting: it leaves the queue
        await _settle()
        assert limiter.borrowed == 1 and limiter.waiting == 2
        release["a"].set()
        await _settle()  # c's slot went on to d
        assert limiter.borrowed == 1 and limiter.waiting == 0
        release["d"].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert tasks["b"].cancelled() and tasks["c"].cancelled()
        assert limiter.borrowed == 0
        return granted

    assert asyncio.run(scenario()) == ["a", "d"]


def test_more_tokens_let_waiting_calls_in_and_fewer_take_effect_as_calls_end() -> None:
    async def scenario() -> None:
        limiter = FairLimiter("app", 1)
        release = asyncio.Event()
        running: list[int] = []
        most = 0

        async def call(i: int) -> None:
            nonlocal most
            async with limiter.slot(Session()):
                running.append(i)
                most = max(most, len(running))
                await release.wait()
                running.remove(i)

        tasks = [asyncio.create_task(call(i)) for i in range(5)]
        await _settle()
        assert limiter.borrowed == 1 and limiter.waiting == 4
        limiter.total_tokens = 3
        await _settle()
        assert len(running) == 3 and limiter.waiting == 2 and limiter.threads.total_tokens == 3
        limiter.total_tokens = 1
        release.set()
        await asyncio.gather(*tasks)
        assert most == 3 and limiter.borrowed == 0

    asyncio.run(scenario())


# ---- who leaves the event loop ----------------------------------------------------------------------------------


CHEAP, EXPENSIVE = (0.0001, 0.0), (0.5, 0.0)


def _run(off: OffLoop, key: Session, calls: list[bool]) -> int:
    """Run `calls` (True: expensive) the way the server does; how many expensive ones ran on the loop."""
    on_loop = 0
    for expensive in calls:
        inline = key not in off
        on_loop += inline and expensive
        off.ran(key, *(EXPENSIVE if expensive else CHEAP), inline=inline)
    return on_loop


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=600))
def test_a_session_gets_the_loop_for_few_expensive_calls_however_it_mixes_them(calls: list[bool]) -> None:
    """However a session mixes cheap and expensive calls, few expensive ones run on the loop: about log2(calls),
    plus two for each 2 * 16 cheap calls on the loop that forgave a strike (a rate it cannot raise)."""
    on_loop = _run(OffLoop(cpu_s=0.002, blocked_s=0.02), Session(), calls)
    assert on_loop <= 2 + math.log2(len(calls)) + len(calls) / OffLoop.FORGIVE, (on_loop, len(calls))


def test_a_session_caught_by_chance_stays_on_the_loop_and_a_loaded_one_leaves_it() -> None:
    off = OffLoop(cpu_s=0.002, blocked_s=0.02)
    key = Session()
    off.ran(key, 0.0001, 0.05, inline=True)  # blocked a little once (a collection ran, the GIL's holder was preempted)
    assert key not in off  # let go
    off.ran(key, 0.0001, 0.05, inline=True)  # twice: its next four calls leave the loop
    for _ in range(4):
        assert key in off
        off.ran(key, *CHEAP, inline=False)
    assert key not in off
    for _ in range(OffLoop.FORGIVE << 2):  # a long run of cheap calls on the loop forgives a strike ...
        off.ran(key, *CHEAP, inline=True)
    off.ran(key, 0.0001, 0.05, inline=True)  # ... so the next one costs four calls again, not eight
    for _ in range(4):
        off.ran(key, *CHEAP, inline=False)
    assert key not in off
    off.ran(key, 0.0001, 0.05, inline=False)  # 50 ms blocked on a thread: the GIL's holder was preempted
    assert key not in off
    alternating = [i % 2 == 1 for i in range(256)]  # cheap, expensive, cheap, ...
    assert _run(OffLoop(cpu_s=0.002, blocked_s=0.02), Session(), alternating) <= 9
    slow = Session()
    off.ran(slow, 0.0001, 0.3, inline=True)  # far over its bounds (a call that really is slow): off at once
    assert slow in off
    burner = Session()
    off.ran(burner, 0.05, 0.0, inline=True)  # 50 ms of CPU on the loop: off at once too
    assert burner in off
    loaded = Session()
    off.expect(loaded)  # it loaded a large state: off the loop before its first call, while its calls cost
    assert _run(off, loaded, [True] * 50) == 0


def test_a_short_call_skips_the_stopwatchs_other_clocks_and_is_judged_the_same() -> None:
    """Under `cheap_under` the stopwatch reads only the wall clock and gives (wall, 0.0): no more CPU than the wall
    time, no longer blocked; `OffLoop` judges such a call cheap either way. Over it, every clock is read."""
    import time

    from envfactory.serve.fair import Stopwatch

    watch = Stopwatch()
    cpu, blocked = watch.stop(cheap_under=10.0)
    assert blocked == 0.0 and 0 <= cpu < 10.0
    full = Stopwatch()
    time.sleep(0.03)  # blocked, not CPU: only the full reading can tell
    cpu, blocked = full.stop(cheap_under=0.002)
    assert cpu < 0.01 and blocked > 0.02
    off = OffLoop(cpu_s=0.002, blocked_s=0.02)
    assert off.cheap_under == 0.002  # the smaller bound
    key = Session()
    for _ in range(3):
        off.ran(key, *Stopwatch().stop(cheap_under=off.cheap_under), inline=True)
    assert key not in off


# ---- a response body reuses the answer's own JSON --------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    payload=JSON,
    wrap=st.booleans(),
    error=st.booleans(),
    request_id=st.integers() | st.text(max_size=8),
    meta=st.none() | st.dictionaries(st.text(max_size=4), JSON, max_size=2),
)
def test_a_response_body_is_the_sdks_as_json_whatever_the_answer(
    payload: object, wrap: bool, error: bool, request_id: int | str, meta: dict[str, object] | None
) -> None:
    """The fast path writes an answer's body by splicing in the structured content's JSON (the text, encoded
    once) instead of encoding it again, the common answer (no `_meta`) written directly: the body parses to
    exactly what encoding the whole result gives."""
    result = tool_result(payload, wrap=wrap, error=error)
    result.meta = meta
    whole = {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": result.model_dump(by_alias=True, mode="json", exclude_none=True),
    }
    assert json.loads(response_body(request_id, result)) == whole
    special = tool_result({"x": float("nan")}, wrap=False)  # json.dumps writes NaN, the SDK null: not reused
    assert json.loads(response_body(1, special))["result"]["structuredContent"] == {"x": None}
