"""The ASGI layers every EnvFactory MCP server puts in front of the SDK (`SessionServer.streamable_http_app`).

- `BoundedJSONBody`: refuses an oversized, slow, malformed or too deeply nested HTTP body with a 4xx
  before the SDK parses it, and hands the parsed body on (`PARSED_BODY`).
- `SessionBudget`: room for a new MCP session (at most `max_sessions`, resident memory under budget),
  else a 503.
- `FastToolCalls`: answers `tools/call` of an open session directly, as the SDK would.
- `NoServerStream`: 405 for the optional standalone GET stream.
- `EndedSessions`: a request whose session ends while the SDK serves it gets a 404, not the SDK's 500.
- `GuardLoop`: at the app's start, the event loop's exception handler and the log handlers made unable
  to fail (`envfactory.serve.http`).
- `DISCONNECT_FILTER`: drops the SDK's and uvicorn's tracebacks of a client closing a session mid-flight.

The limits are `envfactory.serve.limits.ServeLimits`; the connection side (uvicorn) is
`envfactory.serve.http`; the tool results and their JSON-RPC bodies are `envfactory.serve.answers`.
"""

from __future__ import annotations

import functools
import logging
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import anyio.to_thread
from mcp import types
from mcp.server.streamable_http import MCP_PROTOCOL_VERSION_HEADER, MCP_SESSION_ID_HEADER
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _HTTPTOOLS_CYCLE

from envfactory.errors import first_error
from envfactory.inputs import MAX_DEPTH, InputError, has_lone_surrogate, parse_json
from envfactory.serve.answers import response_body
from envfactory.serve.http import CYCLE, guard_event_loop, harden_logging, loop_time
from envfactory.serve.limits import SDK_MAX_BODY_BYTES, LogBudget, ServeLimits

