"""One RL episode on an exported task: its environments forked at the task's initial state, the calls the
agent makes, and the reward — the same composite reward (verifier state match + trajectory) as GRPO's.

Library-neutral: the OpenEnv environment and the verifiers environment both drive a `TaskEpisode`, so the
reward either reports is `CompositeReward.score` of the calls made, against the task's record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.errors import EnvError, EnvFactoryError
from envfactory.export.rl import RLSample
from envfactory.export.tools_schema import ToolNamer, catalog_from_pool
from envfactory.inputs import parse_json, read_text
from envfactory.reward.scorer import CompositeReward
from envfactory.reward.settings import RewardResult


class TaskError(EnvError):
    """A task that does not exist or cannot be started."""


class Task(BaseModel):
    """An exported task: an id and the RL record it is (prompt, tools, ground truth, initial/final state)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    record: RLSample

    @property
    def servers(self) -> list[str]:
        return self.record.servers()

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """The chat messages as an OpenAI-compatible server takes them (no null field, arguments as JSON text)."""
        return [m.openai() for m in self.record.prompt]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.record.tool_list()]


def task_id(record: RLSample) -> str:
    return f"{record.extra_info.conversation_id}#{record.extra_info.turn}"


def tasks_jsonl(tasks: list[Task]) -> str:
    """The package's `tasks.jsonl`: one task a line, unset fields left out (no null anywhere but in the data)."""
    return "".join(t.model_dump_json(exclude_none=True) + "\n" for t in tasks)


def load_tasks(path: Path) -> list[Task]:
    """The tasks of an exported package (`tasks.jsonl`: one `Task` a line)."""
    tasks = []
    for n, line in enumerate(read_text(path, what="tasks file").split("\n"), 1):  # U+2028 is not a line end
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate(parse_json(line, f"{path}:{n}")))
        except ValidationError as e:
            raise TaskError(f"{path}:{n}: not a task: {e.errors()[0]['msg']}") from None
    return tasks


class CallOutcome(BaseModel):
    """What one tool call returned to the agent."""

    tool: str
    ok: bool
    payload: Any
    unknown: bool = False  # no environment of the task has this tool


class TaskEpisode:
    """The task's environments on their initial state; every call runs in them and is kept for the reward."""

    def __init__(self, pool: EnvPool, task: Task, scorer: CompositeReward) -> None:
        self.task, self.scorer = task, scorer
        kwargs = task.record.extra_info.mcp_factory_kwargs
        initial = json.loads(kwargs.initial_config)
        servers = task.servers
        try:
            self.sessions = {s: Session.fork(pool.get(s), initial.get(s)) for s in servers}
        except EnvFactoryError as e:
            raise TaskError(f"task {task.id}: cannot start: {e}") from None
        self.namer = ToolNamer(catalog_from_pool(pool, servers), servers)
        self.calls: list[dict[str, Any]] = []

    def call(self, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """Run a call named as the task's tool list names it; a name no environment has fails as a call."""
        self.calls.append({"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}})
        where = self.namer.resolve(name)
        if where is None:
            error = {"error": {"type": "unknown_tool", "message": f"no tool {name!r} in this task"}}
            return CallOutcome(tool=name, ok=False, payload=error, unknown=True)
        server, tool = where
        rec = self.sessions[server].call(tool, arguments)
        return CallOutcome(tool=name, ok=rec.ok, payload=rec.payload())

    def completion(self) -> list[dict[str, Any]]:
        """The calls made, as one assistant message (what the reward reads)."""
        return [{"role": "assistant", "content": "", "tool_calls": list(self.calls)}] if self.calls else []

    def reward(self, completion: Any = None) -> RewardResult:
        """The composite reward of `completion` (default: the calls made here) against the task's record."""
        kwargs = self.task.record.extra_info.mcp_factory_kwargs
        return self.scorer.score(
            self.completion() if completion is None else completion,
            self.task.record.reward_model.ground_truth,
            kwargs.initial_config,
            kwargs.final_config,
            kwargs.mcp_servers,
        )

    def state(self) -> dict[str, Any]:
        return {server: session.dump() for server, session in self.sessions.items()}

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
