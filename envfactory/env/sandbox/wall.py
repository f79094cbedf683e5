"""The OS boundary around untrusted code: bubblewrap namespaces and a seccomp syscall filter.

Python-level checks (the AST policy, guarded builtins) are a filter: pydantic, dataclasses and copy
run with the real builtins, so hostile code can reach them. The wall is the kernel. Every process
that runs untrusted code is started through `wrap()`:

- **bubblewrap** (`bwrap`): its own user namespace (uid 65534 inside, and *outside* too: bwrap
  never runs as root — started by root, it is dropped to `nobody` first, see `_root_launch`), PID
  namespace with the worker itself as PID 1 (no bwrap init process beside it to take over), mount,
  IPC, UTS, cgroup and network namespaces (so runs cannot see or signal each other, and no
  connection leaves); a new root holding read-only binds of only what the worker needs — the
  interpreter, its site-packages, the `envfactory` runtime package, the system's shared libraries —
  remounted read-only, with a read-only /proc and /dev and a private size-limited tmpfs at /tmp as
  the only writable place; all capabilities dropped; no further user namespaces; a new terminal
  session; the environment cleared; it dies with its parent.
- **seccomp**, twice: bwrap loads a filter before the interpreter starts (no mounting, ptrace,
  namespaces, kernel keys, bpf, module loading...), and the worker, once its trusted start-up is
  done and before it reads any untrusted code, loads a second one that also forbids `execve`,
  `fork`/`clone` (no processes, no threads), `kill` and friends, sockets, and armed timers (`alarm`,
  `setitimer`, `timer_settime`, `timerfd_*`: nothing can wake the worker up while it is idle). Both programs are
  compiled here with libseccomp (`pyseccomp`); the worker installs its program with one `prctl`.

Where bubblewrap is missing or does not work, untrusted code is refused with a message saying how
to get it, unless the user sets `ENVFACTORY_UNSAFE_NO_OS_SANDBOX=1`: then the worker runs as a
plain subprocess with the best it can do alone (seccomp, rlimits, a network namespace and `nobody`
when root, the Python filter) — and the isolation report says so.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import itertools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from envfactory.errors import EnvError

SANDBOX_UID = 65534
_UID_BASE = 1_000_000_000  # host uids of workers started by root: far above any account's
_TMP_INODES = 4096  # files the worker's /tmp may hold: an inode costs kernel memory no size limit counts
_PR_SET_PDEATHSIG = 1
_F_SETOWN, _F_SETSIG, _F_SETOWN_EX = 8, 10, 15
_F_SETPIPE_SZ = 1031
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
# Denied once the worker's trusted start-up is over: no new program, process, thread, signal, socket or
# timer, and no memory outside the address-space limit (shared memory, memfd, message queues are not counted).
_WORKER_DENIED = (
    "memfd_create",
    "memfd_secret",
    "shmget",
    "shmat",
    "msgget",
    "semget",
    "mq_open",
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
    # no timers armed: a signal or a wake-up the worker sets for itself would run code while it is idle (the
    # trusted worker needs none: it blocks on its pipe, and the parent holds every clock). A POSIX timer may
    # be created (a per-uid counter another sandbox must not starve: tests/system/test_attacks_more.py) but not set.
    "alarm",
    "setitimer",
    "timer_settime",
    "timerfd_create",
    "timerfd_settime",
)


class SandboxUnavailable(EnvError):
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
        # a parent-death signal cleared would let the worker outlive us; an fcntl owner would route a
        # signal (even SIGKILL) to another process past the kill rules; a pipe grown to 1 MiB pins kernel
        # memory the address-space limit does not count (64 descriptors: ~30 MB a worker; 64 KiB pipes: 2 MB)
        f.add_rule(pyseccomp.ERRNO(errno.EPERM), "prctl", pyseccomp.Arg(0, pyseccomp.EQ, _PR_SET_PDEATHSIG))
        for cmd in (_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETPIPE_SZ):
            for call in ("fcntl", "fcntl64"):
                with contextlib.suppress(OSError, ValueError):
                    f.add_rule(pyseccomp.ERRNO(errno.EPERM), call, pyseccomp.Arg(1, pyseccomp.EQ, cmd))
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


def _ro_binds() -> list[tuple[str, str]]:
    """Read-only views (source, destination): shared libraries, the interpreter and its packages, the runtime."""
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
    executable = os.path.realpath(sys.executable)
    if not any(executable.startswith(d.rstrip("/") + "/") for d in paths):
        paths.add(executable)  # a system interpreter in /usr/bin: the file alone
    kept = [p for p in sorted(paths) if not any(p.startswith(q.rstrip("/") + "/") for q in paths if q != p)]
    out = [(p, p) for p in kept]
    out.append((str(runtime_root() / "envfactory"), f"{RUNTIME_MOUNT}/envfactory"))
    return out


def _nobody_can_read(path: str) -> bool:
    """Every folder above `path` is searchable by others and `path` itself readable (and searchable)."""
    p = Path(path)
    try:
        for parent in reversed(p.parents):
            if not os.stat(parent).st_mode & 0o001:
                return False
        mode = os.stat(p).st_mode
    except OSError:
        return False
    need = 0o005 if stat.S_ISDIR(mode) else 0o004
    return mode & need == need


_STAGE_PREFIX = "envfactory-stage-"
_stage: str | None = None
_uid_counter = itertools.count()


def _safe_stage(path: str) -> bool:
    """Ours: a real folder (not a link), owned by root, writable by nobody else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _sweep_stages() -> None:
    """Stage folders of parents that were killed (their pid is in the name) are removed."""
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.startswith(_STAGE_PREFIX):
                continue
            pid = name[len(_STAGE_PREFIX) :].split("-", 1)[0]
            path = os.path.join(base, name)
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and _safe_stage(path):
                shutil.rmtree(path, ignore_errors=True)


