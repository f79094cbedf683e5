"""What every EnvFactory MCP server shares: one held object per MCP session, and the HTTP hardening.

`SessionServer` is FastMCP with one object held per MCP session (an environment `Session`, a hub
episode), keyed weakly on the SDK's transport of the session (each `initialize` over streamable HTTP;
for the one stdio connection, its `ServerSession`), so a session's state is freed when its client goes
away. A connection may choose how its object starts (a query parameter or a header: a scenario, a
task); the server's default applies otherwise. Only cheap in-process calls run on the event loop; calls
that may block or cost (a sandboxed worker, a large request, a control tool, a session whose calls were
expensive) run on worker threads, one at a time per MCP session, in order, under thread limiters of
their own (one per app in the hub) that lend their threads in fair order (`envfactory.serve.fair`), so
one slow session, app or flooding client never stalls the others. A served session keeps only its
newest call records (`ServeLimits.history_*`). Subclasses list their tools and answer a call
(`dispatch`); nothing else is theirs to repeat.

Also here: the middleware that refuses bad HTTP bodies before the SDK parses them (`BoundedJSONBody`),
the session budget (`SessionBudget`), the 405 for the standalone GET stream, the filter for the SDK's
disconnect tracebacks, and `tool_result`. The limits are `envfactory.serve.limits.ServeLimits`; the
connection side (uvicorn) is `envfactory.serve.http`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import weakref
from abc import abstractmethod
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import uvicorn
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.server.streamable_http import MCP_PROTOCOL_VERSION_HEADER, MCP_SESSION_ID_HEADER
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
from pydantic import PrivateAttr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from envfactory.inputs import MAX_DEPTH, InputError, parse_json
from envfactory.serve.fair import FairLimiter, OffLoop, Stopwatch, Turn
from envfactory.serve.http import guard_event_loop, harden_logging, serve_http, uvicorn_config
from envfactory.serve.limits import SDK_MAX_BODY_BYTES, CallRing, LogBudget, ServeLimits, resident_mb

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
MAX_BODY_BYTES = SDK_MAX_BODY_BYTES  # the default; `ServeLimits.max_body_bytes` is never larger
PARSED_BODY = "envfactory.parsed_body"  # ASGI scope key: (the body's JSON, its size in bytes)


class BoundedJSONBody:
    """Refuse an oversized, slow, malformed or too deeply nested JSON body with a 4xx and one log line.

    Runs before the SDK parses the body, whose recursive parsing would answer a 100k-deep document
    with a 500 and a traceback. The body is read once (bounded in size and in time), its arrays,
    objects and values are counted before anything is parsed (a byte count: what `json.loads` of the
    body could cost is bounded before it runs, since C parsing holds the GIL wherever it runs), a large
    body is parsed and depth-checked on a worker thread, and the body is handed on unchanged.
    """

    def __init__(self, app: Any, limits: ServeLimits | None = None, max_depth: int = MAX_DEPTH) -> None:
        self.app, self.max_depth = app, max_depth
        self.limits = limits or ServeLimits()
        self.max_bytes = self.limits.max_body_bytes
        self.parse_limiter = anyio.CapacityLimiter(self.limits.parse_threads)
        self.log_budget = LogBudget()

    async def _refuse(self, scope: Any, send: Any, status: int, message: str) -> None:
        client = scope.get("client") or ("?", 0)
        dropped = self.log_budget.take()
        if dropped is not None:
            more = f" ({dropped} more refused since the last line)" if dropped else ""
            _LOG.warning("refused a request from %s: %s%s", client[0], message, more)
        body = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700 if status == 400 else -32600, "message": message},
        }
        # the connection closes with the answer: a refused body is never read to its end
        await JSONResponse(body, status_code=status, headers={"connection": "close"})(scope, _no_receive, send)

    def _over(self, containers: int, values: int) -> str | None:
        """Why a body holding this many arrays and objects, and values, is refused (None: it may be parsed)."""
        limits = self.limits
        if containers > limits.max_body_containers:
            limit = limits.max_body_containers
            return f"the request body holds over {limit} arrays and objects (the limit)"
        if values > limits.max_body_values:
            return f"the request body holds over {limits.max_body_values} values (the limit)"
        return None

    def _parse(self, body: bytes) -> Any:
        return parse_json(body, "the request body", max_depth=self.max_depth, surrogates=True)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is over the {self.max_bytes}-byte limit"
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, 413, too_large)
            return
        chunks: list[bytes] = []
        size, containers, values, more = 0, 0, 0, True
        with anyio.move_on_after(self.limits.body_timeout_s) as reading:
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    await self._refuse(scope, send, 413, too_large)
                    return
                # counted as the body arrives: an absurd one is refused after its first chunks, unread
                containers += chunk.count(b"[") + chunk.count(b"{")
                values += chunk.count(b",")
                why = self._over(containers, values)
                if why is not None:
                    await self._refuse(scope, send, 413, why)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
        if reading.cancelled_caught:
            timeout = self.limits.body_timeout_s
            await self._refuse(scope, send, 408, f"the request body did not arrive within {timeout:g} s")
            return
        body = b"".join(chunks)
        del chunks
        try:
            if len(body) <= self.limits.inline_body_bytes:
                message = self._parse(body)
            else:
                message = await anyio.to_thread.run_sync(self._parse, body, limiter=self.parse_limiter)
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


class SessionBudget:
    """Room for a new MCP session before the SDK opens it: at most `max_sessions` open and resident memory
    under `memory_mb`; when full, the session idle the longest (at least `evict_idle_s`) is ended to make
    room, else the request gets a 503 whose JSON-RPC error says the server is full."""

    def __init__(self, app: Any, server: SessionServer[Any]) -> None:
        self.app, self.server = app, server
        self.path = server.settings.streamable_http_path

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope.get("path") == self.path
            and _header(scope.get("headers") or [], MCP_SESSION_ID_HEADER.encode()) is None
        ):
            full = await self.server.make_room()
            if full is not None:
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": full}}
                await JSONResponse(body, status_code=503, headers={"retry-after": "5"})(scope, _no_receive, send)
                return
        await self.app(scope, receive, send)


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
    (profiled: the environment's own dispatch is ~8 %), and validates a large request on the event
    loop (~20 ms for a 250 KB reset config). A tool call of an open session (its `initialize` answered)
    has nothing more to negotiate, so this layer answers it the way the SDK would (same checks, same
    JSON-RPC body and headers) from the same `SessionServer.answer`, keyed on the same transport; a
    session's first call starts its object from the connection's choice, as through the SDK.

    Anything else — other methods, batches, notifications, an SSE-mode server, a request the SDK would
    refuse (unknown or ended session, bad headers, a protocol version it does not speak, DNS-rebinding
    checks failing, an authenticated user, an oversized body) — goes on to the SDK unchanged, which
    answers it as before.
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
        request = Request(scope)
        if session is None or await self.security.validate_request(request, is_post=True) is not None:
            await self.app(scope, receive, send)
            return
        session_id, transport = session
        params = message["params"]
        arguments = params.get("arguments")
        server = self.server
        choice = server.choice_for(transport, request)
        self._hold(transport)  # this request holds the session, as the SDK's would
        try:  # the body comes encoded from where the call ran (a large answer: off the loop, as its call's work)
            result, content = await server.respond(
                transport, choice, params["name"], arguments or {}, size, message["id"]
            )
        except Exception as e:  # what the SDK's handler makes of a raising tool
            result = types.CallToolResult(content=[types.TextContent(type="text", text=str(e))], isError=True)
            content = None
        self._hold(transport)  # and its idle time starts again when the answer leaves
        if content is None:
            content = _response_body(message["id"], result)
        self.answered += 1
        headers = {"content-type": "application/json", MCP_SESSION_ID_HEADER: session_id}
        await Response(content, 200, headers)(scope, receive, send)

    def _eligible(self, scope: Any, message: Any, size: int) -> tuple[str, Any] | None:
        """(session id, SDK transport: the session's held key) when the SDK would serve this tools/call as
        an ordinary one of an open, initialized session of ours; None sends the request on to the SDK."""
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
        transport = self.server.transport_of(session_id)
        if (
            transport is None
            or transport.is_terminated
            or (transport.idle_scope is not None and transport.idle_scope.cancel_called)
        ):
            return None
        return session_id, transport


class Answer(types.CallToolResult):
    """A tool's result as `tool_result` makes it, holding its structured content as JSON too (the text content,
    encoded once): the response body reuses it instead of encoding the same data a second time."""

    _structured_json: str | None = PrivateAttr(default=None)


def _response_body(request_id: Any, result: types.CallToolResult) -> bytes:
    """The JSON-RPC response body of a tool call, as the SDK writes it (equal as JSON); an `Answer`'s structured
    content is spliced in from its text, not encoded again (a 150 KB answer: ~2 ms instead of ~20 under load)."""
    structured = result._structured_json if isinstance(result, Answer) else None
    if structured is not None and len(result.content) == 1 and isinstance(text := result.content[0], types.TextContent):
        head = {"jsonrpc": "2.0", "id": request_id}
        content = [text.model_dump(by_alias=True, mode="json", exclude_none=True)]
        dump = partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
        meta = "" if result.meta is None else f'"_meta":{dump(result.meta)},'
        return (
            f'{dump(head)[:-1]},"result":{{{meta}"content":{dump(content)},'
            f'"structuredContent":{structured},"isError":{dump(result.isError)}}}}}'
        ).encode()
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": result.model_dump(by_alias=True, mode="json", exclude_none=True),
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _timed_body(request_id: Any, result: types.CallToolResult) -> tuple[bytes, float]:
    """`_response_body` on a worker thread, and what it cost (CPU and blocked seconds)."""
    watch = Stopwatch()
    body = _response_body(request_id, result)
    return body, sum(watch.stop())


def tool_result(payload: Any, *, wrap: bool, error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False)
    structured = None if error else ({"result": payload} if wrap else payload)
    if structured is not None and not isinstance(structured, dict):
        structured = None
    result = Answer(content=[types.TextContent(type="text", text=text)], structuredContent=structured, isError=error)
    if structured is not None and not _NOT_JSON.search(text):  # the text is the structured content's JSON
        result._structured_json = f'{{"result":{text}}}' if wrap else text
    return result


# what json.dumps writes for floats JSON has not (the SDK's encoder writes null): such a text is not reused
_NOT_JSON = re.compile(r"NaN|Infinity")


class SessionServer(FastMCP, Generic[H]):
    """FastMCP with one `H` per MCP session (see the module). Subclasses set `choice_param` and
    `choice_header`, and implement `list_tools`, `create` and `dispatch`; `limiter_keys` names the
    thread limiters a call runs under (one per app in the hub) and `offloaded_tools` the tools that
    always leave the event loop."""

    choice_param: str
    choice_header: str
    offloaded_tools: frozenset[str] = frozenset()

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
        limits: ServeLimits | None = None,
    ) -> None:
        self.limits = limits = limits or ServeLimits()
        super().__init__(
            name=name,
            instructions=instructions,
            host=host,
            port=port,
            log_level=log_level,  # type: ignore[arg-type]
            # tools answer at once and send no progress: plain JSON responses skip SSE framing
            json_response=json_response,
            max_request_body_size=limits.max_body_bytes,
            session_idle_timeout=limits.session_idle_s,
            max_sessions=limits.max_sessions,
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
        self._rings: weakref.WeakKeyDictionary[Any, CallRing] = weakref.WeakKeyDictionary()
        self._off_loop = OffLoop(limits.inline_cpu_s, limits.inline_call_s)
        self._limiters: dict[str, FairLimiter] = {}
        self.fast: FastToolCalls | None = None
        self.evicted = 0  # idle sessions ended to make room for new ones

    def streamable_http_app(self) -> Starlette:
        app = super().streamable_http_app()
        if not self.server_stream:
            app.add_middleware(NoServerStream)
        if self.fast_calls:
            app.add_middleware(FastToolCalls, server=self)
        app.add_middleware(BoundedJSONBody, limits=self.limits)
        app.add_middleware(SessionBudget, server=self)
        app.add_middleware(GuardLoop)
        return app

    def http_config(self, host: str | None = None, port: int | None = None) -> uvicorn.Config:
        """uvicorn's configuration for this server under its limits (what `run` uses; tests and benchmarks too)."""
        return uvicorn_config(
            self.streamable_http_app(),
            host=host or self.settings.host,
            port=port or self.settings.port,
            limits=self.limits,
            log_level=self.settings.log_level.lower(),
        )

    async def run_streamable_http_async(self) -> None:
        await serve_http(
            self.streamable_http_app(),
            host=self.settings.host,
            port=self.settings.port,
            limits=self.limits,
            log_level=self.settings.log_level.lower(),
        )

    # ---- the session budget --------------------------------------------------------------------
    def _open_sessions(self) -> dict[str, Any] | None:
        manager = getattr(self, "_session_manager", None)
        return getattr(manager, "_server_instances", None) if manager is not None else None  # mcp 1.30

    async def make_room(self) -> str | None:
        """None when a new session may open (after ending the longest-idle one if the server is full),
        else why not: the message of the 503."""
        open_ = self._open_sessions()
        if open_ is None:
            return None
        limits = self.limits
        resident = resident_mb()
        over_memory = resident is not None and limits.memory_mb is not None and resident > limits.memory_mb
        if len(open_) < limits.max_sessions and not over_memory:
            return None
        victim = self._longest_idle(open_)
        if victim is not None:
            session_id, transport = victim
            transport.idle_scope.cancel()  # the SDK ends it as it ends a session whose idle timeout ran out
            with anyio.move_on_after(2):
                while session_id in open_:
                    await anyio.sleep(0.005)
            self.evicted += 1
            return None
        if over_memory:
            why = f"its resident memory ({resident:.0f} MB) is over its budget of {limits.memory_mb} MB"
        else:
            why = f"{len(open_)} sessions are open (the limit is {limits.max_sessions})"
        idle = f"none has been idle for {limits.evict_idle_s:g} s"
        return f"the server is full: {why} and {idle}; try again later or end a session you no longer use"

    def _longest_idle(self, open_: dict[str, Any]) -> tuple[str, Any] | None:
        timeout = self.session_manager.session_idle_timeout
        if timeout is None:
            return None
        latest = anyio.current_time() - self.limits.evict_idle_s  # idle since before this: may be ended
        best: tuple[str, Any] | None = None
        best_since = math.inf
        for session_id, transport in list(open_.items()):
            scope = getattr(transport, "idle_scope", None)
            if scope is None or scope.cancel_called or not math.isfinite(scope.deadline):
                continue  # a request in flight, or already ending
            since = scope.deadline - timeout
            if since <= latest and since < best_since:
                best, best_since = (session_id, transport), since
        return best

    def transport_of(self, session_id: str | None) -> Any:
        """The SDK's transport of the open streamable-HTTP session `session_id` (None if there is none): the key
        its held object, lock and history are kept under, whichever path (the SDK or the fast one) a call takes."""
        open_ = self._open_sessions()
        return open_.get(session_id) if open_ is not None and session_id else None

    @property
    def open_held(self) -> int:
        """How many MCP sessions hold an object now."""
        return len(self._held)

    def connection_choice(self) -> Any:
        """What this request's connection chose (`?<choice_param>=` or the `choice_header`), else the default."""
        return self.choice_of(self.get_context().request_context.request)

    def choice_for(self, key: Any, request: Any) -> Any:
        """The choice a call of session `key` over `request` starts the session's object from: the connection's
        for its first call (the one that creates it), the default after (it is not used again)."""
        return self.default_choice if key in self._held else self.choice_of(request)

    def choice_of(self, request: Any) -> Any:
        """What an HTTP request chose (`?<choice_param>=` or the `choice_header`), else the default."""
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
        """This request's session key: its streamable-HTTP transport, else (stdio) the SDK's session object.
        Both live as long as the session and are referenced weakly here."""
        context = self.get_context().request_context
        request = context.request
        if request is not None and hasattr(request, "headers"):
            transport = self.transport_of(request.headers.get(MCP_SESSION_ID_HEADER))
            if transport is not None:
                return transport
        return context.session

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:  # type: ignore[override]
        key = self.request_key()
        request = self.get_context().request_context.request
        choice = self.choice_for(key, request)
        size = 0
        if request is not None and hasattr(request, "headers"):
            declared = request.headers.get("content-length") or ""
            size = int(declared) if declared.isdigit() else 0
        return await self.answer(key, choice, name, arguments if isinstance(arguments, dict) else {}, size)

    async def answer(
        self, key: Any, choice: Any, name: str, args: dict[str, Any], size: int = 0
    ) -> types.CallToolResult:
        """One tool call of session `key` (`size`: its request's bytes); see `respond`."""
        result, _ = await self.respond(key, choice, name, args, size)
        return result

    async def respond(
        self, key: Any, choice: Any, name: str, args: dict[str, Any], size: int = 0, request_id: Any = None
    ) -> tuple[types.CallToolResult, bytes | None]:
        """One tool call of session `key` (`size`: its request's bytes), and with a `request_id` its JSON-RPC
        response body, encoded where the call ran (a large answer's encoding is part of its call's work).

        In-process calls of a session run on the event loop while they are cheap (`OffLoop`: its recent
        calls used at most `inline_cpu_s` of CPU and were not blocked over `inline_call_s`); anything else (a
        blocking environment, a large request, a control tool, a session whose calls were expensive) runs on a
        worker thread under the call's fair limiters (`FairLimiter`: a session's call waits behind no more
        than the calls holding a thread when every other waiting session used more), one call at a time per
        session, in order."""
        lock = self._locks.get(key)
        first = key not in self._held
        in_process = name not in self.offloaded_tools and self.in_process(key, name, args)
        if (
            in_process
            and (lock is None or not lock.locked())
            and size <= self.limits.inline_body_bytes
            and key not in self._off_loop
        ):
            watch = Stopwatch()
            try:
                result = self.dispatch(key, choice, name, args, size)
            finally:
                self.ran(key, name, args, *watch.stop(), inline=True)
            if request_id is None or answer_bytes(result) <= self.limits.inline_body_bytes:
                return result, None if request_id is None else _response_body(request_id, result)
            async with self._slots(key, choice, name, args, size, first) as (threads, turns):  # a large answer
                encoded, spent = await anyio.to_thread.run_sync(_timed_body, request_id, result, limiter=threads)
                for turn in turns:
                    turn.cost = spent
            return result, encoded
        if lock is None:
            lock = self._locks.setdefault(key, anyio.Lock())
        async with lock, self._slots(key, choice, name, args, size, first) as (threads, turns):
            result, cpu, blocked, cost, body = await anyio.to_thread.run_sync(
                self._run, key, choice, name, args, size, request_id, limiter=threads
            )
            for turn in turns:
                turn.cost = cost
        if in_process:
            self.ran(key, name, args, cpu, blocked, inline=False)
        elif name not in self.offloaded_tools and self.in_process(key, name, args):
            # the call that made it in-process (a hub episode's first call of an app: its fork) says what the
            # session's calls cost, not what the tool's do
            self._off_loop.ran(key, cpu, blocked, inline=False)
        return result, body

    def in_process(self, key: Any, name: str, args: dict[str, Any]) -> bool:
        """Whether this call of session `key` runs in-process code only (no sandboxed worker, nothing to load):
        then it may run on the event loop while the session's calls are cheap."""
        return not self.blocking

    def ran(self, key: Any, name: str, args: dict[str, Any], cpu: float, blocked: float, *, inline: bool) -> None:
        """An in-process call of session `key` used `cpu` seconds of CPU and was blocked `blocked` seconds, on the
        event loop (`inline`) or on a thread: `OffLoop` learns whether the session's next calls may run inline."""
        self._off_loop.ran(key, cpu, blocked, inline=inline)

    @contextlib.asynccontextmanager
    async def _slots(
        self, key: Any, choice: Any, name: str, args: dict[str, Any], size: int, first: bool
    ) -> AsyncIterator[tuple[anyio.CapacityLimiter, list[Turn]]]:
        """Hold a slot of each of the call's limiters (in sorted order: two calls never wait on each other's);
        yields the thread limiter to run it under, and the turns to charge its cost to."""
        limiters = [self._limiter(k) for k in sorted(set(self.limiter_keys(key, choice, name, args)))]
        for limiter in limiters:
            if limiter.total_tokens != (wide := self.limiter_capacity(limiter.name)):
                limiter.total_tokens = wide  # what the app turned out to be (in-process or blocking)
        async with contextlib.AsyncExitStack() as held:
            turns = [await held.enter_async_context(limiter.slot(key, size, first=first)) for limiter in limiters]
            yield limiters[-1].threads, turns

    def _run(
        self, key: Any, choice: Any, name: str, args: dict[str, Any], size: int, request_id: Any
    ) -> tuple[types.CallToolResult, float, float, float, bytes | None]:
        """A call on a worker thread: its result, the CPU it used and the time it was blocked, what the call
        and its encoding cost together (CPU and blocked: not the time it waited for the GIL), and its body."""
        watch = Stopwatch()
        result = self.dispatch(key, choice, name, args, size)
        cpu, blocked = watch.stop()
        body = None if request_id is None else _response_body(request_id, result)
        return result, cpu, blocked, sum(watch.stop()), body

    def mark_slow(self, key: Any) -> None:
        """Run session `key`'s next calls off the event loop (they may be expensive: e.g. it loaded a large state)."""
        self._off_loop.expect(key)

    def _limiter(self, name: str) -> FairLimiter:
        limiter = self._limiters.get(name)
        if limiter is None:
            limiter = self._limiters[name] = FairLimiter(name, self.limiter_capacity(name))
        return limiter

    def limiter_keys(self, key: Any, choice: Any, name: str, args: dict[str, Any]) -> list[str]:
        """The thread limiters a call runs under: one for the whole server here."""
        return ["calls"]

    def limiter_capacity(self, name: str) -> int:
        """How many threads limiter `name` lends: `app_threads` for calls that wait (a sandboxed worker),
        `cpu_threads` for in-process ones (CPU-bound: more threads only take the GIL from the event loop)."""
        return self.limits.app_threads if self.blocking else self.limits.cpu_threads

    def remember(self, key: Any, item: Any, weight: int) -> list[Any]:
        """Add a call's record to session `key`'s ring; what falls out is for the caller to drop."""
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = CallRing(self.limits.history_calls, self.limits.history_bytes)
        return ring.add(item, weight)

    def forget(self, key: Any) -> None:
        """Session `key` started over: its ring is empty again."""
        ring = self._rings.get(key)
        if ring is not None:
            ring.clear()

    def config_too_large(self, value: Any, size: int, what: str) -> str | None:
        """Why `value` (a reset config, a task) is refused for its size, or None. `size` is its request's
        bytes when known: a request no larger than the limit holds no larger a value."""
        limit = self.limits.max_config_bytes
        if 0 < size <= limit or value is None:
            return None
        try:
            n = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace"))
        except (TypeError, ValueError, RecursionError):
            return None  # left to the parsers that refuse it anyway
        if n <= limit:
            return None
        return f"the {what} is {n} bytes as JSON, over this server's limit of {limit} bytes"

    @abstractmethod
    def create(self, choice: Any) -> H:
        """A new session's object, started from the connection's choice (or the default)."""

    @abstractmethod
    def dispatch(
        self, key: Any, choice: Any, name: str, arguments: dict[str, Any], size: int = 0
    ) -> types.CallToolResult:
        """Answer one tool call of MCP session `key` (on a worker thread when `blocking`); `size` is the request's
        bytes (0 if unknown)."""


def answer_bytes(result: types.CallToolResult) -> int:
    """The bytes of a result's text content: what an answer weighs in a session's history."""
    return sum(len(c.text) for c in result.content if isinstance(c, types.TextContent))


class GuardLoop:
    """At the app's start, make the event loop's exception handler and the log handlers unable to fail
    (see `envfactory.serve.http`), whichever uvicorn runs the app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            guard_event_loop()
            harden_logging()
        await self.app(scope, receive, send)
