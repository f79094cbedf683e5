"""Workers burn no CPU between calls, and none for longer than the work needs.

Same premise as tests/system/test_attacks.py (whose harness this reuses): the generated code holds the real builtins
and the worker's own objects. The attacks: a SIGALRM handler installed at import that spins while the worker is
idle (every call still answered), the same without any timer (the worker's read loop patched to spin before it
reads), and a worker kept near its CPU limit. What must hold: no timer can be armed in a worker; a worker that
spends CPU while it has no request is ended and its environment marked unhealthy, with that reason, and not
replaced by a fresh worker that re-imports the code; an honest idle worker uses no CPU and is never stopped; a
served worker's CPU limit is a setting, and a worker close to it is retired with its sessions restored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import envfactory.env.sandbox.process as process_module
from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandbox import SandboxLimits
from envfactory.env.sandbox.process import SandboxProcess
from envfactory.env.sandboxed import SandboxedEnvironment, SandboxedSession
from envfactory.env.session import Session
from envfactory.errors import EnvFactoryError
from tests.system.test_attacks import (
    ATTACK_STEP,
    hostile_env,
    meta,  # noqa: F401 - the module-scoped fixture: the hostile module's metadata
    run_attack,
    run_round,
    scenario,
)
from tests.system.test_attacks_more import runtime  # noqa: F401 - the fixture: an untrusted folder served from EnvPool

_TICK = os.sysconf("SC_CLK_TCK")
MONITOR_PERIOD_S = getattr(process_module, "MONITOR_PERIOD_S", 1.0)


def worker_cpu_s(pid: int) -> float:
    """A host process's CPU seconds so far (utime + stime), read from outside."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def worker_of(session: Session) -> SandboxProcess:
    assert isinstance(session, SandboxedSession) and session._worker is not None
    return session._worker.process


# ---- no timers -------------------------------------------------------------------------------------

TIMERS_PAYLOAD = """
    import ctypes
    import signal
    libc = ctypes.CDLL(None, use_errno=True)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # an armed timer must not kill the worker before it reports
    signal.signal(signal.SIGVTALRM, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_IGN)

    def checked(result):
        if result == -1:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return result

    def posix_timer():
        handle = ctypes.c_void_p()
        checked(libc.timer_create(1, None, ctypes.byref(handle)))  # CLOCK_MONOTONIC, SIGALRM
        spec = (ctypes.c_long * 4)(0, 50_000_000, 0, 50_000_000)
        return checked(libc.timer_settime(handle, 0, spec, None))

    def timerfd():
        fd = checked(libc.timerfd_create(1, 0))
        spec = (ctypes.c_long * 4)(0, 50_000_000, 0, 50_000_000)
        return checked(libc.timerfd_settime(fd, 0, spec, None))

    libc.alarm.restype = ctypes.c_int
    attempt("alarm", lambda: checked(libc.alarm(1)) if libc.alarm(1) != -1 else checked(-1))
    attempt("setitimer real", lambda: signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05))
    attempt("setitimer virtual", lambda: signal.setitimer(signal.ITIMER_VIRTUAL, 0.05, 0.05))
    attempt("setitimer prof", lambda: signal.setitimer(signal.ITIMER_PROF, 0.05, 0.05))
    attempt("posix timer", posix_timer)
    attempt("timerfd", timerfd)
"""


def test_no_timer_can_be_armed_in_a_worker(meta: EnvMetadata) -> None:  # noqa: F811
    _, out = run_attack(TIMERS_PAYLOAD, meta, limits=SandboxLimits(timeout_s=10, memory_mb=256, replay=False))
    for name in ("alarm", "setitimer real", "setitimer virtual", "setitimer prof", "posix timer", "timerfd"):
        assert "Operation not permitted" in out[name], (name, out[name])


# ---- the quoted attack: a SIGALRM handler that spins while the worker is idle -------------------------------

SPINNER_AT_IMPORT = """
    import signal
    import time

    def spin(signum, frame):
        end = time.process_time() + 0.08
        while time.process_time() < end:
            pass

    try:
        signal.signal(signal.SIGALRM, spin)
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
        out["armed"] = "OK"
    except OSError as e:  # refused: the code still loads, as an attacker's would
        out["armed"] = f"{type(e).__name__}: {e}"
"""


def test_a_timer_spinning_while_the_worker_is_idle_burns_nothing(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
) -> None:
    env = runtime(SPINNER_AT_IMPORT, at_import=True)
    session = Session.fork(env, "default")
    rec = session.call("attack")
    assert rec.ok, rec
    process = worker_of(session)
    assert process.child_pid is not None
    before = worker_cpu_s(process.child_pid)
    time.sleep(3.0)  # idle: no request outstanding
    if process.alive:
        used = worker_cpu_s(process.child_pid) - before
        assert used < 0.1, f"the idle worker used {used:.2f} s of CPU in 3 s (armed: {rec.result.get('armed')})"
    else:  # ended for it: the environment says why
        assert env.unhealthy is not None and "idle" in env.unhealthy, env.unhealthy
    assert "Operation not permitted" in str(rec.result.get("armed")), rec.result


# ---- the same without a timer: the worker's read loop patched to spin before it reads -------------------------

SPIN_BEFORE_READING = """
    import time
    worker, _ = worker_and_request()
    reader = worker.reader
    original = reader.read

    def read(*args, **kwargs):
        end = time.monotonic() + values["spin"]
        while time.monotonic() < end:
            pass
        return original(*args, **kwargs)

    reader.read = read
    out["patched"] = True
"""


