"""`envfactory envs validate`: check environments against the contract and sync the registry."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from envfactory.env.environment import BaseEnvironment
from envfactory.env.pool import EnvPool, source_label
from envfactory.env.registry import ServerEntry, load_registry, registry_lock, save_registry
from envfactory.errors import EnvFactoryError


class EnvReport(BaseModel):
    """The verdict on one environment."""

    name: str
    ok: bool
    domain: str | None = None
    source: str | None = None
    runs: str | None = None  # in-process (trusted or imported) or sandboxed (untrusted code)
    tools: int = 0
    write_tools: int = 0
    scenarios: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


def source_of(env: BaseEnvironment) -> str:
    """Where an environment came from, for tables: its metadata's word, else what its folder says."""
    return source_label(env.metadata.source, env.folder)


def runs_as(env: BaseEnvironment) -> str:
    return "sandboxed" if env.blocking_io else "in-process"


def validate_env(pool: EnvPool, name: str) -> EnvReport:
    try:
        env = pool.get(name)
    except EnvFactoryError as e:
        return EnvReport(name=name, ok=False, problems=[str(e)])
    meta = env.metadata
    report = EnvReport(
        name=name,
        ok=True,
        domain=meta.domain,
        source=source_of(env),
        runs=runs_as(env),
        tools=len(meta.tools),
        write_tools=sum(t.kind == "write" for t in meta.tools),
        scenarios=env.scenario_names(),
    )
    if env.folder is not None and "default" not in report.scenarios:
        report.problems.append("no scenarios/default.json (the default initial config)")
    for scenario in report.scenarios:
        try:
            env.new_state(env.scenario(scenario), f"{name}/scenarios/{scenario}.json")
        except EnvFactoryError as e:
            report.problems.append(str(e))
    if report.write_tools == 0:  # a calculator is a fine tool, but gives no state to verify
        report.warnings.append("no write tool: tasks on it can be checked by their results only, not by state")
    report.ok = not report.problems
    return report


def missing_registered(pool: EnvPool, names: list[str]) -> list[EnvReport]:
    """Registered environments whose folder or code is gone: reported as failures, never dropped silently."""
    path = pool.settings.registry_file
    out = []
    for name in sorted(load_registry(path).mcpServers):
        if name not in names:
            problem = (
                f"registered in {path} but {pool.folder / name / 'env.py'} is gone; restore it or remove the entry"
            )
            out.append(EnvReport(name=name, ok=False, problems=[problem]))
    return out


def sync_registry(pool: EnvPool, reports: list[EnvReport]) -> None:
    """Add every verified environment to the registry; drop the ones that failed."""
    path = pool.settings.registry_file
    with registry_lock(path):
        _sync(path, reports, {r.name: _variables(pool, r.name) for r in reports if r.ok})


def _variables(pool: EnvPool, name: str) -> dict[str, str] | None:
    """What a client must set for `envfactory serve NAME` to find the environment: the folder it lives in when that
    is not the project's `envs/` (a compiled environment's folder, a pool folder of the user's), which the server
    knows only from the setting."""
    folder = pool.folder_of(name)
    if folder is None:  # an imported suite's: found by name
        return None
    where = folder.resolve().parent
    compiled = pool.settings.compiled_dir
    if compiled is not None and where == compiled.resolve():
        return {"ENVFACTORY_COMPILED_DIR": str(where)}
    if where != (pool.settings.root / "envs").resolve():
        return {"ENVFACTORY_ENVS_DIR": str(where)}
    return None


def _sync(path: Path, reports: list[EnvReport], variables: dict[str, dict[str, str] | None]) -> None:
    registry = load_registry(path)
    for r in reports:
        if r.ok:
            registry.mcpServers[r.name] = ServerEntry(
                args=["serve", r.name, "--transport", "stdio"],
                domain=r.domain or "",
                tools=r.tools,
                write_tools=r.write_tools,
                source=r.source or "",
                scenarios=r.scenarios,
                env=variables.get(r.name),
            )
        else:
            registry.mcpServers.pop(r.name, None)
    save_registry(path, registry)
