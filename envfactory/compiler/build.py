"""From specs to pool folders: compile, make scenarios, pass the health gate, write — one spec at a time or a batch.

A spec's environment joins the pool folder only when `envs health` passes on every dimension; one that
does not is recorded with its failing dimension (and its folder kept under `.rejected/` for a look when
asked). Every spec gives one report row, whatever happens to it, appended to `compile-report.jsonl` as
it finishes, so a killed batch resumes where it stopped and a spec that breaks the compiler is a
recorded failure, not a crash of the batch. Every row names the build that made it (`build_key`: the code that
decides what a spec becomes, and the settings): a batch resumed on a folder another build made is refused,
or with `rebuild_stale` compiles those specs again, so one pool folder never mixes two builds unknown to its user.

A unit (`build_unit`) builds and checks the environment in a folder of its own process and hands back
its files with the report; the driver — the only writer of the output folder — puts them in place. So a
batch runs the same in this process, in worker processes (`ProcessExecutor`) or on Ray workers on other
machines (`RayExecutor`: they need the corpus at the same path, nothing else), with the same records and
the same environments.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from envfactory.compiler.compile import CompileError, CompileSettings, compile_spec
from envfactory.compiler.scenarios import ScenarioGenerationError, ScenarioSettings, generate_scenarios
from envfactory.config import Settings
from envfactory.env.compiled import PLAN_FILE, CompiledEnvironment, CompiledPlan
from envfactory.env.metadata import Domain, dump_metadata
from envfactory.env.pool import EnvPool, load_compiled_folder
from envfactory.envgen.health import HealthReport, HealthSettings, check_health
from envfactory.envgen.openapi import OpenAPIError, identifier, load_openapi
from envfactory.errors import EnvFactoryError
from envfactory.executor import Executor, LocalExecutor, Shipped, WorkerLost
from envfactory.inputs import JsonlAppender, exclusive_folder, read_jsonl_log, write_atomic

if TYPE_CHECKING:
    from envfactory.corpus import Corpus

REPORT_FILE = "compile-report.jsonl"
REJECTED_DIR = ".rejected"
STAGING_DIR = ".staging"

Status = Literal["healthy", "unhealthy", "no_environment", "invalid_spec", "no_scenarios", "failed"]


class SpecJob(BaseModel):
    """One spec to compile: where it is, what to call its environment, where it came from."""

    spec_id: str
    path: Path
    sha256: str | None = Field(default=None, description="the spec's bytes as recorded (a corpus spec's): checked")
    name: str
    domain: Domain = "utilities"
    description: str | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)


class BuildSettings(BaseModel):
    compile: CompileSettings = Field(default_factory=CompileSettings)
    scenarios: ScenarioSettings = Field(default_factory=ScenarioSettings)
    health: HealthSettings = Field(
        default_factory=lambda: HealthSettings(calls=30, scenarios=3, solver_seeds=2, reach_scenarios=20),
        description="the gate: every dimension of `envs health`, with fewer calls than `envs health` runs",
    )
    keep_rejected: bool = Field(default=False, description="keep unhealthy environments' folders under .rejected/")
    rebuild_stale: bool = Field(
        default=False,
        description="compile again the specs an output folder holds from another build (compiler code or settings)",
    )
    work_dir: Path | None = Field(
        default=None,
        description="where units make their temporary folders (a batch's own, removed when it ends: a unit killed "
        "for its time leaves its folder there); None or missing on a worker's machine: the system's",
    )


# the code that decides what a spec becomes: the compiler, the gate (envgen's health checks and the π* solver they
# run), the runtime of a compiled environment, and what they read with; and the libraries that make its values
_BUILD_CODE = ("compiler", "envgen", "env", "tasks", "records", "toolgraph", "words.py", "inputs.py")
_BUILD_LIBRARIES = ("faker", "jsonschema", "regex", "rstr", "pydantic")


def build_key(settings: BuildSettings) -> str:
    """What made a batch's environments: a digest of the code that decides what a spec becomes and of the settings
    that change it. Recorded on every report row, so a batch resumed after either changed does not mix two
    builds in one pool folder unknown to its user (`build_many`)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(settings.model_dump_json(exclude={"keep_rejected", "rebuild_stale", "work_dir"}).encode())
    for part in _BUILD_CODE:
        paths = [root / part] if part.endswith(".py") else sorted((root / part).rglob("*.py"))
        for path in paths:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for library in _BUILD_LIBRARIES:
        digest.update(f"{library}=={metadata.version(library)}\0".encode())
    return digest.hexdigest()[:12]


