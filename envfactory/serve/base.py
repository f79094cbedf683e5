"""What every EnvFactory MCP server shares: one held object per MCP session, and the HTTP hardening.

`SessionServer` is FastMCP with one object held per MCP session (an environment `Session`, a hub
episode), keyed weakly on the SDK's `ServerSession` (each `initialize` over streamable HTTP, or the
one stdio connection), so a session's state is freed when its client goes away. A connection may
choose how its object starts (a query parameter or a header: a scenario, a task); the server's
default applies otherwise. Calls that may block (a sandboxed worker) run off the event loop, one at a
time per MCP session, in order, so one slow session never stalls the others. Subclasses list their
tools and answer a call (`dispatch`); nothing else is theirs to repeat.

Also here: the middleware that refuses bad HTTP bodies before the SDK parses them, the 405 for the
standalone GET stream, the filter for the SDK's disconnect tracebacks, and `tool_result`.
"""

from __future__ import annotations

import json
import logging
import weakref
from abc import abstractmethod
from typing import Any, Generic, TypeVar

import anyio
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.server.streamable_http import MCP_PROTOCOL_VERSION_HEADER, MCP_SESSION_ID_HEADER
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from envfactory.inputs import MAX_DEPTH, InputError, parse_json

STATE_TOOL = "envfactory_state"
H = TypeVar("H")


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


DISCONNECT_FILTER = _DropClientDisconnects()


class NoServerStream:
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
PARSED_BODY = "envfactory.parsed_body"  # ASGI scope key: (the body's JSON, its size in bytes)


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
            message = parse_json(body, "the request body", max_depth=self.max_depth, surrogates=True)
        except InputError as e:
            await self._refuse(scope, send, 400, str(e))
            return
        scope = {**scope, PARSED_BODY: (message, len(body))}  # for `FastToolCalls`, inside this layer
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


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


class FastToolCalls:
    """Answer `tools/call` on an open session directly, without the SDK's per-message machinery.

    The SDK routes every request of a session through memory streams to the session's task, validates
    it twice with pydantic and answers through a per-request stream: ~3/4 of a server's time per call
    (profiled: the environment's own dispatch is ~8 %). A tool call of a session this server already
    holds an object for has nothing more to negotiate, so this layer answers it the way the SDK
    would (same checks, same JSON-RPC body and headers) from the same `SessionServer.answer`.

    Anything else — the session's first call (which chooses its initial state), other methods, batches,
    notifications, an SSE-mode server, a request the SDK would refuse (unknown or ended session, bad
    headers, a protocol version it does not speak, DNS-rebinding checks failing, an authenticated user,
    an oversized body) — goes on to the SDK unchanged, which answers it as before.
    """

    def __init__(self, app: Any, server: SessionServer[Any]) -> None:
        self.app, self.server = app, server
        self.path = server.settings.streamable_http_path
        self.security = TransportSecurityMiddleware(server.settings.transport_security)
        self.answered = 0  # tool calls this layer answered (the rest went to the SDK)
        server.fast = self

    def _hold(self, transport: Any) -> None:
        """Push the session's idle deadline (the SDK's `session_idle_timeout`) to a full timeout from now."""
        idle, timeout = transport.idle_scope, self.server.session_manager.session_idle_timeout
        if idle is not None and timeout is not None:
            idle.deadline = max(idle.deadline, anyio.current_time() + timeout)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        parsed = scope.get(PARSED_BODY)
        if parsed is None or scope.get("path") != self.path or not self.server.settings.json_response:
            await self.app(scope, receive, send)
            return
        message, size = parsed
        session = self._eligible(scope, message, size)
        if session is None or await self.security.validate_request(Request(scope), is_post=True) is not None:
            await self.app(scope, receive, send)
            return
        session_id, key, transport = session
        params = message["params"]
        arguments = params.get("arguments")
        self._hold(transport)  # this request holds the session, as the SDK's would
        try:
            result = await self.server.answer(key, self.server.default_choice, params["name"], arguments or {})
        except Exception as e:  # what the SDK's handler makes of a raising tool
            result = types.CallToolResult(content=[types.TextContent(type="text", text=str(e))], isError=True)
        self._hold(transport)  # and its idle time starts again when the answer leaves
        body = {
            "jsonrpc": "2.0",
            "id": message["id"],
            "result": result.model_dump(by_alias=True, mode="json", exclude_none=True),
        }
        self.answered += 1
        headers = {"content-type": "application/json", MCP_SESSION_ID_HEADER: session_id}
        await Response(json.dumps(body, ensure_ascii=False, separators=(",", ":")), 200, headers)(scope, receive, send)

    def _eligible(self, scope: Any, message: Any, size: int) -> tuple[str, Any, Any] | None:
        """(session id, held key, SDK transport) when the SDK would serve this tools/call as an ordinary
        one of an open, initialized session of ours; None sends the request on to the SDK."""
        if not (
            isinstance(message, dict)
            and message.get("jsonrpc") == "2.0"
            and message.get("method") == "tools/call"
            and type(message.get("id")) in (int, str)
            and isinstance(params := message.get("params"), dict)
            and isinstance(params.get("name"), str)
            and isinstance(params.get("arguments"), dict | None)
            and scope.get("user") is None  # sessions bound to a credential: the SDK checks the owner
        ):
            return None
        headers = scope.get("headers") or []
        session_id = _header(headers, MCP_SESSION_ID_HEADER.encode())
        accept = _header(headers, b"accept") or ""
        content_type = (_header(headers, b"content-type") or "").split(";")[0].strip()
        version = _header(headers, MCP_PROTOCOL_VERSION_HEADER.encode())
        if (
            session_id is None
            or content_type != "application/json"
            or not any(part.strip().startswith("application/json") for part in accept.split(","))
            or (version is not None and version not in SUPPORTED_PROTOCOL_VERSIONS)
        ):
            return None
        manager = self.server.session_manager
        if size > manager.max_request_body_size:
            return None
        transport = getattr(manager, "_server_instances", {}).get(session_id)  # mcp 1.30: the open sessions
        key = self.server.key_of(session_id)
        if (
            transport is None
            or key is None
            or transport.is_terminated
            or (transport.idle_scope is not None and transport.idle_scope.cancel_called)
        ):
            return None
        return session_id, key, transport