if TYPE_CHECKING:
    from envfactory.serve.base import SessionServer


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

    def __init__(self, app: Any, path: str) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # on the MCP endpoint only: a GET of any other path is starlette's 404 (or the app's own route)
        if scope["type"] == "http" and scope["method"] == "GET" and scope.get("path") == self.path:
            response = PlainTextResponse(
                "this server sends no server-initiated messages", status_code=405, headers={"Allow": "POST, DELETE"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_LOG = logging.getLogger("envfactory.serve")
MAX_BODY_BYTES = SDK_MAX_BODY_BYTES  # the default; `ServeLimits.max_body_bytes` is never larger
PARSED_BODY = "envfactory.parsed_body"  # ASGI scope key: (the body's JSON, its size in bytes)
_SESSION_HEADER = MCP_SESSION_ID_HEADER.encode()
HOLD_SLACK_S = 1.0  # how far a session's idle deadline may lag a full timeout before it is pushed (`_hold`)


def _body_arrived(scope: Any, receive: Any) -> bool:
    """Whether the request's whole body has arrived, so that reading it cannot wait: `receive` is the request's
    own uvicorn (httptools) cycle's, unwrapped, and the cycle holds the end of the body (its message is ready
    and no more follows). Anything else (another server, a wrapped `receive`, a body still arriving): False."""
    ref = scope.get(CYCLE)
    cycle = ref() if ref is not None else None
    return (
        isinstance(cycle, _HTTPTOOLS_CYCLE)
        and receive == cycle.receive
        and not cycle.more_body
        and cycle.message_event.is_set()
    )


class EnvelopeProblem(NamedTuple):
    """Why a body is no request MCP answers, and the JSON-RPC error code its refusal carries."""

    message: str
    code: int  # -32600: not a valid request; -32602: a request whose params are not valid
    # 400: refused, the connection closed; 200: a well-formed request answered with its JSON-RPC error (what a
    # client's session reads as an error, not a failed transport: the SDK's client dies on a 400); 202: a
    # notification accepted and dropped (JSON-RPC ignores one it cannot use)
    status: int = 400


def envelope_problem(message: Any) -> EnvelopeProblem | None:
    """Why a parsed body is not a JSON-RPC message MCP could answer, or None. Checked before the SDK reads it:
    the SDK answers an id it cannot write back (a lone surrogate) with a 500 after ~135 ms of logging, an id
    that is a float, a boolean or null with a 202 and no answer, and other shapes (arguments that are a list)
    with a 9 KB warning each — on the event loop every session shares. Strings the server writes back (the id,
    the method, a tool's name) must be UTF-8; a tool's arguments may hold anything JSON does (the tool refuses
    what it cannot read, as `invalid_arguments`)."""
    if not isinstance(message, dict):
        return None  # a batch or a scalar: the SDK's own answer (a 400)
    if "id" in message and not _writable_id(message["id"]):
        return EnvelopeProblem("a JSON-RPC id must be a string (UTF-8: no lone surrogate) or an integer", -32600)
    method = message.get("method")
    if "method" in message and not (isinstance(method, str) and _utf8(method)):
        return EnvelopeProblem("a JSON-RPC method must be a string (UTF-8: no lone surrogate)", -32600)
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        return EnvelopeProblem("an MCP request's params must be an object", -32602)
    if method == "tools/call":
        name = (params or {}).get("name")
        if not (isinstance(name, str) and _utf8(name)):
            return EnvelopeProblem("tools/call needs the tool's name as a string (UTF-8: no lone surrogate)", -32602)
        arguments = (params or {}).get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return EnvelopeProblem("a tool's arguments must be an object", -32602)
    elif isinstance(method, str):
        return _method_problem(message, method)
    return None


@functools.cache
def _client_messages() -> tuple[dict[str, Any], dict[str, Any]]:
    """The SDK's own models of what a client may send: (requests, notifications) by method."""
    found: list[dict[str, Any]] = []
    for union in (types.ClientRequest, types.ClientNotification):
        models = typing.get_args(union.model_fields["root"].annotation)
        found.append({typing.get_args(m.model_fields["method"].annotation)[0]: m for m in models})
    return found[0], found[1]


def _method_problem(message: dict[str, Any], method: str) -> EnvelopeProblem | None:
    """A request or notification (not a tool call) the SDK would refuse, checked by the SDK's own model of its
    method, the way the SDK reads it. The SDK refuses an unknown method, or a known one with params it lacks
    (`resources/read` without a `uri`, an `initialize` without its fields), with a warning that prints the
    validation error of every message type it knows (~18 KB and ~20 ms on the event loop each, not counted by any
    log budget: a flood of them slowed every session 3-4x and filled the log by megabytes)."""
    requests, notifications = _client_messages()
    is_request = "id" in message
    status = 200 if is_request else 202
    model = (requests if is_request else notifications).get(method)
    if model is None:
        kind = "method" if is_request else "notification"
        return EnvelopeProblem(f"MCP has no client {kind} {method[:80]!r}", -32601, status)
    envelope = types.JSONRPCRequest if is_request else types.JSONRPCNotification
    try:
        read = envelope.model_validate(message).model_dump(by_alias=True, mode="json", exclude_none=True)
    except ValidationError:
        return None  # not a message the SDK parses: its own answer, as before
    try:
        model.model_validate(read)
    except ValidationError as e:
        where, what = first_error(e)
        return EnvelopeProblem(f"{method}: {where}: {what}"[:300], -32602, status)
    return None


def _utf8(text: str) -> bool:
    return text.isascii() or not has_lone_surrogate(text)


def _writable_id(rid: Any) -> bool:
    """Whether `rid` is an id a JSON-RPC answer can carry: an integer, or a string UTF-8 can write."""
    return (isinstance(rid, int) and not isinstance(rid, bool)) or (isinstance(rid, str) and _utf8(rid))


class BoundedJSONBody:
    """Refuse an oversized, slow, malformed or too deeply nested JSON body with a 4xx and one log line.

    Runs before the SDK parses the body, whose recursive parsing would answer a 100k-deep document
    with a 500 and a traceback. The body is read once (bounded in size and in time), its arrays,
    objects and values are counted before anything is parsed (a byte count: what `json.loads` of the
    body could cost is bounded before it runs, since C parsing holds the GIL wherever it runs), a large
    body is parsed and depth-checked on a worker thread, and the body is handed on unchanged. A body that
    is whole when its request reaches this layer (a small request arrives with its headers) is read without
    the deadline's cancel scope, which cannot fire then and costs ~9 µs of a ~250 µs fast-path call.
    """

    waited = 0  # bodies read under the body's deadline, not yet whole when their request began (all instances)

    def __init__(self, app: Any, limits: ServeLimits | None = None, max_depth: int = MAX_DEPTH) -> None:
        self.app, self.max_depth = app, max_depth
        self.limits = limits or ServeLimits.from_env()
        self.max_bytes = self.limits.max_body_bytes
        self.too_large = f"the request body is over the {self.max_bytes}-byte limit"
        self.parse_limiter = anyio.CapacityLimiter(self.limits.parse_threads)
        self.log_budget = LogBudget()

    async def _refuse(
        self, scope: Any, send: Any, status: int, message: str, *, code: int | None = None, rid: Any = None
    ) -> None:
        self._log_refusal(scope, message)
        if code is None:
            code = -32700 if status == 400 else -32600
        body = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
        # the connection closes with the answer: a refused body is never read to its end
        await JSONResponse(body, status_code=status, headers={"connection": "close"})(scope, _no_receive, send)

    def _log_refusal(self, scope: Any, message: str) -> None:
        client = scope.get("client") or ("?", 0)
        dropped = self.log_budget.take()
        if dropped is not None:
            more = f" ({dropped} more refused since the last line)" if dropped else ""
            _LOG.warning("refused a request from %s: %s%s", client[0], message, more)

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
        return parse_json(body, "the request body", max_depth=self.max_depth, surrogates=True, constants=False)

    async def _read(self, scope: Any, receive: Any, send: Any, chunks: list[bytes]) -> bool:
        """The body's chunks into `chunks`, counted as they arrive: True if it was refused (answered) or the client
        went away, so an absurd one is refused after its first chunks, unread."""
        size, containers, values, more = 0, 0, 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return True  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, 413, self.too_large)
                return True
            containers += chunk.count(b"[") + chunk.count(b"{")
            values += chunk.count(b",")
            why = self._over(containers, values)
            if why is not None:
                await self._refuse(scope, send, 413, why)
                return True
            chunks.append(chunk)
            more = message.get("more_body", False)
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, 413, self.too_large)
            return
        chunks: list[bytes] = []
        if _body_arrived(scope, receive):  # read at once: no deadline to keep (an anyio scope is ~9 µs a request)
            refused = await self._read(scope, receive, send, chunks)
        else:
            type(self).waited += 1
            with anyio.move_on_after(self.limits.body_timeout_s) as reading:
                refused = await self._read(scope, receive, send, chunks)
            if reading.cancelled_caught:
                timeout = self.limits.body_timeout_s
                await self._refuse(scope, send, 408, f"the request body did not arrive within {timeout:g} s")
                return
        if refused:
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
        problem = envelope_problem(message)
        if problem is not None and problem.status != 400:  # a well-formed message MCP has no use for
            self._log_refusal(scope, problem.message)
            if problem.status == 202:
                await PlainTextResponse("", status_code=202)(scope, _no_receive, send)
            else:
                error = {"code": problem.code, "message": problem.message}
                await JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error})(scope, _no_receive, send)
            return
        if problem is not None:  # JSON, but no JSON-RPC request MCP answers: its id kept where it can be written
            rid = message.get("id") if isinstance(message, dict) else None
            rid = rid if _writable_id(rid) else None
            await self._refuse(scope, send, 400, f"the request body: {problem.message}", code=problem.code, rid=rid)
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
    room, else the request gets a 503 whose JSON-RPC error says the server is full. A new session whose
    connection chose a start the server does not have (an unknown scenario or task) gets a 400 saying so:
    opened, its every call would have answered that error, to a trainer that took them for the tools'."""

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
            # the objects of sessions that ended since (each may hold a sandboxed worker)
            await self.server.drop_ended()
            problem = self.server.choice_problem(self.server.choice_of(Request(scope)))
            if problem is not None:
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": problem}}
                await JSONResponse(body, status_code=400)(scope, _no_receive, send)
                return
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


