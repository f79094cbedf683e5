"""The parent's handle on one sandboxed worker process: start it behind the wall, ask it, kill it.

Every answer is read with a deadline and parsed defensively (`wire.py`); a late, oversized,
malformed or out-of-order answer, or a worker that exits, raises `WorkerDied` and leaves the
worker killed. Nothing the worker does can make the parent raise anything else or wait longer
than the deadline it chose.

The parent also watches the worker's CPU from outside (its host pid's `/proc/<pid>/schedstat`, held
open from start-up, so no pid reuse can misdirect it): an idle worker, one with no request
outstanding, uses none. CPU spent between the end of one answer and the next request (measured when
that request is sent) or while it sits idle (measured by one light monitor thread, every
`MONITOR_PERIOD_S`, for the workers started with `monitor=True`) beyond `IDLE_CPU_TOLERANCE_S` kills
it as `WorkerDied("idle")`: code that arranged to run between requests (a timer, a patched read loop)
is ended, never just replaced. Nothing the worker does can hide it: every thread it could have is
counted in the same figure, and it has no children.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from envfactory.env.sandbox.protocol import Hello, Isolation, WorkerLimits
from envfactory.env.sandbox.wall import Wall, bwrap_args, child_env, real_uid, startup_filter, worker_filter
from envfactory.env.sandbox.wire import FrameReader, WireError, decode, encode, write_frame
from envfactory.errors import EnvError

DeathKind = Literal["timeout", "memory", "crashed", "protocol", "idle"]
_TAIL_BYTES = 4000
IDLE_CPU_TOLERANCE_S = 0.05  # CPU an idle worker may show: the tail of its last answer, clock granularity
MONITOR_PERIOD_S = 1.0  # how often the monitor looks at idle workers
_CLK_TCK = os.sysconf("SC_CLK_TCK")

# bwrap's --die-with-parent is tied to the *thread* that started it: a worker started from a
# short-lived thread (a server's thread pool) would die with that thread. One long-lived thread
# starts them all, so they die with the process and only with it.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envfactory-sandbox-spawner")


class WorkerDied(EnvError):
    """The worker is gone (killed by us or by a limit, or it exited); `kind` says how, `detail` why."""

    def __init__(self, kind: DeathKind, detail: str) -> None:
        super().__init__(detail)
        self.kind: DeathKind = kind
        self.detail = detail


class _InFlight:
    """How many requests this process has out to workers or waiting for one, over all threads."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def enter(self) -> bool:
        """Count one more; True when it is the only one out."""
        with self._lock:
            self._count += 1
            return self._count == 1

    def leave(self) -> None:
        with self._lock:
            self._count -= 1


_IN_FLIGHT = _InFlight()


class ChannelLimits(BaseModel):
    """What the parent accepts from a worker, and how long both sides poll the pipe (`FrameReader`)."""

    max_answer_bytes: int = 32 * 1024 * 1024
    max_depth: int = 100
    max_containers: int = 1_000_000  # arrays and objects in one answer: bounds the parent's parsing work
    max_values: int = 2_000_000  # values in one answer (~60 bytes each in the parent once parsed)
    start_timeout_s: float = 20.0
    spin_us: int = Field(default=0, ge=0, le=10_000)  # both sides poll the pipe this long before sleeping on it


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


