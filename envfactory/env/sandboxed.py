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
the session broken instead of serving a different state. A worker close to its CPU limit
(`sandbox_worker_cpu_s`, the same RLIMIT_CPU a validation round's worker has) is retired the same
way, before the limit can strike a call.

**Judged is served: canaries.** A worker cannot tell a served session from the EnvGen round that
judged its code by its limits, process or requests (`envfactory.envgen.checks.sandbox_round` says
what is made the same, and what cannot be: a served worker is older, has used more CPU, made more
calls and forks; a round sends a session's calls back to back, a client thinks between them). So
served workers are re-checked: each replays *canaries* — a judged session (a passed scenario of the
round, with its results and final state, from the folder's `envgen.json`) and a served session as it
was answered (the pool's first sessions, then about one in `SAMPLE_ONE_IN`; up to `MAX_RECORDED_CALLS`
calls from its start or, from a state dump, from a random later call of it), replayed back to back as a
fresh session: code right only at a round's pace, or only for a session's first calls, answers the
replay otherwise) — as ordinary sessions (a
fork as real ones are, the same calls, a dump at the end), when it starts and then about every
`sandbox_canary_calls` calls and `sandbox_canary_s` seconds, at random points; `integrity` (the
round's tampering check) is asked of it at random points too. A canary that comes out differently,
tampering, or CPU used while idle (`process.py`) ends the worker and marks the environment
**unhealthy**: its sessions' calls come back as `internal_error` naming the reason, new sessions are
refused, and this process never starts that code again. What a canary cannot catch: code that
recognises the very calls a canary replays and answers those right. Canaries replay the judged
scenarios on workers that have not seen them where they can, and the pool's recorded sessions on
workers other than the one that recorded them, but a sequence of calls is what it is.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import random
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envfactory.env.environment import BaseEnvironment, contract_problems
from envfactory.env.metadata import EnvMetadata, ToolKind
from envfactory.env.sandbox.ast_check import static_check
from envfactory.env.sandbox.limits import WORKER_CPU_S, WORKER_SPIN_US, worker_limits
from envfactory.env.sandbox.process import ChannelLimits, SandboxProcess, WorkerDied
from envfactory.env.sandbox.protocol import CallAnswer, JudgedRun, LoadAnswer, load_fields, state_digest
from envfactory.env.sandbox.spare import SPARES
from envfactory.env.sandbox.wall import Wall
from envfactory.env.session import ERROR_TYPES, CallRecord, Session, ToolErrorInfo
from envfactory.env.tools import ArgumentError, ArgumentProblem
from envfactory.errors import ContractError, EnvFactoryError, EnvLoadError, ScenarioError

MAX_JUDGED = 8  # judged sessions taken from envgen.json
MAX_RECORDED = 4  # the pool's first sessions kept as canaries (beside the judged ones, if any)
MAX_SAMPLED = 4  # later served sessions kept as canaries: the newest samples, each replacing the oldest
SAMPLE_ONE_IN = 8  # after the first ones, about one served session in this many is recorded
MAX_RECORDED_CALLS = 10  # calls kept of each
MAX_REFERENCE_BYTES = 256 * 1024  # a recorded session bigger than this (config and results) is not kept
CANARY_BUDGET_S = 0.25  # the most the kept calls of a recorded session took (and a quarter of a call limit)

_LOG = logging.getLogger(__name__)

# code marked unhealthy in this process (name, code hash) -> why: never started again
_UNHEALTHY: dict[tuple[str, str], str] = {}


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
        cpu_s: int = WORKER_CPU_S,
        canary_calls: int = 1000,
        canary_s: float = 60.0,
        spare: bool = False,
        spin_us: int = WORKER_SPIN_US,
        dedicated: bool = False,
    ) -> None:
        self.wall = wall
        self.memory_mb = memory_mb
        self.tmpfs_mb = tmpfs_mb
        self.workers = workers
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.cpu_s = cpu_s  # each worker's RLIMIT_CPU: a worker close to it is retired
        self.canary_calls = canary_calls
        self.canary_s = canary_s
        self.spare = spare  # start workers from a warm spare (`sandbox/spare.py`) and keep one ready
        self.spin_us = spin_us  # parent and worker poll their pipe this long before sleeping (`FrameReader`)
        # a worker of its own for each session (and each stateless request), ended with it; no served session is
        # recorded as a canary (its calls would be replayed on another client's worker)
        self.dedicated = dedicated


_SERIALS = itertools.count(1)


class _Reference:
    """A session a canary replays: `judged` (a passed scenario of the round that judged the code) or
    recorded (one of the pool's first sessions, as first answered, on worker `generation`)."""

    def __init__(
        self,
        label: str,
        config: dict[str, Any] | None,
        source: str,
        *,
        judged: bool,
        generation: int = 0,
        final_digest: str | None = None,
        sampled: bool = False,
    ) -> None:
        self.label, self.config, self.source = label, config, source
        self.judged, self.generation, self.final_digest = judged, generation, final_digest
        self.sampled = sampled  # recorded at random later on (not one of the pool's first sessions)
        self.serial = next(_SERIALS)  # what a worker remembers having replayed
        self.calls: list[tuple[str, dict[str, Any], bool, str | None, Any]] = []
        self.size = 0
        self.took = 0.0  # what its kept calls took when first answered

    def describe(self) -> str:
        return f"judged scenario '{self.label}'" if self.judged else f"recorded session {self.label}"


class _Pooled:
    """One worker of a pool, with the sessions it holds and the ones dropped since its last request."""

    def __init__(self, process: SandboxProcess, generation: int) -> None:
        self.process = process
        self.generation = generation
        self.sessions = 0
        self.served = False  # has held a session (a dedicated pool's worker holds one, then ends)
        self.closed: list[int] = []  # appended from finalizers: list.append is atomic
        self.retired = False  # closed near its CPU limit: its sessions move, a call cut short is retried
        self.seen: set[int] = set()  # references replayed here (serial)
        self.calls_left = 0  # calls until its next canary
        self.canary_at = 0.0  # monotonic time of its next canary
        self.integrity_left = 0  # calls until its next integrity check
        self.checking = threading.Lock()  # one canary at a time per worker


class WorkerPool:
    """Workers for one environment's code, started on demand, replaced when they die or near their CPU
    limit, re-checked with canaries while they serve, and all ended when the code shows itself unhealthy."""

    def __init__(self, name: str, source: str, settings: PoolSettings) -> None:
        self.name, self.source, self.settings = name, source, settings
        self._workers: list[_Pooled] = []
        self._lock = threading.Lock()
        self._generation = 0
        self._sids = itertools.count(1)
        self.load: LoadAnswer | None = None
        self.restarts = 0
        self.retired = 0  # workers retired near their CPU limit
        self.canaries = 0  # canaries replayed
        self.channel = SESSION_CHANNEL
        self.users = 0  # `pool_for`'s count of the loads sharing it
        self.key: tuple[str, str, bool] | None = None  # (name, code hash, dedicated)
        self.unhealthy: str | None = None  # why this code is no longer served
        self.references: list[_Reference] = []
        self._recorded = 0  # served sessions recorded so far
        self._rng = random.Random()  # seeded from the system: the code cannot predict when a canary comes

    # ---- health ----------------------------------------------------------------------------------
    def refusal(self) -> str:
        return f"environment '{self.name}' is unhealthy and serves no more calls: {self.unhealthy}"

    def mark_unhealthy(self, reason: str, detail: str | None = None) -> None:
        """The code showed itself unhealthy: every worker ends, nothing starts it again in this process. `reason` is
        what every client is told from now on, so it holds nothing the worker wrote (a canary's answer could carry
        one client's data to all of them); `detail`, what it wrote, goes to the operator's log only."""
        if self.unhealthy is None:
            self.unhealthy = reason
            if detail is not None:
                # (repr: no raw line ends from the worker in the log)
                _LOG.warning("environment '%s' is unhealthy: %s: %r", self.name, reason, detail)
            if self.key is not None:
                _UNHEALTHY.setdefault(self.key[:2], reason)
        for w in list(self._workers):
            w.process.close()

    def _refuse(self) -> None:
        if self.unhealthy is not None:
            raise EnvLoadError(self.refusal())

    # ---- workers ---------------------------------------------------------------------------------
    def worker_channel(self) -> ChannelLimits:
        """The channel its workers start with, and the spares they are taken from are kept under."""
        s = self.settings
        return self.channel.model_copy(update={"start_timeout_s": s.start_timeout_s, "spin_us": s.spin_us})

    def _start(self) -> _Pooled:
        self._refuse()
        s = self.settings
        limits = worker_limits(s.memory_mb, s.cpu_s)
        channel = self.worker_channel()
        spare = SPARES.take(s.wall, limits, s.tmpfs_mb, channel) if s.spare else None
        process = spare or SandboxProcess(s.wall, limits, tmpfs_mb=s.tmpfs_mb, channel=channel, monitor=True)
        pool = weakref.ref(self)
        process.on_idle_cpu = lambda died: _tell(pool, died)
        try:
            if spare is None:
                process.start()
            raw = process.request("load", s.start_timeout_s, **load_fields(self.source, self.name))
        except WorkerDied as e:
            process.close()
            if e.kind == "idle":
                self.mark_unhealthy(e.detail)
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
        worker = _Pooled(process, self._generation)
        self._schedule(worker)
        self._canary(worker)  # before it serves anything
        if self.unhealthy is not None:
            process.close()
            self._refuse()
        if s.spare:  # the next start is a hand-over (started now: it does not slow this one)
            SPARES.refill(s.wall, limits, s.tmpfs_mb, channel)
        return worker

    def _spent(self, worker: _Pooled) -> bool:
        """Close enough to its CPU limit that one more call could reach it: retired (closed) now."""
        if worker.retired:
            return True
        s = self.settings
        margin = min(s.call_timeout_s + 1.0, s.cpu_s / 2)
        if worker.process.cpu_s + margin < s.cpu_s:
            return False
        worker.retired = True
        self.retired += 1
        worker.process.close()
        return True

    def acquire(self) -> tuple[_Pooled, int]:
        """The live worker holding the fewest sessions (a new one while below the pool size), and a new sid. A
        dedicated pool's: a worker no session has held (one started for the code's load), else a new one."""
        with self._lock:
            self._refuse()
            self._workers = [w for w in self._workers if w.process.alive and not self._spent(w) and not self._ended(w)]
            if self.settings.dedicated:
                worker = next((w for w in self._workers if not w.served), None)
                if worker is None:
                    worker = self._start()
                    self._workers.append(worker)
            else:
                if len(self._workers) < self.settings.workers and (
                    not self._workers or min(w.sessions for w in self._workers) > 0
                ):
                    self._workers.append(self._start())
                worker = min(self._workers, key=lambda w: w.sessions)
            worker.sessions += 1
            worker.served = True
            return worker, next(self._sids)

    def _ended(self, worker: _Pooled) -> bool:
        """A dedicated pool's worker whose session is gone: closed now (never handed to another)."""
        if not (self.settings.dedicated and worker.served and worker.sessions <= 0):
            return False
        worker.process.close()
        return True

    def reap(self) -> None:
        """End a dedicated pool's workers whose sessions are gone (a session's `close`; a session dropped without
        one is reaped at the next `acquire`, as a finalizer does no I/O)."""
        if self.settings.dedicated:
            with self._lock:
                self._workers = [w for w in self._workers if not self._ended(w)]

    def ensure_loaded(self) -> LoadAnswer:
        with self._lock:
            self._refuse()
            if not any(w.process.alive for w in self._workers):
                self._workers.append(self._start())
            assert self.load is not None
            return self.load

    def request(self, worker: _Pooled, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """One request of a session. A call may first be preceded by a canary or an integrity check on the
        worker (when one is due); an unhealthy pool refuses (`EnvLoadError`)."""
        self._refuse()
        if op == "call":
            self._due(worker)
            self._refuse()
        return self._send(worker, op, timeout_s, **fields)

    def _send(self, worker: _Pooled, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        closed, worker.closed = worker.closed, []
        limit = self.settings.call_timeout_s if timeout_s is None else min(timeout_s, self.settings.call_timeout_s)
        try:
            return worker.process.request(op, limit, closed, **fields)
        except WorkerDied as e:
            if e.kind == "idle":
                self.mark_unhealthy(e.detail)
            raise

    def shutdown(self) -> None:
        """End every worker, and the warm spare too (it has no code, but a shutdown leaves no sandbox
        process behind; the next start anywhere is cold and refills it)."""
        with self._lock:
            for w in self._workers:
                w.process.close()
            self._workers.clear()
        if self.settings.spare:
            SPARES.close()

    # ---- canaries ----------------------------------------------------------------------------------
    def set_judged(self, runs: list[tuple[JudgedRun, str]]) -> None:
        """The judged sessions (with the source label a real session of that config has) canaries replay."""
        if any(r.judged for r in self.references):
            return
        for run, source in runs:
            ref = _Reference(run.name, run.initial_config, source, judged=True, final_digest=run.final_digest)
            ref.calls = [(c.tool, c.args, c.ok, c.error_type, c.result) for c in run.calls]
            self.references.append(ref)

    def recording(self, config: dict[str, Any] | None, source: str, generation: int) -> _Reference | None:
        """A reference recorded from a real session as it is answered: each of the pool's first `MAX_RECORDED`
        sessions, then about one in `SAMPLE_ONE_IN` (the newest `MAX_SAMPLED` of those kept) — judged sessions
        or not. A canary replays its calls back to back, as a round sends them, so code that answers a round
        (or a judged canary) right and a client who thinks between calls otherwise shows itself."""
        if self.settings.dedicated:  # its calls would be replayed on another client's worker
            return None
        recorded = [r for r in self.references if not r.judged]
        first = len(recorded) < MAX_RECORDED
        if not first and self._rng.randrange(SAMPLE_ONE_IN):
            return None
        try:
            text = json.dumps(config)
        except (TypeError, ValueError):
            return None
        if len(text) > MAX_REFERENCE_BYTES:
            return None
        self._recorded += 1
        ref = _Reference(
            f"#{self._recorded}", json.loads(text), source, judged=False, generation=generation, sampled=not first
        )
        ref.size = len(text)
        sampled = [r for r in recorded if r.sampled]
        if not first and len(sampled) >= MAX_SAMPLED:
            self.references.remove(sampled[0])
        self.references.append(ref)
        return ref

    def recording_again(
        self, old: _Reference | None, state: dict[str, Any], source: str, generation: int, at: int
    ) -> _Reference | None:
        """A sampled session's recording started again at its call `at`, from its state then (a dump): `old`,
        its earlier window, is replaced. The window's start is a random call of the session (see
        `SandboxedSession.call`), and a canary replays it as a fresh session: code right only for a session's
        first calls answers the replay otherwise. One of the pool's first sessions keeps its window from the
        start (those are replayed oldest first): the later window is added beside it."""
        try:
            text = json.dumps(state)
        except (TypeError, ValueError):
            return None
        if len(text) > MAX_REFERENCE_BYTES:
            return None
        self._recorded += 1
        ref = _Reference(
            f"#{self._recorded} (from call {at + 1})",
            json.loads(text),
            source,
            judged=False,
            generation=generation,
            sampled=True,
        )
        ref.size = len(text)
        refs = self.references
        if old is not None and old.sampled and old in refs:
            with contextlib.suppress(ValueError, IndexError):
                refs[refs.index(old)] = ref
                return ref
        sampled = [r for r in refs if r.sampled and not r.judged]
        if len(sampled) >= MAX_SAMPLED:
            with contextlib.suppress(ValueError):
                refs.remove(sampled[0])
        refs.append(ref)
        return ref

    def record(self, ref: _Reference, tool: str, args: dict[str, Any], answer: CallAnswer, took: float) -> bool:
        """One more call of a recorded session; False when the recording stops here (a failure of the code,
        enough calls, too large, or more time than a canary may take)."""
        error = answer.error.type if answer.error is not None else None
        if error in ("internal_error", "timeout") or len(ref.calls) >= MAX_RECORDED_CALLS:
            return False
        if ref.took + took > min(CANARY_BUDGET_S, self.settings.call_timeout_s / 4):
            return False
        try:
            size = len(json.dumps([args, answer.result]))
        except (TypeError, ValueError):
            return False
        if ref.size + size > MAX_REFERENCE_BYTES:
            return False
        ref.size += size
        ref.took += took
        ref.calls.append((tool, json.loads(json.dumps(args)), answer.ok, error, answer.result))
        return True

    def _schedule(self, worker: _Pooled, *, canary: bool = True, integrity: bool = True) -> None:
        """When the next canary and the next integrity check come: at random, each on its own."""
        n = self.settings.canary_calls
        if canary:
            worker.calls_left = self._rng.randint(max(1, n // 2), max(1, n * 3 // 2))
            worker.canary_at = time.monotonic() + self.settings.canary_s * self._rng.uniform(0.5, 1.5)
        if integrity:
            worker.integrity_left = self._rng.randint(max(1, n // 2), max(1, n * 3 // 2))

    def _due(self, worker: _Pooled) -> None:
        """Before a call: a canary or an integrity check on this worker, when one is due."""
        worker.calls_left -= 1
        worker.integrity_left -= 1
        canary = worker.calls_left <= 0 or time.monotonic() >= worker.canary_at
        integrity = worker.integrity_left <= 0
        if not (canary or integrity) or not worker.checking.acquire(blocking=False):
            return
        try:
            if integrity:
                self._integrity(worker)
            if canary:
                self._canary(worker)
            self._schedule(worker, canary=canary, integrity=integrity)
        finally:
            worker.checking.release()

    def _integrity(self, worker: _Pooled) -> None:
        """The round's tampering check, asked of a served worker."""
        try:
            raw = self._send(worker, "integrity")
        except WorkerDied:
            return  # its sessions are restored elsewhere
        changed = raw.get("tampering")
        if changed and isinstance(changed, list):
            shown = ", ".join(str(c)[:100] for c in changed[:3])
            self.mark_unhealthy("the code changed the runtime it runs in, while serving", shown)

    def _picks(self, worker: _Pooled) -> list[_Reference]:
        """What one canary replays: a judged session (one this worker has not replayed first), and a recorded
        one — one this worker has not replayed yet, else half the time the oldest (the first sessions were
        answered before anything that keys on age or counts could have drifted) — recorded on another worker
        where there is one. A recorded session may have been recorded wrong (code that had already drifted):
        it never stands in for a judged one; it is what catches code that answers the back-to-back calls of
        a round and a canary right, and a client's calls otherwise."""
        refs = [r for r in self.references if r.calls]
        picks: list[_Reference] = []
        judged = [r for r in refs if r.judged]
        if judged:
            fresh = [r for r in judged if r.serial not in worker.seen]
            picks.append(self._rng.choice(fresh or judged))
        recorded = [r for r in refs if not r.judged]
        recorded = [r for r in recorded if r.generation != worker.generation] or recorded
        if recorded:
            fresh = [r for r in recorded if r.serial not in worker.seen]
            if fresh:
                picks.append(self._rng.choice(fresh))
            else:
                picks.append(recorded[0] if self._rng.random() < 0.5 else self._rng.choice(recorded))
        return picks

    def _canary(self, worker: _Pooled) -> None:
        for ref in self._picks(worker):
            worker.seen.add(ref.serial)
            self.canaries += 1
            why = self._replay(worker, ref)
            if why is not None:
                self.mark_unhealthy(
                    f"a canary ({ref.describe()}, replayed as an ordinary session) came out otherwise", why
                )
                return

    def _replay(self, worker: _Pooled, ref: _Reference) -> str | None:
        """`ref` replayed on `worker` as a real session is served: why it came out differently, or None."""
        sid = next(self._sids)
        calls = list(ref.calls)
        try:
            raw = self._send(worker, "fork", sid=sid, config=ref.config, source=ref.source, strict=False)
            if raw.get("load_error") or raw.get("load_crash") or "failure" in raw:
                return f"did not load its initial config: {_short(raw)}"
            for i, (tool, args, ok, error_type, result) in enumerate(calls, 1):
                raw = self._send(worker, "call", sid=sid, tool=tool, args=args)
                try:
                    answer = CallAnswer.model_validate(raw)
                except ValidationError:
                    return f"got no usable answer at call {i} ({tool}): {_short(raw)}"
                got = (answer.ok, answer.error.type if answer.error is not None else None, answer.result)
                if got != (ok, error_type, result):
                    return f"answered call {i} ({tool}) with {_short(got)}, not {_short((ok, error_type, result))}"
            raw = self._send(worker, "dump", sid=sid)
            state = raw.get("state")
            if not isinstance(state, dict):
                return "left a state that cannot be read"
            if ref.final_digest is not None and state_digest(state) != ref.final_digest:
                return "left another final state than the one judged"
            return None
        except WorkerDied as e:
            if e.kind == "memory" or worker.retired or self.unhealthy is not None:
                return None  # a worker out of memory (all its sessions share it) is replaced, not judged
            return f"did not complete: {e.detail}"
        finally:
            worker.closed.append(sid)


def _tell(pool: weakref.ref[WorkerPool], died: WorkerDied) -> None:
    """The idle monitor ended one of `pool`'s workers."""
    target = pool()
    if target is not None:
        target.mark_unhealthy(died.detail)


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _release(worker: _Pooled, sid: int) -> None:
    """A session is gone: its worker forgets it with its next request (no I/O in a finalizer)."""
    worker.sessions -= 1
    worker.closed.append(sid)


_POOLS: dict[tuple[str, str, bool], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(name: str, source: str, code_hash: str, settings: PoolSettings) -> WorkerPool:
    """One pool per environment code per process, shared by every `EnvPool` that loads it (each load
    counts as a user until `release_pool`)."""
    key = (name, code_hash, settings.dedicated)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = WorkerPool(name, source, settings)
            pool.unhealthy = _UNHEALTHY.get(key[:2])  # code that showed itself unhealthy is not started again
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
    SPARES.close()


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

    @property
    def unhealthy(self) -> str | None:
        """Why this environment's code is no longer served (a canary, tampering, CPU used while idle), or None."""
        return self.pool.unhealthy

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
        if self.pool.unhealthy is not None:
            return {"failure": self.pool.refusal()}
        worker, _ = self.pool.acquire()
        try:
            return self.pool.request(worker, op, **fields)
        except WorkerDied as e:
            return {"failure": self.pool.refusal() if self.pool.unhealthy else f"the sandboxed worker died: {e.detail}"}
        except EnvLoadError as e:  # marked unhealthy meanwhile
            return {"failure": str(e)}
        finally:
            worker.sessions -= 1
            self.pool.reap()

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
        self._calls = 0  # calls made on this session (a caller may clear `history`: sampling counts these)
        self._replay: list[tuple[str, dict[str, Any], Any]] = []
        self._replay_s = 0.0  # what replaying `_replay` would take: checkpointed past half a call's limit
        self._worker: _Pooled | None = None
        self._sid = 0
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self.broken: str | None = None
        self.restored = 0
        self._ref: _Reference | None = None  # this session recorded as a canary reference
        self._sampled: bool = False
        self._bind(replay=False)
        assert self._worker is not None
        self._ref = env.pool.recording(self.config, self.source, self._worker.generation)
        self._sampled = self._ref is not None  # recorded: a later window of its calls may be recorded too

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
        """This session's worker, restoring the session on a fresh one if its worker is gone or was retired
        near its CPU limit."""
        worker = self._worker
        if worker is None or not worker.process.alive or self.env.pool._spent(worker):
            self._bind(replay=True)
            worker = self._worker
        assert worker is not None
        return worker

    def close(self) -> None:
        self._unbind()
        self.env.pool.reap()

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
        self._calls = 0
        self.broken = None
        self._ref = None
        self._sampled = False

    def dump(self) -> dict[str, Any]:
        if self.env.pool.unhealthy is not None:
            raise ScenarioError(self.env.pool.refusal())
        try:
            raw = self.env.pool.request(self._live(), "dump", sid=self._sid)
        except WorkerDied as e:
            raise ScenarioError(f"the state of '{self.env.name}' could not be read: {e.detail}") from None
        state = raw.get("state")
        if not isinstance(state, dict):
            why = raw.get("error") or raw.get("failure") or "the worker's answer holds no state"
            raise ScenarioError(f"the state of '{self.env.name}' could not be read: {why}")
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
        pool = self.env.pool
        if pool.unhealthy is not None:
            return self._record(tool, args, error=ToolErrorInfo(type="internal_error", message=pool.refusal()))
        if self.broken is not None:
            return self._record(tool, args, error=ToolErrorInfo(type="internal_error", message=self.broken))
        n = self._calls
        self._calls += 1
        if self._sampled and n and pool._rng.randrange(n + 1) == 0:
            self._record_again(n)  # the window recorded starts at a random call of the session (1/(n+1) here)
        for attempt in (1, 2):
            worker: _Pooled | None = None
            try:
                worker = self._live()
                started = time.monotonic()
                raw = pool.request(worker, "call", sid=self._sid, tool=tool, args=args)
                took = time.monotonic() - started
                break
            except ValueError as e:  # arguments that cannot be encoded
                return self._record(tool, args, error=ToolErrorInfo(type="invalid_arguments", message=str(e)[:300]))
            except WorkerDied as e:
                if attempt == 1 and worker is not None and worker.retired and pool.unhealthy is None:
                    continue  # retired under this call: restored on a fresh worker, the call made there
                return self._died(tool, args, e)
            except (ScenarioError, EnvLoadError) as e:
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
        if self._ref is not None and not pool.record(self._ref, tool, args, answer, took):
            self._ref = None
        if answer.ok and error is None:
            self._replay.append((tool, args, answer.result))
            self._replay_s += took
            if self._replay_s > self.env.pool.settings.call_timeout_s / 2:
                self._checkpoint()
        return self._record(tool, args, result=answer.result, error=error, diff=answer.diff, changes=answer.changes)

    def _record_again(self, at: int) -> None:
        """Start this recorded session's recording again here, from its state now (a dump the code sees: code
        that answers right after a dump is not caught this way)."""
        try:
            state = self.dump()
            generation = self._live().generation
        except ScenarioError:
            return
        ref = self.env.pool.recording_again(self._ref, state, self.source, generation, at)
        if ref is not None:
            self._ref = ref

    def _died(self, tool: str, args: dict[str, Any], e: Exception) -> CallRecord:
        self._unbind()  # restored on a fresh worker with the next request
        if self.env.pool.unhealthy is not None:
            error = ToolErrorInfo(type="internal_error", message=self.env.pool.refusal())
        elif isinstance(e, WorkerDied) and e.kind == "timeout":
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
    pool.set_judged(_judged_runs(env))
    env.check_contract(str(folder / "metadata.json"))
    return env


def _judged_runs(env: SandboxedEnvironment) -> list[tuple[JudgedRun, str]]:
    """The judged sessions of the last EnvGen round in the folder's `envgen.json` that kept any, each with
    the source label a session of that config gets (a shipped scenario's, or a client's dump's)."""
    from envfactory.env.folder import exists, read_json_object

    folder = env.folder
    try:
        if folder is None or not exists(folder, "envgen.json"):
            return []
        reports = read_json_object(folder, "envgen.json", what="envgen.json").get("reports")
    except EnvFactoryError:
        return []
    runs: list[JudgedRun] = []
    for report in reversed(reports if isinstance(reports, list) else []):
        judged = report.get("judged") if isinstance(report, dict) else None
        for raw in (judged if isinstance(judged, list) else [])[:MAX_JUDGED]:
            with contextlib.suppress(ValidationError, TypeError, ValueError):
                if len(json.dumps(raw)) <= MAX_REFERENCE_BYTES:  # a canary costs little, whatever the file says
                    runs.append(JudgedRun.model_validate(raw))
        if runs:
            break
    shipped: dict[str, str] = {}
    with contextlib.suppress(EnvFactoryError):
        for name in env.scenario_names():
            shipped.setdefault(json.dumps(env.scenario(name), sort_keys=True), env.resolve_config(name)[1])
    return [(run, shipped.get(json.dumps(run.initial_config, sort_keys=True), "<config>")) for run in runs]


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