class BuildReport(BaseModel):
    """What became of one spec."""

    spec_id: str
    name: str
    status: Status
    reason: str | None = None
    tools: int = 0
    writes: int = 0
    resources: int = 0
    skipped: int = 0
    skip_reasons: dict[str, int] = Field(default_factory=dict)
    failing: list[str] = Field(default_factory=list)  # health dimensions
    usable: bool = False  # healthy, at least one write tool, at least one dependency (an id one tool reads)
    seconds: float = 0.0  # wall clock of the unit
    cpu_seconds: float = 0.0  # CPU time of the unit (its thread's): what a batch costs, whatever else runs
    build: str | None = None  # `build_key` of the batch that made it (None: a version that recorded none)
    spec_sha256: str | None = None  # the spec's bytes it was made from, where recorded (a corpus spec's)


class BuildResult(BaseModel):
    """A unit's outcome: the report, and the environment's files (relative path -> text) when it goes to the
    pool folder (healthy) or to `.rejected/` (unhealthy, kept on request)."""

    report: BuildReport
    files: dict[str, str] = Field(default_factory=dict)


def write_compiled(folder: Path, plan: CompiledPlan, scenarios: dict[str, dict[str, Any]]) -> None:
    """Write a compiled environment's folder (it must not exist yet): plan, metadata, scenarios."""
    (folder / "scenarios").mkdir(parents=True)
    write_atomic(folder / PLAN_FILE, plan.model_dump_json(indent=1) + "\n")
    dump_metadata(CompiledEnvironment(plan).derived_metadata(), folder / "metadata.json")
    for name, state in scenarios.items():
        write_atomic(folder / "scenarios" / f"{name}.json", json.dumps(state, indent=1) + "\n")


