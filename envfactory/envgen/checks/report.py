"""The Test Agent's verdict: errors by dimension and severity, per-scenario outcomes, the pass rule."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from envfactory.env.sandbox.protocol import JudgedRun

# "health": an invariant of the environment contract that `envfactory.envgen.health` found broken (round trip,
# determinism, read-only reads, robustness, reachable writes, schema); the message starts with which
Dimension = Literal["interface", "execution", "results", "state", "health"]
Severity = Literal["critical", "high", "medium", "low"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "high": 1, "medium": 2, "low": 3}


class ErrorItem(BaseModel):
    dimension: Dimension
    severity: Severity
    tool: str | None = None
    scenario: str | None = None
    step: int | None = None
    message: str

    def line(self) -> str:
        where = [f"tool '{self.tool}'"] if self.tool else []
        if self.scenario is not None:
            where.append(f"scenario '{self.scenario}'" + (f" step {self.step}" if self.step is not None else ""))
        prefix = f"[{self.severity}/{self.dimension}]"
        return f"{prefix} {', '.join(where)}: {self.message}" if where else f"{prefix} {self.message}"


class ScenarioOutcome(BaseModel):
    name: str
    source: Literal["llm", "schema"]
    passed: bool
    steps_run: int = 0


class InvalidScenario(BaseModel):
    name: str
    reason: str


class ErrorReport(BaseModel):
    """The Test Agent's structured verdict, from executed checks only."""

    errors: list[ErrorItem] = Field(default_factory=list)
    scenarios_run: int = 0
    scenarios_passed: int = 0
    pass_rate: float = 0.0
    checks: int = Field(default=0, description="individual comparisons executed")
    outcomes: list[ScenarioOutcome] = Field(default_factory=list)
    invalid_scenarios: list[InvalidScenario] = Field(default_factory=list)
    sandbox_status: str = "ok"
    duration_s: float = 0.0
    threshold: float = 1.0
    judged: list[JudgedRun] = Field(
        default_factory=list,
        description="passed scenarios as the round saw them (calls, results, final state): served workers replay "
        "them as canaries (`envfactory.env.sandboxed`)",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worst(self) -> Severity | None:
        if not self.errors:
            return None
        return min((e.severity for e in self.errors), key=SEVERITY_ORDER.__getitem__)

    def passed(self, threshold: float | None = None) -> bool:
        limit = self.threshold if threshold is None else threshold
        blocking = any(e.severity in ("critical", "high") for e in self.errors)
        return not blocking and self.scenarios_run > 0 and self.pass_rate >= limit

    def summary(self, max_errors: int = 30) -> str:
        """Plain text for a revise prompt: the verdict, then the errors, worst first, repeats folded."""
        verdict = "PASSED" if self.passed() else "FAILED"
        head = (
            f"{verdict}: {self.scenarios_passed}/{self.scenarios_run} scenarios passed "
            f"({self.pass_rate:.0%}, threshold {self.threshold:.0%}); {len(self.errors)} errors"
            + (f", worst {self.worst}" if self.worst else "")
            + f"; sandbox {self.sandbox_status}"
        )
        lines = [head]
        counts: dict[str, int] = {}
        order: list[str] = []
        for e in sorted(self.errors, key=lambda e: SEVERITY_ORDER[e.severity]):
            key = e.model_copy(update={"scenario": None, "step": None}).line() if e.scenario else e.line()
            if key not in counts:
                order.append(e.line())
                counts[key] = 0
            counts[key] += 1
        folded = list(zip(order, counts.values(), strict=True))
        for text, n in folded[:max_errors]:
            lines.append(f"- {text}" + (f" (and {n - 1} more like it)" if n > 1 else ""))
        if len(folded) > max_errors:
            lines.append(f"- ... {len(folded) - max_errors} more distinct errors")
        if self.invalid_scenarios:
            lines.append(f"Ignored {len(self.invalid_scenarios)} invalid scenarios (their fault, not the code's):")
            lines.extend(f"- {s.name}: {s.reason}" for s in self.invalid_scenarios[:10])
        return "\n".join(lines)
