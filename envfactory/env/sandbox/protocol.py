"""What crosses the pipe between the parent and a sandboxed worker, and what the parent makes of it.

The parent drives the worker one request at a time (`wire.py` frames): start-up (`hello`), then
`load` the generated module, `fork` sessions, `call` tools, `dump` states. Every answer is
untrusted: the parent validates it against these models and judges it itself. The worker never
sees an expected result, and it writes no result file a forged exit could leave behind.

`Observations` is the parent's own record of a validation round, built from those answers; the
judge (`envfactory.envgen.checks`) compares it with the scenarios' expectations.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.env.diff import StateDiff, state_part
from envfactory.env.state import Change

CODE_PATH = "/sandbox/env.py"  # what tracebacks name; no such file exists anywhere


def load_fields(source: str, env_name: str) -> dict[str, Any]:
    """The fields of a `load` request: the same for a validation round and a served worker."""
    return {"source": source, "module_name": f"envgen_{env_name}", "path": CODE_PATH}


def state_digest(dump: dict[str, Any]) -> str:
    """A digest of a state dump's state part (runtime keys aside): what a canary compares its final state by."""
    text = json.dumps(state_part(dump), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


# ---- start-up ------------------------------------------------------------------------------------


class WorkerLimits(BaseModel):
    """Resource limits the worker applies to itself before any untrusted code runs."""

    memory_mb: int  # address space on top of the worker's baseline after its imports
    cpu_s: int  # RLIMIT_CPU for the worker's whole life
    fsize_mb: int  # largest file it may write (its log)
    nofile: int = 64


class Hello(BaseModel):
    """The first frame the parent sends: limits, the seccomp program, how the worker is wrapped."""

    limits: WorkerLimits
    seccomp_bpf: str  # base64 of the BPF program the worker installs after its start-up
    wrapped: bool  # inside bubblewrap (False only under the unsafe opt-out: then it drops root itself)
    spin_us: int = Field(default=0, ge=0, le=10_000)  # how long the worker polls its pipe before it sleeps


class Isolation(BaseModel):
    """What the worker found itself in, read from the kernel after its filter was loaded."""

    model_config = ConfigDict(extra="allow")

    wrapped: bool
    uid: int
    outside_uid: int | None = None  # the worker's uid on the host, read by the parent from /proc/<pid>/status
    seccomp_mode: int  # /proc/self/status Seccomp: 2 = filter
    seccomp_filters: int
    no_new_privs: bool
    cap_eff: str
    root_entries: list[str] = Field(default_factory=list)  # what `/` holds inside
    netns: bool | None = None  # unwrapped only: entered its own network namespace
    socket_blocked: bool = False
    sealed_evaluators: list[str] = Field(default_factory=list)
    rlimits: dict[str, int] = Field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why this worker must not run untrusted code (its start-up is trusted, so this is not forged)."""
        out = []
        if self.seccomp_mode != 2:
            out.append("the seccomp filter is not loaded")
        if not self.no_new_privs:
            out.append("no_new_privs is not set")
        if self.wrapped and int(self.cap_eff or "0", 16) != 0:
            out.append(f"the worker still has capabilities ({self.cap_eff})")
        if self.wrapped and self.outside_uid in (None, 0):
            out.append("the sandbox user is the host's root (bwrap was started as root)")
        return out


# ---- answers -------------------------------------------------------------------------------------


class LoadAnswer(BaseModel):
    """What importing the generated module did."""

    import_error: str | None = None
    import_line: int | None = None
    env_problems: list[str] = Field(default_factory=list)
    derived_metadata: dict[str, Any] | None = None
    tampering: list[str] = Field(default_factory=list)


class ForkAnswer(BaseModel):
    load_error: str | None = None  # the config does not fit the state model (the config's fault)
    load_crash: str | None = None  # the state model raised something else (the code's fault)


class ErrorAnswer(BaseModel):
    type: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class CallAnswer(BaseModel):
    """One tool call, as the worker's `Session.call` recorded it."""

    ok: bool
    result: Any = None
    error: ErrorAnswer | None = None
    diff: StateDiff = Field(default_factory=StateDiff)
    changes: list[Change] = Field(default_factory=list)


class DumpAnswer(BaseModel):
    state: dict[str, Any]


class IntegrityAnswer(BaseModel):
    tampering: list[str] = Field(default_factory=list)


# ---- judged sessions, replayed on served workers (canaries) ---------------------------------------


class JudgedCall(BaseModel):
    """One call of a judged session and what it gave."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    error_type: str | None = None
    result: Any = None


class JudgedRun(BaseModel):
    """A session whose outcome was judged (a passed scenario of an EnvGen round): a served worker must
    give the same results and the same final state when it is replayed as an ordinary session."""

    name: str
    initial_config: dict[str, Any] = Field(default_factory=dict)
    calls: list[JudgedCall] = Field(min_length=1)
    final_digest: str | None = None


# ---- the parent's record of a validation round ---------------------------------------------------


class StepObservation(BaseModel):
    tool: str
    ok: bool
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    state: dict[str, Any] | None = None


class ScenarioObservation(BaseModel):
    name: str
    load_error: str | None = None  # the initial config does not fit the state model (the scenario's fault)
    load_crash: str | None = None  # the state model raised something else while loading (the code's fault)
    steps: list[StepObservation] = Field(default_factory=list)
    completed: bool = False
    aborted: str | None = None  # why the scenario stopped early (a hung call, a dead worker)
    replay_difference: str | None = None  # the same calls on a fresh session did something else
    final_digest: str | None = None  # `state_digest` of the state after the last step (a completed scenario)


Phase = Literal["startup", "import", "scenario"]


class Interrupt(BaseModel):
    """Where the run was when a limit stopped it."""

    kind: Literal["timeout", "cpu", "memory"]
    phase: Phase
    scenario: str | None = None
    step: int | None = None
    tool: str | None = None


class Observations(BaseModel):
    """What the code did in one validation round, recorded by the parent from the worker's answers."""

    pid: int  # the worker's process id as the parent sees it (outside its PID namespace)
    isolation: dict[str, Any] = Field(default_factory=dict)
    import_error: str | None = None
    import_line: int | None = None
    env_problems: list[str] = Field(default_factory=list)
    derived_metadata: dict[str, Any] | None = None
    scenarios: list[ScenarioObservation] = Field(default_factory=list)
    tampering: list[str] = Field(default_factory=list)
    hung_tools: list[str] = Field(default_factory=list)  # calls stopped by the per-call limit
    interrupted: Interrupt | None = None  # the whole run stopped by a limit


def parse_observations(output: dict[str, Any] | None) -> Observations | None:
    """A `SandboxResult.output` as `Observations`, or None if missing or malformed."""
    if output is None:
        return None
    try:
        return Observations.model_validate(output)
    except ValidationError:
        return None