def _skip_reasons(plan_skipped: Sequence[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in plan_skipped:
        key = s.reason.split("'")[0].strip()[:80]
        out[key] = out.get(key, 0) + 1
    return out


def _usable(plan: CompiledPlan) -> bool:
    """At least one write tool, and one tool that takes an id another tool's record holds (a dependency edge)."""
    writes = any(o.spec.kind == "write" for o in plan.operations)
    return writes and any(o.id_param is not None or o.parents for o in plan.operations)


def gate_plan(plan: CompiledPlan, staging: Path, settings: BuildSettings) -> HealthReport:
    """The gate a compiled plan passes before it joins a pool: its scenarios made, its folder written at
    `staging` (replaced), loaded as the pool loads it, and every `envs health` dimension checked. Raises
    `ScenarioGenerationError` when no initial state can be made, `EnvFactoryError` when the folder does not
    load; EnvGen's Test Agent judges a revised plan with it too (`envfactory.compiler.draft`)."""
    scenarios = generate_scenarios(plan, settings.scenarios)
    if staging.exists():
        shutil.rmtree(staging)
    write_compiled(staging, plan, scenarios)
    env = load_compiled_folder(staging)
    pool = EnvPool(Settings(root=staging.parent, envs_dir=staging.parent, bfcl=False))
    return check_health(env, settings.health, pool)


def build_one(job: SpecJob, out: Path, settings: BuildSettings) -> BuildReport:
    """Compile `job`'s spec into `out/<name>` if it passes the gate; the report says what happened."""
    result = build_unit(job, settings)
    place(result, out)
    return result.report


def build_unit(job: SpecJob, settings: BuildSettings) -> BuildResult:
    """Compile, make scenarios and check `job`'s spec in a temporary folder of this process; the report, and the
    files of an environment that passed the gate (or failed it, with `keep_rejected`)."""
    work = settings.work_dir if settings.work_dir is not None and settings.work_dir.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="envfactory-build-", dir=work) as tmp:
        return _build(job, Path(tmp), settings)


def _build(job: SpecJob, tmp: Path, settings: BuildSettings) -> BuildResult:
    started, cpu = time.monotonic(), time.thread_time()
    report = BuildReport(spec_id=job.spec_id, name=job.name, status="failed")
    files: dict[str, str] = {}
    try:
        doc = load_openapi(job.path, sha256=job.sha256)
        plan, skipped = compile_spec(
            doc,
            name=job.name,
            domain=job.domain,
            source=f"openapi:{job.spec_id}",
            description=job.description,
            provenance=job.provenance,
            settings=settings.compile,
        )
        report.tools = len(plan.operations)
        report.writes = sum(o.spec.kind == "write" for o in plan.operations)
        report.resources = len(plan.resources)
        report.skipped, report.skip_reasons = len(skipped), _skip_reasons(skipped)
        staging = tmp / job.name
        health = gate_plan(plan, staging, settings)
        report.failing = health.failing
        if health.healthy:
            report.status, report.usable = "healthy", _usable(plan)
        else:
            report.status = "unhealthy"
            report.reason = health.summary()
        if health.healthy or settings.keep_rejected:
            files = {
                p.relative_to(staging).as_posix(): p.read_text(encoding="utf-8")
                for p in sorted(staging.rglob("*"))
                if p.is_file()
            }
    except CompileError as e:
        report.status, report.reason = "no_environment", str(e)
        report.skipped, report.skip_reasons = len(e.skipped), _skip_reasons(e.skipped)
    except OpenAPIError as e:
        report.status, report.reason = "invalid_spec", str(e)
    except ScenarioGenerationError as e:
        report.status, report.reason = "no_scenarios", str(e)
    except EnvFactoryError as e:
        report.reason = str(e)
    except (RecursionError, MemoryError, ValueError, TypeError, KeyError) as e:  # the compiler's own bug: recorded
        report.reason = f"{type(e).__name__}: {e}"[:500]
    report.seconds = round(time.monotonic() - started, 3)
    report.cpu_seconds = round(time.thread_time() - cpu, 3)
    return BuildResult(report=report, files=files)


def place(result: BuildResult, out: Path) -> None:
    """Put a unit's environment where its report says it goes: `out/<name>` (healthy) or `out/.rejected/<name>`,
    replacing an older one whole (written beside it first, then renamed into place)."""
    if not result.files:
        return
    name = result.report.name
    target = out / name if result.report.status == "healthy" else out / REJECTED_DIR / name
    staging = out / STAGING_DIR / name
    if staging.exists():
        shutil.rmtree(staging)
    for rel, text in result.files.items():
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)


class _Runner(Shipped):
    shipped = ("settings",)

    def __init__(self, settings: BuildSettings) -> None:
        self.settings = settings

    def __call__(self, job: SpecJob) -> BuildResult:
        return build_unit(job, self.settings)


