"""What every EnvFactory MCP server shares: one held object per MCP session.

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

The ASGI layers in front of the SDK (body bounds, session budget, the tools/call fast path, the 405 for
the standalone GET stream, the disconnect filter) are `envfactory.serve.asgi`; a tool's answer and its
JSON-RPC body (`tool_result`) are `envfactory.serve.answers`; the limits are
`envfactory.serve.limits.ServeLimits`; the connection side (uvicorn) is `envfactory.serve.http`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import weakref
from abc import abstractmethod
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import uvicorn
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from starlette.applications import Starlette

from envfactory.serve.answers import answer_bytes, response_body, timed_body
from envfactory.serve.asgi import (
    DISCONNECT_FILTER,
    BoundedJSONBody,
    EndedSessions,
    FastToolCalls,
    GuardLoop,
    NoServerStream,
    SessionBudget,
)
from envfactory.serve.fair import FairLimiter, OffLoop, Stopwatch, Turn
from envfactory.serve.http import loop_time, serve_http, uvicorn_config
from envfactory.serve.limits import CallRing, ServeLimits, resident_mb, use_uvloop

STATE_TOOL = "envfactory_state"


def _close_all(objects: list[Any]) -> None:
    """Close each of `objects` that can be (one that fails to close is let go all the same)."""
    for obj in objects:
        close = getattr(obj, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()


H = TypeVar("H")


def unknown_arguments(tool: str, arguments: dict[str, Any], takes: frozenset[str]) -> str | None:
    """Why a control tool's `arguments` are refused (one it does not take: a typo such as `taskId` or `scenarios`
    must not restart or reset with the defaults and report success), or None."""
    unknown = sorted(k for k in arguments if k not in takes)
    if not unknown:
        return None
    allowed = " or ".join(f"`{k}`" for k in sorted(takes)) or "no arguments"
    return f"{tool} takes {allowed}; unknown: {', '.join(unknown)}"


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
        self.limits = limits = limits or ServeLimits.from_env()
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
        self.uds: Path | None = None  # streamable HTTP on this Unix socket instead of (host, port)

    def streamable_http_app(self) -> Starlette:
        app = super().streamable_http_app()
        app.add_middleware(EndedSessions, server=self)  # innermost: what the SDK answers for an ended session
        if not self.server_stream:
            app.add_middleware(NoServerStream, path=self.settings.streamable_http_path)
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

    def serve_on_unix_socket(self, path: Path) -> None:
        """Streamable HTTP on the Unix socket `path` (checked: `net.check_unix_socket`) when `run`. A browser cannot
        reach a Unix socket, so DNS rebinding (what the Host check guards against) cannot: a plain `Host:
        localhost`, what curl --unix-socket and httpx send, is let in too."""
        self.uds = path
        security = self.settings.transport_security
        if security is not None and "localhost" not in security.allowed_hosts:
            security.allowed_hosts.append("localhost")

    def run(self, transport: Any = "stdio", mount_path: str | None = None) -> None:
        """FastMCP's `run`; streamable HTTP on the event loop `limits.event_loop` names (FastMCP's own `run`
        starts it on asyncio's, whatever uvicorn would choose)."""
        if transport != "streamable-http":
            super().run(transport, mount_path)
            return
        anyio.run(self.run_streamable_http_async, backend_options={"use_uvloop": use_uvloop(self.limits)})

    async def run_streamable_http_async(self) -> None:
        await serve_http(
            self.streamable_http_app(),
            host=self.settings.host,
            port=self.settings.port,
            limits=self.limits,
            log_level=self.settings.log_level.lower(),
            uds=self.uds,
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
        if resident is not None:  # and the processes it started (sandboxed workers: a worker per session can be most)
            resident += self.helpers_resident_mb()
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
        latest = loop_time() - self.limits.evict_idle_s  # idle since before this: may be ended
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

    def helpers_resident_mb(self) -> float:
        """The resident memory of the processes this server's objects run on beside it (a subclass's sandboxed
        workers), which its memory budget counts with its own."""
        return 0.0

    async def drop_ended(self) -> int:
        """Let go of the objects of the HTTP sessions that ended (a DELETE, the idle timeout, an eviction), closing
        them; returns how many. They were held by a weak key the SDK keeps referenced after its session ends: the
        state of every ended session stayed, and with `sandbox_session_workers` its worker process too. A session
        with a call still running (its lock held) is left to a later look; the closes run on a thread (ending a
        worker waits for its process), each under its session's lock, so no call of it starts meanwhile."""
        open_ = self._open_sessions()
        if open_ is None:
            return 0
        live = {id(t) for t in open_.values()}
        ended: list[tuple[Any, anyio.Lock]] = []
        for key in list(self._held.keys()):
            if not hasattr(key, "is_terminated") or id(key) in live:
                continue
            lock = self._locks.setdefault(key, anyio.Lock())
            try:
                lock.acquire_nowait()
            except anyio.WouldBlock:
                continue  # a call of it runs, or waits: not now
            ended.append((key, lock))
        if not ended:
            return 0
        held = [self._held.pop(key, None) for key, _ in ended]
        try:
            await anyio.to_thread.run_sync(_close_all, held)
        finally:
            for _, lock in ended:
                lock.release()
        return len(ended)

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

    def choice_problem(self, choice: Any) -> str | None:
        """Why a new session cannot start from `choice` (an unknown scenario or task), checked when the session is
        opened: its first call would fail, and every call after it. None: it can (or the server cannot tell)."""
        return None

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

    @contextlib.contextmanager
    def _held_off(self, key: Any) -> Iterator[None]:
        """While a call of a session the fast path answers (its key is the SDK's transport) waits off the loop, the
        session's idle timer is held off (deadline ∞, as the SDK holds its own requests): neither the idle timeout
        nor eviction (`_longest_idle` skips such sessions) ends it mid-call. After, the deadline is a full timeout
        from now. A session the SDK itself is serving (deadline already ∞) is left to the SDK."""
        idle = getattr(key, "idle_scope", None)  # None: not an HTTP session (stdio's has no manager at all)
        timeout = self.session_manager.session_idle_timeout if idle is not None else None
        if idle is None or timeout is None or not math.isfinite(idle.deadline):
            yield
            return
        idle.deadline = math.inf
        try:
            yield
        finally:
            if not idle.cancel_called:
                idle.deadline = loop_time() + timeout

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
                self.ran(key, name, args, *watch.stop(self._off_loop.cheap_under), inline=True)
            if request_id is None or answer_bytes(result) <= self.limits.inline_body_bytes:
                return result, None if request_id is None else response_body(request_id, result)
            with self._held_off(key):
                async with self._slots(key, choice, name, args, size, first) as (threads, turns):  # a large answer
                    encoded, spent = await anyio.to_thread.run_sync(timed_body, request_id, result, limiter=threads)
                    for turn in turns:
                        turn.cost = spent
            return result, encoded
        if lock is None:
            lock = self._locks.setdefault(key, anyio.Lock())
        with self._held_off(key):  # the wait for a thread included
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
        body = None if request_id is None else response_body(request_id, result)
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
