"""`envfactory envs export`: environments and their tasks as a package OpenEnv or verifiers loads.

The package holds copies of the environment folders, the exporter's trust pins for them, the tasks (the RL
records of a synth run: prompt, tools, ground truth, initial and final state) and a few lines that hand
the library our runtime (`envfactory.hubs.openenv_env` / `envfactory.hubs.verifiers_env`): the episode,
the per-rollout isolation and the reward live here, tested, not in generated code.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Literal

from envfactory.env.folder import FolderError, read_bytes, walk, write_files
from envfactory.env.pool import EnvPool
from envfactory.env.trust import code_hash, trust, trusted_entry
from envfactory.errors import DataError
from envfactory.export.rl import RLSample
from envfactory.hubs.episode import Task, task_id, tasks_jsonl
from envfactory.hubs.package import MANIFEST_FILE, TASKS_FILE, Manifest
from envfactory.inputs import write_atomic

HubFormat = Literal["openenv", "verifiers"]
_NAME = re.compile(r"[a-z][a-z0-9_]{0,48}")  # the whole name (fullmatch): `$` let "pkg\n" through


class HubExportError(DataError):
    """An export that cannot be written as asked."""


def _pyproject(distribution: str, module: str, library: str, description: str, extra: str = "") -> str:
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.1.0"
description = {json.dumps(description)}
requires-python = ">=3.11"
dependencies = ["envfactory", "{library}"]
{extra}
[tool.setuptools.packages.find]
include = ["{module}*"]

[tool.setuptools.package-data]
"{module}" = ["openenv.yaml", "data/**/*"]
'''


def _openenv_files(module: str, name: str, description: str) -> dict[str, str]:
    pascal = "".join(part.title() for part in name.split("_"))
    return {
        "pyproject.toml": _pyproject(
            f"openenv-{module}",
            module,
            "openenv-core>=0.3,<0.4",
            description,
            f'\n[project.scripts]\nserver = "{module}.server.app:main"\n',
        ),
        "openenv.yaml": f"spec_version: 1\nname: {module}\ntype: space\nruntime: fastapi\n"
        f"app: {module}.server.app:app\nport: 8000\n",
        f"{module}/openenv.yaml": f"spec_version: 1\nname: {module}\ndescription: {json.dumps(description)}\n",
        f"{module}/__init__.py": f'"""{description} (an EnvFactory export for OpenEnv)."""\n\n'
        f"from {module}.client import {pascal}Action, {pascal}Env, {pascal}Observation, tasks\n\n"
        f'__all__ = ["{pascal}Action", "{pascal}Env", "{pascal}Observation", "tasks"]\n',
        f"{module}/client.py": '"""The client: OpenEnv\'s own MCP tool client '
        '(`reset(task_id=...)`, `step(CallToolAction(...))`)."""\n\n'
        "from pathlib import Path\n\n"
        "from openenv.core import MCPToolClient\n"
        "from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation\n\n"
        "from envfactory.hubs.episode import Task, load_tasks\n\n"
        f"{pascal}Action = CallToolAction\n{pascal}Observation = CallToolObservation\n\n\n"
        f'class {pascal}Env(MCPToolClient):\n    """A session on the {name} environment server."""\n\n\n'
        'def tasks() -> list[Task]:\n    """The package\'s tasks: id, prompt (chat messages), tools, ground truth."""\n'
        '    return load_tasks(Path(__file__).parent / "data" / "tasks.jsonl")\n',
        f"{module}/server/__init__.py": "",
        f"{module}/server/app.py": '"""The OpenEnv server: `uvicorn '
        f'{module}.server.app:app` (one episode per WebSocket session)."""\n\n'
        "from pathlib import Path\n\nimport uvicorn\n\nfrom envfactory.hubs.openenv_env import make_app\n\n"
        f'app = make_app(Path(__file__).resolve().parent.parent / "data", name="{name}")\n\n\n'
        'def main(host: str = "127.0.0.1", port: int = 8000) -> None:\n    uvicorn.run(app, host=host, port=port)\n\n\n'
        'if __name__ == "__main__":\n    main()\n',
    }


