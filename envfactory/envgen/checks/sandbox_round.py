"""One EnvGen validation round: `run_checks_in_sandbox` drives a fresh sandboxed worker call by call.

The parent sends the code, forks a session per scenario, makes each call, dumps the state where a
check or the read-only rule needs it, replays every completed scenario on a fresh session, and
records everything in `Observations` itself. The worker never sees an expected result and has no
file to write a verdict into: its only output is its answers, which the parent parses with size
and depth limits. The parent holds the clocks: a call that does not answer within the per-call
limit is a hung tool (the worker is killed; the next scenario gets a new one), and the round's
wall clock stops everything. Never raises for bad code: every outcome is a `SandboxResult`.

**Judged is served.** The code must not be able to tell this round from serving, or it could pass
here and serve something else. So the round's worker is started exactly as a served one
(`SandboxProcess`, the same command, environment, working folder and descriptors), with the same
limits (`SandboxLimits.worker()` and the pool both call `worker_limits` with the same settings), the
same module name and path (`load_fields`), and requests of the same shape and kinds a served worker
gets: sessions are forked *not* strict, as served ones are (the parent checks from its own dumps
what strict mode would: writes outside the CRUD helpers, a failed call that changed the state), and
`integrity` is asked of served workers too. What cannot be made the same is said here: the round's
worker is young (little CPU used, seconds since its import, few calls and forks) and the round dumps
the state after every call (as health checks and some clients do, and canaries do not). Against
code that keys its behaviour on such things the round records each passed scenario's calls, results
and final state (`ErrorReport.judged`, kept in the folder's `envgen.json`), and served workers
replay them as ordinary sessions when they start and every so often (`envfactory.env.sandboxed`):
any difference marks the environment unhealthy.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from envfactory.env.diff import diff_states, state_part
from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandbox.ast_check import StaticProblem, static_check
from envfactory.env.sandbox.limits import SandboxLimits
from envfactory.env.sandbox.process import ChannelLimits, SandboxProcess, WorkerDied
from envfactory.env.sandbox.protocol import (
    CallAnswer,
    ForkAnswer,
    Interrupt,
    LoadAnswer,
    Observations,
    Phase,
    ScenarioObservation,
    StepObservation,
    load_fields,
    state_digest,
)
from envfactory.env.sandbox.wall import Wall, find_wall

if TYPE_CHECKING:
    from envfactory.envgen.checks.scenarios import TestScenario

SandboxStatus = Literal["ok", "static_rejected", "timeout", "memory", "crashed"]


class SandboxResult(BaseModel):
    """How a sandbox run ended; `output` is the parent's `Observations` of it (possibly partial)."""

    status: SandboxStatus
    output: dict[str, Any] | None = None
    problems: list[StaticProblem] = Field(default_factory=list)
    stderr_tail: str = ""
    duration_s: float = 0.0
    exit_code: int | None = None
    detail: str = ""  # why, in words: which limit, which signal


