"""A lean MCP client for trainers: one keep-alive HTTP/1.1 connection per session, JSON-RPC written by hand.

A GRPO step sends thousands of tool calls to environments served by `envfactory serve NAME --transport http`
(or `envfactory hub serve`). The SDK's `ClientSession` costs about two thirds of a call's time and an httpx
client per session about half (docs/performance.md), so a trainer's rollout workers use this instead:

```python
async with await TrainerSession.open("http://127.0.0.1:8765/mcp", scenario="default") as env:
    found = await env.call("search_hotels", {"city": "Lisbon"})
    booked = await env.call("book_room", {...})
    state = await env.state()  # the session's state, for the verifier
```

Each `TrainerSession` is one MCP session on its own connection (asyncio streams, no HTTP library): `initialize`
and the `initialized` notification when it opens, then `tools/call` requests carrying its `mcp-session-id`,
which the server answers on its fast path (`serve.asgi.FastToolCalls`), and a DELETE when it closes. Requests
of one session go one at a time, in order; open as many sessions as there are rollouts. The server closes a
connection idle for `ServeLimits.keep_alive_s` (5 s): a session whose connection was closed, or idle for
`ClientOptions.idle_reconnect_s`, opens a new one before its next request (the MCP session lives on: it is
keyed on its header, not on the connection).

Answers are checked at the boundary (pydantic): a tool's result is a `ToolResult` (a tool's own failure is a
result with `is_error`, as MCP has it; `raise_for_error()` turns it into `ToolCallError`); the server refusing
a request is `ServerHTTPError` (its status and the JSON-RPC message it sent), a JSON-RPC error answer is
`JSONRPCError`, a connection that fails or an answer that is not HTTP/JSON-RPC is `ConnectionLostError` or
`ProtocolError`. All are `TrainerClientError`.

A trainer on the same machine as its server can skip TCP: `envfactory serve NAME --transport http --uds PATH`
serves on a Unix socket only its user may connect to, and `ClientOptions(uds=PATH)` makes the session connect
there (the URL still gives the request path and `host` header, e.g. `http://localhost/mcp`); a call costs the
server less than over loopback TCP (docs/performance.md).

What the server sends is not validated against the tool's `outputSchema` on either side (docs/serving.md,
"Serving at trainer scale"): a tool's structured result is made by its return type's pydantic serializer,
whose JSON Schema is the `outputSchema` the server lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.errors import ServiceError

__all__ = [
    "ClientOptions",
    "ConnectionLostError",
    "JSONRPCError",
    "ProtocolError",
    "ServerHTTPError",
    "ToolCallError",
    "ToolInfo",
    "ToolResult",
    "TrainerClientError",
    "TrainerSession",
]

PROTOCOL_VERSION = "2025-06-18"
STATE_TOOL = "envfactory_state"  # serve.base.STATE_TOOL, not imported: the client needs no server code
RESET_TOOL = "envfactory_reset"
SCENARIO_HEADER = "x-envfactory-scenario"
TASK_HEADER = "x-envfactory-task"
_MAX_HEAD = 64 * 1024  # an answer's status line and headers
_DIGITS = re.compile(rb"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,15}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header's name (RFC 9110 token)
_OWN_HEADERS = frozenset(  # what the client writes itself on every request
    {"host", "content-length", "transfer-encoding", "connection", "content-type", "accept"}
    | {"mcp-session-id", "mcp-protocol-version"}
)
_NO_BODY = (204, 304)  # answers that never carry a body (and 1xx, which come before the answer)


class TrainerClientError(ServiceError):
    """A request of a `TrainerSession` failed (the subclasses say how)."""


class ServerHTTPError(TrainerClientError):
    """The server answered with an HTTP error status (e.g. 404: the session ended or is unknown to it)."""

    def __init__(self, status: int, message: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} from the server: {message}")
        self.status, self.message, self.body = status, message, body


class JSONRPCError(TrainerClientError):
    """The server answered the request with a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"JSON-RPC error {code}: {message}")
        self.code, self.message, self.data = code, message, data


class ConnectionLostError(TrainerClientError):
    """The connection failed or closed before the whole answer came (the request may or may not have run)."""


class ProtocolError(TrainerClientError):
    """The answer is not the HTTP/1.1 + JSON-RPC this client speaks (a wrong URL, a proxy's page...)."""


class ToolCallError(TrainerClientError):
    """A tool's own failure (`ToolResult.raise_for_error`): the environment's structured error as its message."""

    def __init__(self, tool: str, result: ToolResult) -> None:
        super().__init__(f"tool '{tool}' failed: {result.text}")
        self.tool, self.result = tool, result


