"""Serve an environment over MCP (FastMCP from the official SDK), one `Session` per MCP session.

The EnvFactory paper's servers hold one global state per process, so every client of a process
shares it. Here each MCP session (each `initialize` over streamable HTTP, or the one stdio
connection) gets its own `Session`, keyed weakly on the SDK's `ServerSession` object: many isolated
conversations per process, and a session's state is freed when the client goes away.

Initial config: the server's default (`--scenario`), overridden per session by the `scenario`
query parameter or the `x-envfactory-scenario` header on the HTTP connection, or at any time by
the `envfactory_reset` control tool (a scenario name or a whole state dump).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.fastmcp import FastMCP
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse

from envfactory.env.environment import BaseEnvironment
from envfactory.env.session import Session
from envfactory.errors import EnvFactoryError
from envfactory.inputs import MAX_DEPTH, InputError, parse_json

RESET_TOOL = "envfactory_reset"
STATE_TOOL = "envfactory_state"
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


class _DropClientDisconnects(logging.Filter):
    """Drop the tracebacks the SDK and uvicorn log when a client closes a session mid-flight.

    mcp 1.30 logs one each time a client closes a session's GET stream, and uvicorn one when a
    POST races the session's DELETE (both end in anyio.ClosedResourceError). They are harmless,
    and rendering them (rich tracebacks, on the event loop) costs ~60-100 ms per closed session:
    most of the server's time when conversations are short.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc: BaseException | None = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError):
                return False
            exc = exc.__context__
        return True


_DISCONNECT_FILTER = _DropClientDisconnects()


class _NoServerStream:
    """Answer the optional standalone GET stream with 405, as the streamable-HTTP spec allows.

    Our tools answer every request in its own response and never send server-initiated messages,
    so the per-session SSE stream the SDK would open (a task, memory streams, a held connection)
    is pure cost: without it the server starts sessions about a third faster.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            response = PlainTextResponse(
                "this server sends no server-initiated messages", status_code=405, headers={"Allow": "POST, DELETE"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_LOG = logging.getLogger("envfactory.serve")
MAX_BODY_BYTES = 16 * 1024 * 1024


class BoundedJSONBody:
    """Refuse an oversized, malformed or too deeply nested JSON body with a 4xx and one log line.

    Runs before the SDK parses the body, whose recursive parsing would answer a 100k-deep document
    with a 500 and a traceback. The body is read once (bounded), checked without recursion, and
    handed on unchanged.
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_DEPTH) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def _refuse(self, scope: Any, send: Any, status: int, message: str) -> None:
        client = scope.get("client") or ("?", 0)
        _LOG.warning("refused a request from %s: %s", client[0], message)
        body = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700 if status == 400 else -32600, "message": message},
        }
        await JSONResponse(body, status_code=status)(scope, _no_receive, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, 413, f"the request body is over the {self.max_bytes}-byte limit")
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, 413, f"the request body is over the {self.max_bytes}-byte limit")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parse_json(body, "the request body", max_depth=self.max_depth, surrogates=True)
        except InputError as e:
            await self._refuse(scope, send, 400, str(e))
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


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


class EnvMCPServer(FastMCP):
    """A FastMCP server whose tools are an environment's tools, dispatched to per-session state."""

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
    ) -> None:
        meta = env.metadata
        super().__init__(
            name=f"envfactory-{env.name}",
            instructions=meta.description,
            host=host,
            port=port,
            log_level=log_level,  # type: ignore[arg-type]
            # tools answer at once and send no progress: plain JSON responses skip SSE framing
            json_response=json_response,
        )
        for logger_name in ("mcp.server.streamable_http", "uvicorn.error"):
            logger = logging.getLogger(logger_name)
            if _DISCONNECT_FILTER not in logger.filters:
                logger.addFilter(_DISCONNECT_FILTER)
        self.env = env
        self.control_tools = control_tools
        self.server_stream = server_stream
        clash = {t.name for t in _CONTROL_TOOLS} & set(meta.tool_names)
        if control_tools and clash:
            raise EnvFactoryError(f"environment '{env.name}' defines reserved tool names: {sorted(clash)}")
        if isinstance(default_config, Path):  # the operator's file: read once, at start
            default_config, _ = env.resolve_config(default_config)
        else:
            env.resolve_config(default_config)  # fail at start, not at the first call, on a bad scenario
        self.default_config: dict[str, Any] | str | None = default_config
        self._sessions: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()
        self._locks: weakref.WeakKeyDictionary[Any, anyio.Lock] = weakref.WeakKeyDictionary()
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

    def streamable_http_app(self) -> Starlette:
        app = super().streamable_http_app()
        if not self.server_stream:
            app.add_middleware(_NoServerStream)
        app.add_middleware(BoundedJSONBody)
        return app

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    async def list_tools(self) -> list[types.Tool]:
        return self._tools + (_CONTROL_TOOLS if self.control_tools else [])

    def _initial_config(self) -> dict[str, Any] | str | None:
        request = self.get_context().request_context.request
        if request is not None and hasattr(request, "query_params"):
            chosen = request.query_params.get("scenario") or request.headers.get(SCENARIO_HEADER)
            if chosen:
                return str(chosen)
        return self.default_config

    def session_for_request(self) -> Session:
        key = self.get_context().request_context.session
        return self._session(key, self._initial_config)

    def _session(self, key: Any, initial: Callable[[], dict[str, Any] | str | None]) -> Session:
        session = self._sessions.get(key)
        if session is None:
            session = Session.fork(self.env, initial())
            self._sessions[key] = session
        return session

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:  # type: ignore[override]
        key = self.get_context().request_context.session
        if not self.env.blocking_io:
            return self._dispatch(key, name, arguments, self._initial_config)
        # a sandboxed worker may take up to its call limit: off the event loop, one call per session at a time
        chosen = self._initial_config()
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            return await anyio.to_thread.run_sync(self._dispatch, key, name, arguments, lambda: chosen)

    def _dispatch(
        self, key: Any, name: str, arguments: Any, initial: Callable[[], dict[str, Any] | str | None]
    ) -> types.CallToolResult:
        arguments = arguments if isinstance(arguments, dict) else {}
        try:
            session = self._session(key, initial)
            if self.control_tools and name == RESET_TOOL:
                config = arguments.get("config") or arguments.get("scenario") or self.default_config
                session.reset(config)
                return _result({"reset": True, "source": session.source}, wrap=False)
            if self.control_tools and name == STATE_TOOL:
                return _result(session.dump(), wrap=False)
        except EnvFactoryError as e:  # e.g. an unknown scenario: the client gets an error result
            return _result({"error": {"type": "invalid_config", "message": str(e)}}, wrap=False, error=True)
        rec = session.call(name, arguments)
        return _result(rec.payload(), wrap=self._wraps.get(name, False), error=not rec.ok)


def _result(payload: Any, *, wrap: bool, error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False)
    structured = None if error else ({"result": payload} if wrap else payload)
    if structured is not None and not isinstance(structured, dict):
        structured = None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=structured, isError=error
    )


def build_server(env: BaseEnvironment, **kwargs: Any) -> EnvMCPServer:
    return EnvMCPServer(env, **kwargs)
