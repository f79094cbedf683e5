"""The pipe protocol between the parent and a sandboxed worker: length-prefixed JSON frames.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (ASCII in practice: both
sides encode with `ensure_ascii`, so a lone surrogate in a tool's arguments crosses intact). The
worker is untrusted, so the parent reads every frame defensively: a length over the limit, bytes
that are not JSON, JSON nested deeper than the limit, a string holding a lone surrogate (no answer
to a client can carry it: UTF-8 has no encoding for it), or a frame that does not arrive before the
deadline is a `WireError`, and the parent treats the worker as crashed. Nothing the worker sends
is ever parsed by a recursive routine that could overflow the parent's stack.
"""

from __future__ import annotations

import json
import os
import re
import select
import struct
import time
from typing import Any

from envfactory.errors import EnvError
from envfactory.inputs import LONE_SURROGATE, finite_float, has_lone_surrogate, no_constant, parse_int

_HEADER = struct.Struct(">I")
_MISSES = 3  # polled reads in a row whose frame came late, after which a reader stops polling
_REPROBE = 4  # reads without polling, after which it polls again


class WireError(EnvError):
    """A frame could not be read: malformed, too large, too deep, late, or the other side is gone."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "eof", "timeout", "too_large", "malformed", "too_deep"


def encode(message: Any) -> bytes:
    """One frame: header + JSON. `ensure_ascii` keeps lone surrogates encodable (as \\ud800 escapes)."""
    body = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, frame: bytes, deadline: float | None = None) -> None:
    """Write a whole frame; with a `deadline` (`fd` must then be non-blocking) a reader that stops
    reading cannot hold the writer past it."""
    view = memoryview(frame)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise WireError("timeout", "the other side did not take the request before the deadline")
            _, ready, _ = select.select([], [fd], [], wait)
            if not ready:
                continue
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


def _tree_depth_exceeds(value: Any, limit: int) -> bool:
    """Depth check for what `json.loads` returns (a tree: nothing shared), iterative and cheap per value."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if type(item) is dict else item
        stack.extend((c, depth + 1) for c in children if type(c) is dict or type(c) is list)
    return False


# `\uD800`-`\uDFFF` escapes: half of a pair (a character past the BMP, which ensure_ascii writes as one), or a
# lone surrogate. Bytes with none hold no surrogate (a raw one is not UTF-8); bytes with one are checked value by value.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

# one instance (json.loads(**kw) builds one per call); long integer literals refused before they are converted
_DECODER = json.JSONDecoder(parse_constant=no_constant, parse_int=parse_int, parse_float=finite_float)


