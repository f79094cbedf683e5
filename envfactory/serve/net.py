"""Loopback helpers for local servers (the demo, benchmarks, tests), and the bind check a server makes before it
says it is serving."""

from __future__ import annotations

import errno
import socket

from envfactory.errors import ServiceError


class BindError(ServiceError):
    """The HTTP address cannot be listened on (the port is taken, the host is not an address of this machine)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (port 2024 may be taken on these machines)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_bindable(host: str, port: int) -> None:
    """Bind (host, port) as uvicorn will (SO_REUSEADDR, the address's own family) and let go: a `BindError`
    naming the address and why, before a server prints that it serves there."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise BindError(f"cannot serve on {host!r}: not a host name or address of this machine ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            taken = " (another process is listening there: pick another --port)" if e.errno == errno.EADDRINUSE else ""
            raise BindError(f"cannot serve on {host}:{port}: {e.strerror or e}{taken}") from None
