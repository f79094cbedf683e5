"""A compiled environment as EnvGen's starting draft: made from a spec, shown to the Code Agent, judged, kept.

When EnvGen starts from a spec (a corpus entry or an OpenAPI file) that compiles, the Code Agent does not
write `env.py` from the metadata: it gets the compiled plan (`draft_from`) — its resources and tools as data,
the operations left out with the reason, and the verdict of the gate on the draft — and answers with a
`PlanRevision` (`envfactory.compiler.revision`). Every candidate, the draft and each revision, is judged by
`judge_plan`: the gate every compiled environment passes before it joins a pool (`build.gate_plan`: initial
states made, the folder loaded as the pool loads it, every `envs health` dimension), reported as the Test
Agent's `ErrorReport` so the revise loop reads it as it reads a sandboxed round. The verdict comes from
running the plan, never from a model. A plan that passes is registered like any EnvGen environment
(`register_plan`: the contract, health again, the registry) and runs in-process: it is data, no code.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from envfactory.compiler.build import BuildSettings, corpus_jobs, gate_plan, write_compiled
from envfactory.compiler.compile import CompileError, CompileSettings, compile_spec
from envfactory.compiler.scenarios import ScenarioGenerationError, generate_scenarios
from envfactory.config import Settings
from envfactory.env.compiled import CompiledEnvironment, CompiledPlan
from envfactory.env.metadata import Domain, EnvMetadata
from envfactory.envgen.checks import ErrorItem, ErrorReport
from envfactory.envgen.health import HealthReport
from envfactory.envgen.openapi import OpenAPIError, load_openapi
from envfactory.envgen.register import ENVGEN_FILE, RegistrationError, register_folder
from envfactory.errors import EnvFactoryError

IN_PROCESS = "none: a compiled plan is data, run in-process"


class Draft(BaseModel):
    """What became of compiling the request's spec: the plan, or why there is none."""

    spec: str  # corpus:<id> or openapi:<file>
    plan: CompiledPlan | None = None
    reason: str | None = None  # why there is no plan (the spec does not compile)

    def record(self, report: ErrorReport | None = None) -> dict[str, Any]:
        """What the graph state keeps of the draft: the plan, what it holds, and the gate's verdict on it."""
        out: dict[str, Any] = {"spec": self.spec, "compiled": self.plan is not None, "reason": self.reason}
        if self.plan is not None:
            out |= {"tools": len(self.plan.operations), "skipped": len(self.plan.skipped)}
            out["plan"] = self.plan.model_dump(mode="json")
        if report is not None:
            out["report"] = report.model_dump(mode="json")
        return out


def draft_from(
    settings: Settings,
    *,
    name: str,
    domain: Domain,
    corpus_id: str | None = None,
    openapi_path: str | None = None,
    description: str | None = None,
    compile_settings: CompileSettings | None = None,
) -> Draft:
    """The compiled plan of a corpus entry (`corpus_id`) or an OpenAPI file, named `name`; a spec that yields no
    honest environment gives a draft with the reason (EnvGen then writes code from the metadata instead).
    Raises `EnvFactoryError` for a corpus id the corpus does not hold or a spec that cannot be read."""
    if corpus_id is not None:
        from envfactory.corpus import Corpus

        corpus = Corpus(settings)
        (job,) = corpus_jobs(corpus, [corpus_id])
        doc, spec = corpus.document(corpus_id), f"corpus:{corpus_id}"
        description, provenance = description or job.description, job.provenance
    elif openapi_path is not None:
        doc, spec, provenance = load_openapi(Path(openapi_path)), f"openapi:{Path(openapi_path).name}", {}
    else:
        raise EnvFactoryError("a draft needs a spec: a corpus id or an OpenAPI file")
    try:
        plan, _ = compile_spec(
            doc,
            name=name,
            domain=domain,
            source=spec,
            description=description,
            provenance=provenance,
            settings=compile_settings,
        )
    except (CompileError, OpenAPIError) as e:
        return Draft(spec=spec, reason=str(e))
    return Draft(spec=spec, plan=plan)


