"""The sandbox child: `python -P -m envfactory.env.sandbox_child JOB.json RESULT.json`.

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
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import faulthandler
import functools
import importlib
import linecache
import os
import resource
import signal
import sys
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from envfactory.env.environment import Environment
from envfactory.env.sandbox import (
    ALLOWED_MODULES,
    ENVFACTORY_NAMES,
    EXIT_BAD_JOB,
    EXIT_MEMORY,
    EXIT_NO_REPORT,
    EXIT_TIMEOUT,
    FORBIDDEN_BUILTINS,
    Interrupt,
    JobScenario,
    Observations,
    Phase,
    SandboxJob,
    ScenarioObservation,
    StepObservation,
    module_member_problem,
    module_problem,
)
from envfactory.env.session import Session
from envfactory.env.state import State
from envfactory.env.tools import Tool
from envfactory.errors import ScenarioError

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
_MARGIN_S = 0.25  # before the deadline: time to write the (partial) result


class LimitHit(BaseException):
    """Raised by the timer / CPU signal handlers. A BaseException: `except Exception` in a tool can't eat it."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class SandboxViolation(PermissionError):
    """Generated code did something the guards refuse (a tool call reports it as internal_error)."""


# ---- isolation --------------------------------------------------------------------------------


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


# ---- guarded builtins -------------------------------------------------------------------------

_real_import = builtins.__import__
_real_getattr = builtins.getattr
_real_setattr = builtins.setattr
_real_delattr = builtins.delattr


_RUNTIME_INTERNAL = frozenset({"time", "_strptime", "locale", "unicodedata", "encodings"})


def _guarded_import(
    name: str,
    globals: dict[str, Any] | None = None,  # the signature of __import__
    locals: dict[str, Any] | None = None,
    fromlist: tuple[str, ...] | list[str] | None = (),
    level: int = 0,
) -> Any:
    """The static allow-list again, at run time: code that slipped past the AST check still can't import."""
    if level:
        raise SandboxViolation("relative imports are not allowed in generated code")
    # C code imports through the current frame's builtins too (date.strftime imports `time`):
    # those stdlib internals are let through; they are not reachable by an import statement
    if name in _RUNTIME_INTERNAL or name.startswith("encodings."):
        return _real_import(name, globals, locals, fromlist, level)
    problem = module_problem(name)
    if problem is not None:
        raise SandboxViolation(problem)
    names = [n for n in fromlist or () if n != "__doc__"]  # PyImport_Import passes ['__doc__']
    if name in ENVFACTORY_NAMES:
        bad = [n for n in names if n not in ENVFACTORY_NAMES[name]]
        if not names or bad:
            raise SandboxViolation(f"only {', '.join(sorted(ENVFACTORY_NAMES[name]))} can be imported from {name}")
    module = _real_import(name, globals, locals, fromlist, level)
    if names and name != "__future__":
        target = sys.modules.get(name, module)
        for n in names:
            why = module_member_problem(target, n) if n != "*" else "star imports are not allowed"
            if why is not None:
                raise SandboxViolation(why)
    return module


def _check_name(name: object, action: str) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SandboxViolation(f"{action} of '{name}' is not allowed in generated code")


def _guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    _check_name(name, "getattr")
    value = _real_getattr(obj, name, *default)
    if isinstance(value, types.ModuleType) and value.__name__ not in ALLOWED_MODULES:
        raise SandboxViolation(f"getattr reaching module '{value.__name__}' is not allowed in generated code")
    return value


def _guarded_hasattr(obj: Any, name: str) -> bool:
    _check_name(name, "hasattr")
    return builtins.hasattr(obj, name)


def _guarded_setattr(obj: Any, name: str, value: Any) -> None:
    _check_name(name, "setattr")
    if isinstance(obj, type | types.ModuleType):
        raise SandboxViolation("setattr on a class or module (monkeypatching) is not allowed in generated code")
    _real_setattr(obj, name, value)


def _guarded_delattr(obj: Any, name: str) -> None:
    _check_name(name, "delattr")
    if isinstance(obj, type | types.ModuleType):
        raise SandboxViolation("delattr on a class or module is not allowed in generated code")
    _real_delattr(obj, name)


