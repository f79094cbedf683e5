"""A Session: one isolated conversation with an environment, with its own copy of the state."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from envfactory.env.diff import StateDiff
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.state import Change
from envfactory.env.tools import ArgumentError
from envfactory.errors import ToolError
from envfactory.inputs import LONE_SURROGATE, has_lone_surrogate

ErrorType = Literal[
    "unknown_tool",
    "invalid_arguments",
    "not_found",
    "conflict",
    "tool_error",
    "contract_violation",
    "internal_error",
    "timeout",
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
ERROR_TYPES: frozenset[str] = frozenset(get_args(ErrorType))


def _tool_error(e: ToolError) -> ToolErrorInfo:
    """A tool's own error as a record; a code or details it made up cannot break the record."""
    code = e.code if isinstance(e.code, str) and e.code in ERROR_TYPES else "tool_error"
    details = e.details if isinstance(e.details, dict) else {}
    try:
        return ToolErrorInfo(type=code, message=str(e.message), details=details)
    except Exception:
        return ToolErrorInfo(type=code, message=str(e.message)[:1000])


class Session:
    """Fork with `Session.fork(env, config)`; `call(tool, args)`; `dump()`. Sessions share nothing."""

    def __init__(
        self, env: BaseEnvironment, state: Any, *, strict: bool = False, source: str = "<config>", traced: bool = True
    ) -> None:
        """`traced=False`: a native environment's write calls are recorded without their diff and change
        list (computing them is a third of a bundled tool's call), for replays that only want the final
        state (the reward's). Reads, strict sessions and environments with their own bookkeeping are
        always traced: that is where the contract checks live."""
        self.env = env
        self.state = state
        self.strict = strict
        self.traced = traced
        self.source = source
        self.history: list[CallRecord] = []

    @classmethod
    def fork(
        cls, env: BaseEnvironment, config: dict[str, Any] | str | Path | None = None, *, strict: bool = False
    ) -> Session:
        """A new session on a fresh state built from `config`: a dump, a scenario *name* of the
        environment, or a `Path` to a JSON file (local callers only; a string is never a path).

        An untrusted environment answers with a session served by its sandboxed workers."""
        data, source = env.resolve_config(config)
        return env.open_session(data, source, strict=strict)

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

    def close(self) -> None:
        """Let go of the session's resources (a sandboxed worker's copy of the state); idempotent."""

    def call(self, tool: str, args: dict[str, Any] | None = None) -> CallRecord:
        """Validate, execute and record one tool call. Never raises for a bad call: errors are results."""
        args = {} if args is None else args
        if not isinstance(tool, str):
            return self._record(
                str(tool)[:100], {}, error=ToolErrorInfo(type="unknown_tool", message="a tool name must be a string")
            )
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
        except Exception as e:  # arguments that cannot even be read: lone surrogates, nesting past the stack
            why = (
                f"a string holds {LONE_SURROGATE}"
                if has_lone_surrogate(args)
                else f"they cannot be read ({type(e).__name__}: {str(e)[:200]})"
            )
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(type="invalid_arguments", message=f"invalid arguments for '{tool}': {why}"),
            )
        env, state = self.env, self.state
        token = env.begin(state, self.strict)
        try:
            result = binding.invoke(state, kwargs)
        except ToolError as e:
            self.state = env.rollback(state, token)
            return self._record(tool, args, error=_tool_error(e))
        except Exception as e:  # a bug in the tool: recorded, state restored, the run goes on
            self.state = env.rollback(state, token)
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(type="internal_error", message=f"{type(e).__name__}: {e}"),
            )
        if not self.traced and not self.strict and binding.kind != "read" and type(env).finish is Environment.finish:
            return self._record(tool, args, result=result)  # untraced: the native log keeps what changed
        try:
            diff, changes, violation = env.finish(state, token, self.strict)
        except ToolError as e:  # the environment refuses the state the call left: undone, as a refusal
            self.state = env.rollback(state, token)
            return self._record(tool, args, error=_tool_error(e))
        except Exception as e:  # the tool left a state that cannot be dumped or compared: undone
            self.state = env.rollback(state, token)
            return self._record(
                tool,
                args,
                error=ToolErrorInfo(
                    type="internal_error",
                    message=f"the call left a state that cannot be read back ({type(e).__name__}: {str(e)[:200]})",
                ),
            )
        if violation is None and binding.kind == "read" and not diff.empty:
            violation = f"read tool '{tool}' changed the state at {', '.join(sorted(diff.paths())[:5])}"
        if violation is not None:
            self.state = env.rollback(state, token)
            return self._record(tool, args, error=ToolErrorInfo(type="contract_violation", message=violation))
        return self._record(tool, args, result=result, diff=diff, changes=changes)
