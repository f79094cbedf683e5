"""The HTTP side of a server under hostile clients: uvicorn's connections bounded, and a process that never exits.

- `GuardedHTTP` (uvicorn's HTTP protocol, httptools or h11, with a guard): a connection must send a
  request's headers within `header_timeout_s` of opening (or of its last response) and in at most
  `max_header_bytes`, else it is closed (431 when too large). uvicorn alone has no such timer: a
  connection that never finishes its headers stays open for ever. A connection opened while
  `connection_cap` connections are open first makes room: the connection that has been sending its
  request (headers or body), or waiting for its first request, the longest, for more than `stall_s`,
  is closed for it — one client's slow bodies or silent connections cannot keep every later client
  out. A kept-alive connection that has been answered is a session's: it is never closed to make room
  (it closes itself after `keep_alive_s` idle), so a flood cannot cut an open session off. Only when none is
  stalled does the new connection get a 503 (a JSON-RPC error body) for each request; the connections
  already open, and so the sessions using them, are served as before. These deadlines and uvicorn's
  keep-alive timeout are kept by one sweep per server (`_Sweep`, a tick of at most 0.25 s), not by two
  timers made and cancelled for every request.
- `guard_event_loop`: the loop's exception handler never raises and logs resource exhaustion (an
  `accept()` failing with EMFILE, asyncio then retries a second later) in one line without a
  traceback. Before it, the default handler logged through Rich, whose handler imports a module to
  render the traceback: out of descriptors that import failed inside the handler and the server exited.
- `harden_logging`: every root handler's failure to emit falls back to one plain line on stderr.
- `uvicorn_config` / `serve_http`: uvicorn with all of the above and the keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import logging
import os
import socket
import sys
import weakref
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from envfactory.serve.limits import LogBudget, ServeLimits, connection_cap, raise_fd_limit
from envfactory.serve.net import bind_unix_socket

try:
    import httptools  # noqa: F401
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseHTTP

    _KEEP_ALIVE_BY_SWEEP = True  # GuardedHTTP answers in httptools' way, with the keep-alive timeout its sweep's
except ImportError:  # pragma: no cover
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseHTTP  # type: ignore[assignment]

    _KEEP_ALIVE_BY_SWEEP = False

_LOG = logging.getLogger("envfactory.serve")
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def _jsonrpc_error(status: int, message: str, code: int = -32000) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
    reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}[status]
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
        b"retry-after: 1\r\n\r\n" % (status, reason, len(body))
    ) + body


def _over_capacity(message: str) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}).encode()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"retry-after", b"1"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def loop_time() -> float:
    """The running event loop's clock, the one anyio's deadlines (a session's idle scope) are on: asyncio's loop
    read directly (~0.15 µs), `anyio.current_time()` (~1.5 µs: a backend lookup, two loop lookups) elsewhere."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:  # not on asyncio's loop (trio)
        return anyio.current_time()


CYCLE = "envfactory.cycle"  # scope key: a weak reference to the request's uvicorn cycle (set by GuardedHTTP)


class GuardedHTTP(_BaseHTTP):
    """uvicorn's HTTP protocol with a header deadline, a header size limit and a connection cap (see the module)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    cap: int = 1024  # connections past it get a 503 for their request, and one second to send it
    hard_cap: int = 1056  # connections past it are answered 503 and closed at once: descriptors stay free
    stall_s: float = 1.0  # at the cap, a connection still sending its request (or idle) this long may make room
    closed_late = 0  # connections closed for not sending their headers in time (all instances)
    refused = 0  # connections over the cap
    evicted = 0  # stalled connections closed to make room for a new one at the cap

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._deadline: float | None = None
        _Sweep.watch(self)
        open_ = len(self.connections)
        if open_ > self.cap and self._make_room():
            open_ -= 1
        if open_ > self.cap:
            type(self).refused += 1
            message = f"the server is at its connection limit ({self.cap} open connections); try again later"
            if open_ > self.hard_cap:
                transport.write(_jsonrpc_error(503, message))
                transport.close()
                return
            self.app = _over_capacity(message)  # this connection's requests get a 503
            self._arm(min(1.0, self.header_timeout_s))
            return
        self._arm()

    def _stalled_since(self) -> float | None:
        """Since when this connection has been sending the request it is on (or waiting for its first), or None.

        An answered connection that has sent nothing of its next request is a session's kept-alive one: None
        (one that trickles its next request's headers is stalled since its last answer).
        """
        since = getattr(self, "_since", None)
        if since is None or self.transport is None or self.transport.is_closing():
            return None
        cycle = self.cycle
        if self._waiting_for_headers():
            idle = getattr(self, "_answered", False) and not getattr(self, "_header_bytes", 0)
            return None if idle else float(since)
        if cycle is not None and cycle.more_body and not cycle.response_started:
            return float(since)
        return None

    def _make_room(self) -> bool:
        """Close the connection stalled longest (past `stall_s`) for this one; False if none is."""
        latest = self.loop.time() - self.stall_s
        victim: GuardedHTTP | None = None
        oldest = latest
        for other in list(self.connections):
            if not isinstance(other, GuardedHTTP) or other is self:
                continue
            since = other._stalled_since()
            if since is not None and since <= oldest:
                victim, oldest = other, since
        if victim is None:
            return False
        type(self).evicted += 1
        victim._disarm()
        victim.transport.close()
        return True

    def _arm(self, timeout_s: float | None = None) -> None:
        """The next request's headers are due within `timeout_s` (the header timeout) from now: a deadline the
        sweep (`_Sweep`) checks, not a timer of the connection's own (a timer made and cancelled per request)."""
        self._since = self.loop.time()  # the request (or the wait for it) began
        self._deadline = self._since + (timeout_s or self.header_timeout_s)
        self._armed_cycle = self.cycle
        self._header_bytes = 0

    def _disarm(self) -> None:
        self._deadline = None

    def _waiting_for_headers(self) -> bool:
        return self.cycle is self._armed_cycle and (self.cycle is None or self.cycle.response_complete)

    def _on_sweep(self, now: float) -> None:
        """Close this connection if its headers are late, or (httptools) if it has been idle since its last
        answer for uvicorn's keep-alive timeout."""
        deadline = self._deadline
        if deadline is None or self.transport is None or self.transport.is_closing():
            return
        if not self._waiting_for_headers():
            return
        if now >= deadline:
            self._deadline = None
            type(self).closed_late += 1
            self.transport.close()
        elif (
            _KEEP_ALIVE_BY_SWEEP
            and getattr(self, "_answered", False)
            and not self._header_bytes
            and now - self._since >= self.timeout_keep_alive
        ):
            self._deadline = None
            self.transport.close()  # what uvicorn's keep-alive timer does

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is None:
            return
        if self.cycle is not self._armed_cycle:  # a request's headers are complete
            self._disarm()
            return
        if not self._waiting_for_headers():  # a pipelined request's body, read while the one before is answered
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._disarm()
            message = f"the request's headers are over {self.max_header_bytes} bytes"
            self.transport.write(_jsonrpc_error(431, message, -32600))
            self.transport.close()

    def on_response_complete(self) -> None:
        before = self.cycle
        self._answered = True
        if _KEEP_ALIVE_BY_SWEEP:  # uvicorn's own, but the keep-alive timeout is the sweep's (no timer per answer)
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
        else:
            super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is before:
            self._arm()  # the next request's headers are due within the timeout too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """The request's cycle, weakly, in its scope (`CYCLE`): middleware wraps `send`, so the fast path finds
        the cycle there to write an answer's head and body at once (`serve.asgi.send_as_one_write`)."""
        cycle.scope[CYCLE] = weakref.ref(cycle)
        super()._start_asgi_task(cycle, app)


class _Sweep:
    """The deadlines of one server's connections, checked every `tick` seconds by one timer while any is open:
    a header deadline and a keep-alive timeout are each a timer made and cancelled per request otherwise (two
    `call_later`s and two cancels of every answered request). A deadline passes at most a tick late: a tenth of
    the shorter timeout, at most 0.25 s."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], tick: float) -> None:
        self.loop, self.connections, self.tick = loop, connections, tick
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def watch(cls, conn: GuardedHTTP) -> None:
        """Make sure the sweep of `conn`'s server (its uvicorn `server_state`) runs on `conn`'s loop."""
        state = conn.server_state
        sweep: _Sweep | None = getattr(state, "_envfactory_sweep", None)
        if sweep is None or sweep.loop is not conn.loop:
            timeouts = [conn.header_timeout_s, float(getattr(conn, "timeout_keep_alive", 5))]
            sweep = cls(conn.loop, conn.connections, max(0.005, min(0.25, *(t / 10 for t in timeouts))))
            state._envfactory_sweep = sweep  # type: ignore[attr-defined]
        if sweep.handle is None:
            sweep.handle = sweep.loop.call_later(sweep.tick, sweep.run)

    def run(self) -> None:
        self.handle = None
        now = self.loop.time()
        try:
            for conn in list(self.connections):
                if isinstance(conn, GuardedHTTP):
                    try:
                        conn._on_sweep(now)
                    except Exception:  # one connection's failure must not end every other's deadlines
                        _LOG.exception("closing a late connection failed")
        finally:
            if self.connections:
                self.handle = self.loop.call_later(self.tick, self.run)


def guarded_protocol(limits: ServeLimits, cap: int) -> type[GuardedHTTP]:
    """A `GuardedHTTP` subclass with these limits (uvicorn instantiates the class it is given)."""
    attributes = {
        "header_timeout_s": limits.header_timeout_s,
        "max_header_bytes": limits.max_header_bytes,
        "cap": cap,
        "hard_cap": cap + max(8, limits.fd_reserve // 2),
        "stall_s": limits.stall_s,
    }
    return type("GuardedHTTP", (GuardedHTTP,), attributes)


def _write_stderr(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line.rstrip("\n") + "\n").encode("utf-8", "replace"))


_EXHAUSTION_LOG = LogBudget(burst=3, per_s=0.2)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: never raises; resource exhaustion is one line now and then, no traceback."""
    exc = context.get("exception")
    try:
        if isinstance(exc, OSError) and exc.errno in _EXHAUSTED:
            # asyncio stops accepting for a second and retries; connections already open are served
            dropped = _EXHAUSTION_LOG.take()
            if dropped is not None:
                more = f" ({dropped} more since the last line)" if dropped else ""
                what = context.get("message")
                _LOG.warning("out of resources: %s (%s); accepting again in 1 s%s", exc.strerror, what, more)
            return
        if isinstance(exc, ConnectionError | socket.timeout):
            return  # a client went away mid-write: nothing to do
        if isinstance(exc, ValueError) and "_start_serving" in repr(context.get("handle")):
            return  # a paused listener's retry after the server closed it (at shutdown)
        loop.default_exception_handler(context)
    except Exception:
        _write_stderr(f"envfactory.serve: {context.get('message', 'error in the event loop')}: {exc!r}")


def guard_event_loop() -> None:
    """Install `_loop_exception` on the running loop (from a coroutine or the app's lifespan)."""
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop().set_exception_handler(_loop_exception)


class _SafeEmit:
    """Wraps a handler's `emit`: a handler that cannot emit (out of descriptors...) writes one plain line instead."""

    def __init__(self, handler: logging.Handler) -> None:
        self.handler, self.emit = handler, handler.emit

    def __call__(self, record: logging.LogRecord) -> None:
        try:
            self.emit(record)
        except Exception:
            try:
                text = record.getMessage()
            except Exception:
                text = str(record.msg)
            _write_stderr(f"{record.levelname} {record.name}: {text}")


def harden_logging() -> None:
    """Make every root and uvicorn log handler unable to raise into its caller (see the module)."""
    with contextlib.suppress(Exception):
        import rich.traceback  # noqa: F401  (Rich imports it on its first traceback: do it while files open)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio"):
        for handler in logging.getLogger(name).handlers:
            if not isinstance(handler.emit, _SafeEmit):
                handler.emit = _SafeEmit(handler)  # type: ignore[method-assign]


def uvicorn_config(
    app: Any, *, host: str, port: int, limits: ServeLimits, log_level: str = "warning"
) -> uvicorn.Config:
    """uvicorn's configuration for a server under `limits` (header deadline, connection cap, keep-alive)."""
    cap = connection_cap(limits)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(limits, cap),
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        backlog=ACCEPT_BATCH,
    )


ACCEPT_BATCH = 128  # asyncio accepts up to `backlog` connections per wake-up, all started in one loop turn
LISTEN_BACKLOG = 2048  # what the kernel queues (uvicorn's default), set again once the server listens


class _Server(uvicorn.Server):
    """uvicorn's server whose listening sockets queue `LISTEN_BACKLOG` connections while asyncio accepts at most
    `ACCEPT_BATCH` at a time: a burst of connections is taken in turns with the sessions' requests (one
    batch of 2,048 held the loop ~20 ms), and out of descriptors asyncio retries 128 accepts, not 2,048."""

    unix_socket: tuple[Path, int, int] | None = None  # (path, device, inode) of the Unix socket it serves on

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, and the Unix socket's file removed if it is still this server's (uvicorn raises the
        stopping signal again after it, so nothing after `serve` would run)."""
        try:
            await super().shutdown(sockets)
        finally:
            if self.unix_socket is not None:
                path, device, inode = self.unix_socket
                with contextlib.suppress(OSError):
                    now = os.lstat(path)
                    if (now.st_dev, now.st_ino) == (device, inode):  # not another server's since
                        os.unlink(path)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for listening in server.sockets or ():
                with contextlib.suppress(OSError):
                    dup = socket.socket(fileno=os.dup(listening.fileno()))
                    try:
                        dup.listen(LISTEN_BACKLOG)
                    finally:
                        dup.close()


async def serve_http(
    app: Any, *, host: str, port: int, limits: ServeLimits, log_level: str = "warning", uds: Path | None = None
) -> None:
    """Serve `app` with uvicorn under `limits` until interrupted (on the Unix socket `uds` when given: bound here,
    owner-only from the start (`net.bind_unix_socket`), handed to uvicorn, removed at the end)."""
    raise_fd_limit()
    config = uvicorn_config(app, host=host, port=port, limits=limits, log_level=log_level)
    server = _Server(config)
    config.load()  # uvicorn sets up its logging here: harden it with the rest
    harden_logging()
    guard_event_loop()
    # what was imported lives as long as the process: out of the collector's way, so that its full
    # collections (which stop every thread, the event loop's too) walk only the sessions' objects
    gc.collect()
    gc.freeze()
    gc.set_threshold(*limits.gc_thresholds)
    # the event loop waits for the GIL after each of its system calls while a worker thread runs a CPU-bound
    # call: the switch interval is the most each such wait can take
    sys.setswitchinterval(limits.switch_interval_s)
    if uds is None:
        await server.serve()
        return
    sock = bind_unix_socket(uds)
    bound = os.lstat(uds)
    server.unix_socket = (uds, bound.st_dev, bound.st_ino)
    with sock:
        await server.serve(sockets=[sock])