def decode(body: bytes, max_depth: int, max_containers: int = 1_000_000, max_values: int = 2_000_000) -> Any:
    """Parse one frame's body, refusing invalid UTF-8, invalid JSON (NaN included), a string (a key
    included) holding a lone surrogate, more than `max_containers` arrays and objects, more than about
    `max_values` values, and nesting beyond `max_depth`.

    The parent's cost is bounded before it starts: the container count is a byte count (brackets
    inside strings only make it stricter), so a frame of a million empty lists is refused at once
    instead of being parsed and walked.
    """
    brackets = body.count(b"[") + body.count(b"{")
    if brackets > max_containers:
        raise WireError("too_large", f"a frame holds more than {max_containers} arrays and objects")
    if brackets + body.count(b",") > max_values:  # what a value costs the parent is objects, not bytes
        raise WireError("too_large", f"a frame holds more than {max_values} values")
    try:
        value = _DECODER.decode(body.decode("utf-8"))
    except RecursionError:
        raise WireError("too_deep", f"a frame nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError("malformed", f"a frame is not valid JSON: {e}") from None
    if brackets > max_depth and type(value) in (dict, list) and _tree_depth_exceeds(value, max_depth):
        raise WireError("too_deep", f"a frame nests deeper than {max_depth} levels")
    if holds_lone_surrogate(body, value):
        raise WireError("malformed", f"a frame holds {LONE_SURROGATE}")
    return value


def holds_lone_surrogate(body: bytes, value: Any) -> bool:
    """Whether `value`, parsed from (or encoded as) the JSON `body`, holds a lone surrogate in a string or a key."""
    return _SURROGATE_ESCAPE.search(body) is not None and has_lone_surrogate(value)


class FrameReader:
    """Frames from one pipe, read through a buffer: a small frame costs one `read`, header and body together.

    `spin_s`: how long a read (`spin=True`) polls the pipe before it sleeps on it. Parent and worker answer each
    other within tens of microseconds, and a process that sleeps between them is woken through the scheduler, on
    another core (on a VM a bare round trip then takes ~80-120 µs; with both sides polling, ~5 µs:
    benchmarks/sessions.py). Polling is the same `select` on the same pipe, bounded: at most `spin_s` of CPU
    per wait, and only while the frames come that fast: a reader stops polling after `_MISSES` polled reads in a
    row whose frame came later than `spin_s` (a poll that outlasts the other side's work only slows that work
    down where the two cores share a physical one, and an agent thinking between calls is not worth polling
    for), and polls again after `_REPROBE` reads without (a frame in time: it keeps polling). One late frame
    does not stop it: the two sides' polls depend on each other (a side that sleeps answers late), and both
    must come back together."""

    def __init__(self, fd: int, spin_s: float = 0.0) -> None:
        self.fd = fd
        self.spin_s = spin_s
        self._buf = bytearray()
        # [polled reads in a row whose frame came late, reads since the last poll]; one list, changed in place:
        # the worker's integrity check holds its reader's attributes by identity
        self._polling: list[int] = [0, 0]

    def _poll(self, until: float) -> None:
        """Poll until the pipe has data or `until` (a `time.monotonic()` value) has passed."""
        fds = [self.fd]
        while not select.select(fds, [], [], 0)[0] and time.monotonic() < until:
            os.sched_yield()  # a process that waits for this core (the other side, under load) gets it

    def _fill(self, need: int, deadline: float | None, poll_until: float | None) -> None:
        while len(self._buf) < need:
            if poll_until is not None:  # a frame comes in pieces when it is larger than a page: each is polled for
                self._poll(poll_until if deadline is None else min(poll_until, deadline))
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise WireError("timeout", "no answer before the deadline")
                ready, _, _ = select.select([self.fd], [], [], wait)
                if not ready:
                    raise WireError("timeout", "no answer before the deadline")
            chunk = os.read(self.fd, max(need - len(self._buf), 1 << 16))
            if not chunk:
                raise WireError("eof", "the other side closed the pipe")
            self._buf += chunk

    def unasked(self) -> str | None:
        """What the other side sent that nothing asked for, looked at before a request goes: None (nothing),
        "eof" (it closed the pipe) or "data" (a frame, or part of one, ahead of its request: one request gets
        one answer, so an answer written before its request was read is refused, not taken as that answer)."""
        if self._buf:
            return "data"
        if not select.select([self.fd], [], [], 0)[0]:
            return None
        chunk = os.read(self.fd, 1 << 16)
        self._buf += chunk
        return "data" if chunk else "eof"

    def read(self, *, max_bytes: int, deadline: float | None = None, spin: bool = False) -> bytes:
        """The body of the next frame; `deadline` is a `time.monotonic()` value (None: wait forever); `spin`: poll
        for up to `spin_s` (in all) before sleeping on the pipe."""
        state = self._polling
        poll_until = None
        if spin and self.spin_s > 0:
            if state[0] < _MISSES or state[1] >= _REPROBE:
                poll_until = time.monotonic() + self.spin_s
                state[1] = 0
            else:
                state[1] += 1
        self._fill(_HEADER.size, deadline, poll_until)
        if poll_until is not None:
            state[0] = 0 if time.monotonic() <= poll_until else state[0] + 1
        (size,) = _HEADER.unpack_from(self._buf)
        if size > max_bytes:
            raise WireError("too_large", f"a frame of {size} bytes is over the {max_bytes}-byte limit")
        end = _HEADER.size + size
        self._fill(end, deadline, poll_until)
        body = bytes(self._buf[_HEADER.size : end])
        del self._buf[:end]
        return body