def assert_stopped_for_idle_cpu(env: SandboxedEnvironment, session: Session, starts: int) -> None:
    unhealthy = getattr(env, "unhealthy", None)
    assert unhealthy is not None and "while it had no request" in unhealthy, unhealthy
    rec = session.call("ping")
    assert not rec.ok and rec.error is not None and rec.error.type == "internal_error", rec
    assert "unhealthy" in rec.error.message and "while it had no request" in rec.error.message, rec.error.message
    with pytest.raises(EnvFactoryError, match="unhealthy"):
        Session.fork(env, "default")
    assert env.pool._generation == starts, "a fresh worker re-imported the code"


def test_a_worker_spinning_while_idle_is_ended_by_the_monitor(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
) -> None:
    env = runtime(SPIN_BEFORE_READING, {"spin": 4.0})
    session = Session.fork(env, "default")
    starts = env.pool._generation
    rec = session.call("attack")
    assert rec.ok and rec.result.get("patched"), rec
    process = worker_of(session)
    deadline = time.monotonic() + MONITOR_PERIOD_S * 2 + 2.0
    while process.alive and time.monotonic() < deadline:
        time.sleep(0.1)  # no request: only the monitor can see it
    assert not process.alive, "the worker spun while idle and was left running"
    while getattr(env, "unhealthy", None) is None and time.monotonic() < deadline + 5:
        time.sleep(0.05)  # the monitor kills the worker, then tells the environment (its thread may lag, loaded)
    assert_stopped_for_idle_cpu(env, session, starts)


def test_a_worker_that_spun_while_idle_is_ended_at_its_next_request(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SandboxProcess, "poll_idle", lambda self: None, raising=False)  # the monitor sees nothing
    env = runtime(SPIN_BEFORE_READING, {"spin": 0.6})
    session = Session.fork(env, "default")
    starts = env.pool._generation
    rec = session.call("attack")
    assert rec.ok and rec.result.get("patched"), rec
    time.sleep(1.2)  # it spins, then waits for its next request
    rec = session.call("ping")
    assert not rec.ok and rec.error is not None and rec.error.type == "internal_error", rec
    assert_stopped_for_idle_cpu(env, session, starts)


def test_an_honest_idle_worker_uses_no_cpu_and_is_never_stopped(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
) -> None:
    env = runtime()
    session = Session.fork(env, "default")
    assert session.call("ping").ok
    process = worker_of(session)
    assert process.child_pid is not None
    before = worker_cpu_s(process.child_pid)
    time.sleep(MONITOR_PERIOD_S * 2 + 0.5)
    assert worker_cpu_s(process.child_pid) - before <= 0.02
    for _ in range(50):
        assert session.call("ping").ok
    assert getattr(env, "unhealthy", None) is None and process.alive


# ---- a CPU limit sized to the work ---------------------------------------------------------------------

BURN = """
    import time
    end = time.process_time() + values["cpu_s"]
    while time.process_time() < end:
        pass
    db.set("hits", db.hits + 1)
    out["hits"] = db.hits
"""


def test_a_worker_near_its_cpu_limit_is_retired_and_its_sessions_restored(
    runtime: Callable[..., SandboxedEnvironment],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENVFACTORY_SANDBOX_WORKER_CPU_S", "3")  # the runtime fixture's settings read it
    env = runtime(BURN, {"cpu_s": 0.3}, call_timeout_s=2.0)
    assert getattr(env.pool.settings, "cpu_s", None) == 3, "the worker's CPU limit is not the setting"
    session = Session.fork(env, "default")
    for i in range(1, 13):  # 3.6 s of CPU: more than one worker may use
        rec = session.call("attack")
        assert rec.ok and rec.result.get("hits") == i, (i, rec)
    assert getattr(env.pool, "retired", 0) >= 1 and session.restored >= 1
    assert session.dump()["hits"] == 12
    assert getattr(env, "unhealthy", None) is None


# ---- the worker's own loop is part of what the integrity check watches ----------------------------------

PATCH_THE_LOOP = {
    "its reader": SPIN_BEFORE_READING,
    "its request handler": """
        import sys
        worker_class = sys.modules["__main__"].Worker
        original = worker_class.answer
        worker_class.answer = lambda self, req: original(self, req)
        out["patched"] = True
    """,
    "its table of requests": """
        import sys
        ops = sys.modules["__main__"]._OPS
        original = ops["dump"]
        ops["dump"] = lambda self, req: original(self, req)
        out["patched"] = True
    """,
}


@pytest.mark.parametrize("what", sorted(PATCH_THE_LOOP))
def test_code_that_patches_the_workers_loop_fails_its_round(meta: EnvMetadata, what: str) -> None:  # noqa: F811
    """The worker runs as __main__ and its loop lives on its own objects: changing them is tampering, as changing
    the runtime is (a read patched to run code between requests, a handler that sees every request)."""
    limits = SandboxLimits(timeout_s=10, memory_mb=256, replay=False)
    code = hostile_env(PATCH_THE_LOOP[what], values={"spin": 0.01})
    _, obs = run_round(code, meta, [scenario(ATTACK_STEP), scenario(ATTACK_STEP, name="again")], limits)
    assert obs.scenarios[0].steps[0].ok and obs.scenarios[0].steps[0].result.get("patched")
    assert any("was changed" in t and ("worker" in t) for t in obs.tampering), obs.tampering