class _Gathered:
    """Stands in for a connection's transport while one answer is sent: keeps what uvicorn writes (the status
    line and headers, then the body) and whether it closed the connection after."""

    __slots__ = ("closed", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closed = True


async def send_as_one_write(send: Any, headers: list[tuple[bytes, bytes]], content: bytes, scope: Any) -> bool:
    """A 200 answer, its head and body in one write to the socket; True if it went so. uvicorn (httptools)
    writes the head when it is sent and the body when it is, and each write of an idle connection is a `send`
    system call of its own: a second call's worth of the kernel's loopback work in every fast-path answer. The
    two ASGI messages still go through `send` (every middleware's wrapper sees them); only the request's cycle
    (`CYCLE` in the scope, set by `GuardedHTTP`) writes into a gatherer meanwhile. Under another server the
    two messages go as they are."""
    ref = scope.get(CYCLE)
    cycle = ref() if ref is not None else None
    if not isinstance(cycle, _HTTPTOOLS_CYCLE) or cycle.response_started:
        cycle = None
    else:
        real, gathered = cycle.transport, _Gathered()
        cycle.transport = gathered  # type: ignore[assignment]
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})
    finally:
        if cycle is not None:
            cycle.transport = real
            if gathered.parts:
                real.write(b"".join(gathered.parts))
            if gathered.closed:
                real.close()
    return cycle is not None


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
        self.one_write = 0  # of them, answers written to the socket at once (under GuardedHTTP)
        server.fast = self

    def _hold(self, transport: Any) -> None:
        """Push the session's idle deadline (the SDK's `session_idle_timeout`) to a full timeout from now, to
        within `HOLD_SLACK_S` (or 1 % of the timeout): every move of the deadline reschedules the scope's timer
        (a `call_at` and a cancel on the loop), which a session calling thousands of times a second need not
        pay for each call; a session's end and its eviction's idle time move by at most that slack."""
        idle, timeout = transport.idle_scope, self.server.session_manager.session_idle_timeout
        if idle is not None and timeout is not None:
            deadline = loop_time() + timeout
            if deadline - idle.deadline > min(HOLD_SLACK_S, timeout / 100):
                idle.deadline = deadline

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
            content = response_body(message["id"], result)
        self.answered += 1
        # what starlette's Response(content, 200, headers) sends, without building one a call
        headers = [
            (b"content-length", str(len(content)).encode()),
            (b"content-type", b"application/json"),
            (_SESSION_HEADER, session_id.encode("latin-1")),
        ]
        self.one_write += await send_as_one_write(send, headers, content, scope)

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
        if isinstance(request_id := message["id"], str) and not request_id.isascii():
            try:  # a lone surrogate (the body parser keeps them) cannot be written back as UTF-8: the SDK answers
                request_id.encode()
            except UnicodeEncodeError:
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


