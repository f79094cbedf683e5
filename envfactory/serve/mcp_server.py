"""Serve an environment over MCP (FastMCP from the official SDK), one `Session` per MCP session.

The EnvFactory paper's servers hold one global state per process, so every client of a process
shares it. Here each MCP session (each `initialize` over streamable HTTP, or the one stdio
connection) gets its own `Session`, keyed weakly on the SDK's transport of the session: many isolated
conversations per process, and a session's state is freed when the client goes away.

Initial config: the server's default (`--scenario`), overridden per session by the `scenario`
query parameter or the `x-envfactory-scenario` header on the HTTP connection, or at any time by
the `envfactory_reset` control tool (a scenario name or a whole state dump).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import types

from envfactory.env.environment import BaseEnvironment
from envfactory.env.sandbox.process import workers_resident_mb
from envfactory.env.session import Session
from envfactory.errors import EnvFactoryError
from envfactory.serve.answers import answer_bytes, tool_result
from envfactory.serve.base import STATE_TOOL, SessionServer, unknown_arguments
from envfactory.serve.limits import ServeLimits, drop

__all__ = ["RESET_TOOL", "SCENARIO_HEADER", "STATE_TOOL", "EnvMCPServer", "build_server"]

RESET_TOOL = "envfactory_reset"
SCENARIO_HEADER = "x-envfactory-scenario"

_CONTROL_TOOLS = [
    types.Tool(
        name=RESET_TOOL,
        description=(
            "Reset this session's environment state: to a named scenario, to a full state dump given as"
            " `config`, or (neither given) to the server's default initial config."
        ),
        inputSchema={
            "type": "object",
            "properties": {
                "scenario": {"type": "string", "description": "name of a bundled initial config"},
                "config": {"type": "object", "description": "a full state dump to start from"},
            },
        },
    ),
    types.Tool(
        name=STATE_TOOL,
        description="Return this session's current environment state (a JSON dump), for verification.",
        inputSchema={"type": "object", "properties": {}},
    ),
]


_CONTROL_ARGUMENTS = {RESET_TOOL: frozenset({"scenario", "config"}), STATE_TOOL: frozenset()}


def _mcp_output_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """MCP wants structured output to be an object: wrap other results as {"result": ...}."""
    if schema is None:
        return None
    if schema.get("type") == "object" and "properties" in schema:
        return schema
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped: dict[str, Any] = {"type": "object", "properties": {"result": inner}, "required": ["result"]}
    if "$defs" in schema:  # refs resolve from the root, so definitions move up with the wrapper
        wrapped["$defs"] = schema["$defs"]
    return wrapped


class EnvMCPServer(SessionServer[Session]):
    """A FastMCP server whose tools are an environment's tools, dispatched to per-session state."""

    choice_param = "scenario"
    choice_header = SCENARIO_HEADER
    offloaded_tools = frozenset({RESET_TOOL, STATE_TOOL})  # a whole state in or out: never on the event loop

    def __init__(
        self,
        env: BaseEnvironment,
        *,
        default_config: dict[str, Any] | str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 8765,
        control_tools: bool = True,
        log_level: str = "WARNING",
        json_response: bool = True,
        server_stream: bool = False,
        fast_calls: bool = True,
        limits: ServeLimits | None = None,
    ) -> None:
        meta = env.metadata
        clash = {t.name for t in _CONTROL_TOOLS} & set(meta.tool_names)
        if control_tools and clash:
            raise EnvFactoryError(f"environment '{env.name}' defines reserved tool names: {sorted(clash)}")
        if isinstance(default_config, Path):  # the operator's file: read once, at start
            default_config, _ = env.resolve_config(default_config)
        else:
            env.resolve_config(default_config)  # fail at start, not at the first call, on a bad scenario
        super().__init__(
            name=f"envfactory-{env.name}",
            instructions=meta.description,
            default_choice=default_config,
            blocking=env.blocking_io,  # a sandboxed worker may take up to its call limit
            host=host,
            port=port,
            control_tools=control_tools,
            log_level=log_level,
            json_response=json_response,
            server_stream=server_stream,
            fast_calls=fast_calls,
            limits=limits,
        )
        self.env = env
        self.default_config: dict[str, Any] | str | None = default_config
        self._tools = [
            types.Tool(
                name=t.name,
                description=t.description,
                inputSchema=t.input_schema,
                outputSchema=_mcp_output_schema(t.output_schema),
                annotations=types.ToolAnnotations(readOnlyHint=t.kind == "read", idempotentHint=t.kind == "read"),
            )
            for t in meta.tools
        ]
        self._wraps = {t.name: _mcp_output_schema(t.output_schema) is not t.output_schema for t in meta.tools}

    @property
    def open_sessions(self) -> int:
        return self.open_held

    async def list_tools(self) -> list[types.Tool]:
        return self._tools + (_CONTROL_TOOLS if self.control_tools else [])

    def session_for_request(self) -> Session:
        return self.held(self.request_key(), self.connection_choice())

    def create(self, choice: Any) -> Session:
        return Session.fork(self.env, choice)

    def helpers_resident_mb(self) -> float:
        return workers_resident_mb()  # the sandboxed workers of this process (untrusted environments)

    def choice_problem(self, choice: Any) -> str | None:
        if choice is self.default_choice:
            return None
        try:
            self.env.resolve_config(choice)
        except EnvFactoryError as e:
            return str(e)
        return None

    def dispatch(
        self, key: Any, choice: Any, name: str, arguments: dict[str, Any], size: int = 0
    ) -> types.CallToolResult:
        try:
            session = self.held(key, choice)
            takes = _CONTROL_ARGUMENTS.get(name) if self.control_tools else None
            unknown = unknown_arguments(name, arguments, takes) if takes is not None else None
            if unknown is not None:  # a typo (`scenarios`) must not reset to the default and report success
                return tool_result({"error": {"type": "invalid_arguments", "message": unknown}}, wrap=False, error=True)
            if self.control_tools and name == RESET_TOOL:
                given, scenario = arguments.get("config"), arguments.get("scenario")
                if given is not None and scenario is not None:  # (config won, silently)
                    message = "give a config (a full state) or a scenario (a name), not both"
                    return tool_result(
                        {"error": {"type": "invalid_arguments", "message": message}}, wrap=False, error=True
                    )
                # an empty config is an empty state, not "no config" (it loaded the default scenario)
                config = given if given is not None else scenario or self.default_config
                too_large = self.config_too_large(given, size, "config")
                if too_large is not None:
                    error = {"error": {"type": "invalid_config", "message": too_large}}
                    return tool_result(error, wrap=False, error=True)
                session.reset(config)
                self.forget(key)
                if size > self.limits.inline_body_bytes:
                    self.mark_slow(key)  # calls on a state this large may be expensive: off the loop while they are
                return tool_result({"reset": True, "source": session.source}, wrap=False)
            if self.control_tools and name == STATE_TOOL:
                return tool_result(session.dump(), wrap=False)
        except EnvFactoryError as e:  # e.g. an unknown scenario: the client gets an error result
            return tool_result({"error": {"type": "invalid_config", "message": str(e)}}, wrap=False, error=True)
        rec = session.call(name, arguments)
        result = tool_result(rec.payload(), wrap=self._wraps.get(name, False), error=not rec.ok)
        # the session's history is a ring here: the newest records, bounded in count and bytes
        drop(session.history, self.remember(key, rec, size + answer_bytes(result)))
        return result


def build_server(env: BaseEnvironment, **kwargs: Any) -> EnvMCPServer:
    return EnvMCPServer(env, **kwargs)