def _stage_root() -> str:
    """An empty, root-owned folder, checked on every launch (a /tmp cleaner may remove it, another user
    may recreate the name): the launcher mounts a private tmpfs over it, so nothing is ever in it."""
    global _stage
    if _stage is None or not _safe_stage(_stage):
        if _stage is None:
            _sweep_stages()
        _stage = tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-")
        os.chmod(_stage, 0o755)
        atexit.register(shutil.rmtree, _stage, True)
    return _stage


_UID_SLOTS = 1000  # host uids per parent process
_UID_HELD_S = 5.0  # a uid handed out this recently, not yet seen in /proc, counts as taken (its worker is starting)
_uid_lock = threading.Lock()
_uid_handed: dict[int, float] = {}


def real_uid(pid: int | str) -> int | None:
    """Process `pid`'s real uid as the host sees it (from /proc: nested user namespaces make a process's own view
    relative), or None where it cannot be read (gone, or not readable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _uids_in_use(lo: int, hi: int) -> set[int]:
    """The real uids in [lo, hi) some process has now, read from /proc."""
    used: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (uid := real_uid(entry.name)) is not None and lo <= uid < hi:
                used.add(uid)
    return used


def _host_uid() -> int:
    """A host uid of its own for each worker (no account has it): no two sandboxes, and no other process,
    share a uid, so none can read another's memory through /proc or use up its per-uid kernel quotas.

    A parent has `_UID_SLOTS` of them; after that many starts a slot is reused only when no process holds its
    uid (a long-lived worker keeps its own while others come and go) and it was not handed out in the last
    `_UID_HELD_S` to a worker not yet seen running (`setpriv` takes the uid within milliseconds of the launch)."""
    base = _UID_BASE + (os.getpid() % 1_000_000) * _UID_SLOTS
    with _uid_lock:
        n = next(_uid_counter)
        now = time.monotonic()
        taken = _uids_in_use(base, base + _UID_SLOTS) if n >= _UID_SLOTS else set()
        for uid, at in list(_uid_handed.items()):
            if now - at > _UID_HELD_S or uid in taken:  # up (/proc covers it from now on), or long since started
                del _uid_handed[uid]
        for k in range(_UID_SLOTS):
            uid = base + (n + k) % _UID_SLOTS
            if uid not in taken and uid not in _uid_handed:
                _uid_handed[uid] = now
                return uid
    raise SandboxUnavailable(
        f"every one of this process's {_UID_SLOTS} sandbox uids is held by a running worker or one starting "
        f"(started in the last {_UID_HELD_S:g} s): too many sandboxed workers at once"
    )


# Run as root by the parent. In a private mount namespace: a tmpfs over the stage folder; the worker's
# /tmp as a tmpfs with a size *and* an inode limit; the bind sources `nobody` cannot reach (an
# interpreter under /root) staged in it; then become the worker's own uid and exec bwrap.
_ROOT_LAUNCHER = """set -e
stage=$1; tmp_options=$2; uid=$3; n=$4; shift 4
mount -t tmpfs -o size=1m,nr_inodes=1024,mode=0755 envfactory-stage "$stage"
mkdir "$stage/tmp"
mount -t tmpfs -o "$tmp_options" envfactory-tmp "$stage/tmp"
i=0
while [ "$i" -lt "$n" ]; do
  if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi
  mount --bind "$1" "$stage/$i"
  shift; i=$((i+1))
