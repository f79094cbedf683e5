"""The OS boundary around untrusted code: bubblewrap namespaces and a seccomp syscall filter.

Python-level checks (the AST policy, guarded builtins) are a filter: pydantic, dataclasses and copy
run with the real builtins, so hostile code can reach them. The wall is the kernel. Every process
that runs untrusted code is started through `wrap()`:

- **bubblewrap** (`bwrap`): its own user namespace (uid 65534 inside), PID, mount, IPC, UTS, cgroup
  and network namespaces (so runs cannot see or signal each other, and no connection leaves); a new
  root holding read-only binds of only what the worker needs — the interpreter, its site-packages,
  the `envfactory` runtime package, the system's shared libraries — and a private size-limited
  tmpfs at /tmp; all capabilities dropped; no further user namespaces; a new terminal session; the
  environment cleared; it dies with its parent.
- **seccomp**, twice: bwrap loads a filter before the interpreter starts (no mounting, ptrace,
  namespaces, kernel keys, bpf, module loading...), and the worker, once its trusted start-up is
  done and before it reads any untrusted code, loads a second one that also forbids `execve`,
  `fork`/`clone` (no processes, no threads), `kill` and friends, and sockets. Both programs are
  compiled here with libseccomp (`pyseccomp`); the worker installs its program with one `prctl`.

Where bubblewrap is missing or does not work, untrusted code is refused with a message saying how
to get it, unless the user sets `ENVFACTORY_UNSAFE_NO_OS_SANDBOX=1`: then the worker runs as a
plain subprocess with the best it can do alone (seccomp, rlimits, a network namespace and `nobody`
when root, the Python filter) — and the isolation report says so.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel

from envfactory.errors import EnvFactoryError

SANDBOX_UID = 65534
RUNTIME_MOUNT = "/opt/envfactory-runtime"  # where the runtime package appears inside the sandbox
UNSAFE_FLAG = "ENVFACTORY_UNSAFE_NO_OS_SANDBOX"

# Denied for the whole life of the process, from before the interpreter starts.
_ALWAYS_DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "personality",
    "mknod",
    "mknodat",
    "lookup_dcookie",
    "vhangup",
)
# Denied once the worker's trusted start-up is over: no new program, process, thread, signal or socket.
_WORKER_DENIED = (
    "execve",
    "execveat",
    "fork",
    "vfork",
    "clone",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
)


class SandboxUnavailable(EnvFactoryError):
    """No OS boundary for untrusted code on this machine, and the unsafe opt-out was not given."""


class Wall(BaseModel):
    """How untrusted processes are wrapped on this machine."""

    kind: str  # "bubblewrap" or "none" (the explicit unsafe opt-out)
    bwrap: str | None = None
    reason: str = ""  # why there is no OS sandbox (kind "none")


def _seccomp_program(names: tuple[str, ...]) -> bytes:
    """A BPF program (libseccomp) that fails each of `names` with EPERM; `clone3` with ENOSYS so
    libc falls back to `clone`, which the worker's filter then denies."""
    import pyseccomp

    f = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in names:
        try:
            f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):  # a syscall this architecture does not have (fork on aarch64)
            continue
    if "clone" in names:
        f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


@functools.cache
def startup_filter() -> bytes:
    """The filter bwrap loads before the interpreter starts."""
    return _seccomp_program(_ALWAYS_DENIED)


@functools.cache
def worker_filter() -> bytes:
    """The filter the worker loads after its trusted start-up, before any untrusted code."""
    return _seccomp_program(_ALWAYS_DENIED + _WORKER_DENIED)


def runtime_root() -> Path:
    """The folder holding the `envfactory` package (bound read-only into the sandbox)."""
    return Path(__file__).resolve().parents[3]


def _ro_binds() -> list[str]:
    """Read-only views: shared libraries, the interpreter and its packages, the runtime package."""
    paths: set[str] = set()
    for p in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/share/zoneinfo", "/etc/ld.so.cache"):
        if os.path.exists(p):
            paths.add(p)
    for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(p)
        if real != "/usr" and not real.startswith("/usr/lib"):  # /usr/bin and friends stay out
            paths.add(real)
        if p != real:
            paths.add(p)
    out: list[str] = []
    for p in sorted(paths):
        out += ["--ro-bind", p, p]
    out += ["--ro-bind", str(runtime_root() / "envfactory"), f"{RUNTIME_MOUNT}/envfactory"]
    return out


def _symlinks() -> list[str]:
    """Merged-/usr distributions link /lib to usr/lib: the loader looks there."""
    out: list[str] = []
    for name in ("lib", "lib64", "lib32"):
        link = f"/{name}"
        if os.path.islink(link):
            out += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            out += ["--ro-bind", link, link]
    return out


def child_env(*, wrapped: bool) -> dict[str, str]:
    """A scrubbed environment: no API keys or settings reach generated code; a fixed hash seed."""
    return {
        "PATH": "/nonexistent",
        "PYTHONPATH": RUNTIME_MOUNT if wrapped else str(runtime_root()),
        "PYTHONHASHSEED": "0",  # set iteration order is part of a deterministic tool's behaviour
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
    }


def bwrap_args(bwrap: str, *, tmpfs_mb: int, seccomp_fd: int | None) -> list[str]:
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    for key, value in child_env(wrapped=True).items():
        args += ["--setenv", key, value]
    args += _ro_binds() + _symlinks()
    args += ["--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    args += ["--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args


def _unsafe_opt_out() -> bool:
    return os.environ.get(UNSAFE_FLAG, "").strip().lower() in ("1", "true", "yes")


@functools.cache
def _probe(bwrap: str | None) -> str | None:
    """None when bubblewrap can start a sandboxed interpreter here; else why not."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        import pyseccomp  # noqa: F401  (libseccomp must be loadable to build the filters)
    except (ImportError, RuntimeError, OSError) as e:
        return f"libseccomp is not usable ({e}); install libseccomp2 and the pyseccomp package"
    cmd = [*bwrap_args(bwrap, tmpfs_mb=1, seccomp_fd=None), sys.executable, "-I", "-c", "pass"]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start: {e}"
    if done.returncode != 0:
        last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        return f"bubblewrap cannot create a sandbox here (exit {done.returncode}: {last})"
    return None


def wall(*, unsafe_no_os_sandbox: bool = False) -> Wall:
    """The OS boundary this machine offers, or `SandboxUnavailable` with what to do about it.

    `unsafe_no_os_sandbox` (or ENVFACTORY_UNSAFE_NO_OS_SANDBOX=1) runs untrusted code without one.
    """
    bwrap = shutil.which("bwrap")
    why = _probe(bwrap)
    if why is None:
        return Wall(kind="bubblewrap", bwrap=bwrap)
    if unsafe_no_os_sandbox or _unsafe_opt_out():
        return Wall(kind="none", reason=why)
    raise SandboxUnavailable(
        f"untrusted generated code needs an OS sandbox and {why}: install bubblewrap (Debian/Ubuntu: "
        "apt-get install bubblewrap; it needs user namespaces or root), review and trust the environment "
        f"(envfactory envs trust NAME), or set {UNSAFE_FLAG}=1 to run it with Python-level guards only (UNSAFE)"
    )