def _verifiers_files(module: str, name: str, description: str) -> dict[str, str]:
    return {
        # verifiers 0.4 dropped the Environment API this package uses (README: why 0.3)
        "pyproject.toml": _pyproject(module, module, "verifiers>=0.3.1,<0.4", description),
        f"{module}/__init__.py": f'"""{description} (an EnvFactory export for verifiers)."""\n\n'
        f"from {module}.environment import load_environment\n\n"
        '__all__ = ["load_environment"]\n',
        f"{module}/environment.py": '"""`load_environment()`: what `verifiers.load_environment('
        f'"{module}")` calls."""\n\n'
        "from pathlib import Path\nfrom typing import Any\n\n"
        "from envfactory.hubs.verifiers_env import make_environment\n\n\n"
        "def load_environment(**kwargs: Any) -> Any:\n"
        '    return make_environment(Path(__file__).resolve().parent / "data", **kwargs)\n',
    }


def export_package(
    pool: EnvPool,
    names: list[str],
    records: list[RLSample],
    fmt: HubFormat,
    out: Path,
    name: str | None = None,
) -> Manifest:
    """Write the package to `out`; the tasks are the records whose environments are all in `names`."""
    if not names:
        raise HubExportError("no environment to export")
    for env_name in names:
        if not (pool.folder / env_name / "env.py").is_file():
            hint = " (an imported suite's environments live in its package)" if env_name in pool.names() else ""
            raise HubExportError(f"no environment folder {env_name!r} in {pool.folder}{hint}")
    name = name or (names[0] if len(names) == 1 else "envfactory_pool")
    if not _NAME.fullmatch(name):
        raise HubExportError(f"package name {name!r}: use lowercase letters, digits and _ (a Python module name)")
    module = name if name.endswith("_env") else f"{name}_env"
    if out.exists() and not out.is_dir():
        raise HubExportError(f"{out} is a file: --out names the folder the package is written to")
    earlier = out / module / "data" / MANIFEST_FILE
    if out.exists() and any(out.iterdir()) and not earlier.is_file():
        raise HubExportError(f"{out} is not empty and holds no earlier export of {module}: choose an empty folder")
    if earlier.is_file() and (was := _earlier_format(earlier)) != fmt:
        raise HubExportError(
            f"{out} holds an earlier {was} export of {module}; a {fmt} one would leave its files beside the new "
            "ones: choose another folder (or empty this one)"
        )
    chosen = set(names)
    tasks = [Task(id=task_id(r), record=r) for r in records if set(r.servers()) <= chosen]
    if records and not tasks:
        raise HubExportError(f"none of the {len(records)} tasks uses only {', '.join(names)}")
    manifest = Manifest(
        format=fmt,
        name=name,
        module=module,
        environments=names,
        tasks=len(tasks),
        envfactory_version=version("envfactory"),
    )
    data = out / module / "data"
    try:
        _write_package(pool, names, tasks, module, name, fmt, out, data)
        write_atomic(data / MANIFEST_FILE, manifest.model_dump_json(indent=2) + "\n")
    except OSError as e:
        raise HubExportError(f"cannot write the package to {out}: {e.strerror or e}") from None
    return manifest


def _earlier_format(manifest: Path) -> str:
    """The format of the export whose manifest this is ("unreadable" when it does not read)."""
    try:
        return Manifest.model_validate_json(manifest.read_text(encoding="utf-8")).format
    except (OSError, ValueError):
        return "unreadable"


def _write_package(
    pool: EnvPool, names: list[str], tasks: list[Task], module: str, name: str, fmt: HubFormat, out: Path, data: Path
) -> None:
    """The package's files: the environment folders (with their trust pins), the tasks, the library's glue."""
    if data.exists():
        shutil.rmtree(data)
    trust_file = data / "configs" / "trusted.json"
    for env_name in names:
        source, copy = pool.folder / env_name, data / "envs" / env_name
        # regular files only, read without following a link (a folder holding one is refused), so no
        # file from outside the environment's folder reaches the package; the pin is the copy's own hash
        try:
            copied = {rel: read_bytes(source, rel, what="environment file") for rel in walk(source.absolute())}
            write_files(copy, copied)
        except FolderError as e:
            raise HubExportError(f"cannot export '{env_name}': {e}") from None
        kept = trusted_entry(pool.settings.trust_file, env_name)
        if kept is not None and kept.sha256 == code_hash(copy):  # what was copied is what was trusted
            trust(trust_file, env_name, copy, note="trusted where it was exported", at=kept.trusted_at)
    data.mkdir(parents=True, exist_ok=True)
    write_atomic(data / TASKS_FILE, tasks_jsonl(tasks))
    description = f"EnvFactory environments {', '.join(names)} with {len(tasks)} tasks"
    files = (
        _openenv_files(module, name, description) if fmt == "openenv" else _verifiers_files(module, name, description)
    )
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out / rel, text)
