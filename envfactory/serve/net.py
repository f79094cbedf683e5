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
    """Bind (host, port) as asyncio's `create_server` will for uvicorn, and let go: every address the host
    resolves to, SO_REUSEADDR, IPV6_V6ONLY on IPv6, an address this machine lacks skipped. A `BindError` naming
    the address and why when none binds or the port is taken, before a server prints that it serves there."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise BindError(f"cannot serve on {host!r}: not a host name or address of this machine ({e})") from None
    why = "no address of it can be bound here"
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            s = socket.socket(family, kind, proto)
        except OSError:  # this machine has no such family (IPv6 off): asyncio skips it too
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise BindError(
                        f"cannot serve on {shown}: the port is in use (another process is listening there: pick"
                        " another --port)"
                    ) from None
                why = e.strerror or str(e)
                continue
        return
    raise BindError(f"cannot serve on {shown}: {why}")
