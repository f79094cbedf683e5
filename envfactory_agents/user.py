"""The simulated user of QueryGen's conversational variant (role "user").

When the solving agent asks something before the turn's goal is reached, the simulated user answers
from their profile, the scenario and what they want this turn (the turn's calls with their values:
the user knows the values they would say, not internal ids). With user tool use on, the user also
has the chain's user-side tools (a confirmation only a human can give): calls it makes run in the
branch's own episode, and it answers once it is done with them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig

from envfactory.env.pool import EnvPool
from envfactory.llm.messages import message_text
from envfactory.llm.thinking import strip_thinking
from envfactory.querygen.records import USER_ROLE, SolveTask
from envfactory.records.models import Step, ToolCall, ToolResult
from envfactory_agents.common import AgentDeps
from envfactory_agents.query import calls_view

Execute = Callable[[str, Any, str | None], tuple[ToolCall, ToolResult]]


def dialog_view(steps: list[Step]) -> str:
    """This turn as the user saw it: their words and the assistant's (tool calls are not shown to users)."""
    lines = []
    for step in steps:
        if step.role in ("user", "assistant") and isinstance(step.content, str) and step.content:
            lines.append(f"{'You' if step.role == 'user' else 'Assistant'}: {step.content}")
    return "\n".join(lines)


def user_reply(
    deps: AgentDeps,
    pool: EnvPool,
    *,
    task: SolveTask,
    dialog: list[Step],
    question: str,
    tools: list[dict[str, Any]],
    execute: Execute,
) -> tuple[str, list[tuple[ToolCall, ToolResult]]]:
    """(the user's answer, the user-side calls it performed); an empty answer if the model gave none."""
    actions = [{"tool": t["function"]["name"], "description": t["function"]["description"]} for t in tools]
    messages: list[BaseMessage] = deps.prompts.get("user/reply").render(
        profile=task.profile,
        scenario=task.scenario,
        query=task.query,
        intent=task.user_intent,
        wants=calls_view(pool, task.raw_calls),
        user_actions=actions or "none",
        dialog=dialog_view(dialog),
        question=question,
    )
    base = deps.model(USER_ROLE)
    model: BaseChatModel | Runnable[LanguageModelInput, AIMessage] = base.bind_tools(tools) if tools else base
    config: RunnableConfig = {"tags": [f"role:{USER_ROLE}"], "metadata": {"role": USER_ROLE, "branch": task.branch}}
    performed: list[tuple[ToolCall, ToolResult]] = []
    for round_ in range(task.config.max_user_tool_rounds + 1):
        reply = model.invoke(messages, config=config)
        text = strip_thinking(message_text(reply))
        tool_calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        if not (tools and tool_calls) or round_ == task.config.max_user_tool_rounds:
            return text, performed
        messages.append(reply)
        for tc in tool_calls:
            call, result = execute(tc["name"], tc["args"], tc.get("id"))
            performed.append((call, result))
            content = json.dumps(result.result, ensure_ascii=False, default=str)
            messages.append(ToolMessage(content=content, tool_call_id=tc.get("id") or "", name=tc["name"]))
    return "", performed
