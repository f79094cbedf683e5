"""The protocol between parent and child: the job, the child's raw observations, its exit codes.

The job holds the calls to make (tool, arguments, initial config), never the expected results:
the judge (`envfactory.env.checks`) compares in the parent, so generated code cannot read the
answers it is checked against.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

# Child exit codes the parent maps to a status (anything else, or a signal, is a crash).
EXIT_MEMORY = 71
EXIT_TIMEOUT = 72
EXIT_BAD_JOB = 73
EXIT_NO_REPORT = 74


class JobStep(BaseModel):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    observe_state: bool = False  # dump the state after this step (only where a check reads it)


class JobScenario(BaseModel):
    name: str
    initial_config: dict[str, Any] = Field(default_factory=dict)
    steps: list[JobStep]


class SandboxJob(BaseModel):
    """What the child is asked to do: calls only, never the expected outcomes."""

    code_path: str
    module_name: str
    deadline: float  # time.time() by which the child must have written its result
    call_timeout_s: float
    memory_mb: int
    cpu_s: int
    fsize_mb: int
    drop_privileges: bool
    replay: bool = True  # run each completed scenario twice: the second run must repeat the first
    scenarios: list[JobScenario]


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
    aborted: str | None = None  # why the scenario stopped early (a hung call)
    replay_difference: str | None = None  # the same calls on a fresh session did something else


Phase = Literal["startup", "import", "scenario"]


class Interrupt(BaseModel):
    """Where the child was when a limit stopped it."""

    kind: Literal["timeout", "cpu", "memory"]
    phase: Phase
    scenario: str | None = None
    step: int | None = None
    tool: str | None = None


class Observations(BaseModel):
    """The child's raw report: what the code did, with no verdict."""

    pid: int
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
    """The child's output as `Observations`, or None if it is missing or malformed (it is untrusted)."""
    if output is None:
        return None
    try:
        return Observations.model_validate(output)
    except ValidationError:
        return None
