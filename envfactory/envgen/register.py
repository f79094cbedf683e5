"""Writing a generated environment's folder, and registering it: load it as the pool would, validate, list it.

A folder holds `env.py`, `metadata.json`, `scenarios/<name>.json` (each test scenario's initial state;
the first is `default`), `scenarios/tests/<name>.json` (the scenarios themselves) and `envgen.json`
(the Search Agent's report and every test round's report). An environment EnvGen revised from a compiled
draft holds `compiled.json` instead of `env.py` (written by `envfactory.compiler.draft`), registered the
same way (`register_folder`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from envfactory.config import Settings
from envfactory.env.compiled import PLAN_FILE
from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX, EnvMetadata, dump_metadata
from envfactory.env.pool import EnvPool
from envfactory.env.trust import CODE_FILE
from envfactory.envgen.checks import TestScenario
from envfactory.envgen.health import HealthSettings, gate
from envfactory.envgen.registry import registry_lock
from envfactory.envgen.validate import sync_registry, validate_env
from envfactory.errors import EnvFactoryError

ENVGEN_FILE = "envgen.json"  # what EnvGen did: its reports; marks a folder EnvGen wrote (and may overwrite)


class RegistrationError(EnvFactoryError):
    """The environment was not registered (the message says why)."""


class GeneratedEnvironment(BaseModel):
    """What EnvGen produced for one environment: its metadata, code, test scenarios and reports."""

    metadata: EnvMetadata
    code: str
    scenarios: list[TestScenario] = Field(default_factory=list)
    search: dict[str, Any] | None = None
    reports: list[dict[str, Any]] = Field(default_factory=list)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")[:60] or "scenario"


def write_environment(folder: Path, env: GeneratedEnvironment) -> None:
    """Write (or overwrite) the environment's folder."""
    (folder / "scenarios" / "tests").mkdir(parents=True, exist_ok=True)
    (folder / PLAN_FILE).unlink(missing_ok=True)  # an earlier EnvGen run's compiled plan: the code replaces it
    (folder / CODE_FILE).write_text(env.code, encoding="utf-8")
    dump_metadata(env.metadata, folder / "metadata.json")
    for i, s in enumerate(env.scenarios):
        name = "default" if i == 0 else _slug(s.name)
        (folder / "scenarios" / f"{name}.json").write_text(json.dumps(s.initial_config, indent=2) + "\n")
        (folder / "scenarios" / "tests" / f"{_slug(s.name)}.json").write_text(s.model_dump_json(indent=2) + "\n")
    (folder / ENVGEN_FILE).write_text(json.dumps({"search": env.search, "reports": env.reports}, indent=2) + "\n")


def register(env: GeneratedEnvironment, settings: Settings) -> Path:
    """Write `envs/<name>/` (the code, its metadata and scenarios), then `register_folder`; its folder."""
    return register_folder(env.metadata.name, lambda folder: write_environment(folder, env), settings)


def _not_envgens(folder: Path) -> bool:
    """A folder holding an environment EnvGen did not write (hand-written code, a compiled plan from
    `corpus compile`): EnvGen never overwrites it."""
    own = (folder / ENVGEN_FILE).exists()
    return not own and ((folder / CODE_FILE).exists() or (folder / PLAN_FILE).exists())


def register_folder(name: str, write: Callable[[Path], None], settings: Settings) -> Path:
    """Write `envs/<name>/` with `write`, load it as the pool would, validate it and add it to the registry.

    One registration at a time (threads of a batch, other processes): write, load, validate, list.
    Raises `RegistrationError` when the name is no environment name, when the folder holds an environment
    EnvGen did not write (not overwritten) or cannot be written, when the written environment does not load,
    or when validation (the contract, then every health dimension) fails.
    """
    if not ENV_NAME.fullmatch(name):  # metadata built without validation (model_construct, an old checkpoint)
        shown = name if len(name) <= 80 else name[:77] + "..."
        rule = f"letters, digits, underscore; at most {ENV_NAME_MAX} characters"
        raise RegistrationError(f"{shown!r} is not a valid environment name ({rule}); not registered")
    folder = settings.envs_path / name
    with registry_lock(settings.registry_file):
        if _not_envgens(folder):
            raise RegistrationError(f"{folder} holds an environment EnvGen did not write; not overwritten")
        try:
            write(folder)
        except OSError as e:  # a full disk, a read-only pool folder
            raise RegistrationError(f"cannot write {folder}: {e.strerror or e}") from None
        pool = EnvPool(settings)
        try:  # untrusted code is loaded in the same OS sandbox it was judged in, never in this process
            pool.get(name)
        except EnvFactoryError as e:
            raise RegistrationError(f"the written environment does not load: {e}") from e
        report = validate_env(pool, name)
        gate(pool, report, HealthSettings(calls=settings.health_calls))  # unhealthy: not registered
        sync_registry(pool, [report])
    if not report.ok:
        raise RegistrationError(f"validation failed: {'; '.join(report.problems)}")
    return folder
