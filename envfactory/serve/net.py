"""Loopback helpers for local servers (the demo, benchmarks, tests), and the bind check a server makes before it
says it is serving."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import tempfile
from pathlib import Path

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


UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, less its terminating NUL), Linux


def check_unix_socket(path: Path) -> Path:
    """`path`, absolute, if a server may listen there on a Unix socket: its folder exists, it fits in a socket
    address, and it is free — nothing there, or a socket no process listens on (left by a server that died;
    asyncio replaces it). A `BindError` that says which, before a server prints that it serves there: a live
    socket is another server's, and a file that is not a socket is never replaced."""
    path = Path(os.path.abspath(path))
    if not path.parent.is_dir():
        raise BindError(f"cannot serve on {path}: its folder does not exist (create it, or pick another --uds)")
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        too_long = f"a Unix socket's path is at most {UNIX_PATH_MAX} bytes"
        raise BindError(f"cannot serve on {path}: {too_long}; pick a shorter one")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return path
    except OSError as e:
        raise BindError(f"cannot serve on {path}: {e.strerror or e}") from None
    if not stat.S_ISSOCK(mode):
        raise BindError(f"cannot serve on {path}: a file that is not a socket is there (it is left alone)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return path  # a socket nobody listens on (or gone since): replaced when the server starts
        except OSError as e:  # a full accept queue (a busy server), another user's socket: not stale, not ours
            why = e.strerror or type(e).__name__
            in_use = f"a socket is there that may be in use ({why}); pick another --uds"
            raise BindError(f"cannot serve on {path}: {in_use}") from None
    raise BindError(f"cannot serve on {path}: another process is listening there (pick another --uds)")


def bind_unix_socket(path: Path) -> socket.socket:
    """A socket bound at `path` that only its owner may connect to from the moment anyone could reach it: bound
    inside a fresh private folder beside `path` (mode 0700), set to 0600 there, then renamed to `path` — which
    replaces what is there (a stale socket) in one step, a symbolic link itself rather than what it points to.
    Binding at `path` directly would make the socket under the umask (0777 with umask 0) until a chmod."""
    folder = tempfile.mkdtemp(prefix=".ef", dir=path.parent)  # 0700; its name short: the path limit applies
    inner = os.path.join(folder, "s")
    try:
        if len(os.fsencode(inner)) > UNIX_PATH_MAX:
            raise BindError(f"cannot serve on {path}: its folder's path is too long to bind a socket beside it")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(inner)
            os.chmod(inner, 0o600)
            os.rename(inner, path)
        except OSError as e:
            sock.close()
            raise BindError(f"cannot serve on {path}: {e.strerror or e}") from None
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(inner)  # only if the rename did not happen
        with contextlib.suppress(OSError):
            os.rmdir(folder)