class ClientOptions(BaseModel):
    """How a `TrainerSession` talks to its server."""

    model_config = ConfigDict(frozen=True)

    timeout_s: float = Field(default=300.0, gt=0, description="one request's limit, sending to last byte")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    idle_reconnect_s: float = Field(
        default=4.0,
        ge=0,
        description="open a new connection before a request when the last one idled this long "
        "(under the server's keep-alive, 5 s by default, so a request never races the server's close)",
    )
    close_timeout_s: float = Field(
        default=5.0, gt=0, description="the limit of `close`'s DELETE (a hung server does not hold a close for long)"
    )
    protocol_version: str = PROTOCOL_VERSION
    client_name: str = "envfactory-trainer"
    uds: str | None = Field(
        default=None,
        description="connect through this Unix socket (a server's --uds) instead of the URL's host and port",
    )


class Content(BaseModel):
    """One content block of a tool result (text for every EnvFactory tool)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ToolResult(BaseModel):
    """A `tools/call` result: the content blocks, the structured content and whether the tool failed."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    content: list[Content] = Field(default_factory=list)
    structured: dict[str, Any] | None = Field(default=None, alias="structuredContent")
    is_error: bool = Field(default=False, alias="isError")

    @property
    def text(self) -> str:
        """The text blocks joined (an EnvFactory tool's JSON answer, or its error)."""
        return "".join(c.text or "" for c in self.content)

    @property
    def data(self) -> Any:
        """The tool's answer as data: the structured content (unwrapped from `{"result": ...}` where the server
        wrapped a non-object), else the text parsed as JSON, else the text."""
        if self.structured is not None:
            if set(self.structured) == {"result"}:
                return self.structured["result"]
            return self.structured
        try:
            return json.loads(self.text)
        except ValueError:
            return self.text

    def raise_for_error(self, tool: str = "?") -> ToolResult:
        if self.is_error:
            raise ToolCallError(tool, self)
        return self


