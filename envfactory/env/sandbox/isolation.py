"""The worker's own part of its isolation: preloading, resource limits, the seccomp filter, network, privileges.

Used by the worker only (`envfactory.env.sandbox.worker` calls these in the order its docstring
gives), during its trusted start-up; the parent never imports this module. The namespaces and the
read-only view come from bubblewrap (`wall.py`) before the interpreter starts.
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
from envfactory.env.sandbox.protocol import WorkerLimits

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


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


def apply_limits(limits: WorkerLimits) -> dict[str, int]:
    """Resource limits of this process (hard = soft: they cannot be raised again); what was applied."""
    applied: dict[str, int] = {}
    baseline = _vm_size_bytes()
    if baseline is not None:
        _set_limit(resource.RLIMIT_AS, baseline + limits.memory_mb * 1024 * 1024, applied, "as_bytes")
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        applied["cpu_s"] = limits.cpu_s
    _set_limit(resource.RLIMIT_FSIZE, limits.fsize_mb * 1024 * 1024, applied, "fsize_bytes")
    _set_limit(resource.RLIMIT_NOFILE, limits.nofile, applied, "nofile")
    _set_limit(resource.RLIMIT_NPROC, 0, applied, "nproc")
    _set_limit(resource.RLIMIT_CORE, 0, applied, "core")
    return applied


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(bpf: bytes) -> None:
    """Load a seccomp BPF program (compiled by the parent with libseccomp) into this process.

    Sets no_new_privs first (the kernel requires it of an unprivileged process). Raises OSError if
    the kernel refuses: the worker then reports a broken start-up and the parent refuses to use it.
    """
    if not bpf or len(bpf) % 8:
        raise OSError("the seccomp program is empty or malformed")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def read_status() -> dict[str, str]:
    """/proc/self/status as a dict (Seccomp, Seccomp_filters, NoNewPrivs, CapEff, Uid...)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    return out


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