class SandboxProcess:
    """One worker behind the wall. `start()`, then `request(op, ..., timeout_s=...)`; `kill()` at the end."""

    def __init__(
        self,
        wall: Wall,
        limits: WorkerLimits,
        *,
        tmpfs_mb: int = 16,
        channel: ChannelLimits | None = None,
        monitor: bool = False,
    ):
        self.wall = wall
        self.limits = limits
        self.tmpfs_mb = tmpfs_mb
        self.channel = channel or ChannelLimits()
        self.proc: subprocess.Popen[bytes] | None = None
        self.isolation: Isolation | None = None
        self._log: IO[bytes] | None = None
        self._info: int | None = None  # bwrap's --info-fd: the worker's pid on the host
        self.child_pid: int | None = None
        self._pidfd: int | None = None  # the worker, held from start-up: no pid reuse can misdirect the kill
        self._reader: FrameReader | None = None
        self._next_id = 0
        self._lock = threading.Lock()
        # the thread with a request out (None: none): another thread's close kills the worker but leaves the pipes
        # to it, which reads the end of the worker's output and closes them (closed under a reading thread, a pipe's
        # descriptor number could be another worker's by its next read)
        self._asking: int | None = None
        self._pipes_left = False
        self.died: WorkerDied | None = None
        self._closing = False
        self.monitor = monitor  # watched while idle by the monitor thread (pooled workers)
        self.on_idle_cpu: Callable[[WorkerDied], None] | None = None  # told when the monitor ends it
        self._cpu_fd: int | None = None  # /proc/<host pid>/schedstat (or stat), opened while it is alive
        self._cpu_schedstat = True
        self._idle_base: int | None = None  # its CPU (ns) when it last answered; None while a request is out
        self._idle_at = 0.0  # when it last answered (monotonic)
        self.cpu_ns = 0  # its CPU so far (ns), as last read

    # ---- life ------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.died is None and self.proc.poll() is None

    def _command(self) -> tuple[list[str], tuple[int, ...], dict[str, str] | None, str | None]:
        inner = [sys.executable, "-P", "-s", "-m", "envfactory.env.sandbox.worker"]
        if self.wall.kind == "bubblewrap" and self.wall.bwrap:
            r, w = os.pipe()
            os.write(w, startup_filter())  # a few KB: fits the pipe buffer
            os.close(w)
            info_r, info_w = os.pipe()
            self._info = info_r
            args = bwrap_args(self.wall.bwrap, tmpfs_mb=self.tmpfs_mb, seccomp_fd=r, info_fd=info_w)
            return [*args, *inner], (r, info_w), None, None
        return inner, (), child_env(wrapped=False), tempfile.gettempdir()

    def start(self) -> Isolation:
        """Start the worker and complete its trusted start-up; `WorkerDied` if it does not come up clean."""
        cmd, fds, env, cwd = self._command()
        self._log = tempfile.TemporaryFile(prefix="envfactory-sandbox-")  # noqa: SIM115 - lives as long as the worker
        log = self._log

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                pass_fds=fds,
                env=env if env is not None else {},
                cwd=cwd,
                start_new_session=True,
            )

        try:
            self.proc = _SPAWNER.submit(spawn).result()
            assert self.proc.stdout is not None and self.proc.stdin is not None
            self._reader = FrameReader(self.proc.stdout.fileno(), self.channel.spin_us / 1e6)
            os.set_blocking(self.proc.stdin.fileno(), False)  # writes wait under the request's deadline
        except OSError as e:
            raise WorkerDied("crashed", f"the sandbox could not start: {e}") from None
        finally:
            for fd in fds:
                os.close(fd)
        hello = Hello(
            limits=self.limits,
            seccomp_bpf=base64.b64encode(worker_filter()).decode("ascii"),
            wrapped=self.wall.kind == "bubblewrap",
            spin_us=self.channel.spin_us,
        )
        reply = self._exchange(hello.model_dump(mode="json"), self.channel.start_timeout_s)
        if "isolation" not in reply:
            self.kill()
            raise WorkerDied("crashed", str(reply.get("failure") or "the worker did not report its isolation"))
        try:
            self.isolation = Isolation.model_validate(reply["isolation"])
        except ValidationError as e:
            self.kill()
            raise WorkerDied(
                "protocol", f"the worker's isolation report is malformed: {e.errors()[0]['msg']}"
            ) from None
        self._read_child_pid()
        if self.wall.kind == "bubblewrap":
            self.isolation.outside_uid = self._host_uid()
        problems = self.isolation.problems()
        if problems:
            self.kill()
            raise WorkerDied("crashed", "the sandbox is not in place: " + "; ".join(problems))
        self._open_cpu()
        self._idle_base, self._idle_at = self._cpu_now(), time.monotonic()
        if self.monitor:
            _MONITOR.add(self)
        return self.isolation

    # ---- CPU, read from outside --------------------------------------------------------------
    @property
    def host_pid(self) -> int | None:
        """The worker's pid on the host: bwrap's child under bubblewrap, else the process started."""
        return self.child_pid if self.wall.kind == "bubblewrap" else (self.proc.pid if self.proc else None)

    def _open_cpu(self) -> None:
        host_pid = self.host_pid
        if host_pid is None:
            return
        for name, schedstat in (("schedstat", True), ("stat", False)):
            try:
                self._cpu_fd = os.open(f"/proc/{host_pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            self._cpu_schedstat = schedstat
            if self._cpu_now() is not None:
                return
            os.close(self._cpu_fd)
            self._cpu_fd = None

    def _cpu_now(self) -> int | None:
        """The worker's CPU time so far in ns (every thread of it), or None when it cannot be read."""
        fd = self._cpu_fd
        if fd is None:
            return None
        try:
            data = os.pread(fd, 1024, 0)
            if self._cpu_schedstat:
                value = int(data.split(maxsplit=1)[0])
            else:  # utime and stime, in clock ticks, after the command name
                fields = data.rsplit(b")", 1)[1].split()
                value = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _CLK_TCK
        except (OSError, ValueError, IndexError):
            return None
        self.cpu_ns = value
        return value

    @property
    def cpu_s(self) -> float:
        """CPU seconds the worker has used, as last read (at its last answer)."""
        return self.cpu_ns / 1e9

    def _idle_tolerance_ns(self) -> int:
        tick = 0 if self._cpu_schedstat else 3 * 1_000_000_000 // _CLK_TCK
        return max(int(IDLE_CPU_TOLERANCE_S * 1e9), tick)

    def _idle_violation(self) -> str | None:
        """Why the worker must end: it used CPU since its last answer (the lock held, no request out)."""
        base = self._idle_base
        if base is None or time.monotonic() - self._idle_at < IDLE_CPU_TOLERANCE_S:
            return None  # (idle for less than the tolerance: it cannot have used more; no read needed)
        now = self._cpu_now()
        if now is None or now - base <= self._idle_tolerance_ns():
            return None
        return (
            f"the worker used {(now - base) / 1e9:.2f} s of CPU while it had no request to answer "
            "(code running between calls: a timer, a loop around its pipe); an idle worker uses none"
        )

    def poll_idle(self) -> WorkerDied | None:
        """The monitor's look at an idle worker: ended (its death returned) if it used CPU. A worker busy
        with a request is skipped: that CPU is the request's, bounded by the request's deadline."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self.died is not None or not self.alive:
                return None
            why = self._idle_violation()
            return self._die("idle", why) if why is not None else None
        finally:
            self._lock.release()

    def _read_child_pid(self) -> None:
        """bwrap's info (JSON with "child-pid"): the worker itself, killed directly, whatever it did to its
        parent-death signal."""
        if self._info is None:
            return
        try:
            ready, _, _ = select.select([self._info], [], [], 2.0)
            data = os.read(self._info, 4096) if ready else b""
            self.child_pid = int(json.loads(data.decode("utf-8"))["child-pid"])
            self._pidfd = os.pidfd_open(self.child_pid)
        except (OSError, ValueError, KeyError, TypeError):
            self.child_pid = None
        finally:
            os.close(self._info)
            self._info = None

    def _host_uid(self) -> int | None:
        """The worker's real uid as the host sees it (nested user namespaces make the inside view relative)."""
        return None if self.child_pid is None else real_uid(self.child_pid)

    def kill(self) -> None:
        self._idle_base = None
        if self._cpu_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._cpu_fd)
            self._cpu_fd = None
        proc = self.proc
        if proc is None:
            return
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        asking = self._asking
        if asking is not None and asking != threading.get_ident():
            self._pipes_left = True  # (the asking thread closes them: `_request`)
            return
        self._close_pipes(proc)

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[union-attr]

    def close(self) -> None:
        """Kill the worker and drop its log."""
        self._closing = True
        self.kill()
        if self._info is not None:
            with contextlib.suppress(OSError):
                os.close(self._info)
            self._info = None
        if self.died is None:
            self.died = WorkerDied("crashed", "the worker was closed")
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    def stderr_tail(self) -> str:
        log = self._log
        if log is None:
            return ""
        try:
            size = os.fstat(log.fileno()).st_size
            data = os.pread(log.fileno(), _TAIL_BYTES, max(0, size - _TAIL_BYTES))
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    # ---- asking ----------------------------------------------------------------------------
    def request(self, op: str, timeout_s: float, closed: Iterable[int] = (), **fields: Any) -> dict[str, Any]:
        """Send one request and return the worker's answer (a dict); `WorkerDied` when there is none.

        Every request has the same shape, whoever sends it: op, id, the sessions `closed` since the last
        one, then its own fields. A worker that used CPU since its last answer is ended first ("idle").

        The parent polls for a call's answer (the fast, frequent request) only while it has no other request out
        or waiting for a worker (`_IN_FLIGHT`, counted before the worker's lock): with others, a polling thread
        would take the CPU (and the GIL) those need."""
        alone = _IN_FLIGHT.enter()
        try:
            return self._request(op, timeout_s, closed, fields, spin=alone and op == "call")
        finally:
            _IN_FLIGHT.leave()

    def _request(
        self, op: str, timeout_s: float, closed: Iterable[int], fields: dict[str, Any], *, spin: bool
    ) -> dict[str, Any]:
        with self._lock:
            if self.died is not None:
                raise self.died
            why = self._idle_violation()
            if why is not None:
                raise self._die("idle", why)
            self._next_id += 1
            rid = self._next_id
            self._idle_base = None
            self._asking = threading.get_ident()
            try:
                reply = self._exchange({"op": op, "id": rid, "closed": list(closed), **fields}, timeout_s, spin=spin)
            finally:
                self._asking = None
                if self._pipes_left and self.proc is not None:  # closed by another thread meanwhile
                    self._pipes_left = False
                    self._close_pipes(self.proc)
            if self.died is not None:  # closed by another thread while its answer came: not served
                raise self.died
            if type(reply.get("id")) is not int or reply["id"] != rid:  # (True and 1.0 equal 1)
                raise self._die("protocol", f"the worker answered request {reply.get('id')!r}, not {rid}")
            self._idle_base, self._idle_at = self._cpu_now(), time.monotonic()
            return reply

    def _exchange(self, message: dict[str, Any], timeout_s: float, spin: bool = False) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and self._reader is not None
        deadline = time.monotonic() + timeout_s
        try:
            frame = encode(message)
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"the request cannot be encoded as JSON: {e}") from None
        try:
            left = self._reader.unasked()
        except (OSError, ValueError):  # its pipe closed already
            raise self._die("crashed", "the worker is gone") from None
        if left == "data":
            raise self._die("protocol", "the worker sent a frame no request asked for")
        if left == "eof":
            raise self._die("crashed", "the worker exited")
        try:
            write_frame(proc.stdin.fileno(), frame, deadline)
        except WireError:
            raise self._die("timeout", f"the worker did not take the request within {timeout_s:g} s") from None
        except (BrokenPipeError, OSError):
            raise self._die("crashed", "the worker is gone") from None
        try:
            body = self._reader.read(max_bytes=self.channel.max_answer_bytes, deadline=deadline, spin=spin)
            reply = decode(body, self.channel.max_depth, self.channel.max_containers, self.channel.max_values)
        except WireError as e:
            if e.kind == "timeout":
                raise self._die("timeout", f"no answer within {timeout_s:g} s") from None
            if e.kind == "eof":
                raise self._die("crashed", "the worker exited") from None
            raise self._die("protocol", str(e)) from None
        except (OSError, ValueError):  # its pipe closed under the read (a close from another thread before it was
            raise self._die("crashed", "the worker is gone") from None  # kept from doing so)
        if not isinstance(reply, dict):
            raise self._die("protocol", "the worker's answer is not a JSON object")
        if time.monotonic() > deadline + 0.5:  # an answer sent at the last moment and slow to parse
            raise self._die("timeout", f"no usable answer within {timeout_s:g} s")
        return reply

    def _die(self, kind: DeathKind, detail: str) -> WorkerDied:
        """Kill the worker and say how it ended (an exit by a signal or a limit refines `kind`)."""
        proc = self.proc
        if self._closing:
            kind, detail = "crashed", "the worker was closed while it was being asked"
        elif kind == "crashed" and proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            rc = proc.returncode
            if rc is not None:
                kind, detail = _exit_meaning(rc, detail)
        self.kill()
        self.died = WorkerDied(kind, detail)
        return self.died


