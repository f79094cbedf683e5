"""The pipe protocol between the parent and a sandboxed worker: length-prefixed JSON frames.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (ASCII in practice: both
sides encode with `ensure_ascii`, so a lone surrogate in a tool's arguments crosses intact). The
worker is untrusted, so the parent reads every frame defensively: a length over the limit, bytes
that are not JSON, JSON nested deeper than the limit, or a frame that does not arrive before the
deadline is a `WireError`, and the parent treats the worker as crashed. Nothing the worker sends
is ever parsed by a recursive routine that could overflow the parent's stack.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

from envfactory.inputs import depth_exceeds

_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A frame could not be read: malformed, too large, too deep, late, or the other side is gone."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "eof", "timeout", "too_large", "malformed", "too_deep"


def encode(message: Any) -> bytes:
    """One frame: header + JSON. `ensure_ascii` keeps lone surrogates encodable (as \\ud800 escapes)."""
    body = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, frame: bytes) -> None:
    view = memoryview(frame)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def decode(body: bytes, max_depth: int) -> Any:
    """Parse one frame's body, refusing invalid UTF-8, invalid JSON and nesting beyond `max_depth`."""
    # fast path: fewer opening brackets than the limit cannot nest deeper than it
    maybe_deep = body.count(b"[") + body.count(b"{") > max_depth
    try:
        value = json.loads(body)
    except RecursionError:
        raise WireError("too_deep", f"a frame nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError("malformed", f"a frame is not valid JSON: {e}") from None
    if maybe_deep and depth_exceeds(value, max_depth):
        raise WireError("too_deep", f"a frame nests deeper than {max_depth} levels")
    return value


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise WireError("timeout", "no answer before the deadline")
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise WireError("timeout", "no answer before the deadline")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WireError("eof", "the other side closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, *, max_bytes: int, deadline: float | None = None) -> bytes:
    """The body of the next frame on `fd`; `deadline` is a `time.monotonic()` value (None: wait forever)."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > max_bytes:
        raise WireError("too_large", f"a frame of {size} bytes is over the {max_bytes}-byte limit")
    return _read_exact(fd, size, deadline)