def tool_result(payload: Any, *, wrap: bool, error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False)
    structured = None if error else ({"result": payload} if wrap else payload)
    if structured is not None and not isinstance(structured, dict):
        structured = None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=structured, isError=error
    )


class SessionServer(FastMCP, Generic[H]):
    """FastMCP with one `H` per MCP session (see the module). Subclasses set `choice_param` and
    `choice_header`, and implement `list_tools`, `create` and `dispatch`."""

    choice_param: str
    choice_header: str

    def __init__(
        self,
        *,
        name: str,
        instructions: str | None,
        default_choice: Any,
        blocking: bool,
        host: str,
        port: int,
        control_tools: bool,
        log_level: str,
        json_response: bool,
        server_stream: bool,
        fast_calls: bool = True,
    ) -> None:
        super().__init__(
            name=name,
            instructions=instructions,
            host=host,
            port=port,
            log_level=log_level,  # type: ignore[arg-type]
            # tools answer at once and send no progress: plain JSON responses skip SSE framing
            json_response=json_response,
        )
        for logger_name in ("mcp.server.streamable_http", "uvicorn.error"):
            logger = logging.getLogger(logger_name)
            if DISCONNECT_FILTER not in logger.filters:
                logger.addFilter(DISCONNECT_FILTER)
        self.default_choice = default_choice
        self.blocking = blocking
        self.control_tools = control_tools
        self.server_stream = server_stream
        self.fast_calls = fast_calls
        self._held: weakref.WeakKeyDictionary[Any, H] = weakref.WeakKeyDictionary()
        self._locks: weakref.WeakKeyDictionary[Any, anyio.Lock] = weakref.WeakKeyDictionary()
        # streamable HTTP: MCP session id -> the SDK's session object our held objects are keyed on
        self._keys: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self.fast: FastToolCalls | None = None

    def streamable_http_app(self) -> Starlette:
        app = super().streamable_http_app()
        if not self.server_stream:
            app.add_middleware(NoServerStream)
        if self.fast_calls:
            app.add_middleware(FastToolCalls, server=self)
        app.add_middleware(BoundedJSONBody)
        return app

    def key_of(self, session_id: str) -> Any:
        """The held key of the HTTP session `session_id`, once a call of it went through the SDK (else None)."""
        key = self._keys.get(session_id)
        return key if key is not None and key in self._held else None

    @property
    def open_held(self) -> int:
        """How many MCP sessions hold an object now."""
        return len(self._held)

    def connection_choice(self) -> Any:
        """What this request's connection chose (`?<choice_param>=` or the `choice_header`), else the default."""
        request = self.get_context().request_context.request
        if request is not None and hasattr(request, "query_params"):
            chosen = request.query_params.get(self.choice_param) or request.headers.get(self.choice_header)
            if chosen:
                return str(chosen)
        return self.default_choice

    def held(self, key: Any, choice: Any) -> H:
        """The object of MCP session `key`, created from `choice` on its first call."""
        value = self._held.get(key)
        if value is None:
            value = self._held[key] = self.create(choice)
        return value

    def request_key(self) -> Any:
        return self.get_context().request_context.session

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:  # type: ignore[override]
        key = self.request_key()
        # the connection's choice matters only to a session's first call (it starts the held object)
        choice = self.connection_choice() if key not in self._held else self.default_choice
        request = self.get_context().request_context.request
        if request is not None and hasattr(request, "headers"):
            session_id = request.headers.get(MCP_SESSION_ID_HEADER)
            if session_id:
                self._keys[session_id] = key
        return await self.answer(key, choice, name, arguments if isinstance(arguments, dict) else {})

    async def answer(self, key: Any, choice: Any, name: str, args: dict[str, Any]) -> types.CallToolResult:
        """One tool call of session `key`: at once, or off the event loop one at a time per session when `blocking`."""
        if not self.blocking:
            return self.dispatch(key, choice, name, args)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            return await anyio.to_thread.run_sync(self.dispatch, key, choice, name, args)

    @abstractmethod
    def create(self, choice: Any) -> H:
        """A new session's object, started from the connection's choice (or the default)."""

    @abstractmethod
    def dispatch(self, key: Any, choice: Any, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Answer one tool call of MCP session `key` (on a worker thread when `blocking`)."""
