"""Attack suite, second round: the root launcher, the shared host uid, kernel memory, the parent's own
resources and clocks, and the runtime pool.

Same premise as tests/system/test_attacks.py (whose harness this reuses): generated code holds the real
builtins and the worker's own objects. What is tested here is what the first round did not reach:
what the worker holds and sees of the launcher, what two sandboxes (and the host's own `nobody`)
share, kernel memory no rlimit counts, and whether the parent's clocks and memory hold against a
worker that answers early, answers wide, or stops reading. Holes this round found, now closed and
kept as tests: every sandbox ran as host uid 65534 (a host `nobody` could read a worker's memory,
sandboxes shared per-uid quotas); semaphores and tmpfs inodes pinned kernel memory; a worker that
stopped reading hung the parent's blocking write; a sleeping import stalled every other environment's
load; a session restore replayed every call at full call limits; a stage folder in /tmp was used
without checking its owner; one wide answer cost a session without bound.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import envfactory.env.sandboxed as sandboxed
from envfactory.config import Settings
from envfactory.env.metadata import EnvMetadata
from envfactory.env.pool import EnvPool
from envfactory.env.sandbox import SandboxLimits, parse_observations
from envfactory.env.sandbox.process import SandboxProcess
from envfactory.env.sandbox.protocol import WorkerLimits
from envfactory.env.sandbox.wall import _stage_root, bwrap_args, find_wall
from envfactory.env.sandbox.wire import decode
from envfactory.env.sandboxed import SandboxedEnvironment, SandboxedSession
from envfactory.env.session import Session
from envfactory.envgen.checks import ExpectedCall, judge
from envfactory.envgen.checks.sandbox_round import SandboxResult, run_checks_in_sandbox
from envfactory.errors import EnvLoadError, ScenarioError
from tests.system.test_attacks import (
    AS_ROOT,
    ATTACK_STEP,
    SLACK_S,
    hostile_env,
    meta,  # noqa: F401 - the module-scoped fixture: the hostile module's metadata
    run_attack,
    run_round,
    scenario,
)

HAS_SETPRIV = shutil.which("setpriv") is not None
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
NO_PTRACE_AT_ALL = _YAMA.is_file() and _YAMA.read_text(encoding="ascii").strip() == "3"
PING = ExpectedCall(tool="ping", expect_result="pong")
WORKER_LIMITS = WorkerLimits(memory_mb=256, cpu_s=30, fsize_mb=8)

# ---- harness ----------------------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path, meta: EnvMetadata) -> Iterator[Callable[..., SandboxedEnvironment]]:  # noqa: F811
    """`make(payload, values, call_timeout_s=..., name=..., at_import=...)`: an untrusted folder loaded from EnvPool.

    A nonce in `values` gives every environment its own code hash, hence its own worker pool (pools are
    shared per code across the process)."""
    made: list[SandboxedEnvironment] = []

    def make(
        payload: str = "",
        values: dict[str, Any] | None = None,
        *,
        call_timeout_s: float = 5.0,
        name: str = "attack",
        at_import: bool = False,
        config: str = '{"hits": 0, "notes": []}',
    ) -> SandboxedEnvironment:
        write_folder(tmp_path, meta, name, hostile_env(payload, values=nonce(values), at_import=at_import), config)
        settings = Settings(
            root=tmp_path, sandbox_memory_mb=256, sandbox_call_timeout_s=call_timeout_s, sandbox_workers=1
        )
        env = EnvPool(settings).get(name)
        assert isinstance(env, SandboxedEnvironment)
        made.append(env)
        return env

    try:
        yield make
    finally:
        for env in made:
            env.pool.shutdown()


def nonce(values: dict[str, Any] | None) -> dict[str, Any]:
    return {**(values or {}), "nonce": secrets.token_hex(6)}


def write_folder(root: Path, metadata: EnvMetadata, name: str, code: str, config: str) -> Path:
    """envs/<name>/ with the code, metadata.json (named after the folder) and one scenario, 'default'."""
    folder = root / "envs" / name
    (folder / "scenarios").mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(code.replace('Environment("attack"', f'Environment("{name}"'), encoding="utf-8")
    data = metadata.model_copy(update={"name": name}).model_dump_json(indent=2)
    (folder / "metadata.json").write_text(data, encoding="utf-8")
    (folder / "scenarios" / "default.json").write_text(config, encoding="utf-8")
    return folder


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SandboxProcess]]:
    """Every SandboxProcess started during the test (killed at the end, whatever the test did)."""
    started: list[SandboxProcess] = []
    real_start = SandboxProcess.start

    def start(self: SandboxProcess) -> Any:
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(SandboxProcess, "start", start)
    try:
        yield started
    finally:
        for process in started:
            process.kill()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `fn` in a daemon thread; the dict gets 'value' or 'error', and 'seconds'."""
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as e:  # reported to the test
            box["error"] = e
        box["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def processes_left(spawned: list[SandboxProcess], within_s: float = 3.0) -> list[int]:
    """The sandbox processes (bwrap or worker) still alive after waiting up to `within_s` for them to go: killed,
    then reaped, which a loaded machine takes its time over."""
    deadline = time.monotonic() + within_s
    while True:
        left = [pid for p in spawned for pid in (p.pid, p.child_pid) if host_process_alive(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def host_process_alive(pid: int | None) -> bool:
    """`pid` still names a live process started by the sandbox (bwrap or the worker), not a zombie."""
    if not pid:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if "\nState:\tZ" in status:
        return False
    return b"bwrap" in cmdline or b"envfactory.env.sandbox.worker" in cmdline


def deep_size(value: Any) -> int:
    """Bytes the parent keeps for a decoded JSON value (containers and their items, recursively)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


# ---- 1. what the worker holds and sees of the launcher ----------------------------------------

INVENTORY_PAYLOAD = """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    def descriptors():
        found = {}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                os.fstat(fd)
            except OSError:
                continue  # the listing's own descriptor, closed by now
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        return found

    def setns_own_user_namespace():
        fd = os.open("/proc/self/ns/user", os.O_RDONLY)
        if libc.setns(fd, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return "entered"
    out["fds"] = descriptors()
    attempt("ppid", os.getppid)
    attempt("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    attempt("tmp", lambda: sorted(os.listdir("/tmp")))
    attempt("mountinfo", lambda: open("/proc/self/mountinfo").read())
    for path in ("/bin/sh", "/usr/bin/setpriv", "/usr/bin/unshare", "/usr/bin/bwrap", "/usr/bin/mount"):
        attempt("exists " + path, lambda p=path: os.path.exists(p))
    for fd in (5, 6, 7, 8, 9, 10):  # where the seccomp and info descriptors would be if bwrap left them open
        attempt(f"read fd {fd}", lambda fd=fd: os.read(fd, 100))
    attempt("reopen the log", lambda: os.open("/proc/self/fd/2", os.O_RDONLY))
    attempt("pids of this process", lambda: open("/proc/self/status").read().split("NSpid:")[1].split("\\n")[0].split())
    attempt("setns own user namespace", setns_own_user_namespace)
"""


def test_the_worker_holds_only_its_pipes_and_log_and_sees_nothing_of_the_launcher(meta: EnvMetadata) -> None:  # noqa: F811
    """The descriptors the worker holds: /dev/null, the log (stderr, also stdout), the request pipe and
    the answer pipe. Not bwrap's seccomp or info descriptor, not a handle on the outer bwrap, the stage
    folder, the launcher's programs or the host's /tmp."""
    _, out = run_attack(INVENTORY_PAYLOAD, meta)
    fds = out["fds"]
    assert set(fds) == {"0", "1", "2", "3", "4"}, fds
    assert fds["0"] == "/dev/null"
    assert fds["1"] == fds["2"] and "(deleted)" in fds["2"], fds  # the parent's unlinked log file
    assert fds["3"].startswith("pipe:[") and fds["4"].startswith("pipe:["), fds
    for fd in (5, 6, 7, 8, 9, 10):
        assert out[f"read fd {fd}"].startswith("OSError: [Errno 9]"), out[f"read fd {fd}"]
    assert out["ppid"] == "OK 0" and out["pids"] == "OK [1]"  # the outer bwrap is in another PID namespace
    assert "envfactory-stage" not in out["mountinfo"] and "envfactory-stage" not in out["tmp"], out["mountinfo"]
    for path in ("/bin/sh", "/usr/bin/setpriv", "/usr/bin/unshare", "/usr/bin/bwrap", "/usr/bin/mount"):
        assert out["exists " + path] == "OK False", (path, out["exists " + path])
    assert out["reopen the log"].startswith("PermissionError"), out["reopen the log"]  # root's 0600 file
    assert out["pids of this process"] == "OK ['1']", out["pids of this process"]  # no host pid visible
    assert out["setns own user namespace"].startswith("PermissionError"), out["setns own user namespace"]


# ---- 2. the stage folder of the root launcher --------------------------------------------------


@pytest.fixture
def stage() -> Iterator[Path]:
    """This process's stage folder; put back as the launcher made it (root's, 0755) after the test."""
    root = Path(_stage_root())
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.mkdir(root, 0o755)
        os.chmod(root, 0o755)


def staged_sources(bwrap: str) -> list[str]:
    args = bwrap_args(bwrap, tmpfs_mb=1, seccomp_fd=None)
    return [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind" and "envfactory-stage-" in args[i + 1]]


def unsafe_owner(path: Path) -> str | None:
    """Why `path` (a folder above a bind source) could be changed by someone other than root."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid != 0:
        return f"{path} belongs to uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others ({oct(st.st_mode & 0o777)})"
    return None


@pytest.mark.skipif(not AS_ROOT, reason="the stage folder exists only when the parent is root")
def test_the_stage_folder_is_roots_alone_and_holds_nothing(stage: Path) -> None:
    wall = find_wall()
    assert wall.bwrap is not None
    sources = staged_sources(wall.bwrap)
    assert sources  # the interpreter under /root is staged
    assert unsafe_owner(stage) is None, unsafe_owner(stage)
    for source in sources:
        assert Path(source).parent == stage
        # staged only inside the launcher's private tmpfs: nothing on the host to swap or pre-create
        assert not Path(source).exists()
    assert stage.name.startswith("envfactory-stage-") and len(stage.name) > len("envfactory-stage-") + 6


@pytest.mark.skipif(not AS_ROOT, reason="the stage folder exists only when the parent is root")
def test_a_stage_folder_taken_over_or_removed_is_replaced(stage: Path) -> None:
    wall = find_wall()
    assert wall.bwrap is not None
    shutil.rmtree(stage)  # a /tmp cleaner aged it out ...
    os.mkdir(stage, 0o755)  # ... and an unprivileged local user (uid 1000 here) took the name
    os.chown(stage, 1000, 1000)
    sources = staged_sources(wall.bwrap)
    fresh = Path(sources[0]).parent
    assert fresh != stage and unsafe_owner(fresh) is None
    shutil.rmtree(fresh)  # removed outright: the next launch makes a new one and works
    process = SandboxProcess(wall, WorkerLimits(memory_mb=256, cpu_s=10, fsize_mb=1))
    try:
        assert process.start().uid == 65534
    finally:
        process.close()


# ---- 3. the shared host uid ------------------------------------------------------------------

READ_WORKER_MEMORY = """
import os, sys
pid, token = int(sys.argv[1]), sys.argv[2].encode()
found = []
mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
for line in open(f"/proc/{pid}/maps"):
    span, perms = line.split()[:2]
    if not perms.startswith("rw"):
        continue
    start, end = (int(x, 16) for x in span.split("-"))
    try:
        if token in os.pread(mem, end - start, start):
            found.append(span)
    except OSError:
        pass
print("uid", os.getuid(), "found", len(found))
"""


@pytest.mark.skipif(not (AS_ROOT and HAS_SETPRIV), reason="needs root to run a helper as the host's nobody")
@pytest.mark.skipif(NO_PTRACE_AT_ALL, reason="Yama ptrace_scope 3: no process may ptrace another")
def test_a_host_process_running_as_nobody_cannot_read_a_worker(runtime: Callable[..., SandboxedEnvironment]) -> None:
    token = f"session-secret-{secrets.token_hex(8)}"
    env = runtime(config=json.dumps({"hits": 0, "notes": [token]}))
    session = Session.fork(env, "default")
    assert session.call("ping").result == "pong"
    assert isinstance(session, SandboxedSession) and session._worker is not None
    pid = session._worker.process.child_pid
    assert pid is not None
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    command = [*as_nobody, sys.executable, "-c", READ_WORKER_MEMORY, str(pid), token]
    helper = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert "found 0" in helper.stdout or helper.returncode != 0, (helper.stdout, helper.stderr[-300:])


PER_UID_HOG = """
    import ctypes
    import time
    libc = ctypes.CDLL(None, use_errno=True)

    def timers():  # each POSIX timer preallocates a queued signal: counted against RLIMIT_SIGPENDING per uid
        made, handle = 0, ctypes.c_void_p()
        while made < 120_000 and libc.timer_create(1, None, ctypes.byref(handle)) == 0:
            made += 1
        return made

    def inotify():  # fs.inotify.max_user_instances, per uid
        made = []
        while len(made) < 50:
            fd = libc.inotify_init()
            if fd < 0:
                break
            made.append(fd)
        return len(made)
    attempt("timers", timers)
    attempt("inotify", inotify)
    time.sleep(values["hold"])
"""

PER_UID_PROBE = """
    import ctypes
    import time
    libc = ctypes.CDLL(None, use_errno=True)
    starved = {}
    end = time.monotonic() + values["window"]
    while time.monotonic() < end and len(starved) < 2:
        handle = ctypes.c_void_p()
        if libc.timer_create(1, None, ctypes.byref(handle)) == 0:
            libc.timer_delete(handle)
        else:
            starved.setdefault("timer_create", os.strerror(ctypes.get_errno()))
        fd = libc.inotify_init()
        if fd >= 0:
            os.close(fd)
        else:
            starved.setdefault("inotify_init", os.strerror(ctypes.get_errno()))
        time.sleep(0.05)
    out["starved"] = starved
"""


@pytest.fixture(scope="module")
def per_uid_round(meta: EnvMetadata) -> dict[str, Any]:  # noqa: F811
    """Three hostile sandboxes take every per-uid timer and inotify instance of host uid 65534 and hold them;
    meanwhile an honest round runs, and a fourth sandbox probes what it can still get."""
    # the call makes ~100k timers (seconds on a loaded machine: 12 s timed out under pytest-xdist), then holds 6 s
    hold = SandboxLimits(timeout_s=26, call_timeout_s=24, memory_mb=256, replay=False)
    hogs = [
        in_thread(
            lambda: run_checks_in_sandbox(
                hostile_env(PER_UID_HOG, values=nonce({"hold": 6})), meta, [scenario(ATTACK_STEP)], hold
            )
        )
        for _ in range(3)
    ]
    time.sleep(1.0)
    honest = scenario(*[PING] * 50, name="honest")
    honest_thread, honest_box = in_thread(
        lambda: run_checks_in_sandbox(hostile_env(values=nonce(None)), meta, [honest], SandboxLimits(timeout_s=12))
    )
    probe_limits = SandboxLimits(timeout_s=12, call_timeout_s=10, memory_mb=256, replay=False)
    _, probe = run_attack(PER_UID_PROBE, meta, values={"window": 4.0}, limits=probe_limits)
    honest_thread.join(30)
    hogged = []
    for thread, box in hogs:
        thread.join(30)
        obs = parse_observations(box["value"].output)
        hogged.append(obs.scenarios[0].steps[0].result if obs and obs.scenarios[0].steps else box["value"].detail)
    return {"honest": honest_box.get("value"), "honest_scenario": honest, "probe": probe, "hogs": hogged}


def test_an_honest_round_passes_while_others_take_every_per_uid_counter(
    per_uid_round: dict[str, Any],
    meta: EnvMetadata,  # noqa: F811
) -> None:
    """What per-uid counters the hogs can fill (queued signals, inotify) is nothing an honest worker needs."""
    result = per_uid_round["honest"]
    assert isinstance(result, SandboxResult), per_uid_round
    report = judge(meta, [per_uid_round["honest_scenario"]], result, 1.0)
    assert result.status == "ok" and report.passed(), (result.status, result.detail, report.summary())
    for hog in per_uid_round["hogs"]:
        assert isinstance(hog, dict) and str(hog["timers"]).startswith("OK"), per_uid_round["hogs"]


def test_a_sandbox_cannot_starve_another_of_per_uid_kernel_counters(per_uid_round: dict[str, Any]) -> None:
    assert per_uid_round["probe"]["starved"] == {}, (per_uid_round["probe"], per_uid_round["hogs"])


# ---- 4. kernel memory no rlimit counts -------------------------------------------------------

KERNEL_MEMORY_PAYLOAD = """
    import ctypes
    import time
    libc = ctypes.CDLL(None, use_errno=True)

    def available_mb():
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    before = available_mb()
    made, end = 0, time.monotonic() + values["seconds"]
    try:
        if values["what"] == "semaphores":  # SysV semaphore sets: 32,000 a set, 32,000 sets per IPC namespace
            while made < values["count"] and time.monotonic() < end:
                if libc.semget(0, 32000, 0o1600) < 0:  # IPC_PRIVATE, IPC_CREAT | 0600
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                made += 32000
        else:  # empty files in the private /tmp: its size limit counts blocks, not inodes
            os.mkdir("/tmp/many")
            while made < values["count"] and time.monotonic() < end:
                os.close(os.open("/tmp/many/" + str(made).rjust(200, "n"), os.O_CREAT | os.O_WRONLY, 0o600))
                made += 1
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["made"] = made
    out["available_drop_mb"] = before - available_mb()
    out["vm_size"] = [ln for ln in open("/proc/self/status") if ln.startswith("VmSize")][0].split()[1]
"""
# Least kernel memory each object pins: a `struct sem` is 56 bytes (64 with SMP cache-line alignment); an empty
# tmpfs file is a shmem inode (752 bytes here), a dentry (192) and, for a 200-character name, an external name
# (kmalloc-256). Counted from what the worker made, so the bound holds whatever else runs on the host.
LEAST_BYTES = {"semaphores": 48, "files": 900}
KERNEL_MEMORY = SandboxLimits(timeout_s=12, call_timeout_s=10, memory_mb=32, tmpfs_mb=16, replay=False)


@pytest.mark.parametrize(("what", "count"), [("semaphores", 100 * 32000), ("files", 200_000)])
def test_kernel_memory_a_worker_can_pin_is_bounded(meta: EnvMetadata, what: str, count: int) -> None:  # noqa: F811
    values = {"what": what, "count": count, "seconds": 5.0}
    _, out = run_attack(KERNEL_MEMORY_PAYLOAD, meta, values=values, limits=KERNEL_MEMORY)
    least_mb = out["made"] * LEAST_BYTES[what] / 2**20
    bound = KERNEL_MEMORY.memory_mb + KERNEL_MEMORY.tmpfs_mb
    assert least_mb <= bound, (
        f"{out['made']} {what} pin at least {least_mb:.0f} MB of kernel memory (limit {bound} MB; MemAvailable "
        f"fell {out['available_drop_mb']} MB; the worker's own address space: {out['vm_size']} kB): {out}"
    )


# ---- 5. the parent's clocks: a worker that stops reading ----------------------------------------

# Answer the current request (and, with values["dump"], the state dump that follows it) before they are
# asked, shrink the request pipe to one page, and never read again. No CPU time is spent: RLIMIT_CPU never
# fires. The parent's next request larger than the pipe blocks in write(), which has no deadline.
STOP_READING = """
    import fcntl
    import time
    worker, req = worker_and_request()
    call = {"ok": True, "result": "answered early", "error": None, "diff": {}, "changes": []}
    frames = frame_of({"id": req["id"], **call})
    if values.get("dump"):
        frames += frame_of({"id": req["id"] + 1, "state": {"hits": 0, "notes": []}})
    os.write(worker.wfd, frames)
    fcntl.fcntl(worker.reader.fd, 1031, 4096)  # F_SETPIPE_SZ
    time.sleep(3600)
"""
BIG_ARGS = {"pad": "x" * 20_000}


def test_a_worker_that_stops_reading_cannot_hold_a_session_call(runtime: Callable[..., SandboxedEnvironment]) -> None:
    limit = 1.0
    env = runtime(STOP_READING, call_timeout_s=limit)
    session = Session.fork(env, "default")
    assert session.call("attack").result == "answered early"
    thread, box = in_thread(lambda: session.call("ping", BIG_ARGS))
    try:
        thread.join(limit + SLACK_S + 1)
        assert not thread.is_alive(), f"Session.call still blocked after {limit + SLACK_S + 1:g} s (limit {limit:g} s)"
        rec = box["value"]
        assert not rec.ok and rec.error.type in ("timeout", "internal_error"), rec
    finally:
        env.pool.shutdown()  # kills the worker: the blocked write fails with EPIPE and the thread ends
        thread.join(10)


def test_a_worker_that_stops_reading_cannot_hold_a_validation_round(
    meta: EnvMetadata,  # noqa: F811
    spawned: list[SandboxProcess],
) -> None:
    limits = SandboxLimits(timeout_s=3, call_timeout_s=1, memory_mb=256, replay=False)
    steps = scenario(ATTACK_STEP, ExpectedCall(tool="ping", args=BIG_ARGS))
    code = hostile_env(STOP_READING, values=nonce({"dump": True}))
    thread, box = in_thread(lambda: run_checks_in_sandbox(code, meta, [steps], limits))
    bound = limits.timeout_s + SLACK_S
    try:
        thread.join(bound + 1)
        assert not thread.is_alive(), f"the round still runs after {bound + 1:g} s (limit {limits.timeout_s:g} s)"
        assert box["value"].status in ("timeout", "crashed"), box
    finally:
        for process in spawned:
            process.kill()
        thread.join(10)


# ---- 6. the parent's memory and clock: wide answers ---------------------------------------------


def test_what_one_answer_can_cost_a_session_is_bounded(runtime: Callable[..., SandboxedEnvironment]) -> None:
    # a float costs the parent ~32 bytes for ~4 on the wire: the bound is on values, not bytes
    env = runtime('out["wide"] = [0.0] * values["n"]', {"n": 1_000_000}, call_timeout_s=20)
    session = Session.fork(env, "default")
    rec = session.call("attack")
    assert not rec.ok and rec.error is not None and "values" in rec.error.message, rec.error
    limit = env.pool.channel.max_values
    assert limit * 64 <= 64 * 2**20  # so one answer costs a session at most ~64 MB of objects
    assert session.call("ping").ok  # restored on a fresh worker, and usable
    small = runtime('out["wide"] = [0.0] * values["n"]', {"n": limit // 2}, call_timeout_s=20)
    rec = Session.fork(small, "default").call("attack")
    assert rec.ok and deep_size(rec.result) <= limit * 64


def test_an_answer_of_long_integers_is_refused_before_it_is_converted(
    runtime: Callable[..., SandboxedEnvironment],
) -> None:
    """CPython reads an integer literal in time quadratic in its digits, holding the GIL: 3,000 integers of
    4,299 digits (13 MB, well under the answer limits) would hold the server's every thread for ~0.7 s, per
    call of a hostile environment. Refused at the first long one, unconverted."""
    env = runtime('out["wide"] = [int("1" * values["digits"])] * values["n"]', {"n": 3000, "digits": 4299})
    session = Session.fork(env, "default")
    rec = session.call("attack")
    assert not rec.ok and rec.error is not None and "digits" in rec.error.message, rec.error
    assert session.call("ping").ok
    fits = runtime('out["wide"] = [2 ** 2048] * values["n"]', {"n": 10})  # a 2048-bit number still comes through
    rec = Session.fork(fits, "default").call("attack")
    assert rec.ok and rec.result["wide"] == [2**2048] * 10, rec.error


def _seconds_per_float() -> float:
    n = 200_000
    body = b"[" + b"0.0," * (n - 1) + b"0.0]"
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        decode(body, 100)
        best = min(best, time.perf_counter() - started)
    return best / n


LATE_WIDE_ANSWER = """
    import time
    worker, req = worker_and_request()
    head = b'{"id":%d,"ok":true,"error":null,"diff":{},"changes":[],"result":[0.0' % req["id"]
    frame = head + b",0.0" * (values["n"] - 1) + b"]}"
    frame = struct.pack(">I", len(frame)) + frame
    time.sleep(values["wait"])  # just before the call's deadline
    while frame:
        frame = frame[os.write(worker.wfd, frame):]
    serve_globals = type(worker).serve.__globals__
    real_write = serve_globals["write_frame"]

    def skip_once(fd, data):  # the worker's own answer to this call would be a second one
        serve_globals["write_frame"] = real_write
    serve_globals["write_frame"] = skip_once
"""


def test_a_late_answer_of_many_values_does_not_hold_the_parent_past_its_deadline(meta: EnvMetadata) -> None:  # noqa: F811
    limits = SandboxLimits(timeout_s=1.5, call_timeout_s=1.2, memory_mb=512, replay=False)
    bound = limits.timeout_s + SLACK_S
    n = (limits.max_answer_mb * 2**20 - 100) // 4  # as many values as fit the answer limit
    parse_s = _seconds_per_float() * n
    if parse_s + 0.4 < bound:  # then the hole may be there but this machine cannot show it past the slack
        pytest.skip(f"this machine parses the largest answer in {parse_s:.1f} s, within the deadline's slack")
    code = hostile_env(LATE_WIDE_ANSWER, values=nonce({"n": n, "wait": 0.1}))
    started = time.monotonic()
    result = run_checks_in_sandbox(code, meta, [scenario(ATTACK_STEP)], limits)
    elapsed = time.monotonic() - started
    obs = parse_observations(result.output)
    if obs is None or not obs.scenarios or not obs.scenarios[0].steps or not obs.scenarios[0].steps[0].ok:
        pytest.skip(f"the answer did not arrive before the deadline on this machine: {result.detail}")
    assert elapsed < bound, f"a {n * 4 >> 20} MB answer held the parent {elapsed:.1f} s (limit {limits.timeout_s:g} s)"


# ---- 7. the runtime pool ---------------------------------------------------------------------


def test_a_sleeping_import_does_not_hold_other_environments(
    tmp_path: Path,
    meta: EnvMetadata,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_timeout = 3.0
    monkeypatch.setitem(sandboxed.PoolSettings.__init__.__kwdefaults__, "start_timeout_s", start_timeout)
    config = '{"hits": 0, "notes": []}'
    slow = hostile_env("import time\ntime.sleep(600)", values=nonce(None), at_import=True)
    write_folder(tmp_path, meta, "sleeper", slow, config)
    write_folder(tmp_path, meta, "calm", hostile_env(values=nonce(None)), config)
    pool = EnvPool(Settings(root=tmp_path, sandbox_memory_mb=256, sandbox_call_timeout_s=5.0, sandbox_workers=1))
    thread, box = in_thread(lambda: pool.get("sleeper"))
    try:
        time.sleep(0.5)  # the sleeper's worker is starting or importing
        started = time.monotonic()
        pool.get("calm")
        waited = time.monotonic() - started
        thread.join(start_timeout + 30)
        assert isinstance(box.get("error"), EnvLoadError), box
        assert waited < start_timeout / 2, f"loading 'calm' waited {waited:.1f} s for another environment's import"
    finally:
        thread.join(start_timeout + 30)
        for env in pool._kept.values():
            if isinstance(env, SandboxedEnvironment):
                env.pool.shutdown()


def test_a_worker_that_dies_on_every_fork_costs_one_start_per_session(
    runtime: Callable[..., SandboxedEnvironment], spawned: list[SandboxProcess]
) -> None:
    """No restart loop: each session that cannot be forked is one worker start and a ScenarioError."""
    payload = """
        worker, req = worker_and_request()
        type(worker).serve.__globals__["_OPS"]["fork"] = lambda self, req: os._exit(0)
    """
    env = runtime(payload, at_import=True)
    before = len(spawned)
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(ScenarioError, match="died"):
            Session.fork(env, "default")
        assert time.monotonic() - started < 5 + SLACK_S
    assert len(spawned) - before <= 3, f"{len(spawned) - before} workers started for 3 sessions"
    assert len([w for w in env.pool._workers if w.process.alive]) <= 1
    env.pool.shutdown()
    left = processes_left(spawned)
    assert left == [], f"processes left behind: {left}"


SLOW_TOOL = """
    import time
    time.sleep(values["seconds"])
"""


def test_a_call_after_a_worker_death_is_not_held_by_the_replay(runtime: Callable[..., SandboxedEnvironment]) -> None:
    limit = 1.0
    env = runtime(SLOW_TOOL, {"seconds": 0.85 * limit}, call_timeout_s=limit)
    session = Session.fork(env, "default")
    for _ in range(4):
        assert session.call("attack").ok
    assert isinstance(session, SandboxedSession) and session._worker is not None
    session._worker.process.kill()  # the worker dies (a limit, the OOM killer...)
    started = time.monotonic()
    rec = session.call("ping")
    elapsed = time.monotonic() - started
    assert rec.ok and session.restored == 1, rec
    assert elapsed < limit + SLACK_S, f"one call took {elapsed:.1f} s (call limit {limit:g} s)"


# ---- 8. what the parent is left with ------------------------------------------------------------

LEAVERS = {
    "exit": "os._exit(0)",
    "spin": "while True:\n    pass",
    "sleep": "import time\ntime.sleep(3600)",
    "close both pipes": "worker, req = worker_and_request()\nos.close(worker.wfd)\nos.close(worker.reader.fd)\n"
    "import time\ntime.sleep(3600)",
    "drip": "import time\nworker, req = worker_and_request()\nfor b in frame_of({'id': req['id'], 'ok': True}):\n"
    "    os.write(worker.wfd, bytes([b]))\n    time.sleep(0.3)",
}


def test_dead_and_dying_workers_leave_no_process_descriptor_or_thread(
    meta: EnvMetadata,  # noqa: F811
    spawned: list[SandboxProcess],
) -> None:
    limits = SandboxLimits(timeout_s=2, call_timeout_s=0.75, memory_mb=256, replay=False)
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for name, payload in LEAVERS.items():
        result, _ = run_round(hostile_env(textwrap.dedent(payload)), meta, [scenario(ATTACK_STEP, PING)], limits)
        assert result.status in ("crashed", "timeout"), (name, result.status, result.detail)
    left = processes_left(spawned)
    assert left == [], f"sandbox processes left behind: {left}"
    assert len(spawned) >= len(LEAVERS)
    assert len(os.listdir("/proc/self/fd")) <= fds, "descriptors leaked"
    assert threading.active_count() <= max(threads, 2), "threads leaked"  # the spawner thread, once


def test_a_killed_worker_is_gone_from_the_host_with_its_bwrap(spawned: list[SandboxProcess]) -> None:
    process = SandboxProcess(find_wall(), WORKER_LIMITS)
    process.start()
    assert host_process_alive(process.child_pid) and host_process_alive(process.pid)
    os.kill(process.pid, signal.SIGKILL)  # the outer bwrap dies first: --die-with-parent takes the worker
    time.sleep(0.5)
    process.close()
    assert not host_process_alive(process.child_pid) and not host_process_alive(process.pid)