def _exit_meaning(rc: int, detail: str) -> tuple[DeathKind, str]:
    # bwrap reports a child killed by signal N as exit 128+N; a direct child shows -N
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
    if sig == signal.SIGXCPU:
        return "timeout", "the worker used its CPU time limit (SIGXCPU)"
    if sig == signal.SIGKILL:
        return "memory", "the worker was killed (SIGKILL), most likely out of memory"
    if sig:
        return "crashed", f"the worker died from signal {_signal_name(sig)}"
    return "crashed", f"{detail} (exit code {rc})"


class _IdleMonitor:
    """One daemon thread that looks at every monitored worker while it is idle; it ends when none is left."""

    def __init__(self) -> None:
        self._procs: weakref.WeakSet[SandboxProcess] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, process: SandboxProcess) -> None:
        with self._lock:
            self._procs.add(process)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="envfactory-sandbox-idle-monitor", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(MONITOR_PERIOD_S)
            with self._lock:
                procs = [p for p in self._procs if p.died is None and p.alive]
                if not procs:
                    self._thread = None
                    return
            for p in procs:
                died = p.poll_idle()
                callback = p.on_idle_cpu
                if died is not None and callback is not None:
                    with contextlib.suppress(Exception):
                        callback(died)


_MONITOR = _IdleMonitor()


def workers_resident_mb() -> float:
    """The resident memory of this process's live sandboxed workers (every monitored one: pooled and spare), in MB,
    read from /proc: a server's memory budget counts them (they are processes of their own)."""
    with _MONITOR._lock:
        procs = [p for p in _MONITOR._procs if p.died is None]
    pages = 0
    for p in procs:
        pid = p.host_pid
        if pid is None:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm", "rb") as fh:
            pages += int(fh.read().split()[1])
    return pages * _PAGE / 2**20


_PAGE = os.sysconf("SC_PAGE_SIZE")
