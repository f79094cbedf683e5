# Runs first in every payload of tests/test_attacks.py, with the real builtins (exec'd by hostile_env.py).
# `out` is what the attack tool returns to the parent; `values` what the test passed in; `db` the state.
import json
import os
import struct
import sys


def attempt(name, fn):
    """Run one attempt; out[name] is 'OK <value>' or '<ExceptionType>: <message>'."""
    try:
        value = fn()
    except BaseException as e:  # the attacker catches everything it can
        out[name] = f"{type(e).__name__}: {e}"[:500]
        return None
    out[name] = "OK " + repr(value)[:2000]
    return value


def worker_and_request():
    """The sandbox worker object and the request it is answering, from the interpreter's frames."""
    frame = sys._getframe(1)
    while frame is not None:
        me = frame.f_locals.get("self")
        if type(me).__name__ == "Worker" and isinstance(frame.f_locals.get("req"), dict):
            return me, frame.f_locals["req"]
        frame = frame.f_back
    raise LookupError("the worker's frame was not found")


def frame_of(message):
    """A protocol frame: a 4-byte big-endian length and the body."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


out["real_builtins"] = "open" in __builtins__ and "exec" in __builtins__ and "__import__" in __builtins__
