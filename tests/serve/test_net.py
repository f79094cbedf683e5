"""The bind check a server makes before it says it serves: as asyncio binds for uvicorn, no stricter."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from envfactory.serve.net import (
    UNIX_PATH_MAX,
    BindError,
    bind_unix_socket,
    check_bindable,
    check_unix_socket,
    free_port,
)


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


def test_a_unix_socket_path_is_checked_before_serving() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # short: a socket's path is at most 107 bytes
        folder = Path(tmp)
        free = folder / "free.sock"
        assert check_unix_socket(free) == free and not free.exists()  # nothing there: fine, nothing made
        with pytest.raises(BindError, match="its folder does not exist"):
            check_unix_socket(folder / "no" / "s.sock")
        with pytest.raises(BindError, match=f"at most {UNIX_PATH_MAX} bytes"):
            check_unix_socket(folder / ("x" * 120))
        plain = folder / "notes.txt"
        plain.write_text("keep me")
        with pytest.raises(BindError, match="a file that is not a socket is there"):
            check_unix_socket(plain)
        assert plain.read_text() == "keep me"
        live = folder / "live.sock"
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(live))
            listening.listen()
            with pytest.raises(BindError, match="another process is listening there"):
                check_unix_socket(live)
        busy = folder / "busy.sock"
        with socket.socket(socket.AF_UNIX) as listening:  # a server too busy to accept: its queue full
            listening.bind(str(busy))
            listening.listen(0)
            queued = []
            try:
                while True:
                    waiting = socket.socket(socket.AF_UNIX)
                    waiting.setblocking(False)
                    queued.append(waiting)
                    waiting.connect(str(busy))
            except OSError:
                pass
            with pytest.raises(BindError, match="a socket is there that may be in use"):
                check_unix_socket(busy)
            for waiting in queued:
                waiting.close()
        stale = folder / "stale.sock"
        with socket.socket(socket.AF_UNIX) as gone:
            gone.bind(str(stale))  # never listened on, now closed: what a killed server leaves
        assert check_unix_socket(stale) == stale
        cwd = os.getcwd()
        try:
            os.chdir(folder)
            assert check_unix_socket(Path("rel.sock")) == folder.resolve() / "rel.sock"  # made absolute
        finally:
            os.chdir(cwd)


def test_a_bound_socket_is_its_owners_alone_and_replaces_only_the_link(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        folder = Path(tmp)
        before = os.umask(0)  # the loosest umask: a socket bound in place would be open to everyone (0777)
        try:
            fresh = bind_unix_socket(folder / "a.sock")
        finally:
            os.umask(before)
        with fresh:
            assert stat.S_IMODE((folder / "a.sock").stat().st_mode) == 0o600
            fresh.listen()
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(folder / "a.sock"))  # it is the socket bound: connections reach it
        target = folder / "target.sock"
        with socket.socket(socket.AF_UNIX) as other:
            other.bind(str(target))
            os.chmod(target, 0o777)
            link = folder / "link.sock"
            link.symlink_to(target)
            with bind_unix_socket(link):
                assert not link.is_symlink() and stat.S_ISSOCK(link.lstat().st_mode)
                assert stat.S_IMODE(link.stat().st_mode) == 0o600
            assert stat.S_IMODE(target.stat().st_mode) == 0o777  # what the link pointed to: untouched
        assert sorted(p.name for p in folder.iterdir()) == ["a.sock", "link.sock", "target.sock"]  # no folder left
