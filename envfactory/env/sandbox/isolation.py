"""The child's isolation from the machine: preloading, resource limits, network, privileges.

Used by the child only (`envfactory.env.sandbox.child` calls these in the order its docstring
gives); the parent never imports this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import resource
import warnings
from typing import Any, NoReturn

from envfactory.env.sandbox.policy import ALLOWED_MODULES
from envfactory.env.sandbox.protocol import SandboxJob

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38


def block_network() -> None:
    """Replace the socket API with functions that raise, in `socket` and in `_socket`.

    Always applied, even when the network namespace could not be entered (not root, no
    CAP_SYS_ADMIN): without it a namespace failure would leave the network open.
    """
    import _socket
    import socket

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError("network access is disabled in the sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            refuse()

    for name in (
        "create_connection",
        "create_server",
        "socketpair",
        "fromfd",
        "getaddrinfo",
        "gethostbyname",
        "gethostbyname_ex",
        "gethostbyaddr",
        "getnameinfo",
    ):
        if hasattr(socket, name):
            setattr(socket, name, refuse)
    socket.socket = NoSocket  # type: ignore[misc]
    socket.SocketType = NoSocket
    for name in ("socket", "SocketType", "socketpair", "getaddrinfo", "gethostbyname"):
        if hasattr(_socket, name):
            setattr(_socket, name, refuse)


def enter_network_namespace() -> tuple[bool, str | None]:
    """unshare(CLONE_NEWNET): a namespace with only a downed loopback. Needs root (CAP_SYS_ADMIN)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) == 0:
            return True, None
        return False, os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as e:
        return False, str(e)


def _no_new_privs() -> bool:
    """PR_SET_NO_NEW_PRIVS: an escaped process could not regain root through a setuid binary."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _drop_privileges() -> int:
    """As root, become nobody: no writes to root's files, and RLIMIT_NPROC applies."""
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return uid


def _vm_size_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _set_limit(which: int, value: int, applied: dict[str, int], label: str) -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(which, (value, value))
        applied[label] = value


def apply_limits(job: SandboxJob) -> dict[str, Any]:
    """Resource limits of this process; returns what was applied (for the isolation report)."""
    applied: dict[str, int] = {}
    baseline = _vm_size_bytes()
    if baseline is not None:
        _set_limit(resource.RLIMIT_AS, baseline + job.memory_mb * 1024 * 1024, applied, "as_bytes")
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (job.cpu_s, job.cpu_s + 1))
        applied["cpu_s"] = job.cpu_s
    _set_limit(resource.RLIMIT_FSIZE, job.fsize_mb * 1024 * 1024, applied, "fsize_bytes")
    _set_limit(resource.RLIMIT_NOFILE, 64, applied, "nofile")
    _set_limit(resource.RLIMIT_NPROC, 0, applied, "nproc")
    _set_limit(resource.RLIMIT_CORE, 0, applied, "core")
    return {"rlimits": applied, "baseline_vm_bytes": baseline}


def _preload() -> None:
    """Import what generated code may use now, while every file is still readable."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(ALLOWED_MODULES - {"__future__"}):
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        import pydantic

        for name in pydantic.__all__:  # pydantic imports its submodules lazily, on first access
            with contextlib.suppress(Exception):
                getattr(pydantic, name)
        for name in ("_strptime", "encodings.ascii", "encodings.latin_1", "unicodedata", "traceback"):
            with contextlib.suppress(Exception):
                importlib.import_module(name)
