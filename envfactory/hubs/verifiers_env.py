"""The verifiers side of an exported package (`envfactory envs export --format verifiers`).

`make_environment` builds a `verifiers.MultiTurnEnv` (the classic API, verifiers 0.3.x: see the README for why
not 0.4) whose dataset rows are the package's tasks (`prompt` = the task's chat messages, `info` = its id and
tool list in verifiers' `tool_defs` form). Each rollout gets its own `TaskEpisode` in `setup_state` — the
task's environments forked at its initial state — and its tool calls run there; the rubric's reward is the
composite reward of the rollout's completion against the task's record (what GRPO trains with), with the
verifier's state match and the trajectory match as metrics.

Not `vf.ToolEnv`: it builds schemas from Python functions through openai-agents, whose top-level module
`agents` is also this project's agents package; our tools already have their JSON schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import verifiers as vf
from datasets import Dataset
from verifiers.legacy.types import ToolMessage

from envfactory.hubs.episode import Task, TaskEpisode
from envfactory.hubs.package import PackageData, package_data
from envfactory.reward.settings import RewardResult

DEFAULT_MAX_TURNS = 16


def _tool_defs(task: Task) -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters", {"type": "object", "properties": {}}),
        }
        for t in task.tools
    ]


def _as_dict(message: Any) -> Any:
    return message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else message


class EnvFactoryEnv(vf.MultiTurnEnv):
    """The package's tasks as a verifiers environment: one `TaskEpisode` per rollout (see the module)."""

    def __init__(self, data: PackageData, **kwargs: Any) -> None:
        self.data = data
        rows = [{"prompt": t.prompt, "info": {"task_id": t.id, "tool_defs": _tool_defs(t)}} for t in data.tasks]
        rubric = vf.Rubric(funcs=[self.envfactory_reward], weights=[1.0])
        rubric.add_metric(self.verifier_state_match)
        rubric.add_metric(self.trajectory_match)
        kwargs.setdefault("max_turns", DEFAULT_MAX_TURNS)
        super().__init__(dataset=Dataset.from_list(rows), rubric=rubric, **kwargs)

    async def setup_state(self, state: vf.State) -> vf.State:
        task = self.data.task(state["info"]["task_id"])
        state["episode"] = self.data.episode(task)
        return await super().setup_state(state)

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        episode: TaskEpisode = state["episode"]
        last = messages[-1]
        replies: list[Any] = []
        for call in getattr(last, "tool_calls", None) or []:
            try:
                arguments = json.loads(call.arguments) if isinstance(call.arguments, str) else call.arguments
            except json.JSONDecodeError as e:
                replies.append(ToolMessage(tool_call_id=call.id, content=f"arguments are not JSON: {e}"))
                continue
            if not isinstance(arguments, dict):
                replies.append(ToolMessage(tool_call_id=call.id, content="arguments must be a JSON object"))
                continue
            outcome = episode.call(call.name, arguments)
            replies.append(ToolMessage(tool_call_id=call.id, content=json.dumps(outcome.payload, ensure_ascii=False)))
        return replies

    @vf.stop
    async def no_tools_called(self, state: vf.State) -> bool:
        """The model answered without calling a tool: its turn is over."""
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return bool(last.role == "assistant" and not getattr(last, "tool_calls", None))

    @vf.cleanup
    async def close_episode(self, state: vf.State) -> None:
        episode = state.get("episode")
        if episode is not None:
            episode.close()

    def _result(self, completion: Any, state: vf.State) -> RewardResult:
        cached = state.get("envfactory_reward")
        if cached is None:
            episode: TaskEpisode = state["episode"]
            cached = state["envfactory_reward"] = episode.reward([_as_dict(m) for m in completion or []])
        return cached

    async def envfactory_reward(self, completion: Any, state: vf.State) -> float:
        """The composite reward: α·R_traj + (1−α)·R_state − length and format penalties, clipped at 0."""
        return self._result(completion, state).reward

    async def verifier_state_match(self, completion: Any, state: vf.State) -> float:
        return self._result(completion, state).r_state

    async def trajectory_match(self, completion: Any, state: vf.State) -> float:
        return self._result(completion, state).r_traj


def make_environment(data_folder: Path, **kwargs: Any) -> EnvFactoryEnv:
    """The package's verifiers environment (`load_environment(**kwargs)`; kwargs go to `MultiTurnEnv`)."""
    return EnvFactoryEnv(package_data(data_folder), **kwargs)