class ToolInfo(BaseModel):
    """One tool as `tools/list` describes it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")


class _ErrorBody(BaseModel):
    code: int
    message: str
    data: Any = None


class _Response(BaseModel):
    """A JSON-RPC response as the server sends it."""

    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    result: dict[str, Any] | None = None
    error: _ErrorBody | None = None


class _CallResponse(_Response):
    result: ToolResult | None = None  # type: ignore[assignment]


class _Connection:
    """One HTTP/1.1 keep-alive connection: requests written and answers read by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = time.monotonic()

    @property
    def closed(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    async def exchange(self, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(head + body)
        while True:  # interim answers (100 Continue, 103 Early Hints) come before the answer, with no body
            status, headers = await self._head()
            if not 100 <= status < 200 or status == 101:
                break
        if status in _NO_BODY or 100 <= status < 200:
            payload = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            payload = await self._chunked()
        elif (length := headers.get("content-length")) is not None:
            if not _DIGITS.fullmatch(length.encode("latin-1")):
                raise ProtocolError(f"bad content-length {length!r}")
            payload = await self.reader.readexactly(int(length))
        else:  # no length: the body runs to the connection's end
            payload = await self.reader.read()
            headers["connection"] = "close"
        self.used = time.monotonic()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, payload

    async def _head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        if len(raw) > _MAX_HEAD:
            raise ProtocolError(f"an answer's head of {len(raw)} bytes (over {_MAX_HEAD})")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not _DIGITS.fullmatch(parts[1].encode("latin-1")):
            raise ProtocolError(f"not an HTTP/1.1 answer: {status_line[:100]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}
        return int(parts[1]), headers

    async def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size_text = size_line.split(b";")[0].strip()
            if not _HEX.fullmatch(size_text):
                raise ProtocolError(f"bad chunk size {size_line[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return bytes(out)
            out += await self.reader.readexactly(size)
            if await self.reader.readexactly(2) != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


class TrainerSession:
    """One MCP session on its own keep-alive connection; `open` it, `call` tools, read its `state`, `close` it.

    Not safe to share between event loops; within one, concurrent requests of a session wait their turn."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, options: ClientOptions | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise TrainerClientError(
                f"{url!r}: give the server's plain-HTTP address, e.g. http://127.0.0.1:8765/mcp (this client speaks "
                "no TLS: put it beside the server, or behind a proxy on the same host)"
            )
        try:
            port = parts.port
        except ValueError as e:  # "Port out of range 0-65535", a port that is no number
            raise TrainerClientError(f"{url!r}: {e}") from None
        self.url = url
        self.options = options or ClientOptions()
        self.host, self.port = parts.hostname, port or 80
        # the request target as it goes on the wire: characters a URL may not hold raw are percent-encoded
        self._target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~") + (
            f"?{quote(parts.query, safe='/?%:@!$&()*+,;=-._~')}" if parts.query else ""
        )
        self._host_header = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in _checked_headers(headers or {}).items())
        self.session_id: str | None = None
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the session's connection and lock belong to
        self._next_id = 0
        self._post_head: tuple[bytes, bytes] | None = None

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        scenario: str | None = None,
        task: str | None = None,
        headers: dict[str, str] | None = None,
        options: ClientOptions | None = None,
    ) -> TrainerSession:
        """A new MCP session on the server at `url` (its `/mcp` address): `scenario` picks an environment
        server's initial state, `task` a hub's task (both as the servers' headers); `headers` are sent with
        every request."""
        extra = dict(headers or {})
        if scenario is not None:
            extra[SCENARIO_HEADER] = scenario
        if task is not None:
            extra[TASK_HEADER] = task
        session = cls(url, extra, options)
        try:
            await session._initialize()
        except BaseException:
            session._drop()
            raise
        return session

    async def __aenter__(self) -> TrainerSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ---- requests ------------------------------------------------------------------------------------

    def _head(self, method: str, length: int) -> bytes:
        if method == "POST":
            if self._post_head is None:  # the same for every request of the session but the length
                self._post_head = self._head_around("POST")
            before, after = self._post_head
            return before + str(length).encode() + after
        before, after = self._head_around(method)
        return before + str(length).encode() + after

    def _head_around(self, method: str) -> tuple[bytes, bytes]:
        """A request's head, cut where its content length goes."""
        before = f"{method} {self._target} HTTP/1.1\r\nhost: {self._host_header}\r\ncontent-length: "
        after = "\r\n"
        if method == "POST":
            after += "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        if self.session_id is not None:
            after += f"mcp-session-id: {self.session_id}\r\nmcp-protocol-version: {self.options.protocol_version}\r\n"
        return before.encode("latin-1"), (after + self._extra + "\r\n").encode("latin-1")

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and (conn.closed or time.monotonic() - conn.used > self.options.idle_reconnect_s):
            conn.close()
            conn = None
        if conn is None:
            try:
                async with asyncio.timeout(self.options.connect_timeout_s):
                    if self.options.uds is not None:
                        reader, writer = await asyncio.open_unix_connection(self.options.uds, limit=2**22)
                    else:
                        reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**22)
            except (OSError, TimeoutError) as e:
                through = "" if self.options.uds is None else f" through {self.options.uds}"
                raise ConnectionLostError(f"cannot connect to {self.url}{through}: {e or type(e).__name__}") from e
            conn = self._conn = _Connection(reader, writer)
        return conn

    def _own_loop(self) -> None:
        """The session's connection and lock belong to the loop that first used it: another loop cannot use them."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise TrainerClientError(
                "this session belongs to another event loop (the one it was opened in): open a session in each loop"
            )

    async def _send(
        self, method: str, body: bytes, timeout_s: float | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        self._own_loop()
        limit = self.options.timeout_s if timeout_s is None else timeout_s
        async with self._lock:
            conn = await self._connection()
            head = self._head(method, len(body))
            done = False
            try:
                async with asyncio.timeout(limit):
                    answer = await conn.exchange(head, body)
                done = True
                return answer
            except TimeoutError:
                raise ConnectionLostError(
                    f"no whole answer from {self.url} within {limit} s (ClientOptions.timeout_s)"
                ) from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                raise ConnectionLostError(f"the connection to {self.url} failed: {type(e).__name__}: {e}") from e
            except ValueError as e:  # a head or chunk the checks above let through and Python cannot read
                raise ProtocolError(f"an answer from {self.url} this client cannot read: {e}") from None
            finally:
                # a request that did not end with its whole answer read (a failure, a timeout, a cancelled task)
                # leaves the connection out of step: the next request would read this one's answer
                if not done:
                    conn.close()

    async def _post(self, message: dict[str, Any]) -> tuple[dict[str, str], bytes]:
        try:
            encoded = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as e:  # an object JSON has no form for, NaN, a cycle
            what = message.get("params", {}).get("name") or message.get("method")
            raise TrainerClientError(f"{what}: the arguments are not JSON: {e}") from None
        status, headers, body = await self._send("POST", encoded)
        if status >= 300:
            raise ServerHTTPError(status, _error_message(body), body)
        if headers.get("content-type", "").lower().startswith("text/event-stream"):
            raise ProtocolError(
                f"{self.url} answered with an event stream: this client reads JSON answers (a server made with "
                "json_response=True, as `envfactory serve` and `envfactory hub serve` are)"
            )
        return headers, body

    async def _request(self, method: str, params: dict[str, Any], model: type[_Response] = _Response) -> Any:
        self._next_id += 1
        request_id = self._next_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        _, body = await self._post(message)
        try:
            answer = model.model_validate_json(body)
        except ValidationError as e:
            raise ProtocolError(f"{method}: the answer is not a JSON-RPC response: {body[:200]!r} ({e})") from None
        if answer.id != request_id and not (answer.error is not None and answer.id is None):
            self._drop()  # an answer to another request: whatever the connection reads next is out of step too
            raise ProtocolError(f"{method}: the answer is to request {answer.id!r}, not {request_id}: {body[:200]!r}")
        if answer.error is not None:
            raise JSONRPCError(answer.error.code, answer.error.message, answer.error.data)
        if answer.result is None:
            raise ProtocolError(f"{method}: no result for request {request_id} in the answer: {body[:200]!r}")
        return answer.result

    async def _initialize(self) -> None:
        o = self.options
        params = {
            "protocolVersion": o.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": o.client_name, "version": "1"},
        }
        self._next_id += 1
        headers, body = await self._post(
            {"jsonrpc": "2.0", "id": self._next_id, "method": "initialize", "params": params}
        )
        session_id = headers.get("mcp-session-id")
        if not session_id:
            raise ProtocolError(f"{self.url} opened no MCP session (no mcp-session-id header): {body[:200]!r}")
        self.session_id = session_id
        self._post_head = None  # the head carries the session from now on
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    # ---- what trainers call --------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Call `tool` on this session's state; a tool's own failure is a result with `is_error` set."""
        if self.session_id is None:
            raise TrainerClientError("the session is closed: open a new one")
        result: ToolResult = await self._request(
            "tools/call", {"name": tool, "arguments": arguments or {}}, _CallResponse
        )
        return result

    async def state(self) -> dict[str, Any]:
        """The session's environment state (the `envfactory_state` control tool)."""
        result = (await self.call(STATE_TOOL)).raise_for_error(STATE_TOOL)
        if result.structured is None:
            raise ProtocolError(f"{STATE_TOOL} answered no structured state: {result.text[:200]!r}")
        return result.structured

    async def reset(self, scenario: str | None = None, config: dict[str, Any] | None = None) -> ToolResult:
        """Reset the session's state to a scenario, a whole state dump, or (neither) the server's default."""
        arguments: dict[str, Any] = {}
        if scenario is not None:
            arguments["scenario"] = scenario
        if config is not None:
            arguments["config"] = config
        return (await self.call(RESET_TOOL, arguments)).raise_for_error(RESET_TOOL)

    async def tools(self) -> list[ToolInfo]:
        """The server's tools (`tools/list`)."""
        if self.session_id is None:
            raise TrainerClientError("the session is closed: open a new one")
        result = await self._request("tools/list", {})
        try:
            return [ToolInfo.model_validate(t) for t in result.get("tools", [])]
        except ValidationError as e:
            raise ProtocolError(f"tools/list: a tool the client cannot read: {e}") from None

    async def close(self) -> None:
        """End the MCP session on the server (DELETE) and close the connection; safe to call twice. A server
        already gone, or one that already ended the session, is not an error here."""
        if self.session_id is not None:
            foreign = self._loop is not None and self._loop is not asyncio.get_running_loop()
            if not foreign:  # (from another loop: the connection is dropped and the server ends the session idle)
                with contextlib.suppress(TrainerClientError):
                    await self._send("DELETE", b"", min(self.options.timeout_s, self.options.close_timeout_s))
            self.session_id = None
            self._post_head = None
        self._drop()
        await asyncio.sleep(0)  # let the transport finish closing

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed: the transport is gone with it
                self._conn.close()
            self._conn = None

    @property
    def closed(self) -> bool:
        return self.session_id is None


def _checked_headers(headers: dict[str, str]) -> dict[str, str]:
    """`headers` as they may go on the wire: a name is an HTTP token, and a value holds no line break or NUL (one
    would start headers of the caller's making: another session's id) and is Latin-1 (what HTTP headers carry; a
    scenario named "東京" cannot be sent as one)."""
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise TrainerClientError(f"header name {name!r} is not an HTTP token (letters, digits, !#$%&'*+.^_`|~-)")
        if name.lower() in _OWN_HEADERS:  # a second content-length would frame the request two ways
            raise TrainerClientError(f"header {name} is the client's own to write; it cannot be given")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise TrainerClientError(f"header {name}: {value!r} holds a line break or NUL (or is not a string)")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise TrainerClientError(
                f"header {name}: {value!r} is not Latin-1, which is all an HTTP header carries: name the scenario or "
                "task in ASCII"
            ) from None
    return headers


def _error_message(body: bytes) -> str:
    """The message of an error answer: its JSON-RPC error's, else the start of its text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace") or "(no body)"
    if isinstance(parsed, dict) and isinstance(err := parsed.get("error"), dict) and "message" in err:
        return str(err["message"])
    return body[:200].decode("utf-8", "replace")
