"""An exported package's data: its environments, trust pins, tasks; loaded once per process on the serving side.

Layout (under the package's `data/` folder): `envs/<name>/` (copies of the pool's folders), `configs/trusted.json`
(the exporter's trust pins for exactly those folders: code edited after export no longer matches and runs
sandboxed), `tasks.jsonl` (one `Task` a line) and `export.json` (what was exported, from where).
"""

from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.hubs.episode import Task, TaskEpisode, TaskError, load_tasks
from envfactory.reward.scorer import CompositeReward

TASKS_FILE = "tasks.jsonl"
MANIFEST_FILE = "export.json"


class Manifest(BaseModel):
    """`export.json`: what a package holds."""

    model_config = ConfigDict(extra="forbid")

    format: str
    name: str
    module: str
    environments: list[str]
    tasks: int
    envfactory_version: str


class PackageData:
    """The environments and tasks of one exported package (a pool rooted in its `data/` folder)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        if not (self.folder / TASKS_FILE).is_file():
            raise TaskError(f"{self.folder}: not an exported package's data folder (no {TASKS_FILE})")
        self.pool = EnvPool(Settings(root=self.folder, bfcl=False))
        self.scorer = CompositeReward(self.pool)

    @cached_property
    def tasks(self) -> list[Task]:
        return load_tasks(self.folder / TASKS_FILE)

    @cached_property
    def by_id(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def task(self, task_id: str | None, seed: int | None = None) -> Task:
        """The task named `task_id`; else the `seed`-th (modulo the count); else the first."""
        if not self.tasks:
            raise TaskError(f"{self.folder}: the package holds no tasks")
        if task_id is not None:
            task = self.by_id.get(task_id)
            if task is None:
                shown = task_id if len(task_id) <= 80 else task_id[:77] + "..."
                raise TaskError(f"no task {shown!r} in this package ({len(self.tasks)} tasks)")
            return task
        return self.tasks[(seed or 0) % len(self.tasks)]

    def episode(self, task: Task) -> TaskEpisode:
        return TaskEpisode(self.pool, task, self.scorer)  # the pool loads each environment once, under its lock


_LOADED: dict[Path, PackageData] = {}
_LOADED_LOCK = threading.Lock()


def package_data(folder: Path) -> PackageData:
    """The package data of `folder`, loaded once per process."""
    key = folder.resolve()
    with _LOADED_LOCK:
        data = _LOADED.get(key)
        if data is None:
            data = _LOADED[key] = PackageData(key)
        return data