class EndedSessions:
    """A request whose session ends while the SDK serves it (a DELETE racing it, an eviction, the idle timeout)
    gets the 404 every later request of that session gets, not a 500.

    The SDK's POST handler meets its session's closed streams (`anyio.ClosedResourceError`): it answers 500, or
    raises after answering, and uvicorn then drops the connection without a response. Here a 500 of a session
    request is held until the SDK is done; if the session has ended by then, the 404 goes out instead, and an
    exception the SDK raises for an ended session is not passed on. Any other answer passes through untouched.
    """

    def __init__(self, app: Any, server: SessionServer[Any]) -> None:
        self.app, self.server = app, server

    def _ended(self, session_id: str) -> bool:
        transport = self.server.transport_of(session_id)
        return transport is None or bool(transport.is_terminated)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        session_id = (
            _header(scope.get("headers") or [], _SESSION_HEADER)
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if session_id is None:
            await self.app(scope, receive, send)
            return
        held: list[dict[str, Any]] = []  # a 500's messages, not sent yet
        started = False  # an answer other than a 500 went out

        async def hold_500(message: dict[str, Any]) -> None:
            nonlocal started
            if held or (message["type"] == "http.response.start" and message.get("status") == 500 and not started):
                held.append(message)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, hold_500)
        except Exception:
            if started or not self._ended(session_id):  # an answer under way, or no ended session: as the SDK left it
                for message in held:
                    await send(message)
                raise
            _LOG.debug("a request of session %s met its end in the SDK", session_id[:64])
        else:
            if not held:
                return
            if not self._ended(session_id):
                for message in held:
                    await send(message)
                return
        # here nothing has gone out (an answer under way is passed on above): the ended session's 404
        error = types.JSONRPCError(
            jsonrpc="2.0",
            id="server-error",
            error=types.ErrorData(code=types.INVALID_REQUEST, message="Session not found"),
        )
        await JSONResponse(error.model_dump(by_alias=True, exclude_none=True), status_code=404)(
            scope, _no_receive, send
        )


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
