"""The sandbox child: `python -P -m envfactory.env.sandbox.child JOB.json RESULT.json`.

A fresh interpreter per validation round (no module of an earlier round is loaded). In order:
read the job; import the runtime and every allowed module (they may not be readable once root is
dropped); set resource limits; leave the network namespace; forbid new privileges; drop root;
replace the socket API; seal the library functions that evaluate strings; then run the generated
module with guarded builtins and record what every call did. The result goes to RESULT.json
through a descriptor opened before any generated code runs, so nothing the code prints can
corrupt it. The child reports observations only; the parent judges them.

Limits: RLIMIT_AS (baseline + memory_mb), RLIMIT_CPU (SIGXCPU, then SIGKILL one second later),
RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC = 0 (no fork once root is dropped; root ignores it),
RLIMIT_CORE = 0, and one interval timer: per tool call (a hang is reported with its scenario and
tool, and the run goes on) and at the job's deadline. The parent's kill after the deadline is the
backstop for code that never returns to the interpreter.

The steps live in isolation.py (preload, limits, network, privileges), guards.py (builtins and
sealed evaluators) and integrity.py (tampering snapshots); the order is kept here, in `main`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import linecache
import os
import signal
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Literal

from envfactory.env.environment import Environment
from envfactory.env.sandbox.guards import restricted_builtins, seal_evaluators
from envfactory.env.sandbox.integrity import _changed, _env_snapshot, _state_overrides, _trusted_snapshot
from envfactory.env.sandbox.isolation import (
    _drop_privileges,
    _no_new_privs,
    _preload,
    apply_limits,
    block_network,
    enter_network_namespace,
)
from envfactory.env.sandbox.protocol import (
    EXIT_BAD_JOB,
    EXIT_MEMORY,
    EXIT_NO_REPORT,
    EXIT_TIMEOUT,
    Interrupt,
    JobScenario,
    Observations,
    Phase,
    SandboxJob,
    ScenarioObservation,
    StepObservation,
)
from envfactory.env.session import Session
from envfactory.env.state import State
from envfactory.env.tools import Tool
from envfactory.errors import ScenarioError

_MARGIN_S = 0.25  # before the deadline: time to write the (partial) result


class LimitHit(BaseException):
    """Raised by the timer / CPU signal handlers. A BaseException: `except Exception` in a tool can't eat it."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


# ---- running the job --------------------------------------------------------------------------


@dataclass
class _Progress:
    phase: Phase = "startup"
    scenario: str | None = None
    step: int | None = None
    tool: str | None = None


