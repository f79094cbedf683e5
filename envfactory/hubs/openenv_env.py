"""The OpenEnv side of an exported package (`envfactory envs export --format openenv`).

An OpenEnv `Environment` whose instances are episodes: OpenEnv's server makes one instance per WebSocket
session (`/ws`), and each `reset` starts a fresh `TaskEpisode` — the task's environments forked at its
initial state — so rollouts never share state. Actions and observations are OpenEnv's own MCP types
(`ListToolsAction`, `CallToolAction` → `ListToolsObservation`, `CallToolObservation`), so OpenEnv's
`MCPToolClient` drives it unchanged. Every call's observation carries the reward of the calls made so far:
the composite reward (the verifier's final-state match and the trajectory match, less the length penalty)
GRPO trains with; the episode is done after `max_calls` calls.

`reset(task_id=...)` picks a task (else `seed` picks one, else the first) and returns its tools as `list_tools`
does (OpenEnv's `MCPToolClient` reads a reset's `tools` as MCP tools), with the task's id and prompt beside them
(in the raw observation; the MCP client keeps only the tools). The package's `tasks()` lists the tasks with their
prompts and tool lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar
from uuid import uuid4

from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import Observation, State
from pydantic import Field

from envfactory.hubs.episode import Task, TaskEpisode
from envfactory.hubs.package import PackageData, package_data

DEFAULT_MAX_CALLS = 32
DEFAULT_SESSIONS = 64


class EpisodeState(State):
    """`state()`: the episode's task, calls and reward so far, and its environments' state."""

    task_id: str | None = None
    calls: int = 0
    reward: float = 0.0
    environments: dict[str, Any] = Field(default_factory=dict)


class TaskObservation(ListToolsObservation):
    """What `reset` returns: the task's tools (as `list_tools` gives them, so OpenEnv's MCP client reads them),
    its id and its prompt (chat messages as an OpenAI-compatible server takes them)."""

    task_id: str
    prompt: list[dict[str, Any]]


def mcp_tools(task: Task) -> list[Tool]:
    """The task's tool list as MCP tools (name, description, input schema)."""
    return [
        Tool(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            input_schema=t["function"].get("parameters", {"type": "object"}),
        )
        for t in task.tools
    ]


class EnvFactoryEnvironment(Environment[Any, Any, EpisodeState]):
    """One OpenEnv session: one episode at a time on a task of the package (see the module)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    data_folder: ClassVar[Path]
    max_calls: ClassVar[int] = DEFAULT_MAX_CALLS

    def __init__(self) -> None:
        super().__init__()
        self.data: PackageData = package_data(self.data_folder)
        self.episode: TaskEpisode | None = None
        self._state = EpisodeState(episode_id=str(uuid4()))

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None, **_: Any
    ) -> TaskObservation:
        if self.episode is not None:
            self.episode.close()
        task = self.data.task(task_id, seed)
        self.episode = self.data.episode(task)
        self._state = EpisodeState(episode_id=episode_id or str(uuid4()), task_id=task.id)
        return TaskObservation(task_id=task.id, prompt=task.prompt, tools=mcp_tools(task), reward=0.0, done=False)

    def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Observation:
        episode = self.episode
        if isinstance(action, ListToolsAction):  # before the first reset: no task, so no tool yet
            tools = mcp_tools(episode.task) if episode is not None else []
            return ListToolsObservation(tools=tools, reward=self._state.reward, done=False)
        if not isinstance(action, CallToolAction):
            raise ValueError(f"this environment takes call_tool and list_tools actions, not {type(action).__name__}")
        # no call runs outside an episode: before the first reset (which picks the task), or once the episode is
        # done (a client that does not stop at `done` would otherwise go on changing the state it was scored on)
        if episode is None or len(episode.calls) >= self.max_calls:
            why = "no episode: reset first (it picks the task)" if episode is None else "the episode is over: reset"
            return CallToolObservation(
                tool_name=action.tool_name,
                result={"content": [{"type": "text", "text": why}], "is_error": True},
                error=ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=why),
                reward=self._state.reward,
                done=True,
            )
        outcome = episode.call(action.tool_name, dict(action.arguments))
        result = episode.reward()
        self._state.step_count += 1
        self._state.calls = len(episode.calls)
        self._state.reward = result.reward
        done = len(episode.calls) >= self.max_calls
        text = json.dumps(outcome.payload, ensure_ascii=False)
        error = None
        if outcome.unknown:
            error = ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=f"Unknown tool: {action.tool_name!r}")
        return CallToolObservation(
            tool_name=action.tool_name,
            result={
                "content": [{"type": "text", "text": text}],
                "structured_content": outcome.payload
                if isinstance(outcome.payload, dict)
                else {"result": outcome.payload},
                "data": outcome.payload,
                "is_error": not outcome.ok,
            },
            error=error,
            reward=result.reward,
            done=done,
        )

    @property
    def state(self) -> EpisodeState:
        if self.episode is not None:
            self._state.environments = self.episode.state()
        return self._state

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None


def make_app(
    data_folder: Path, *, name: str, max_sessions: int = DEFAULT_SESSIONS, max_calls: int = DEFAULT_MAX_CALLS
) -> Any:
    """The package's OpenEnv server app (FastAPI): `uvicorn <module>.server.app:app`."""
    env_cls = type(
        f"{name.title().replace('_', '')}Environment",
        (EnvFactoryEnvironment,),
        {"data_folder": data_folder.resolve(), "max_calls": max_calls},
    )
    package_data(data_folder)  # fail at start on a broken package, not at the first session
    return create_app(env_cls, CallToolAction, CallToolObservation, env_name=name, max_concurrent_envs=max_sessions)