@functools.cache
def restricted_builtins() -> dict[str, Any]:
    """The generated module's builtins (one dict per process): no exec/eval/open/..., guarded import and getattr."""
    out = dict(vars(builtins))
    for name in (*FORBIDDEN_BUILTINS, "copyright", "credits", "license", "__loader__", "__spec__"):
        out.pop(name, None)
    out.update(
        __import__=_guarded_import,
        getattr=_guarded_getattr,
        hasattr=_guarded_hasattr,
        setattr=_guarded_setattr,
        delattr=_guarded_delattr,
    )
    return out


_real_eval = builtins.eval
# Library functions that evaluate strings (annotations, mostly) in a namespace their caller picks.
# Generated code can steer them to a trusted module's namespace (a class whose __module__ is
# 'types', say), whose builtins are the real ones: a known escape. Each gets a module-level
# `eval` that shadows the builtin and always evaluates with the restricted builtins.
_EVALUATING_MODULES = ("typing", "typing_extensions", "inspect", "pydantic._internal._namespace_utils")


def _restricted_eval(source: Any, globals: Any = None, locals: Any = None) -> Any:  # the signature of eval
    if globals is None:
        caller = sys._getframe(1)
        globals, locals = caller.f_globals, caller.f_locals if locals is None else locals
    if isinstance(globals, dict):
        globals = {**globals, "__builtins__": restricted_builtins()}
    return _real_eval(source, globals, locals)


def seal_evaluators() -> list[str]:
    """Give every string-evaluating library module the restricted `eval`; returns the modules sealed."""
    sealed = []
    for name in _EVALUATING_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.__dict__["eval"] = _restricted_eval
            sealed.append(name)
    return sealed


# ---- integrity of the runtime the observations come from ---------------------------------------

_VOLATILE = ("__pydantic", "_abc_")


def _trusted_snapshot() -> dict[str, Any]:
    """References to every global and class attribute of the runtime and to `BaseModel`'s methods.

    Generated code runs in this process; if it rebinds `Session.call` or `State.dump`, the
    observations would be its own claims. Compared by identity after import and after each scenario.
    """
    from pydantic import BaseModel

    snap: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "envfactory" or name.startswith("envfactory.")):
            continue
        for key, value in list(vars(module).items()):
            snap[f"{name}.{key}"] = value
            if isinstance(value, type) and value.__module__ == name:
                _class_snapshot(value, f"{name}.{key}", snap)
    _class_snapshot(BaseModel, "pydantic.BaseModel", snap)
    for key, value in vars(builtins).items():
        snap[f"builtins.{key}"] = value
    return snap


def _class_snapshot(cls: type, label: str, snap: dict[str, Any]) -> None:
    for key, value in list(vars(cls).items()):
        if not key.startswith(_VOLATILE):
            snap[f"{label}.{key}"] = value


def _env_snapshot(env: Environment) -> dict[str, Any]:
    snap: dict[str, Any] = {f"env.{k}": v for k, v in vars(env).items()}
    for name, tool in env.tools.items():
        snap[f"env.tools[{name}]"] = tool
        snap.update({f"env.tools[{name}].{k}": v for k, v in vars(tool).items()})
    for cls in env.state_model.__mro__:
        if cls is State:
            break
        _class_snapshot(cls, f"state model {cls.__qualname__}", snap)
    return snap


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    keys = before.keys() | after.keys()
    return sorted(k for k in keys if before.get(k, _ABSENT) is not after.get(k, _ABSENT))


_ABSENT = object()


@functools.cache
def _automatic_class_names() -> frozenset[str]:
    """What pydantic puts in the namespace of any State subclass by itself."""

    class _Probe(State):
        probe: int = 0

    return frozenset(vars(_Probe))


def _state_overrides(state_model: type[State]) -> list[str]:
    """Machinery of `State` (and BaseModel) a state model redefines: its dumps or change log could say anything."""
    reserved = set(dir(State)) - {"model_config", "model_post_init"} - _automatic_class_names()
    out: list[str] = []
    for cls in state_model.__mro__:
        if cls is State:
            break
        for name in sorted(set(vars(cls)) & reserved):
            out.append(f"state model {cls.__qualname__} redefines State.{name}; the runtime's own must be used")
    return out


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
        print("usage: python -m envfactory.env.sandbox_child JOB.json RESULT.json", file=sys.stderr)
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
