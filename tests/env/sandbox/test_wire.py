"""The pipe between the parent and a worker: frames read whole whenever they come, and polling before sleeping
bounded in CPU and by the deadline. Real pipes and threads, no mocks."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest

from envfactory.config import Settings
from envfactory.env.sandbox import wire
from envfactory.env.sandbox.limits import WORKER_SPIN_US, SandboxLimits
from envfactory.env.sandbox.process import _InFlight
from envfactory.env.sandbox.wire import FrameReader, WireError, encode, write_frame


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # a test may have closed it
            os.close(fd)


def _write_later(fd: int, frames: list[bytes], delay_s: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        for frame in frames:
            write_frame(fd, frame)

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("delay_s", [0.0, 0.0002, 0.05])  # ready, while it polls, after it went to sleep
@pytest.mark.parametrize("spin", [True, False])
def test_a_frame_is_read_whole_whenever_it_comes(pipe: tuple[int, int], delay_s: float, spin: bool) -> None:
    r, w = pipe
    reader = FrameReader(r, spin_s=0.002)
    messages = [{"id": 1, "ok": True, "result": "x" * 70_000}, {"id": 2, "ok": True}]  # the first over a pipe buffer
    t = _write_later(w, [encode(m) for m in messages], delay_s)
    try:
        got = [reader.read(max_bytes=1 << 20, deadline=time.monotonic() + 10, spin=spin) for _ in messages]
    finally:
        t.join()
    assert [encode(m)[4:] for m in messages] == got


def test_polling_is_bounded_in_cpu(pipe: tuple[int, int]) -> None:
    """A read that waits 0.3 s with a 1 ms poll spends about 1 ms of CPU, not 0.3 s: after the poll it sleeps."""
    r, w = pipe
    reader = FrameReader(r, spin_s=0.001)
    t = _write_later(w, [encode({"id": 1})], 0.3)
    try:
        before = time.thread_time()
        assert reader.read(max_bytes=1024, deadline=time.monotonic() + 10, spin=True) == encode({"id": 1})[4:]
        used = time.thread_time() - before
    finally:
        t.join()
    assert used < 0.05, f"the reader used {used:.3f} s of CPU waiting 0.3 s with a 1 ms poll"


def test_polling_stops_at_the_deadline(pipe: tuple[int, int]) -> None:
    """A deadline before the poll's end still ends the read at the deadline: nothing arrives, a timeout."""
    r, _ = pipe
    reader = FrameReader(r, spin_s=5.0)  # far longer than the deadline
    start = time.monotonic()
    with pytest.raises(WireError) as e:
        reader.read(max_bytes=1024, deadline=start + 0.2, spin=True)
    assert e.value.kind == "timeout"
    assert time.monotonic() - start < 2.0


def test_only_a_lone_request_polls() -> None:
    """The parent polls (and tells its worker to) only while it has one request out: with others out, a waiting
    thread and a polling worker would take the CPU the others need."""
    flight = _InFlight()
    assert flight.enter() is True
    assert flight.enter() is False  # a second thread's request while the first is out
    flight.leave()
    flight.leave()
    assert flight.enter() is True
    flight.leave()


def test_a_round_polls_as_serving_does() -> None:
    """A validation round's worker is told the served workers' poll (`sandbox_spin_us`): the code cannot tell
    them apart by it (tests/env/sandbox/test_fingerprint.py checks the hellos themselves)."""
    assert Settings().sandbox_spin_us == WORKER_SPIN_US == SandboxLimits().spin_us
    assert SandboxLimits.from_settings(Settings(sandbox_spin_us=123)).spin_us == 123


def test_a_reader_stops_polling_for_frames_that_come_late_and_tries_again_later(pipe: tuple[int, int]) -> None:
    """A reader stops polling after `_MISSES` polled reads in a row whose frame came late (polling that outlasts the
    other side's work only slows that work; an agent thinking between calls is not worth polling for), not after
    one; after `_REPROBE` reads without, it polls again, and keeps polling once a frame comes in time."""
    r, w = pipe
    reader = FrameReader(r, spin_s=0.02)

    def late(n: int) -> float:
        """CPU the read of a frame written 0.1 s from now used."""
        t = _write_later(w, [encode({"id": n})], 0.1)
        before = time.thread_time()
        reader.read(max_bytes=1024, deadline=time.monotonic() + 10, spin=True)
        used = time.thread_time() - before
        t.join()
        return used

    for k in range(wire._MISSES):  # each polls its 20 ms first: late, but not yet given up
        late(k)
        assert reader._polling == [k + 1, 0]
    used = late(10)  # given up: sleeps at once
    assert used < 0.012, f"the read after {wire._MISSES} late frames polled again ({used:.3f} s of CPU)"
    assert reader._polling == [wire._MISSES, 1]
    for k in range(wire._REPROBE - 1):  # frames already there: read without polling, counted
        write_frame(w, encode({"id": 20 + k}))
        reader.read(max_bytes=1024, deadline=time.monotonic() + 10, spin=True)
    assert reader._polling == [wire._MISSES, wire._REPROBE]
    write_frame(w, encode({"id": 99}))
    reader.read(max_bytes=1024, deadline=time.monotonic() + 10, spin=True)  # the re-probe: polled, in time
    assert reader._polling == [0, 0]
    late(100)  # one late frame again: still polling
    assert reader._polling == [1, 0]


@pytest.mark.parametrize("body", [b'{"result": 1e999}', b'{"result": [-1E400]}', b'{"result": NaN}'])
def test_a_number_json_has_not_is_a_malformed_frame(body: bytes) -> None:
    """A worker's answer holding a number past a float's range read as infinity (NaN and Infinity were refused)."""
    with pytest.raises(WireError) as err:
        wire.decode(body, max_depth=10)
    assert err.value.kind == "malformed"
    assert wire.decode(b'{"result": 1e308}', max_depth=10) == {"result": 1e308}