def _import_error_line(tb: types.TracebackType | None, path: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _import_module(job: SandboxJob, source: str) -> types.ModuleType:
    module = types.ModuleType(job.module_name)
    module.__file__ = job.code_path
    module.__dict__["__builtins__"] = restricted_builtins()
    # tracebacks show the code's lines without reading the file (it may not be readable as nobody)
    linecache.cache[job.code_path] = (len(source), None, source.splitlines(True), job.code_path)
    sys.modules[job.module_name] = module  # pydantic resolves the module's annotations through sys.modules
    exec(compile(source, job.code_path, "exec", dont_inherit=True), module.__dict__)
    return module


def _is_memory_error(message: str | None) -> bool:
    return bool(message) and str(message).startswith("MemoryError")


def run_job(job: SandboxJob, source: str, obs: Observations, progress: _Progress, timer: _Timer) -> None:
    trusted = _trusted_snapshot()
    progress.phase = "import"
    try:
        module = _import_module(job, source)
    except (MemoryError, LimitHit):
        raise
    except BaseException as e:  # SystemExit / KeyboardInterrupt raised by the code count as import failures
        obs.import_error = f"{type(e).__name__}: {e}"
        obs.import_line = _import_error_line(e.__traceback__, job.code_path)
        return
    obs.tampering.extend(f"after import: {k} was changed" for k in _changed(trusted, _trusted_snapshot()))
    env = module.__dict__.get("env")
    if env is None:
        obs.env_problems.append("env.py must define `env = Environment(...)` at module level")
        return
    if type(env) is not Environment:
        obs.env_problems.append(f"`env` must be an envfactory Environment, not {type(env).__name__}")
        return
    if not (isinstance(env.state_model, type) and issubclass(env.state_model, State)):
        obs.env_problems.append("`env.state_model` must be a subclass of envfactory State")
        return
    bad_tools = [n for n, t in env.tools.items() if type(t) is not Tool]
    obs.env_problems.extend(f"tool '{n}' is not registered through @env.tool" for n in bad_tools)
    obs.env_problems.extend(_state_overrides(env.state_model))
    if obs.env_problems:
        return
    try:
        obs.derived_metadata = env.derived_metadata().model_dump(mode="json")
        env.metadata  # noqa: B018 - fill the lazy cache now, so the snapshot below sees its final value
    except Exception as e:
        obs.env_problems.append(f"metadata cannot be derived from the code: {type(e).__name__}: {e}")
        return
    watched = _env_snapshot(env)
    progress.phase = "scenario"
    for scenario in job.scenarios:
        progress.scenario, progress.step, progress.tool = scenario.name, None, None
        current = ScenarioObservation(name=scenario.name)
        obs.scenarios.append(current)
        try:
            session = Session.fork(env, scenario.initial_config, strict=True)
        except ScenarioError as e:
            current.load_error = str(e)
            continue
        except (MemoryError, LimitHit):
            raise
        except Exception as e:
            current.load_crash = f"{type(e).__name__}: {e}"
            continue
        current.steps, current.aborted = _play(session, scenario, job, obs, progress, timer, observe=True)
        current.completed = current.aborted is None
        if current.completed and job.replay:
            current.replay_difference = _replay(env, scenario, current, session.dump(), job, obs, progress, timer)
        label = f"after scenario '{scenario.name}'"
        obs.tampering.extend(f"{label}: {k} was changed" for k in _changed(trusted, _trusted_snapshot()))
        obs.tampering.extend(f"{label}: {k} was changed" for k in _changed(watched, _env_snapshot(env)))
        if obs.tampering:
            return


def _play(
    session: Session,
    scenario: JobScenario,
    job: SandboxJob,
    obs: Observations,
    progress: _Progress,
    timer: _Timer,
    *,
    observe: bool,
) -> tuple[list[StepObservation], str | None]:
    """Run a scenario's calls; returns what each did, and why it stopped early (a hang) or None."""
    steps: list[StepObservation] = []
    for i, step in enumerate(scenario.steps):
        progress.step, progress.tool = i, step.tool
        if step.tool in obs.hung_tools:  # it would hang again: don't spend the run's time on it
            return steps, f"stopped at step {i}: tool '{step.tool}' hung earlier in this run"
        timer.start_call()
        try:
            rec = session.call(step.tool, step.args)
        except LimitHit as e:
            if e.kind != "call":
                raise
            timer.until_deadline()
            obs.hung_tools.append(step.tool)
            message = f"did not return within the per-call limit of {job.call_timeout_s:g} s"
            steps.append(StepObservation(tool=step.tool, ok=False, error_type="timeout", error_message=message))
            return steps, f"stopped at step {i}: the call hung"
        except MemoryError:
            raise
        except BaseException as e:  # SystemExit, KeyboardInterrupt... from a tool: no rollback happened
            timer.until_deadline()
            message = f"{type(e).__name__}: {e} (raised past the session, which catches Exception only)"
            steps.append(StepObservation(tool=step.tool, ok=False, error_type="internal_error", error_message=message))
            return steps, f"stopped at step {i}: the call raised {type(e).__name__}"
        timer.until_deadline()
        error = rec.error
        if error is not None and error.type == "internal_error" and _is_memory_error(error.message):
            raise MemoryError(error.message)
        steps.append(
            StepObservation(
                tool=step.tool,
                ok=rec.ok,
                result=rec.result,
                error_type=error.type if error else None,
                error_message=error.message if error else None,
                state=session.dump() if observe and step.observe_state else None,
            )
        )
    return steps, None


def _replay(
    env: Environment,
    scenario: JobScenario,
    first: ScenarioObservation,
    final: dict[str, Any],
    job: SandboxJob,
    obs: Observations,
    progress: _Progress,
    timer: _Timer,
) -> str | None:
    """Run the same calls again on a fresh session: a deterministic tool gives the same results and state.

    Catches what one run cannot: module-level counters or caches, id()-based values, anything that
    makes a replayed trajectory end somewhere else (DESIGN: replay reproduces the final state exactly).
    """
    session = Session.fork(env, scenario.initial_config, strict=True)
    again, aborted = _play(session, scenario, job, obs, progress, timer, observe=False)
    if aborted is not None:
        return f"the replay {aborted}"
    for i, (a, b) in enumerate(zip(first.steps, again, strict=True)):
        if (a.ok, a.error_type, a.result) != (b.ok, b.error_type, b.result):
            was = a.result if a.ok else a.error_type
            now = b.result if b.ok else b.error_type
            return f"step {i} ({a.tool}) gave {_short(was)} the first time and {_short(now)} on replay"
    if session.dump() != final:
        return "the same calls left a different final state on replay"
    return None


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write(fd: int, obs: Observations) -> None:
    data = obs.model_dump_json().encode("utf-8")
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.close(fd)


class _Timer:
    """One ITIMER_REAL for two limits: the run's deadline, and during a tool call the call's own limit.

    A call that hangs is reported with its tool and the run goes on with the next scenario; only
    the run's deadline (or the CPU limit) stops everything.
    """

    def __init__(self, deadline: float, call_s: float) -> None:
        self.deadline = deadline - _MARGIN_S
        self.call_s = call_s
        self.kind = "timeout"
        signal.signal(signal.SIGALRM, self._fire)
        signal.signal(signal.SIGXCPU, self._cpu)

    def _fire(self, signum: int, frame: Any) -> None:
        raise LimitHit(self.kind)

    def _cpu(self, signum: int, frame: Any) -> None:
        raise LimitHit("cpu")

    def _arm(self, kind: str, seconds: float) -> None:
        self.kind = kind
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))

    def until_deadline(self) -> None:
        self._arm("timeout", self.deadline - time.time())

    def start_call(self) -> None:
        left = self.deadline - time.time()
        if self.call_s < left:
            self._arm("call", self.call_s)
        else:
            self._arm("timeout", left)

    @staticmethod
    def stop() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _interrupt(kind: Literal["timeout", "cpu", "memory"], progress: _Progress) -> Interrupt:
    return Interrupt(
        kind=kind, phase=progress.phase, scenario=progress.scenario, step=progress.step, tool=progress.tool
    )


