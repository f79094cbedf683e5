"""Untrusted environments at run time: the `Session` API served by pooled sandboxed workers.

EnvGen judges generated code inside the OS sandbox; this module makes sure that the same code is
never run any other way until a person trusts it (`envfactory envs trust NAME`). An untrusted
folder loads as a `SandboxedEnvironment`: its metadata comes from `metadata.json` (checked against
what the code derives, inside the sandbox), its scenarios are read by the parent, and its
sessions — for the MCP server, the hub, the reward, GRPO rollouts, QueryGen — are
`SandboxedSession`s whose state lives in a worker process behind the wall.

Workers are pooled per code (a worker holds many sessions; the pool starts up to
`sandbox_workers` of them), so a session costs a `fork` request, not a process: ~3,000 calls/s
per worker, see `benchmarks/sessions.py`. The parent keeps each session's initial config and its
successful calls; when a worker dies (a hung call is killed at `sandbox_call_timeout_s`, a limit
strikes, the code crashes it) every session it held is restored on a fresh worker by replaying
them — tools are deterministic, so the state comes back exactly; a replay that disagrees marks
the session broken instead of serving a different state.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envfactory.env.environment import BaseEnvironment, contract_problems
from envfactory.env.metadata import EnvMetadata, ToolKind
from envfactory.env.sandbox.ast_check import static_check
from envfactory.env.sandbox.process import ChannelLimits, SandboxProcess, WorkerDied
from envfactory.env.sandbox.protocol import CallAnswer, LoadAnswer, WorkerLimits
from envfactory.env.sandbox.wall import Wall
from envfactory.env.session import ERROR_TYPES, CallRecord, Session, ToolErrorInfo
from envfactory.env.tools import ArgumentError, ArgumentProblem
from envfactory.errors import ContractError, EnvLoadError, ScenarioError

_WORKER_CPU_S = 3600  # a pooled worker's whole life; it is replaced (sessions replayed) when it runs out


# What a pooled worker may send in one answer. A session keeps its results (as in-process sessions do),
# so the budget is on values (each ~32-60 bytes once parsed), not only bytes.
SESSION_CHANNEL = ChannelLimits(max_answer_bytes=16 * 1024 * 1024, max_values=500_000)


class PoolSettings:
    """What a pool of workers for one environment needs (a plain value object, hashable)."""

    def __init__(
        self,
        *,
        wall: Wall,
        memory_mb: int,
        tmpfs_mb: int,
        workers: int,
        call_timeout_s: float,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.wall = wall
        self.memory_mb = memory_mb
        self.tmpfs_mb = tmpfs_mb
        self.workers = workers
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s


class _Pooled:
    """One worker of a pool, with the sessions it holds and the ones dropped since its last request."""

    def __init__(self, process: SandboxProcess, generation: int) -> None:
        self.process = process
        self.generation = generation
        self.sessions = 0
        self.closed: list[int] = []  # appended from finalizers: list.append is atomic


class WorkerPool:
    """Workers for one environment's code, started on demand and replaced when they die."""

    def __init__(self, name: str, source: str, settings: PoolSettings) -> None:
        self.name, self.source, self.settings = name, source, settings
        self._workers: list[_Pooled] = []
        self._lock = threading.Lock()
        self._generation = 0
        self._sid = 0
        self.load: LoadAnswer | None = None
        self.restarts = 0
        self.channel = SESSION_CHANNEL
        self.users = 0  # `pool_for`'s count of the loads sharing it
        self.key: tuple[str, str] | None = None

    def _start(self) -> _Pooled:
        s = self.settings
        process = SandboxProcess(
            s.wall,
            WorkerLimits(memory_mb=s.memory_mb, cpu_s=_WORKER_CPU_S, fsize_mb=16),
            tmpfs_mb=s.tmpfs_mb,
            channel=self.channel.model_copy(update={"start_timeout_s": s.start_timeout_s}),
        )
        try:
            process.start()
            raw = process.request(
                "load", s.start_timeout_s, source=self.source, module_name=f"envgen_{self.name}", path="/sandbox/env.py"
            )
        except WorkerDied as e:
            process.close()
            raise EnvLoadError(f"environment '{self.name}': its sandboxed worker did not start: {e.detail}") from None
        try:
            load = LoadAnswer.model_validate(raw)
        except ValidationError:
            process.close()
            raise EnvLoadError(f"environment '{self.name}': malformed answer from its sandboxed worker") from None
        if load.import_error or load.env_problems or "failure" in raw:
            process.close()
            why = load.import_error or "; ".join(load.env_problems) or str(raw.get("failure"))
            raise EnvLoadError(f"environment '{self.name}': env.py does not load in the sandbox: {why}")
        if self.load is None:
            self.load = load
        self._generation += 1
        return _Pooled(process, self._generation)

    def acquire(self) -> tuple[_Pooled, int]:
        """The live worker holding the fewest sessions (a new one while below the pool size), and a new sid."""
        with self._lock:
            self._workers = [w for w in self._workers if w.process.alive]
            if len(self._workers) < self.settings.workers and (
                not self._workers or min(w.sessions for w in self._workers) > 0
            ):
                self._workers.append(self._start())
            worker = min(self._workers, key=lambda w: w.sessions)
            worker.sessions += 1
            self._sid += 1
            return worker, self._sid

    def ensure_loaded(self) -> LoadAnswer:
        with self._lock:
            if not any(w.process.alive for w in self._workers):
                self._workers.append(self._start())
            assert self.load is not None
            return self.load

    def request(self, worker: _Pooled, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        closed, worker.closed = worker.closed, []
        limit = self.settings.call_timeout_s if timeout_s is None else min(timeout_s, self.settings.call_timeout_s)
        return worker.process.request(op, limit, closed=closed, **fields)

    def shutdown(self) -> None:
        with self._lock:
            for w in self._workers:
                w.process.close()
            self._workers.clear()


def _release(worker: _Pooled, sid: int) -> None:
    """A session is gone: its worker forgets it with its next request (no I/O in a finalizer)."""
    worker.sessions -= 1
    worker.closed.append(sid)


_POOLS: dict[tuple[str, str], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(name: str, source: str, code_hash: str, settings: PoolSettings) -> WorkerPool:
    """One pool per environment code per process, shared by every `EnvPool` that loads it (each load
    counts as a user until `release_pool`)."""
    key = (name, code_hash)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = WorkerPool(name, source, settings)
        pool.users += 1
        pool.key = key
        return pool


def release_pool(pool: WorkerPool) -> None:
    """One user is done with `pool`: the last one shuts its workers down (another thread checking the
    same code keeps them until it is done too)."""
    with _POOLS_LOCK:
        pool.users -= 1
        if pool.users > 0:
            return
        if pool.key is not None and _POOLS.get(pool.key) is pool:
            del _POOLS[pool.key]
    pool.shutdown()


@atexit.register
def shutdown_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown()


class _RemoteBinding:
    """A tool of an untrusted environment: its name and kind from the metadata, argument parsing in a worker."""

    def __init__(self, env: SandboxedEnvironment, name: str, kind: ToolKind) -> None:
        self.env, self.name, self.kind = env, name, kind

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        raw = self.env.ask("parse_args", tool=self.name, args=args)
        problems = raw.get("problems") or []
        if problems or not isinstance(raw.get("kwargs"), dict):
            raise ArgumentError(
                [ArgumentProblem.model_validate(p) for p in problems]
                or [ArgumentProblem(parameter="<arguments>", problem=str(raw.get("failure") or "cannot be parsed"))]
            )
        return dict(raw["kwargs"])

    def invoke(self, state: Any, kwargs: dict[str, Any]) -> Any:
        raise TypeError("an untrusted environment's tools run only through its sandboxed sessions")


class SandboxedEnvironment(BaseEnvironment):
    """An environment whose code has not been trusted: everything that runs its code runs in a worker."""

    blocking_io = True  # servers call its sessions from a thread: a call may wait on a worker

    def __init__(self, name: str, folder: Path, source: str, metadata: EnvMetadata, pool: WorkerPool) -> None:
        self.name = name
        self.folder = folder
        self.source = source
        self._metadata = metadata
        self.pool = pool
        self.kinds = {t.name: t.kind for t in metadata.tools}

    @property
    def metadata(self) -> EnvMetadata:
        return self._metadata

    def check_contract(self, source_label: str) -> None:
        """Start the pool's first worker and compare the code's own metadata with `metadata.json`."""
        load = self.pool.ensure_loaded()
        try:
            derived = EnvMetadata.model_validate(load.derived_metadata or {})
        except ValidationError as e:
            raise EnvLoadError(
                f"environment '{self.name}': the code's own metadata is invalid: {e.errors()[0]['msg']}"
            ) from None
        problems = contract_problems(self._metadata, derived, source_label)
        if problems:
            raise ContractError(self.name, problems)

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request to any worker of the pool (for stateless requests)."""
        worker, _ = self.pool.acquire()
        try:
            return self.pool.request(worker, op, **fields)
        except WorkerDied as e:
            return {"failure": f"the sandboxed worker died: {e.detail}"}
        finally:
            worker.sessions -= 1

    def binding(self, tool: str) -> _RemoteBinding | None:
        kind = self.kinds.get(tool)
        return _RemoteBinding(self, tool, kind) if kind is not None else None

    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> dict[str, Any]:
        """The config loaded into the state model and dumped again (the state itself stays in a worker)."""
        raw = self.ask("normalize", config=config, source=source)
        if isinstance(raw.get("state"), dict):
            return dict(raw["state"])
        raise ScenarioError(str(raw.get("load_error") or raw.get("failure") or f"{source}: does not load"))

    def dump_state(self, state: Any) -> dict[str, Any]:
        return dict(state)

    def open_session(self, data: dict[str, Any] | None, source: str, *, strict: bool = False) -> Session:
        return SandboxedSession(self, data, source, strict=strict)


class SandboxedSession(Session):
    """A `Session` whose state lives in a sandboxed worker; same API, same records."""

    def __init__(self, env: SandboxedEnvironment, config: dict[str, Any] | None, source: str, *, strict: bool) -> None:
        self.env: SandboxedEnvironment = env
        self.strict = strict
        self.source = source
        self.config = config
        self.history: list[CallRecord] = []
        self._replay: list[tuple[str, dict[str, Any], Any]] = []
        self._replay_s = 0.0  # what replaying `_replay` would take: checkpointed past half a call's limit
        self._worker: _Pooled | None = None
        self._sid = 0
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self.broken: str | None = None
        self.restored = 0
        self._bind(replay=False)

    # ---- where the state lives -------------------------------------------------------------
    def _unbind(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # releases the sid on its worker (once)
            self._finalizer = None
        self._worker = None

    def _bind(self, *, replay: bool) -> None:
        """Fork this session's state on a live worker; with `replay`, redo its successful calls."""
        self._unbind()
        pool = self.env.pool
        worker, sid = pool.acquire()
        self._worker, self._sid = worker, sid
        self._finalizer = weakref.finalize(self, _release, worker, sid)
        try:
            raw = pool.request(worker, "fork", sid=sid, config=self.config, source=self.source, strict=self.strict)
        except WorkerDied as e:
            raise ScenarioError(f"{self.source}: the sandboxed worker died while loading it: {e.detail}") from None
        if raw.get("load_error") or raw.get("load_crash") or "failure" in raw:
            self._unbind()
            why = raw.get("load_error") or raw.get("load_crash") or raw.get("failure")
            raise ScenarioError(str(why))
        if not replay:
            return
        self.restored += 1
        deadline = time.monotonic() + pool.settings.call_timeout_s  # the whole restore: one call's time
        for tool, args, result in self._replay:
            left = deadline - time.monotonic()
            if left <= 0:
                self.broken = "the session could not be restored after its worker died: the replay took too long"
                return
            raw = pool.request(worker, "call", sid=sid, tool=tool, args=args, timeout_s=left)
            if raw.get("ok") is not True or raw.get("result") != result:
                self.broken = f"the session could not be restored after its worker died: '{tool}' did not repeat itself"
                return

    def _checkpoint(self) -> None:
        """Make the current state the session's starting point (a dump), so a restore never replays more
        than half a call's time limit of work."""
        try:
            state = self.dump()
        except ScenarioError:
            return  # the next restore replays instead
        self.config, self._replay, self._replay_s = state, [], 0.0

    def _live(self) -> _Pooled:
        """This session's worker, restoring the session on a fresh one if its worker is gone."""
        worker = self._worker
        if worker is None or not worker.process.alive:
            self._bind(replay=True)
            worker = self._worker
        assert worker is not None
        return worker

    def close(self) -> None:
        self._unbind()

    # ---- the Session API ---------------------------------------------------------------------
    def reset(self, config: dict[str, Any] | str | Path | None = None) -> None:
        data, source = self.env.resolve_config(config)
        old = (self.config, self.source, self._replay, self._replay_s)
        self.config, self.source, self._replay, self._replay_s = data, source, [], 0.0
        try:
            self._bind(replay=False)
        except ScenarioError:
            self.config, self.source, self._replay, self._replay_s = old
            raise
        self.history.clear()
        self.broken = None

    def dump(self) -> dict[str, Any]:
        try:
            raw = self.env.pool.request(self._live(), "dump", sid=self._sid)
        except WorkerDied as e:
            raise ScenarioError(f"the state of '{self.env.name}' could not be read: {e.detail}") from None
        state = raw.get("state")
        if not isinstance(state, dict):
            raise ScenarioError(f"the state of '{self.env.name}' could not be read: {raw.get('error')}")
        return state

    def call(self, tool: str, args: dict[str, Any] | None = None) -> CallRecord:
        args = {} if args is None else args
        if not isinstance(tool, str) or tool not in self.env.kinds:
            names = ", ".join(self.env.metadata.tool_names)
            message = f"no tool '{str(tool)[:100]}'; available: {names}"
            return self._record(str(tool)[:100], {}, error=ToolErrorInfo(type="unknown_tool", message=message))
        if not isinstance(args, dict):
            error = ToolErrorInfo(type="invalid_arguments", message="arguments must be a JSON object")
            return self._record(tool, {}, error=error)
        if self.broken is not None:
            return self._record(tool, args, error=ToolErrorInfo(type="internal_error", message=self.broken))
        try:
            worker = self._live()
            started = time.monotonic()
            raw = self.env.pool.request(worker, "call", sid=self._sid, tool=tool, args=args)
            took = time.monotonic() - started
        except ValueError as e:  # arguments that cannot be encoded
            return self._record(tool, args, error=ToolErrorInfo(type="invalid_arguments", message=str(e)[:300]))
        except (WorkerDied, ScenarioError, EnvLoadError) as e:
            return self._died(tool, args, e)
        if "failure" in raw:  # the worker could not answer (an unencodable result...): its copy may be off
            self._unbind()
            message = f"the environment could not complete the call: {str(raw['failure'])[:300]}"
            return self._record(tool, args, error=ToolErrorInfo(type="internal_error", message=message))
        try:
            answer = CallAnswer.model_validate(raw)
        except ValidationError as e:
            self._unbind()
            message = f"malformed answer from the sandboxed worker: {e.errors()[0]['msg']}"
            return self._record(tool, args, error=ToolErrorInfo(type="internal_error", message=message))
        error = None
        if answer.error is not None:
            kind = answer.error.type if answer.error.type in ERROR_TYPES else "internal_error"
            error = ToolErrorInfo(type=kind, message=answer.error.message)
            with contextlib.suppress(ValidationError):
                error = ToolErrorInfo(type=kind, message=answer.error.message, details=answer.error.details)
        if answer.ok and error is None:
            self._replay.append((tool, args, answer.result))
            self._replay_s += took
            if self._replay_s > self.env.pool.settings.call_timeout_s / 2:
                self._checkpoint()
        return self._record(tool, args, result=answer.result, error=error, diff=answer.diff, changes=answer.changes)

    def _died(self, tool: str, args: dict[str, Any], e: Exception) -> CallRecord:
        self._unbind()  # restored on a fresh worker with the next request
        if isinstance(e, WorkerDied) and e.kind == "timeout":
            t = self.env.pool.settings.call_timeout_s
            error = ToolErrorInfo(type="timeout", message=f"the call did not return within {t:g} s")
        else:
            detail = e.detail if isinstance(e, WorkerDied) else str(e)
            error = ToolErrorInfo(type="internal_error", message=f"the environment's sandboxed worker failed: {detail}")
        return self._record(tool, args, error=error)


def _check_statically(folder: Path, source: str) -> None:
    problems = static_check(source)
    if problems:
        first, more = problems[0], len(problems) - 1
        raise EnvLoadError(
            f"{folder / 'env.py'}: the code fails the sandbox's static check at line {first.line}: {first.message}"
            + (f" (and {more} more)" if more else "")
        )


def load_sandboxed_folder(
    folder: Path, metadata: EnvMetadata, source: str, settings: PoolSettings, code_hash: str
) -> SandboxedEnvironment:
    """An untrusted folder as a `SandboxedEnvironment` (its first worker started, its contract checked)."""
    _check_statically(folder, source)
    pool = pool_for(folder.name, source, code_hash, settings)
    env = SandboxedEnvironment(folder.name, folder, source, metadata, pool)
    env.check_contract(str(folder / "metadata.json"))
    return env


def derive_metadata_sandboxed(folder: Path, source: str, the_wall: Wall, memory_mb: int) -> EnvMetadata:
    """Load untrusted code in a one-off worker and return the metadata its signatures and docstrings define."""
    _check_statically(folder, source)
    settings = PoolSettings(wall=the_wall, memory_mb=memory_mb, tmpfs_mb=16, workers=1, call_timeout_s=30)
    pool = WorkerPool(folder.name, source, settings)
    try:
        load = pool.ensure_loaded()
    finally:
        pool.shutdown()
    try:
        return EnvMetadata.model_validate(load.derived_metadata or {})
    except ValidationError as e:
        raise EnvLoadError(f"{folder / 'env.py'}: the code's own metadata is invalid: {e.errors()[0]['msg']}") from None
