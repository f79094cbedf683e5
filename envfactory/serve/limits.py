"""What one server process lets its clients use: bodies, connections, threads, sessions, memory.

`ServeLimits` is a settings object (every field can be set with an `ENVFACTORY_SERVE_*` environment
variable, e.g. `ENVFACTORY_SERVE_MAX_SESSIONS=500`); each server takes one (`limits=`) or reads the
environment when given none. The defaults keep one hostile client from stalling or exhausting a server
that serves many well-behaved ones (see the README's "Serving under hostile clients").
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Literal

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from envfactory.errors import ConfigError, first_error

SDK_MAX_BODY_BYTES: int = DEFAULT_MAX_REQUEST_BODY_SIZE  # mcp 1.30: 4 MiB


class ServeLimits(BaseSettings):
    """Limits of one MCP server process (HTTP transport; the per-session ones apply to stdio too)."""

    model_config = SettingsConfigDict(env_prefix="ENVFACTORY_SERVE_", extra="ignore")

    # ---- request bodies: refused (413/400) before they are parsed -------------------------------
    max_body_bytes: int = Field(
        default=SDK_MAX_BODY_BYTES, gt=0, description="a request body larger than this is refused (at most the SDK's)"
    )
    max_body_containers: int = Field(
        default=50_000, gt=0, description="'[' and '{' in one body, counted before parsing (bounds the parse time)"
    )
    max_body_values: int = Field(default=250_000, gt=0, description="',' in one body, counted before parsing")
    inline_body_bytes: int = Field(
        default=64 * 1024, ge=0, description="larger bodies are parsed, and their calls run, off the event loop"
    )
    body_timeout_s: float = Field(default=30.0, gt=0, description="time to receive a whole request body (else 408)")
    parse_threads: int = Field(default=2, ge=1, description="threads parsing large bodies at once")

    # ---- connections (uvicorn) -------------------------------------------------------------------
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a connection that has not sent a request's headers in this time is closed"
    )
    max_header_bytes: int = Field(default=64 * 1024, gt=0, description="request line and headers (else 431)")
    keep_alive_s: int = Field(default=5, ge=1, description="an idle keep-alive connection is closed after this")
    max_connections: int = Field(
        default=1024, ge=1, description="open connections; later ones are answered 503 (capped by the fd limit)"
    )
    stall_s: float = Field(
        default=1.0,
        gt=0,
        description="at the connection cap, a connection still sending its request (or silent since it opened) "
        "this long is closed to make room for a new one; an answered, idle keep-alive connection never is",
    )
    fd_reserve: int = Field(
        default=64, ge=0, description="file descriptors kept free for sessions, workers and logs (lowers the cap)"
    )

    # ---- tool calls --------------------------------------------------------------------------------
    app_threads: int = Field(
        default=8, ge=1, description="threads one app (hub) or the environment (server) may hold for blocking calls"
    )
    cpu_threads: int = Field(
        default=1,
        ge=1,
        description="threads one in-process (trusted) app may hold: its calls are CPU-bound, more only contend "
        "for the GIL with the event loop",
    )
    gc_thresholds: tuple[int, int, int] = Field(
        default=(50_000, 20, 20),
        description="the collector's thresholds in a server: sessions' states are many objects, and CPython's default "
        "(700, 10, 10) ran full collections that stopped every thread for 30-250 ms under load",
    )
    switch_interval_s: float = Field(
        default=0.0005,
        gt=0,
        description="how long a thread holding the GIL may keep it while another waits (sys.setswitchinterval) in "
        "a server: CPython's 5 ms let a worker thread's CPU-bound call hold the event loop 5 ms at each of its "
        "waits for the GIL",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="the HTTP server's event loop: uvloop (libuv; ~3-5 % more calls per server CPU-second on the "
        "fast path, measured) or asyncio's own; asyncio where uvloop is not installed (Windows)",
    )
    inline_cpu_s: float = Field(
        default=0.002,
        gt=0,
        description="a session whose in-process call used more CPU runs its next calls off the event loop (calls "
        "on the loop run in arrival order, so only cheap ones may: the others wait in fair order for a thread)",
    )
    inline_call_s: float = Field(
        default=0.02,
        gt=0,
        description="a session whose in-process call was blocked longer (a sleep, I/O) runs its next calls off "
        "the event loop",
    )

    # ---- sessions and memory -----------------------------------------------------------------------
    max_sessions: int = Field(default=4096, ge=1, description="open MCP sessions per server process")
    session_idle_s: float = Field(default=1800.0, gt=0, description="a session without requests this long ends")
    evict_idle_s: float = Field(
        default=60.0, ge=0, description="when full, a session idle this long may be ended to make room for a new one"
    )
    memory_mb: int | None = Field(
        default=None, ge=1, description="resident memory over which new sessions are refused; default 3/4 of RAM"
    )
    history_calls: int = Field(default=32, ge=0, description="call records a served session keeps (the newest)")
    history_bytes: int = Field(
        default=1024 * 1024, ge=0, description="bytes of arguments and answers those records may hold"
    )
    max_config_bytes: int = Field(
        default=1024 * 1024, gt=0, description="a reset config or a loaded task, as JSON (larger: an error result)"
    )

    @classmethod
    def from_env(cls) -> ServeLimits:
        """The limits the `ENVFACTORY_SERVE_*` variables set; one that does not validate is a `ConfigError`
        naming its variable (the CLI's one line), not a validation traceback."""
        try:
            return cls()
        except ValidationError as e:
            loc, msg = first_error(e, "limits")
            where = f"ENVFACTORY_SERVE_{loc.split('.')[0].upper()}" if loc != "limits" else "ENVFACTORY_SERVE_*"
            raise ConfigError(f"server limit '{loc}' (environment variable {where}): {msg}") from None

    @model_validator(mode="after")
    def _at_most_the_sdk(self) -> ServeLimits:
        # the SDK refuses larger bodies itself (after we parsed them): our limit is never the larger one
        self.max_body_bytes = min(self.max_body_bytes, SDK_MAX_BODY_BYTES)
        if self.memory_mb is None:
            self.memory_mb = default_memory_mb()
        return self


def default_memory_mb() -> int:
    """3/4 of the memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return max(64, total * 3 // 4 // 2**20)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> float | None:
    """This process's resident memory now (None when it cannot be read, e.g. out of file descriptors)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return None


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_cap(limits: ServeLimits) -> int:
    """`max_connections`, lowered so that connections alone never run the process out of descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    room = soft - open_fds() - max(limits.fd_reserve, soft // 10)
    return max(1, min(limits.max_connections, room))


def raise_fd_limit() -> None:
    """Raise the soft descriptor limit to the hard one (a server process, at start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


class CallRing:
    """The newest call records of one served session, bounded in count and in (estimated) bytes.

    `add` takes an item and its weight and returns what fell out; the server then drops those records
    from the session's own lists (`Session.history`, a hub episode's `calls`)."""

    __slots__ = ("bytes", "calls", "items", "total")

    def __init__(self, calls: int, bytes_: int) -> None:
        self.calls, self.bytes = calls, bytes_
        self.items: deque[tuple[Any, int]] = deque()
        self.total = 0

    def add(self, item: Any, weight: int) -> list[Any]:
        self.items.append((item, weight))
        self.total += weight
        out: list[Any] = []
        while self.items and (len(self.items) > self.calls or self.total > self.bytes):
            old, w = self.items.popleft()
            self.total -= w
            out.append(old)
        return out

    def clear(self) -> None:
        self.items.clear()
        self.total = 0


def drop(records: list[Any], gone: Iterable[Any]) -> None:
    """Remove `gone` (by identity) from `records` (distinct objects, one per call), in place. What a `CallRing`
    lets go is its oldest, in the order they came: when they lead `records`, they are cut off the front without
    a pass over the rest (a full session's history is rebuilt at every call otherwise)."""
    out = list(gone)
    if not out:
        return
    if len(out) <= len(records) and all(r is g for r, g in zip(records, out, strict=False)):
        del records[: len(out)]
        return
    ids = {id(g) for g in out}
    records[:] = [r for r in records if id(r) not in ids]


class LogBudget:
    """At most `burst` log lines, refilled at `per_s` a second; the lines left out are counted in the next one."""

    def __init__(self, burst: int = 20, per_s: float = 1.0) -> None:
        self.burst, self.per_s = burst, per_s
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.dropped = 0

    def take(self) -> int | None:
        """None: stay quiet; else the number of lines left out since the last one (0 or more)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.per_s)
        self.stamp = now
        if self.tokens < 1:
            self.dropped += 1
            return None
        self.tokens -= 1
        dropped, self.dropped = self.dropped, 0
        return dropped


def use_uvloop(limits: ServeLimits) -> bool:
    """Whether a server under `limits` runs on uvloop: asked for, and installed."""
    if limits.event_loop != "uvloop":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True
