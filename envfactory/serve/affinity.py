"""Several server processes behind one port, each MCP session pinned to the process that opened it.

An MCP session lives in one server process (its state is that process's memory), and a client sends the
session's requests over any connection it likes; so a balancer must route by the `mcp-session-id` header,
not by connection. HAProxy does it with a stick table that learns each session id from the response that
created it (`stick store-response`) and routes every later request carrying it to the same server (`stick
match`); requests without an id (an `initialize`) are spread round-robin. `haproxy_config` writes that
configuration; README "Serving at trainer scale" shows the whole set-up. We ship no balancer of our own:
HAProxy is the well-kept tool for exactly this, and a Python one would cost what it saves.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

from envfactory.errors import ConfigError

# matched whole (fullmatch): with `^...$` and match, a trailing newline got through and split the config's lines
_ADDRESS = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")
_SOCKET = re.compile(r"[A-Za-z0-9/._\-]+")


class AffinityError(ConfigError):
    """A balancer configuration that cannot be written as asked."""


class BalancerSettings(BaseModel):
    """What the balancer needs: where it listens and the server processes behind it."""

    backends: list[str] = Field(min_length=1, description="host:port of each `envfactory serve --transport http`")
    bind: str = Field(default="127.0.0.1:8765", description="host:port the balancer listens on")
    path: str = Field(default="/mcp", description="the servers' MCP path")
    idle_s: int = Field(default=1800, gt=0, description="forget a session's server after this long unused")
    max_sessions: int = Field(default=100_000, gt=0, description="session ids the stick table holds")
    stats_socket: str | None = Field(default=None, description="a Unix socket for HAProxy's runtime API")

    @field_validator("backends")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            _address(address)
        return value

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return _address(value)

    @field_validator("stats_socket")
    @classmethod
    def _socket(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or not _SOCKET.fullmatch(value)):
            raise ValueError(f"{value!r} is not an absolute socket path (letters, digits, / . _ - only)")
        return value


def _address(value: str) -> str:
    """`value` if it is host:port with a port HAProxy takes (1-65535), else a ValueError saying so."""
    if not _ADDRESS.fullmatch(value):
        raise ValueError(f"{value!r} is not host:port")
    if not 1 <= int(value.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(f"{value!r}: the port must be 1-65535")
    return value


def haproxy_config(s: BalancerSettings) -> str:
    """An HAProxy configuration that balances sessions over `s.backends`, each session sticky to its server."""
    if len(set(s.backends)) != len(s.backends):
        raise AffinityError("a backend is listed twice")
    if s.bind in s.backends:
        raise AffinityError(f"the balancer would listen on its own backend {s.bind}: give --bind another port")
    stats = (
        f"    stats socket {s.stats_socket} mode 600 level admin\n" if s.stats_socket else "    # (no runtime API)\n"
    )
    # `check`: a process that stops answering gets no new sessions (its own sessions are gone with it)
    servers = "".join(f"    server w{i} {address} check\n" for i, address in enumerate(s.backends))
    return f"""# EnvFactory MCP servers behind one port; each MCP session stays on the server that opened it.
global
{stats}
defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s

frontend mcp
    bind {s.bind}
    default_backend envfactory

backend envfactory
    balance roundrobin
    # learn each session id from the response that opened the session, route its later requests by it
    stick-table type string len 128 size {s.max_sessions} expire {s.idle_s}s
    stick store-response res.hdr(mcp-session-id)
    stick match req.hdr(mcp-session-id)
{servers}"""
