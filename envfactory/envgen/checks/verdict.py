"""The judge: observations of a sandbox run compared with the scenarios' expectations, as an `ErrorReport`.

`validate_generated` is the whole round: static check, one fresh sandbox run, then `judge`.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from pydantic import ValidationError

from envfactory.env.json_schema import pattern_budget, timed_validator
from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandbox import (
    JudgedCall,
    JudgedRun,
    Observations,
    SandboxLimits,
    ScenarioObservation,
    StepObservation,
    parse_observations,
)
from envfactory.env.state_path import MISSING, resolve_path
from envfactory.envgen.checks.interface import _interface_errors
from envfactory.envgen.checks.matching import _short, match
from envfactory.envgen.checks.report import (
    Dimension,
    ErrorItem,
    ErrorReport,
    InvalidScenario,
    ScenarioOutcome,
    Severity,
)
from envfactory.envgen.checks.sandbox_round import SandboxResult, run_checks_in_sandbox
from envfactory.envgen.checks.scenarios import ExpectedCall, TestScenario

_FAILING = frozenset({"critical", "high", "medium"})  # severities that fail the scenario they occur in
MAX_JUDGED_RUNS = 8  # passed scenarios kept for canaries
MAX_JUDGED_RUN_BYTES = 64 * 1024  # a bigger one (a large initial config or result) is not kept
_TOOL_ERROR_FAMILY = frozenset({"tool_error", "not_found", "conflict"})


class _Judge:
    def __init__(self, metadata: EnvMetadata) -> None:
        self.metadata = metadata
        self.meta_tools = set(metadata.tool_names)
        self.errors: list[ErrorItem] = []
        self.checks = 0

    def add(self, dimension: Dimension, severity: Severity, message: str, **where: Any) -> ErrorItem:
        item = ErrorItem(dimension=dimension, severity=severity, message=message, **where)
        self.errors.append(item)
        return item

    def step(self, scenario: str, index: int, want: ExpectedCall, got: StepObservation) -> bool:
        """Judge one step; True when it is clean (no failing error)."""
        where: dict[str, Any] = {"tool": want.tool, "scenario": scenario, "step": index}
        before = len(self.errors)
        clean = True
        self.checks += 1  # the universal checks: no hang, no internal error, no contract violation
        if got.error_type == "timeout":
            self.add("execution", "critical", f"hung (an endless loop?): {got.error_message}", **where)
        elif got.error_type in ("internal_error", "contract_violation"):
            what = "raised an exception" if got.error_type == "internal_error" else "broke the state contract"
            self.add("execution", "high", f"{what}: {got.error_message}", **where)
        elif got.error_type == "unknown_tool" and want.tool in self.meta_tools:
            clean = False  # the interface check already reports the missing tool (critical)
        elif got.error_type == "invalid_arguments" and want.args_schema_valid:
            self.add(
                "interface",
                "high",
                f"rejected arguments the metadata schema accepts {_short(want.args)}: {got.error_message}",
                **where,
            )
        else:
            self._outcome(want, got, where)
        if got.error_type == "timeout" or not clean:
            return False  # the state after a hung or missing tool says nothing new
        for path, value in want.expect_state.items():
            self.checks += 1
            problem = self._state_problem(path, value, got.state)
            if problem:
                self.add("state", "high", f"after this call {problem}", **where)
        return clean and not any(e.severity in _FAILING for e in self.errors[before:])

    def _outcome(self, want: ExpectedCall, got: StepObservation, where: dict[str, Any]) -> None:
        if want.expect_ok is None:
            return
        self.checks += 1
        if want.expect_ok and not got.ok:
            self.add("results", "high", f"expected success, got {got.error_type}: {got.error_message}", **where)
            return
        if not want.expect_ok and got.ok:
            kind = want.expect_error_type or "an error"
            self.add("results", "high", f"expected {kind}, but the call succeeded with {_short(got.result)}", **where)
            return
        if not got.ok and want.expect_error_type is not None:
            self.checks += 1
            expected, actual = want.expect_error_type, got.error_type
            same = actual == expected or (expected == "tool_error" and actual in _TOOL_ERROR_FAMILY)
            if not same:
                self.add(
                    "results",
                    "medium",
                    f"failed as expected but with {actual} ({got.error_message}), expected {expected}",
                    **where,
                )
        if got.ok and want.expect_result is not None:
            self.checks += 1
            problem = match(want.expect_result, got.result)
            if problem:
                self.add("results", "high", f"wrong result: {problem}", **where)

    @staticmethod
    def _state_problem(path: str, value: Any, state: dict[str, Any] | None) -> str | None:
        if state is None:
            return "the state was not observed"
        found = resolve_path(state, path)
        if isinstance(value, dict) and value.get("$absent") is True:
            return None if found is MISSING else f"state '{path}' should not exist but is {_short(found)}"
        if found is MISSING:
            return f"state '{path}' does not exist (expected {_short(value)})"
        problem = match(value, found, path)
        return f"state {problem}" if problem else None

    def scenario(self, want: TestScenario, got: ScenarioObservation) -> bool | None:
        """True/False: passed or not; None: the scenario is invalid (its initial config does not load)."""
        if got.load_error is not None:
            return None
        if got.load_crash is not None:
            self.add(
                "execution",
                "high",
                f"the state model crashed loading the initial config: {got.load_crash}",
                scenario=want.name,
            )
            return False
        clean = True
        for i, (step, obs) in enumerate(zip(want.steps, got.steps, strict=False)):
            if obs.tool != step.tool:  # the child answers in order; anything else is a broken report
                self.add("execution", "critical", "the sandbox report does not match the scenario", scenario=want.name)
                return False
            clean = self.step(want.name, i, step, obs) and clean
        if got.replay_difference is not None:
            self.checks += 1
            self.add(
                "execution",
                "high",
                "nondeterministic: the same calls on the same initial config differ "
                f"({got.replay_difference}); keep all state in the state model, ids from db.new_id()",
                scenario=want.name,
            )
            clean = False
        return clean and got.completed and len(got.steps) == len(want.steps)


def _precheck(metadata: EnvMetadata, scenario: TestScenario) -> str | None:
    """Why a scenario cannot be a fair test of the code, or None.

    A step calling a tool the metadata does not define, or a step claimed to succeed whose arguments
    break the metadata's own schema (wrong type, missing required, unknown parameter), is the
    scenario's mistake. Formats (dates...) are not checked here: the strict runtime judges those.
    """
    specs = {t.name: t for t in metadata.tools}
    for i, step in enumerate(scenario.steps):
        spec = specs.get(step.tool)
        if spec is None:
            if step.expect_error_type != "unknown_tool":
                return f"step {i} calls '{step.tool}', which the metadata does not define"
            continue
        if step.expect_ok is not True:
            continue
        unknown = sorted(set(step.args) - set(spec.parameters))
        if unknown:
            return f"step {i} expects success but passes '{unknown[0]}', which '{step.tool}' does not take"
        # null for an optional parameter means "not given" to the runtime, whatever its schema type says
        given = {k: v for k, v in step.args.items() if v is not None or k in spec.required}
        try:
            with pattern_budget():
                error = jsonschema.exceptions.best_match(
                    timed_validator(spec.input_schema, formats=False).iter_errors(given)
                )
        except Exception:  # SchemaError, an unresolvable $ref...: an odd metadata schema is not the scenario's fault
            continue
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            broken = f"break the schema of '{step.tool}' at {where}: {error.message}"
            return f"step {i} expects success but its arguments {broken}"
    return None


def _sandbox_error(result: SandboxResult, obs: Observations | None) -> ErrorItem:
    where: dict[str, Any] = {}
    if obs is not None and obs.interrupted is not None:
        it = obs.interrupted
        where = {"tool": it.tool, "scenario": it.scenario, "step": it.step}
        if it.phase == "import":
            where["scenario"] = None
    message = f"sandbox {result.status}: {result.detail}"
    if where.get("tool"):
        message += " (while running this call)"
    elif obs is not None and obs.interrupted is not None and obs.interrupted.phase == "import":
        message += " (while importing env.py: module-level code)"
    last = [ln for ln in result.stderr_tail.strip().splitlines() if ln.strip()][-1:]
    if last and result.status == "crashed":
        message += f"; last output: {_short(last[0], 300)}"
    return ErrorItem(dimension="execution", severity="critical", message=message, **where)


def judge(
    metadata: EnvMetadata, scenarios: list[TestScenario], result: SandboxResult, threshold: float = 1.0
) -> ErrorReport:
    """Compare the observations of `run_checks_in_sandbox(code, metadata, scenarios, ...)` with expectations."""
    report = ErrorReport(sandbox_status=result.status, duration_s=result.duration_s, threshold=threshold)
    judge_ = _Judge(metadata)
    invalid: dict[int, str] = {}
    for i, s in enumerate(scenarios):
        reason = _precheck(metadata, s)
        if reason:
            invalid[i] = reason
    obs = parse_observations(result.output)
    if result.status == "static_rejected":
        for p in result.problems:
            judge_.add("execution", "critical", f"rejected before running, line {p.line}: {p.message}")
    elif result.status != "ok" and not (result.status == "timeout" and obs is not None and obs.interrupted is None):
        judge_.errors.append(_sandbox_error(result, obs))  # (hung calls alone are reported at their steps)
    elif obs is None:
        judge_.add("execution", "critical", "the sandbox returned no usable report: " + (result.detail or "malformed"))
    observed: list[ScenarioObservation] = []
    if obs is not None:
        observed = obs.scenarios
        if obs.import_error is not None:
            at = f" at line {obs.import_line}" if obs.import_line else ""
            judge_.add("execution", "critical", f"env.py failed to import{at}: {obs.import_error}")
        for problem in obs.env_problems:
            judge_.add("execution", "critical", problem)
        for change in obs.tampering:
            judge_.add("execution", "critical", f"the code changed the runtime it is checked with: {change}")
        if obs.derived_metadata is not None:
            try:
                derived = EnvMetadata.model_validate(obs.derived_metadata)
            except ValidationError as e:
                judge_.add("interface", "critical", f"the code's own metadata is invalid: {e.errors()[0]['msg']}")
            else:
                try:
                    judge_.errors.extend(_interface_errors(metadata, derived))
                except Exception as e:  # derived metadata comes from untrusted code: odd schemas must not crash us
                    judge_.add("interface", "critical", f"cannot compare the code's schemas: {type(e).__name__}: {e}")
    for i, want in enumerate(scenarios):
        if i in invalid:
            report.invalid_scenarios.append(InvalidScenario(name=want.name, reason=invalid[i]))
            continue
        got = observed[i] if i < len(observed) else None
        # not observed (import failed, a limit stopped the run): run, and not passed
        verdict = judge_.scenario(want, got) if got is not None else False
        if verdict is None:
            assert got is not None
            reason = f"its initial config does not load into the state model: {got.load_error}"
            report.invalid_scenarios.append(InvalidScenario(name=want.name, reason=reason))
            continue
        steps_run = len(got.steps) if got is not None else 0
        report.outcomes.append(ScenarioOutcome(name=want.name, source=want.source, passed=verdict, steps_run=steps_run))
        if verdict and got is not None:
            _keep_judged(report, want, got)
    report.errors = judge_.errors
    report.checks = judge_.checks
    report.scenarios_run = len(report.outcomes)
    report.scenarios_passed = sum(o.passed for o in report.outcomes)
    report.pass_rate = report.scenarios_passed / report.scenarios_run if report.scenarios_run else 0.0
    return report


def _keep_judged(report: ErrorReport, want: TestScenario, got: ScenarioObservation) -> None:
    """A passed scenario as the round saw it, for served workers to replay (the first ones: a round lists
    the Test Agent's scenarios before the schema checks)."""
    if not got.completed or got.final_digest is None or len(got.steps) != len(want.steps):
        return
    run = JudgedRun(
        name=want.name,
        initial_config=want.initial_config,
        calls=[
            JudgedCall(tool=s.tool, args=w.args, ok=s.ok, error_type=s.error_type, result=s.result)
            for w, s in zip(want.steps, got.steps, strict=True)
        ],
        final_digest=got.final_digest,
    )
    try:
        size = len(json.dumps(run.model_dump(mode="json")))
    except (TypeError, ValueError):
        return
    if size > MAX_JUDGED_RUN_BYTES:
        return
    if len(report.judged) < MAX_JUDGED_RUNS:
        report.judged.append(run)


def validate_generated(
    code: str,
    metadata: EnvMetadata,
    scenarios: list[TestScenario],
    limits: SandboxLimits,
    threshold: float,
) -> ErrorReport:
    """Static check, then one fresh sandbox run of the scenarios, then the judge (invalid ones are not judged).

    `limits` and `threshold` come from the caller's settings (`SandboxLimits.from_settings`,
    `pass_threshold`). Callers usually pass LLM scenarios plus `schema_checks(metadata, config)`.
    """
    result = run_checks_in_sandbox(code, metadata, scenarios, limits)
    return judge(metadata, scenarios, result, threshold)