done
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all -- "$@"
"""


def _root_launch(binds: list[tuple[str, str]], tmpfs_mb: int) -> tuple[list[str], list[tuple[str, str]], str]:
    """The command prefix that drops root before bwrap, the binds rewritten to staged sources, and the /tmp source.

    Started by root, bwrap would map the sandbox uid to host uid 0: kernel settings under /proc/sys
    check the uid only. Dropped to an unused uid first, bwrap makes an unprivileged user namespace
    whose 65534 is that uid on the host.
    """
    stage = _stage_root()
    staged: list[tuple[str, str]] = []
    sources: list[str] = []
    for source, dest in binds:
        if _nobody_can_read(source):
            staged.append((source, dest))
        else:
            staged.append((os.path.join(stage, str(len(sources))), dest))
            sources.append(source)
    tmp_options = f"size={tmpfs_mb}m,nr_inodes={_TMP_INODES},mode=1777"
    uid = str(_host_uid())
    prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _ROOT_LAUNCHER, "sh"]
    prefix += [stage, tmp_options, uid, str(len(sources)), *sources]
    return prefix, staged, os.path.join(stage, "tmp")


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


def bwrap_args(bwrap: str, *, tmpfs_mb: int, seccomp_fd: int | None, info_fd: int | None = None) -> list[str]:
    """The whole command line up to the sandboxed program (a root launcher first when we are root)."""
    binds = _ro_binds()
    prefix: list[str] = []
    tmp: list[str] = ["--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    if os.geteuid() == 0:
        prefix, binds, tmp_source = _root_launch(binds, tmpfs_mb)
        tmp = ["--bind", tmp_source, "/tmp"]
    args = [
        *prefix,
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",
        "--as-pid-1",
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
    # the private /tmp first: a bind below /tmp (an interpreter or venv under /tmp) then shows on top of it
    args += tmp
    for source, dest in binds:
        args += ["--ro-bind", source, dest]
    args += _symlinks()
    # /proc read-only; /dev holds four character devices and nothing else (no ptys, no shm)
    args += ["--proc", "/proc", "--remount-ro", "/proc", "--dir", "/dev"]
    for dev in ("null", "zero", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    args += ["--remount-ro", "/", "--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args


def _unsafe_opt_out() -> bool:
    return os.environ.get(UNSAFE_FLAG, "").strip().lower() in ("1", "true", "yes")


@functools.cache
def _probe(bwrap: str | None) -> str | None:
    """None when bubblewrap can start a sandboxed interpreter here; else why not."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0 and not all(shutil.which(t) for t in ("unshare", "mount", "setpriv")):
        return "util-linux's unshare, mount and setpriv are needed to start it as nobody when running as root"
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


def find_wall(*, unsafe_no_os_sandbox: bool = False) -> Wall:
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
