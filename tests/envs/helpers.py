"""Assertions shared by the per-environment tests."""

from __future__ import annotations

from typing import Any

from envfactory.env import CallRecord, Session


def ok(session: Session, tool: str, **args: Any) -> Any:
    """Call a tool that must succeed; return its result."""
    rec = session.call(tool, args)
    assert rec.ok, f"{tool}({args}) failed: {rec.error}"
    return rec.result


def fails(session: Session, tool: str, error_type: str, **args: Any) -> CallRecord:
    """Call a tool that must fail with `error_type` and leave the state exactly as it was."""
    before = session.dump()
    rec = session.call(tool, args)
    assert not rec.ok, f"{tool}({args}) should have failed with {error_type}, got {rec.result}"
    assert rec.error is not None and rec.error.type == error_type, rec.error
    assert session.dump() == before, "a failed call changed the state"
    assert rec.diff.empty
    return rec
