"""The verifiers side of an exported package (`envfactory envs export --format verifiers`).

`make_environment` builds a `verifiers.MultiTurnEnv` (the classic API, verifiers 0.3.x: see the README for why
not 0.4) whose dataset rows are the package's tasks (`prompt` = the task's chat messages, `info` = its id and
tool list in verifiers' `tool_defs` form). Both columns are `datasets` `Json` features, so each row keeps its
own shape: Arrow would otherwise merge every row's structs into one, padding each message with the others'
fields as nulls (`"tool_calls": null` on every user message), each call's arguments with every other tool's
parameters and each tool's schema with every other tool's properties, all as nulls.

A model request leaves out the null fields verifiers 0.3's chat client writes into every assistant message
without calls (`"tool_calls": null`, `"reasoning_content": null`): llama.cpp's OpenAI-compatible server answers
a history holding one with HTTP 500, which verifiers records as an aborted rollout with reward 0.

Each rollout gets its own `TaskEpisode` in `setup_state` — the task's environments forked at its initial
state — and its tool calls run there; the rubric's reward is the composite reward of the rollout's completion
against the task's record (what GRPO trains with), with the verifier's state match and the trajectory match as
metrics.

Not `vf.ToolEnv`: it builds schemas from Python functions through openai-agents, whose top-level module
`agents` is also this project's agents package; our tools already have their JSON schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import verifiers as vf
from datasets import Dataset, Features, Json, List
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


def _as_run(messages: list[Any]) -> list[Any]:
    """The completion as it ran: a call that no tool message answers before the next assistant message is left out.
    verifiers runs a message's calls only to build the next prompt, so the last message's calls never run when a
    rollout stops at `max_turns` (or a timeout, or a prompt too long): scored from the transcript, they earned the
    reward of a state never reached. (Matched within the turn: ids may repeat across turns, or be empty.)"""
    out: list[Any] = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and calls:
            answered: set[Any] = set()
            for later in messages[i + 1 :]:
                if not isinstance(later, dict) or later.get("role") != "tool":
                    break
                answered.add(later.get("tool_call_id"))
            kept = [c for c in calls if isinstance(c, dict) and c.get("id") in answered]
            if len(kept) < len(calls):
                m = {**m, "tool_calls": kept} if kept else {k: v for k, v in m.items() if k != "tool_calls"}
        out.append(m)
    return out


ROWS = Features({"prompt": List(Json()), "info": Json()})  # every row exactly as written (see the module)


def dataset_rows(tasks: list[Task]) -> Dataset:
    """The tasks as verifiers' dataset: `prompt` (the chat messages) and `info` (the id and tool list)."""
    rows = [{"prompt": t.prompt, "info": {"task_id": t.id, "tool_defs": _tool_defs(t)}} for t in tasks]
    return Dataset.from_list(rows, features=ROWS)


def _without_nulls(message: Any) -> Any:
    """A request message with its null fields (and its calls' null fields) left out."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if v is not None}
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_without_nulls(c) for c in out["tool_calls"]]
    return out


class NullFreeClient:
    """A verifiers client whose requests carry no null message field (see the module); all else is the client's.

    `get_response` is the client class's own, run with this object as `self`, so the prompt goes through
    `to_native_prompt` below and everything else (the request, the response's parsing) through the client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
        native, extra = await self._client.to_native_prompt(messages)
        return [_without_nulls(m) for m in native], extra

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        return await type(self._client).get_response(self, *args, **kwargs)


class EnvFactoryEnv(vf.MultiTurnEnv):
    """The package's tasks as a verifiers environment: one `TaskEpisode` per rollout (see the module)."""

    def __init__(self, data: PackageData, **kwargs: Any) -> None:
        self.data = data
        rubric = vf.Rubric(funcs=[self.envfactory_reward], weights=[1.0])
        rubric.add_metric(self.verifier_state_match)
        rubric.add_metric(self.trajectory_match)
        kwargs.setdefault("max_turns", DEFAULT_MAX_TURNS)
        super().__init__(dataset=dataset_rows(data.tasks), rubric=rubric, **kwargs)

    async def get_model_response(self, state: vf.State, prompt: vf.Messages, client: Any = None, **kwargs: Any) -> Any:
        """The model's reply, asked through a `NullFreeClient` (see the module)."""
        chosen = client if client is not None else state["client"]
        return await super().get_model_response(state, prompt, client=NullFreeClient(chosen), **kwargs)

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
            cached = state["envfactory_reward"] = episode.reward(_as_run([_as_dict(m) for m in completion or []]))
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
