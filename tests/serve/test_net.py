"""The bind check a server makes before it says it serves: as asyncio binds for uvicorn, no stricter."""

from __future__ import annotations

import asyncio
import socket

import pytest

from envfactory.serve.net import BindError, check_bindable, free_port


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_taken_port_is_refused_and_a_free_one_is_left_free() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=rf"127\.0\.0\.1:{port}: the port is in use"):
            check_bindable("127.0.0.1", port)
    port = free_port()
    check_bindable("127.0.0.1", port)
    with socket.socket() as again:  # the check let go of it
        again.bind(("127.0.0.1", port))


def test_a_host_that_is_not_this_machines_is_refused() -> None:
    with pytest.raises(BindError, match="not a host name or address of this machine"):
        check_bindable("nosuch.invalid", free_port())
    with pytest.raises(BindError, match=r"cannot serve on 192\.0\.2\.1:\d+: "):  # TEST-NET-1: no interface has it
        check_bindable("192.0.2.1", free_port())


@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 on this machine")
def test_ipv6_any_beside_an_ipv4_listener_is_accepted_as_asyncio_accepts_it() -> None:
    """asyncio binds IPv6 sockets IPV6_V6ONLY: `::` on a port an IPv4 listener holds is served, so the check
    must not refuse it."""
    with socket.socket() as v4:
        v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        v4.bind(("0.0.0.0", 0))
        v4.listen()
        port = v4.getsockname()[1]
        check_bindable("::", port)

        async def serve() -> None:
            server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host="::", port=port)
            server.close()
            await server.wait_closed()

        asyncio.run(serve())  # what uvicorn does: it binds too
