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
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse

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
        self._held: weakref.WeakKeyDictionary[Any, H] = weakref.WeakKeyDictionary()
        self._locks: weakref.WeakKeyDictionary[Any, anyio.Lock] = weakref.WeakKeyDictionary()

    def streamable_http_app(self) -> Starlette:
        app = super().streamable_http_app()
        if not self.server_stream:
            app.add_middleware(NoServerStream)
        app.add_middleware(BoundedJSONBody)
        return app

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
        args = arguments if isinstance(arguments, dict) else {}
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
