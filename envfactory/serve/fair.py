"""Fair shares of a server's call threads: a waiting call gets a thread in order of what its session has used.

A server runs the tool calls that may be slow on worker threads, a few at a time per app
(`ServeLimits.cpu_threads` for in-process apps, `app_threads` for sandboxed ones). With a first-come
queue, a client that keeps many sessions busy with expensive calls has a call waiting ahead of every
other session's; each of those waits for all of them. `FairLimiter` lends its slots by start-time
fair queueing instead (Goyal et al., "Start-time Fair Queueing", 1996), with sessions as the flows:

- each session has a *finish tag*: the virtual time (seconds of work) up to which it was served;
- a call's *start tag* is the larger of the limiter's clock and its session's finish tag, and a free
  slot goes to the waiting call with the smallest start tag; among equal ones (sessions that used no
  more than the clock) to the session whose last call cost less, then to the smaller request (bytes),
  then to the earlier;
- the clock is the largest start tag given a slot so far; a call moves its session's finish tag on by
  what its session's last call cost when it comes (so that two calls of a session never share a start
  tag), and by the difference to its own cost when it ends. A call costs the seconds it held its slot,
  or what its caller measured of its own work (`Turn.cost`: the server counts a call's CPU and the time
  it was blocked, not the time it waited for the GIL while others worked);
- a session's first call comes in as if the session had just had a call as long as the longest one of
  late, so that a burst of new sessions does not go ahead of the known ones that used no more than that.

A session that has used no more than the clock (a quiet one, one that was idle) starts at the clock,
ahead of every session that used more, and of those at the clock whose calls cost more. So a cheap call
of a session that used less than the waiting ones waits only for the calls that hold a slot when it
arrives, however many calls the others keep queued: the bound is in calls, not in their cost. A flooding
session's calls still run, in turn with the other busy sessions'.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

__all__ = ["FairLimiter", "OffLoop", "Stopwatch", "Turn"]


@dataclass(order=True)
class _Waiter:
    start: float
    expected: float  # what the session's last call cost: among equal starts, the cheaper session goes first
    size: int  # the request's bytes: then the smaller call
    seq: int
    event: anyio.Event = field(compare=False)
    granted: bool = field(default=False, compare=False)
    gone: bool = field(default=False, compare=False)


class Turn:
    """A call's hold on a slot: set `cost` to what the call's work cost (seconds); else the time it held the slot."""

    __slots__ = ("cost",)

    def __init__(self) -> None:
        self.cost: float | None = None


class FairLimiter:
    """`tokens` slots lent to sessions' calls in start-time fair order (see the module); `async with
    limiter.slot(key)` holds one for session `key` (weakly referenced, like the server's other per-session
    maps). `threads` is an anyio limiter of the same size for `anyio.to_thread.run_sync`, so a call never
    waits for a thread once it holds a slot, and never for anyio's shared default threads either."""

    LATE = 0.9  # the longest call of late: each call's cost weighs against the last longest's times this

    def __init__(self, name: str, tokens: int, timer: Callable[[], float] = time.perf_counter) -> None:
        self.name = name
        self.timer = timer
        self.clock = 0.0
        self.longest = 0.0  # the longest call of late (decaying by LATE per call)
        self.threads = anyio.CapacityLimiter(tokens)
        self._tokens = tokens
        self._borrowed = 0
        self._heap: list[_Waiter] = []
        self._live = 0  # waiters in the heap not gone (cancelled)
        self._seq = itertools.count()
        # per session: [finish tag, what its last call cost (what its next one is expected to)]
        self._tags: weakref.WeakKeyDictionary[Any, list[float]] = weakref.WeakKeyDictionary()

    @property
    def total_tokens(self) -> int:
        return self._tokens

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        self._tokens = value
        self.threads.total_tokens = value
        while self._borrowed < self._tokens and self._grant():
            self._borrowed += 1

    @property
    def borrowed(self) -> int:
        """Slots held now."""
        return self._borrowed

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot now."""
        return self._live

    def used(self, key: Any) -> float:
        """Session `key`'s finish tag: the virtual time up to which it has been served (0 if never)."""
        tags = self._tags.get(key)
        return tags[0] if tags is not None else 0.0

    @asynccontextmanager
    async def slot(self, key: Any, size: int = 0, *, first: bool = False) -> AsyncIterator[Turn]:
        """Hold one slot for a call of session `key` (`size`: its request's bytes; `first`: the session's first
        call to the server), waiting in fair order while none is free."""
        tags = self._tags.get(key)
        if tags is None:
            prior = self.longest if first else 0.0
            tags = self._tags[key] = [self.clock + prior, prior]
        start = max(self.clock, tags[0])
        expected = tags[1]
        tags[0] = start + expected  # so that another call of the session, meanwhile, starts after this one
        if self._borrowed < self._tokens and not self._live:
            self._borrowed += 1
        else:
            waiter = _Waiter(start, expected, size, next(self._seq), anyio.Event())
            heapq.heappush(self._heap, waiter)
            self._live += 1
            try:
                await waiter.event.wait()
            except BaseException:  # cancelled: a slot handed over meanwhile goes on to the next call
                if waiter.granted:
                    self._release()
                else:
                    waiter.gone = True
                    self._live -= 1
                tags[0] -= expected
                raise
        self.clock = max(self.clock, start)
        turn = Turn()
        began = self.timer()
        try:
            yield turn
        finally:
            cost = max(0.0, self.timer() - began if turn.cost is None else turn.cost)
            tags[0] += cost - expected
            tags[1] = cost
            self.longest = max(cost, self.longest * self.LATE)
            self._release()

    def _grant(self) -> bool:
        """Hand a slot to the first waiting call (True), or find none waiting (False)."""
        while self._heap:
            waiter = heapq.heappop(self._heap)
            if waiter.gone:
                continue
            self._live -= 1
            waiter.granted = True
            waiter.event.set()
            return True
        return False

    def _release(self) -> None:
        if self._borrowed > self._tokens or not self._grant():
            self._borrowed -= 1


class Stopwatch:
    """What a call cost its thread: `stop()` gives (CPU seconds of this thread, seconds blocked), where blocked
    is the wall time in which no thread of the process ran and this one was not waiting for a CPU (a sleep,
    I/O, waiting on a lock), so that neither waiting for the GIL while other threads work nor the OS running
    other processes (a busy machine) is mistaken for a slow call."""

    __slots__ = ("cpu", "process", "queued", "wall")

    def __init__(self) -> None:
        self.wall, self.cpu, self.process = time.perf_counter(), time.thread_time(), time.process_time()
        self.queued = run_queue_s()

    def stop(self, cheap_under: float = 0.0) -> tuple[float, float]:
        """(CPU seconds, blocked seconds). A call whose wall time is at most `cheap_under` gives (its wall time, 0.0)
        without reading the other clocks (three system calls, ~5 % of a fast-path call's server CPU): one thread
        uses no more CPU than wall time, and is blocked no longer, so to a caller asking only whether either passed
        a bound >= `cheap_under` (`OffLoop`) the answer is the same."""
        wall = time.perf_counter() - self.wall
        if wall <= cheap_under:
            return wall, 0.0
        cpu = time.thread_time() - self.cpu
        process = time.process_time() - self.process
        queued = run_queue_s() - self.queued
        return cpu, max(0.0, wall - process - queued)


class _SchedStat:
    """This thread's /proc/thread-self/schedstat, kept open (a read is one system call) and closed with the
    thread."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not Linux, no /proc, out of descriptors: no correction
            self.fd = None

    def __del__(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


_THREAD = threading.local()


def run_queue_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux's schedstat; 0.0 where unknown)."""
    stat: _SchedStat | None = getattr(_THREAD, "stat", None)
    if stat is None:
        stat = _THREAD.stat = _SchedStat()
    if stat.fd is None:
        return 0.0
    try:
        return int(os.pread(stat.fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class OffLoop:
    """Which in-process calls must leave the event loop.

    Calls on the loop run in arrival order and cannot be interrupted, so only cheap ones may run there: a
    call on the loop that used over `cpu_s` of CPU or was blocked over `blocked_s` (`Stopwatch`) was
    expensive. Caught so a k-th time (`strike`; k >= 2 when the first was less than `CHANCE` times over the
    bounds, as such chance strikes are common: a collection, a wait for the GIL while the thread holding it was
    preempted; at once when it was far over), a session runs its next 2**k
    calls on a thread (in fair order, `FairLimiter`); an expensive call on a thread starts that count over,
    a cheap one counts down, and each run of 16 * 2**k cheap calls on the loop forgives one strike, so chance
    strikes do not pile up over a long session. A session that alternates cheap and expensive calls to get the
    loop is off it for ever longer. What is known in advance to be expensive (a large state loaded) sends the
    session's next calls off the loop at once (`expect`).
    On a thread, blocked time counts only over `thread_blocked_s` (10 x `blocked_s` by default): there it
    mostly is the GIL held by a thread the OS preempted, which says nothing of the call.

    Keys are sessions (held weakly), or with `weak=False` names, such as a hub app's tools: a client that opens
    a new session for each expensive call then gets the loop once per tool, not once per session."""

    FORGIVE = 16  # cheap calls on the loop, times 2**k, that forgive one strike
    CHANCE = 10  # a first strike under this many times the bounds may be chance, and is let go

    def __init__(
        self,
        cpu_s: float,
        blocked_s: float,
        most: int = 1 << 16,
        *,
        thread_blocked_s: float | None = None,
        weak: bool = True,
    ) -> None:
        self.cpu_s, self.blocked_s, self.most = cpu_s, blocked_s, most
        self.thread_blocked_s = 10 * blocked_s if thread_blocked_s is None else thread_blocked_s
        # [strikes, calls left off the loop, cheap calls on the loop since the last strike] per key
        self._marks: MutableMapping[Any, list[int]] = weakref.WeakKeyDictionary() if weak else {}

    @property
    def cheap_under(self) -> float:
        """A call on the loop no longer than this (wall time) is cheap whatever its CPU and blocked time
        (`Stopwatch.stop(cheap_under)`): it cannot have passed either bound."""
        return min(self.cpu_s, self.blocked_s)

    def __contains__(self, key: Any) -> bool:
        """The next call of session (or tool) `key` must leave the loop."""
        mark = self._marks.get(key)
        return mark is not None and mark[1] > 0

    def strike(self, key: Any, *, chance: bool = False) -> None:
        """Session `key` ran an expensive call on the loop: its next calls leave it — from the second time on when
        the call was over its bounds by less than `CHANCE` times (what a collection or a preempted GIL holder does
        to a cheap call), at once when it was far over (a call that really is slow)."""
        mark = self._marks.setdefault(key, [0, 0, 0])
        mark[0] += 1
        mark[1] = min(self.most, 1 << mark[0]) if mark[0] > 1 or not chance else 0
        mark[2] = 0

    def expect(self, key: Any) -> None:
        """Session `key`'s calls will be expensive (e.g. it loaded a large state): its next ones leave the loop."""
        mark = self._marks.setdefault(key, [0, 0, 0])
        mark[0] = max(mark[0], 1)
        mark[1] = max(mark[1], min(self.most, 1 << mark[0]))

    def ran(self, key: Any, cpu: float, blocked: float, *, inline: bool) -> None:
        """Session `key`'s call used `cpu` seconds of CPU and was blocked `blocked` seconds, on the loop (`inline`)
        or not."""
        mark = self._marks.get(key)
        if cpu > self.cpu_s or blocked > (self.blocked_s if inline else self.thread_blocked_s):
            if inline:
                self.strike(key, chance=cpu <= self.CHANCE * self.cpu_s and blocked <= self.CHANCE * self.blocked_s)
            else:  # expensive off the loop too: its count starts over
                mark = self._marks.setdefault(key, [0, 0, 0])
                mark[1] = min(self.most, 1 << mark[0])
        elif mark is not None:  # cheap
            if not inline:
                mark[1] = max(0, mark[1] - 1)
            elif mark[0] > 0:
                mark[2] += 1
                if mark[2] >= self.FORGIVE << mark[0]:
                    mark[0] -= 1
                    mark[2] = 0