def main(argv: list[str]) -> int:
    faulthandler.enable()
    if len(argv) != 3:
        print("usage: python -m envfactory.env.sandbox.child JOB.json RESULT.json", file=sys.stderr)
        return EXIT_BAD_JOB
    try:
        with open(argv[1], "rb") as f:
            job = SandboxJob.model_validate_json(f.read())
        with open(job.code_path, encoding="utf-8") as f:
            source = f.read()
        fd = os.open(argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except Exception as e:
        print(f"sandbox child: cannot read the job: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_JOB

    _preload()
    reserve: bytearray | None = bytearray(8 * 1024 * 1024)  # freed on MemoryError, to write the report
    isolation: dict[str, Any] = apply_limits(job)
    is_root = os.geteuid() == 0
    isolation["netns"], isolation["netns_error"] = enter_network_namespace()
    isolation["no_new_privs"] = _no_new_privs()
    if job.drop_privileges and is_root:
        try:
            isolation["uid"] = _drop_privileges()
        except OSError as e:
            isolation["uid"], isolation["drop_error"] = os.geteuid(), str(e)
    else:
        isolation["uid"] = os.geteuid()
    block_network()
    isolation["socket_blocked"] = True
    isolation["sealed_evaluators"] = seal_evaluators()

    obs = Observations(pid=os.getpid(), isolation=isolation)
    progress = _Progress()
    code = 0
    try:
        timer = _Timer(job.deadline, job.call_timeout_s)
        timer.until_deadline()
        run_job(job, source, obs, progress, timer)
        timer.stop()
        if obs.hung_tools:
            code = EXIT_TIMEOUT
    except LimitHit as e:
        _Timer.stop()
        obs.interrupted = _interrupt("cpu" if e.kind == "cpu" else "timeout", progress)
        code = EXIT_TIMEOUT
    except MemoryError:
        _Timer.stop()
        reserve = None
        obs.interrupted = _interrupt("memory", progress)
        code = EXIT_MEMORY
    del reserve
    try:
        _write(fd, obs)
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except (OSError, ValueError, LimitHit) as e:  # EFBIG past RLIMIT_FSIZE; LimitHit: a stray signal
        print(f"sandbox child: cannot write the result: {e}", file=sys.stderr)
        os._exit(EXIT_NO_REPORT)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    # no interpreter shutdown: finalizers (__del__, atexit) of the generated code never run
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
