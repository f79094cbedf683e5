"""Fair shares of a server's call threads: a waiting call gets a thread in order of what its session has used.

A server runs the tool calls that may be slow on worker threads, a few at a time per app
(`ServeLimits.cpu_threads` for in-process apps, `app_threads` for sandboxed ones). With a first-come
queue, a client that keeps many sessions busy with expensive calls has a call waiting ahead of every
other session's; each of those waits for all of them. `FairLimiter` lends its slots by start-time
fair queueing instead (Goyal et al., "Start-time Fair Queueing", 1996), with sessions as the flows:

- each session has a *finish tag*: the virtual time (seconds of slot use) up to which it was served;
- a call's *start tag* is the larger of the limiter's clock and its session's finish tag, and a free
  slot goes to the waiting call with the smallest start tag; among equal ones (sessions that used no
  more than the clock) to the smaller request (bytes: what is known of a call's cost before it runs),
  then to the earlier;
- the clock is the largest start tag given a slot so far; a call moves its session's finish tag on by
  the seconds its last call held a slot when it comes (so that two calls of a session never share a
  start tag) and by the difference to what it held itself when it ends.

A session that has used no more than the clock (a quiet one, one that was idle, a new one) starts at
the clock, ahead of every session that used more. So a call of a session that used less than every
waiting session waits only for the calls that hold a slot when it arrives, however many calls the others
keep queued (and, if it is no larger, whatever they send): the bound is in calls, not in their cost. A
flooding session's calls still run, in turn with the other busy sessions'.
"""

from __future__ import annotations

import heapq
import itertools
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

__all__ = ["FairLimiter", "OffLoop", "Stopwatch"]


@dataclass(order=True)
class _Waiter:
    start: float
    size: int  # the request's bytes: among equal starts, the smaller call goes first
    seq: int
    event: anyio.Event = field(compare=False)
    granted: bool = field(default=False, compare=False)
    gone: bool = field(default=False, compare=False)


class FairLimiter:
    """`tokens` slots lent to sessions' calls in start-time fair order (see the module); `async with
    limiter.slot(key)` holds one for session `key` (weakly referenced, like the server's other per-session
    maps). `threads` is an anyio limiter of the same size for `anyio.to_thread.run_sync`, so a call never
    waits for a thread once it holds a slot, and never for anyio's shared default threads either."""

    def __init__(self, name: str, tokens: int, timer: Callable[[], float] = time.perf_counter) -> None:
        self.name = name
        self.timer = timer
        self.clock = 0.0
        self.threads = anyio.CapacityLimiter(tokens)
        self._tokens = tokens
        self._borrowed = 0
        self._heap: list[_Waiter] = []
        self._live = 0  # waiters in the heap not gone (cancelled)
        self._seq = itertools.count()
        # per session: [finish tag, seconds its last call held a slot (what its next one is expected to)]
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
    async def slot(self, key: Any, size: int = 0) -> AsyncIterator[None]:
        """Hold one slot for a call of session `key` (`size`: its request's bytes), waiting in fair order
        while none is free."""
        tags = self._tags.setdefault(key, [0.0, 0.0])
        start = max(self.clock, tags[0])
        expected = tags[1]
        tags[0] = start + expected  # so that another call of the session, meanwhile, starts after this one
        if self._borrowed < self._tokens and not self._live:
            self._borrowed += 1
        else:
            waiter = _Waiter(start, size, next(self._seq), anyio.Event())
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
                raise
        self.clock = max(self.clock, start)
        began = self.timer()
        try:
            yield
        finally:
            held = max(0.0, self.timer() - began)
            tags[0] += held - expected
            tags[1] = held
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
    is the wall time in which no thread of the process ran (a sleep, I/O, waiting on a lock), so that time
    spent waiting for the GIL while other threads work is not mistaken for a slow call."""

    __slots__ = ("cpu", "process", "wall")

    def __init__(self) -> None:
        self.wall, self.cpu, self.process = time.perf_counter(), time.thread_time(), time.process_time()

    def stop(self) -> tuple[float, float]:
        wall = time.perf_counter() - self.wall
        cpu = time.thread_time() - self.cpu
        process = time.process_time() - self.process
        return cpu, max(0.0, wall - process)


class OffLoop:
    """Which sessions' in-process calls must leave the event loop.

    Calls on the loop run in arrival order and cannot be interrupted, so only cheap ones may run there: a
    call that used over `cpu_s` of CPU or was blocked over `blocked_s` (`Stopwatch`) is expensive. A
    session whose call was expensive runs its next calls on a thread (in fair order, `FairLimiter`) until
    they turn cheap again: each expensive call sends the next 2**k calls there, k being how often the session
    was caught running an expensive call on the loop (`strike`, also for what is known in advance, such as a
    large state loaded). A session caught once by chance (a collection, a preempted thread) is back on the loop
    after two calls; one that alternates cheap and expensive calls to get the loop runs a number of expensive
    calls there that grows with the log of its calls, not with their number."""

    def __init__(self, cpu_s: float, blocked_s: float, most: int = 1 << 16) -> None:
        self.cpu_s, self.blocked_s, self.most = cpu_s, blocked_s, most
        self._marks: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()  # [strikes, calls left]

    def __contains__(self, key: Any) -> bool:
        mark = self._marks.get(key)
        return mark is not None and mark[1] > 0

    def strike(self, key: Any) -> None:
        """Session `key` ran an expensive call on the loop, or is about to (its next calls leave it)."""
        mark = self._marks.setdefault(key, [0, 0])
        mark[0] += 1
        mark[1] = min(self.most, 1 << mark[0])

    def ran(self, key: Any, cpu: float, blocked: float, *, inline: bool) -> None:
        """Session `key`'s call used `cpu` seconds of CPU and was blocked `blocked` seconds, on the loop or not."""
        if cpu <= self.cpu_s and blocked <= self.blocked_s:  # cheap: one call nearer the loop again
            cheap = self._marks.get(key)
            if cheap is not None and cheap[1] > 0:
                cheap[1] -= 1
        elif inline:
            self.strike(key)
        else:  # expensive off the loop too: its countdown starts over
            mark = self._marks.setdefault(key, [0, 0])
            mark[1] = min(self.most, 1 << mark[0])