def plan_metadata(plan: CompiledPlan) -> EnvMetadata:
    """The metadata a plan's folder carries (derived from it, as the pool checks)."""
    return CompiledEnvironment(plan).derived_metadata()


def plan_view(plan: CompiledPlan) -> str:
    """The plan as the Code Agent reads it: its resources and tools as JSON (output schemas are derived, not
    shown; the operations left out are listed apart by `skipped_view`). The spec's text in it is data."""
    data = plan.model_dump(mode="json", exclude={"format", "clock", "provenance", "skipped"})
    for op in data["operations"]:
        op["spec"].pop("output_schema", None)
    return json.dumps(data, indent=1, ensure_ascii=False)


def skipped_view(plan: CompiledPlan) -> str:
    return "\n".join(f"- {s.method} {s.route}: {s.reason}" for s in plan.skipped) or "none"


def _health_errors(health: HealthReport) -> list[ErrorItem]:
    if health.error:
        return [ErrorItem(dimension="health", severity="high", message=f"cannot be checked: {health.error}")]
    return [
        ErrorItem(dimension="health", severity="high", message=f"{d.name}: {problem}")
        for d in health.dimensions
        for problem in d.problems
    ]


def judge_plan(plan: CompiledPlan, threshold: float = 1.0, settings: BuildSettings | None = None) -> ErrorReport:
    """The gate every compiled environment passes (`gate_plan`), as the Test Agent's verdict: passed when the
    plan's initial states are made, its folder loads and every health dimension holds; else a blocking error
    for each problem, naming the stage (`scenarios:`, `load:`) or the health dimension."""
    s = settings or BuildSettings()
    started = time.monotonic()
    report = ErrorReport(sandbox_status=IN_PROCESS, threshold=threshold)
    with tempfile.TemporaryDirectory(prefix="envfactory-gate-") as tmp:
        try:
            health = gate_plan(plan, Path(tmp) / plan.name, s)
        except ScenarioGenerationError as e:
            report.errors.append(
                ErrorItem(dimension="state", severity="critical", message=f"scenarios: no initial state: {e}")
            )
        except EnvFactoryError as e:
            report.errors.append(ErrorItem(dimension="execution", severity="critical", message=f"load: {e}"))
        else:
            report.errors += _health_errors(health)
            report.scenarios_run = s.scenarios.count
            report.checks = sum(d.checked for d in health.dimensions)
    if report.scenarios_run and not report.errors:
        report.scenarios_passed, report.pass_rate = report.scenarios_run, 1.0
    report.duration_s = round(time.monotonic() - started, 3)
    return report


def write_plan_environment(
    folder: Path, plan: CompiledPlan, scenarios: dict[str, dict[str, Any]], record: dict[str, Any]
) -> None:
    """Write (or replace) an EnvGen folder for a plan: `compiled.json`, its metadata, its initial states and
    `envgen.json` (`record`: what EnvGen did)."""
    if folder.exists():
        shutil.rmtree(folder)
    write_compiled(folder, plan, scenarios)
    (folder / ENVGEN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def keep_rejected_plan(folder: Path, plan: CompiledPlan, record: dict[str, Any]) -> None:
    """A rejected plan's folder, for a look (outside the pool); without initial states when none can be made."""
    try:
        scenarios = generate_scenarios(plan, BuildSettings().scenarios)
    except ScenarioGenerationError:
        scenarios = {}
    write_plan_environment(folder, plan, scenarios, record)


def register_plan(plan: CompiledPlan, record: dict[str, Any], settings: Settings) -> Path:
    """Write `envs/<name>/` for a plan EnvGen judged (its initial states made as the gate made them), then
    register it as any EnvGen environment is registered (loaded as the pool loads it, the contract, every
    health dimension, the registry); its folder. Raises `RegistrationError` saying why not."""
    try:
        scenarios = generate_scenarios(plan, BuildSettings().scenarios)
    except ScenarioGenerationError as e:
        raise RegistrationError(f"no initial state can be made: {e}") from None
    return register_folder(plan.name, lambda folder: write_plan_environment(folder, plan, scenarios, record), settings)
