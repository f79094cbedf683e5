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
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from envfactory.config import Settings
from envfactory.env.compiled import PLAN_FILE
from envfactory.env.folder import FolderError, write_files
from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX, EnvMetadata, metadata_json
from envfactory.env.pool import EnvPool
from envfactory.env.registry import registry_lock
from envfactory.env.trust import CODE_FILE
from envfactory.envgen.checks import TestScenario
from envfactory.envgen.health import HealthSettings, gate
from envfactory.envgen.validate import sync_registry, validate_env
from envfactory.errors import EnvError, EnvFactoryError

ENVGEN_FILE = "envgen.json"  # what EnvGen did: its reports; marks a folder EnvGen wrote (and may overwrite)


class RegistrationError(EnvError):
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


def _unique(name: str, files: dict[str, bytes], prefix: str) -> str:
    """`name`, or `name_2`, `name_3`... : the first no file of `files` under `prefix` has."""
    out, n = name, 2
    while f"{prefix}{out}.json" in files:
        out, n = f"{name}_{n}", n + 1
    return out


def write_environment(folder: Path, env: GeneratedEnvironment) -> None:
    """Write (or replace) the environment's folder.

    An earlier folder is removed whole first (a link in its place is refused: `OSError`), and every file is
    created new, never opened through a link: a folder left with `env.py` or a scenario linking to a host
    file would otherwise have had the generated code written over that file, as root."""
    files: dict[str, bytes] = {
        CODE_FILE: env.code.encode("utf-8"),
        "metadata.json": metadata_json(env.metadata).encode("utf-8"),
    }
    for i, s in enumerate(env.scenarios):  # each its own file: a later name that slugs alike (a second scenario
        # named "Default") overwrote the first's state, the one judged as the default
        name = _unique("default" if i == 0 else _slug(s.name), files, "scenarios/")
        files[f"scenarios/{name}.json"] = (json.dumps(s.initial_config, indent=2) + "\n").encode("utf-8")
        test = _unique(_slug(s.name), files, "scenarios/tests/")
        files[f"scenarios/tests/{test}.json"] = (s.model_dump_json(indent=2) + "\n").encode("utf-8")
    files[ENVGEN_FILE] = (json.dumps({"search": env.search, "reports": env.reports}, indent=2) + "\n").encode("utf-8")
    if folder.is_symlink() or folder.exists():
        shutil.rmtree(folder)  # refuses a link; removes links inside without following them
    try:
        write_files(folder, files)
    except FolderError as e:
        raise OSError(str(e)) from None
    (folder / "scenarios" / "tests").mkdir(parents=True, exist_ok=True)


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