class _Stop(Exception):
    """The round ends here: a limit, a crash or a broken answer."""

    def __init__(self, status: SandboxStatus, detail: str, kind: Literal["timeout", "cpu", "memory"] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.kind = status, detail, kind


def _is_memory_error(message: str | None) -> bool:
    return bool(message) and str(message).startswith("MemoryError")


class _Round:
    def __init__(self, code: str, metadata: EnvMetadata, limits: SandboxLimits, the_wall: Wall) -> None:
        self.code, self.metadata, self.limits, self.wall = code, metadata, limits, the_wall
        self.deadline = time.monotonic() + limits.timeout_s
        self.obs = Observations(pid=0)
        self.worker: SandboxProcess | None = None
        self.tails: list[str] = []
        self.phase: Phase = "startup"
        self.where: dict[str, Any] = {}
        self.kinds = {t.name: t.kind for t in metadata.tools}
        self._sid = 0
        self.closed: list[int] = []  # sessions done with, told to the worker with the next request

    # ---- the worker ------------------------------------------------------------------------
    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _fail(self, died: WorkerDied) -> _Stop:
        """A dead worker ends the round, unless it was a hung call (handled by the caller)."""
        if died.kind == "timeout" and "SIGXCPU" in died.detail:
            return _Stop("timeout", f"the code used its CPU limit of {self.limits.cpu_limit_s} s", "cpu")
        if died.kind == "timeout":
            return _Stop("timeout", f"the code did not finish within the {self.limits.timeout_s:g} s limit", "timeout")
        if died.kind == "memory":
            return _Stop("memory", f"{died.detail} (limit {self.limits.memory_mb} MB)", "memory")
        return _Stop("crashed", died.detail)

    def _retire(self) -> None:
        if self.worker is not None:
            self.tails.append(self.worker.stderr_tail())
            self.worker.close()
            self.worker = None

    def _ensure_worker(self) -> SandboxProcess:
        """A live worker with the code loaded: a fresh one after a hang killed the last."""
        if self.worker is not None and self.worker.alive:
            return self.worker
        self._retire()
        self.phase = "startup"
        self.closed = []
        worker = SandboxProcess(
            self.wall,
            self.limits.worker(),
            tmpfs_mb=self.limits.tmpfs_mb,
            channel=ChannelLimits(
                max_answer_bytes=self.limits.max_answer_mb * 1024 * 1024,
                max_depth=self.limits.max_depth,
                start_timeout_s=max(0.1, self._left()),
                spin_us=self.limits.spin_us,
            ),
        )
        self.worker = worker
        try:
            isolation = worker.start()
        except WorkerDied as e:
            raise self._fail(e) from None
        self.obs.pid = worker.pid
        self.obs.isolation = {"wall": self.wall.kind, **isolation.model_dump(mode="json")}
        self.phase = "import"
        raw = self._ask(worker, "load", self._left(), **load_fields(self.code, self.metadata.name))
        answer = self._parse(LoadAnswer, raw)
        if answer.import_error is not None and _is_memory_error(answer.import_error):
            raise _Stop("memory", f"the code exceeded its memory limit of {self.limits.memory_mb} MB", "memory")
        if self.obs.import_error is None and self.obs.derived_metadata is None:  # the first load tells
            self.obs.import_error, self.obs.import_line = answer.import_error, answer.import_line
            self.obs.env_problems = answer.env_problems
            self.obs.derived_metadata = answer.derived_metadata
            self.obs.tampering.extend(answer.tampering)
        if answer.import_error is not None or answer.env_problems:
            raise _Loaded()
        return worker

    def _request(self, worker: SandboxProcess, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """One request, shaped as a served worker's (`closed` first); `WorkerDied` passes through."""
        closed, self.closed = self.closed, []
        return worker.request(op, max(0.001, timeout_s), closed, **fields)

    def _ask(self, worker: SandboxProcess, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        try:
            reply = self._request(worker, op, timeout_s, **fields)
        except WorkerDied as e:
            raise self._fail(e) from None
        if "failure" in reply:
            if reply.get("memory"):
                raise _Stop("memory", f"the code exceeded its memory limit of {self.limits.memory_mb} MB", "memory")
            raise _Stop("crashed", f"the worker could not {op}: {str(reply['failure'])[:300]}")
        return reply

    @staticmethod
    def _parse(model: type[Any], raw: dict[str, Any]) -> Any:
        try:
            return model.model_validate(raw)
        except ValidationError as e:
            raise _Stop("crashed", f"malformed answer from the worker: {e.errors()[0]['msg']}") from None

    # ---- scenarios -------------------------------------------------------------------------
    def run(self, scenarios: list[TestScenario]) -> None:
        try:
            self._ensure_worker()
        except _Loaded:
            return
        self.phase = "scenario"
        for scenario in scenarios:
            current = ScenarioObservation(name=scenario.name)
            self.obs.scenarios.append(current)
            self.where = {"scenario": scenario.name, "step": None, "tool": None}
            try:
                worker = self._ensure_worker()
            except _Loaded:
                return
            self.phase = "scenario"
            sid = self._fork(worker, scenario.initial_config, current)
            if sid is None:
                continue
            current.steps, current.aborted, final = self._play(scenario, sid, observe=True)
            self.closed.append(sid)
            current.completed = current.aborted is None
            if final is not None:
                current.final_digest = state_digest(final)
            if current.completed and self.limits.replay and final is not None:
                current.replay_difference = self._replay(scenario, current, final)
            if self.worker is not None and self.worker.alive:
                raw = self._ask(self.worker, "integrity", min(self.limits.call_limit_s, self._left()))
                label = f"after scenario '{scenario.name}'"
                self.obs.tampering.extend(f"{label}: {k} was changed" for k in raw.get("tampering") or [])
            if self.obs.tampering:
                return

    def _fork(self, worker: SandboxProcess, config: dict[str, Any], current: ScenarioObservation | None) -> int | None:
        self._sid += 1
        # the fields and order of a served session's fork (`SandboxedSession._bind`): not strict, as served ones
        raw = self._ask(
            worker,
            "fork",
            min(self.limits.call_limit_s, self._left()),
            sid=self._sid,
            config=config,
            source="<config>",
            strict=False,
        )
        answer = self._parse(ForkAnswer, raw)
        if current is not None:
            current.load_error, current.load_crash = answer.load_error, answer.load_crash
        if answer.load_error is not None or answer.load_crash is not None:
            return None
        return self._sid

    def _dump(self, sid: int) -> dict[str, Any]:
        assert self.worker is not None
        raw = self._ask(self.worker, "dump", min(self.limits.call_limit_s, self._left()), sid=sid)
        state = raw.get("state")
        if not isinstance(state, dict):
            raise _Stop("crashed", "malformed answer from the worker: a dump is not an object")
        return state

    def _play(
        self, scenario: TestScenario, sid: int, *, observe: bool
    ) -> tuple[list[StepObservation], str | None, dict[str, Any] | None]:
        """Run a scenario's calls; (what each did, why it stopped early or None, the final dump)."""
        steps: list[StepObservation] = []
        before = self._dump(sid)
        for i, step in enumerate(scenario.steps):
            self.where = {"scenario": scenario.name, "step": i, "tool": step.tool}
            if step.tool in self.obs.hung_tools:  # it would hang again: don't spend the round's time on it
                return steps, f"stopped at step {i}: tool '{step.tool}' hung earlier in this run", None
            assert self.worker is not None
            call_s = self.limits.call_limit_s
            hung = call_s < self._left()
            try:
                raw = self._request(
                    self.worker, "call", min(call_s, self._left()), sid=sid, tool=step.tool, args=step.args
                )
            except WorkerDied as e:
                if e.kind == "timeout" and hung:
                    self.obs.hung_tools.append(step.tool)
                    late = f"did not return within the per-call limit of {call_s:g} s"
                    steps.append(StepObservation(tool=step.tool, ok=False, error_type="timeout", error_message=late))
                    self._retire()
                    return steps, f"stopped at step {i}: the call hung", None
                raise self._fail(e) from None
            if "failure" in raw:
                if raw.get("memory"):
                    raise _Stop("memory", f"the code exceeded its memory limit of {self.limits.memory_mb} MB", "memory")
                why = f"{raw['failure']}"[:500]
                steps.append(StepObservation(tool=step.tool, ok=False, error_type="internal_error", error_message=why))
                return steps, f"stopped at step {i}: the worker could not answer ({why[:120]})", None
            answer: CallAnswer = self._parse(CallAnswer, raw)
            error = answer.error
            if error is not None and error.type == "internal_error" and _is_memory_error(error.message):
                raise _Stop("memory", f"the code exceeded its memory limit of {self.limits.memory_mb} MB", "memory")
            after = self._dump(sid)
            ok = answer.ok
            error_type: str | None = error.type if error else None
            message: str | None = error.message if error else None
            violation = self._violation(step.tool, answer, before, after)
            if violation is not None:
                ok, error_type, message = False, "contract_violation", violation
            steps.append(
                StepObservation(
                    tool=step.tool,
                    ok=ok,
                    result=answer.result,
                    error_type=error_type,
                    error_message=message,
                    state=after if observe and step.expect_state else None,
                )
            )
            before = after
        return steps, None, before

    def _violation(self, tool: str, answer: CallAnswer, before: dict[str, Any], after: dict[str, Any]) -> str | None:
        """What strict mode would have refused, judged here from the parent's own dumps (sessions are forked
        as served ones are, not strict): a read that wrote, a write outside the CRUD helpers (the dumps
        differ from the change log's diff), a failed call that left the state changed."""
        if not answer.ok:
            if state_part(after) != state_part(before):
                return f"'{tool}' failed but left the state changed (a write outside the CRUD helpers is not undone)"
            return None
        if self.kinds.get(tool) == "read" and after != before:
            return f"read tool '{tool}' changed the state"
        full = diff_states(before, after)
        if full != answer.diff.sorted():
            paths = sorted(full.paths() ^ answer.diff.paths())[:5]
            return f"state changed outside the CRUD helpers (create/update/delete/set): the dump differs at {paths}"
        return None

    def _replay(self, scenario: TestScenario, first: ScenarioObservation, final: dict[str, Any]) -> str | None:
        """The same calls on a fresh session of the same worker: a deterministic tool repeats itself.

        Catches what one run cannot: module-level counters or caches, id()-based values, anything
        that makes a replayed trajectory end somewhere else.
        """
        assert self.worker is not None
        sid = self._fork(self.worker, scenario.initial_config, None)
        if sid is None:
            return "the initial config did not load the second time"
        again, aborted, final_again = self._play(scenario, sid, observe=False)
        self.closed.append(sid)
        if aborted is not None:
            return f"the replay {aborted}"
        for i, (a, b) in enumerate(zip(first.steps, again, strict=True)):
            if (a.ok, a.error_type, a.result) != (b.ok, b.error_type, b.result):
                was = a.result if a.ok else a.error_type
                now = b.result if b.ok else b.error_type
                return f"step {i} ({a.tool}) gave {_short(was)} the first time and {_short(now)} on replay"
        if final_again != final:
            return "the same calls left a different final state on replay"
        return None


class _Loaded(Exception):
    """The module did not load (import error, env problems): nothing to run."""


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_checks_in_sandbox(
    code: str, metadata: EnvMetadata, scenarios: list[TestScenario], limits: SandboxLimits
) -> SandboxResult:
    """Statically check `code`, then run `scenarios` against it in fresh sandboxed workers.

    `metadata` names the module and says which tools are reads; the comparison with the
    expectations is the judge's. Raises `SandboxUnavailable` (no OS sandbox, no opt-out) before
    anything runs; never raises for bad code.
    """
    started = time.monotonic()
    problems = static_check(code)
    if problems:
        return SandboxResult(status="static_rejected", problems=problems, detail=f"{len(problems)} static problems")
    the_wall = find_wall(unsafe_no_os_sandbox=limits.unsafe_no_os_sandbox)
    round_ = _Round(code, metadata, limits, the_wall)
    status: SandboxStatus = "ok"
    detail = ""
    try:
        round_.run(scenarios)
        if round_.obs.hung_tools:
            status = "timeout"
            hung = ", ".join(sorted(set(round_.obs.hung_tools)))
            detail = f"tool calls did not return within the per-call limit of {limits.call_limit_s:g} s: {hung}"
    except _Stop as stop:
        status, detail = stop.status, stop.detail
        if stop.kind is not None:
            round_.obs.interrupted = Interrupt(kind=stop.kind, phase=round_.phase, **_where(round_))
    finally:
        round_._retire()
    return SandboxResult(
        status=status,
        output=round_.obs.model_dump(mode="json"),
        stderr_tail="".join(round_.tails)[-4000:],
        duration_s=time.monotonic() - started,
        detail=detail,
    )


def _where(round_: _Round) -> dict[str, Any]:
    if round_.phase != "scenario":
        return {}
    return {k: round_.where.get(k) for k in ("scenario", "step", "tool")}
