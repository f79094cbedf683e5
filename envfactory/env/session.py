"""A Session: one isolated conversation with an environment, with its own copy of the state."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from envfactory.env.diff import StateDiff
from envfactory.env.environment import BaseEnvironment
from envfactory.env.state import Change
from envfactory.env.tools import ArgumentError
from envfactory.errors import ToolError

ErrorType = Literal[
    "unknown_tool",
    "invalid_arguments",
    "not_found",
    "conflict",
    "tool_error",
    "contract_violation",
    "internal_error",
]


class ToolErrorInfo(BaseModel):
    """A structured tool error: what went wrong, in words an agent can act on."""

    type: ErrorType
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class CallRecord(BaseModel):
    """One call of a session: what was asked, what came back, what changed."""

    index: int
    tool: str
    arguments: dict[str, Any]
    ok: bool
    result: Any = None
    error: ToolErrorInfo | None = None
    diff: StateDiff = Field(default_factory=StateDiff)
    changes: list[Change] = Field(default_factory=list)

    def payload(self) -> Any:
        """What an agent sees: the result, or `{"error": {...}}`."""
        if self.ok:
            return self.result
        assert self.error is not None
        return {"error": self.error.model_dump(exclude_defaults=True)}


_EMPTY_DIFF = StateDiff()


class Session:
    """Fork with `Session.fork(env, config)`; `call(tool, args)`; `dump()`. Sessions share nothing."""

    def __init__(self, env: BaseEnvironment, state: Any, *, strict: bool = False, source: str = "<config>") -> None:
        self.env = env
        self.state = state
        self.strict = strict
        self.source = source
        self.history: list[CallRecord] = []

    @classmethod
    def fork(
        cls, env: BaseEnvironment, config: dict[str, Any] | str | Path | None = None, *, strict: bool = False
    ) -> Session:
        """A new session on a fresh state built from `config` (a dump, a scenario name, a JSON path)."""
        data, source = env.resolve_config(config)
        return cls(env, env.new_state(data, source), strict=strict, source=source)

    def reset(self, config: dict[str, Any] | str | Path | None = None) -> None:
        data, source = self.env.resolve_config(config)
        self.state = self.env.new_state(data, source)
        self.source = source
        self.history.clear()

    def dump(self) -> dict[str, Any]:
        return self.env.dump_state(self.state)

    def _record(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        result: Any = None,
        error: ToolErrorInfo | None = None,
        diff: StateDiff = _EMPTY_DIFF,
        changes: list[Change] | None = None,
    ) -> CallRecord:
        rec = CallRecord.model_construct(
            index=len(self.history),
            tool=tool,
            arguments=args,
            ok=error is None,
            result=result,
            error=error,
            diff=diff,
            changes=changes or [],
        )
        self.history.append(rec)
        return rec

    def call(self, tool: str, args: dict[str, Any] | None = None) -> CallRecord:
        """Validate, execute and record one tool call. Never raises for a bad call: errors are results."""
        args = {} if args is None else args
        binding = self.env.binding(tool)
        if binding is None:
            names = ", ".join(self.env.metadata.tool_names)
            return self._record(
                tool, args, error=ToolErrorInfo(type="unknown_tool", message=f"no tool '{tool}'; available: {names}")
            )
        if not isinstance(args, dict):
            return self._record(
                tool,
                {},
                error=ToolErrorInfo(type="invalid_arguments", message="arguments must be a JSON object"),
            )
        try:
            kwargs = binding.parse_args(args)
        except ArgumentError as e:
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(
                    type="invalid_arguments",
                    message=f"invalid arguments for '{tool}': {e}",
                    details={"problems": [p.model_dump() for p in e.problems]},
                ),
            )
        env, state = self.env, self.state
        token = env.begin(state, self.strict)
        try:
            result = binding.invoke(state, kwargs)
        except ToolError as e:
            self.state = env.rollback(state, token)
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(type=e.code, message=e.message, details=e.details),
            )
        except Exception as e:  # a bug in the tool: recorded, state restored, the run goes on
            self.state = env.rollback(state, token)
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(type="internal_error", message=f"{type(e).__name__}: {e}"),
            )
        diff, changes, violation = env.finish(state, token, self.strict)
        if violation is None and binding.kind == "read" and not diff.empty:
            violation = f"read tool '{tool}' changed the state at {', '.join(sorted(diff.paths())[:5])}"
        if violation is not None:
            self.state = env.rollback(state, token)
            return self._record(tool, args, error=ToolErrorInfo(type="contract_violation", message=violation))
        return self._record(tool, args, result=result, diff=diff, changes=changes)