def build_many(
    jobs: Sequence[SpecJob],
    out: Path,
    settings: BuildSettings | None = None,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[BuildReport]:
    """Build every job not already in `out/compile-report.jsonl` (a resumed batch skips them); yields each
    report as it is recorded. Names must be unique across `jobs`. A folder with rows of another build is
    refused (`EnvFactoryError`), or with `settings.rebuild_stale` those of `jobs` are compiled again (their old
    folders removed first); rows of specs outside `jobs` stay as they are."""
    s = settings or BuildSettings()
    with (
        exclusive_folder(out, "envfactory corpus compile", error=EnvFactoryError),
        tempfile.TemporaryDirectory(prefix="envfactory-batch-", ignore_cleanup_errors=True) as work,
    ):
        yield from _build_many(jobs, out, s.model_copy(update={"work_dir": Path(work)}), executor, progress)


def _build_many(
    jobs: Sequence[SpecJob],
    out: Path,
    s: BuildSettings,
    executor: Executor | None,
    progress: Callable[[int, int], None] | None,
) -> Iterator[BuildReport]:
    log = out / REPORT_FILE
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise EnvFactoryError("two specs would make environments of the same name: give them distinct names")
    read_jsonl_log(log)  # a torn last row (a killed batch's) cut off, now that this batch holds the folder
    key, last, stale = check_build(out, s, jobs)
    # the spec whose environment each folder of the pool is (a healthy latest row): never overwritten by another's
    owner = {str(row.get("name")): spec for spec, row in last.items() if row.get("status") == "healthy"}
    todo = [j for j in jobs if j.spec_id not in last or j.spec_id in stale]
    appender = JsonlAppender(log)
    runner = _Runner(s)
    results = (executor or LocalExecutor(concurrency=1)).map(runner, todo)
    for finished, (job, result) in enumerate(results, 1):
        if job.spec_id in stale:  # compiled again: what the older build left goes, whatever becomes of it now
            old = str(last[job.spec_id].get("name"))
            if owner.get(old, job.spec_id) == job.spec_id:
                _remove_environment(out, old)
                owner.pop(old, None)
        taken = owner.get(job.name, job.spec_id)
        if taken != job.spec_id:  # its name is another spec's environment here (a selection named them otherwise)
            why = f"its environment's name '{job.name}' is the environment of {taken} in {out}: not overwritten"
            report = BuildReport(spec_id=job.spec_id, name=job.name, status="failed", reason=why)
        elif isinstance(result, BuildResult):
            report = result.report
            place(result, out)
            if report.status == "healthy":
                owner[job.name] = job.spec_id
        else:
            why = result.reason if isinstance(result, WorkerLost) else f"{type(result).__name__}: {result}"
            report = BuildReport(spec_id=job.spec_id, name=job.name, status="failed", reason=why[:500])
        report.build, report.spec_sha256 = key, job.sha256
        appender.write(report.model_dump_json())
        if progress is not None:
            progress(finished, len(todo))
        yield report
    shutil.rmtree(out / STAGING_DIR, ignore_errors=True)


def check_build(
    out: Path, settings: BuildSettings, jobs: Sequence[SpecJob] = ()
) -> tuple[str, dict[str, dict[str, Any]], set[str]]:
    """This build's key, `out`'s latest row of each spec, and the stale specs: those another build made, and of
    `jobs` those whose spec's bytes are not the ones their row was made from (a new corpus version: its specs
    would never be compiled again, old and new mixed in one pool folder). Raises `EnvFactoryError` when there
    are such specs and `settings.rebuild_stale` is off (a CLI asks before it starts)."""
    key = build_key(settings)
    last = _last_rows(read_jsonl_log(out / REPORT_FILE, repair=False))  # (read-only: no lock is needed)
    stale = {spec for spec, row in last.items() if row.get("build") != key}
    changed = {
        j.spec_id
        for j in jobs
        if j.sha256 is not None and j.spec_id in last and last[j.spec_id].get("spec_sha256") != j.sha256
    }
    if (stale or changed) and not settings.rebuild_stale:
        why = (
            [f"{len(stale)} spec(s) compiled by another build (other compiler code or settings; first: {min(stale)})"]
            if stale
            else []
        )
        if changed:
            why.append(f"{len(changed)} spec(s) compiled from other bytes than the spec's now (first: {min(changed)})")
        raise EnvFactoryError(
            f"{out} holds {' and '.join(why)}, and one pool folder should not mix two: compile into a new --out, "
            "or pass --rebuild-stale to compile them again here"
        )
    return key, last, stale | changed


def _last_rows(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each spec's latest report row (a spec compiled again has its new row appended after the old)."""
    return {str(row.get("spec_id")): row for row in rows}


def _remove_environment(out: Path, name: object) -> None:
    """The folders an earlier build left for the environment `name` (in the pool folder or `.rejected/`)."""
    if not isinstance(name, str) or not name or name != Path(name).name or name.startswith("."):
        return  # (a row's name is the driver's own; anything else names no environment folder of ours)
    for folder in (out / name, out / REJECTED_DIR / name):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)


def corpus_jobs(corpus: Corpus, ids: Sequence[str] | None = None) -> list[SpecJob]:
    """One job per corpus spec (all, or `ids`), named from its id (`amazonaws_com_rbin`), with its domain,
    its title and description, and its provenance (provider, version, licence, origin, sha256)."""
    entries = [corpus.entry(i) for i in dict.fromkeys(ids)] if ids else corpus.entries()  # `--id X --id X`: once
    names = _names(corpus)
    jobs: list[SpecJob] = []
    for e in entries:
        name = names[e.id]
        description = f"{e.title}: {e.description}" if e.description else e.title
        provenance = {
            "corpus_id": e.id,
            "provider": e.provider,
            "service": e.service,
            "title": e.title,
            "version": e.version,
            "licence": e.licence,
            "licence_id": e.licence_id,
            "licence_url": e.licence_url,
            "origin_url": e.origin_url,
            "sha256": e.sha256,
        }
        jobs.append(
            SpecJob(
                spec_id=e.id,
                path=corpus.spec_path(e.id),
                sha256=e.sha256,
                name=name,
                domain=e.domain,
                description=description,
                provenance=provenance,
            )
        )
    return jobs


def _names(corpus: Corpus) -> dict[str, str]:
    """Each corpus spec's environment name, from its id (`amazonaws_com_rbin`), made unique over the whole corpus in
    id order — never over a selection: `--id B` alone named B's environment what A's was in the same folder."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for e in sorted(corpus.entries(), key=lambda e: e.id):
        base = identifier(e.id, "api")[:56]
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        out[e.id] = name
    return out


def read_reports(out: Path) -> list[BuildReport]:
    """Each spec's latest report (one a spec, in the order they were first recorded)."""
    rows = _last_rows(read_jsonl_log(out / REPORT_FILE, repair=False))
    return [BuildReport.model_validate(row) for row in rows.values()]


class Yield(BaseModel):
    """How many specs got how far: the funnel a batch's reports add up to."""

    specs: int = 0
    compiled: int = 0  # a plan with read and write tools
    with_scenarios: int = 0
    healthy: int = 0
    usable: int = 0  # healthy, a write tool, a dependency between tools
    tools_compiled: int = 0
    tools_healthy: int = 0
    operations_skipped: int = 0
    failing: dict[str, int] = Field(default_factory=dict)  # health dimension -> unhealthy environments
    seconds: float = 0.0


def yield_of(reports: Sequence[BuildReport]) -> Yield:
    y = Yield(specs=len(reports))
    for r in reports:
        y.seconds += r.seconds
        y.operations_skipped += r.skipped
        if r.status in ("invalid_spec", "no_environment") or (r.status == "failed" and not r.tools):
            continue
        y.compiled += 1
        y.tools_compiled += r.tools
        if r.status in ("no_scenarios", "failed"):
            continue
        y.with_scenarios += 1
        for d in r.failing:
            y.failing[d] = y.failing.get(d, 0) + 1
        if r.status == "healthy":
            y.healthy += 1
            y.tools_healthy += r.tools
            y.usable += r.usable
    y.seconds = round(y.seconds, 1)
    return y
