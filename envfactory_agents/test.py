"""Test Agent: LLM-written scenarios plus schema-derived checks, executed in the sandbox and judged.

The verdict is computed by `envfactory.envgen.checks` from what the code actually did in a fresh
sandbox process — never from the model's claim that a scenario passed (the published code's flaw).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandbox import SandboxLimits
from envfactory.envgen.checks import ErrorItem, ErrorReport, TestScenario, schema_checks, validate_generated
from envfactory.envgen.health import HealthReport, HealthSettings, check_code
from envfactory.llm.structured import Structured, expect_model
from envfactory_agents.common import AgentDeps


class ScenarioSet(BaseModel):
    scenarios: list[TestScenario] = Field(min_length=1)


def generate_scenarios(deps: AgentDeps, metadata: EnvMetadata, n: int = 4) -> Structured[ScenarioSet]:
    """The Test Agent's scenarios for `metadata` (each marked `source="llm"`)."""
    messages = deps.prompts.get("test/scenarios").render(
        metadata=metadata.model_dump_json(indent=2, exclude_none=True), n_scenarios=str(n)
    )
    answer = deps.ask("test", messages, expect_model(ScenarioSet))
    if answer.value is not None:
        answer.value.scenarios = [s.model_copy(update={"source": "llm"}) for s in answer.value.scenarios]
    return answer


def initial_config_for(scenarios: list[TestScenario]) -> dict[str, Any]:
    """The initial state schema checks run on: the first LLM scenario's (it has real ids)."""
    return scenarios[0].initial_config if scenarios else {}


def run_tests(deps: AgentDeps, code: str, metadata: EnvMetadata, scenarios: list[TestScenario]) -> ErrorReport:
    """Execute LLM scenarios + schema checks against `code` in a fresh sandbox process; judge. Code that
    passes is then health-checked (`envfactory.envgen.health`, run sandboxed as the pool would run it): each
    broken invariant is a blocking `health` error naming its dimension, for the Code Agent to revise."""
    checks = schema_checks(metadata, initial_config_for(scenarios))
    limits = SandboxLimits.from_settings(deps.settings)
    report = validate_generated(code, metadata, [*scenarios, *checks], limits, deps.settings.pass_threshold)
    if report.passed():
        invalid = {s.name for s in report.invalid_scenarios}
        configs = [(s.name, s.initial_config) for s in scenarios if s.name not in invalid]
        health = check_code(code, metadata, configs, deps.settings, HealthSettings(calls=deps.settings.health_calls))
        report.errors += health_errors(health)
    return report


def health_errors(health: HealthReport) -> list[ErrorItem]:
    """A health report as the Test Agent's errors: blocking, each naming its dimension."""
    if health.error:
        return [ErrorItem(dimension="health", severity="high", message=f"cannot be checked: {health.error}")]
    return [
        ErrorItem(dimension="health", severity="high", message=f"{d.name}: {problem}")
        for d in health.dimensions
        for problem in d.problems
    ]
