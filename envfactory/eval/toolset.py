"""The tools of some environments as a model sees them, and a model's calls run back on them.

`Toolset` exposes each tool under its own name, or `env__tool` where two environments share a name
(the export's rule, `ToolNamer`), as OpenAI-style function specs, and runs a call the model made in an
`Episode` (an unknown tool or bad arguments are failed results, never raised). `history_messages`
renders earlier turns as chat messages. The evaluated agent (`envfactory.eval.agent`) and QueryGen's
solver agent (`envfactory_agents/solver.py`) both use them.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from envfactory.env.pool import EnvPool
from envfactory.records.episode import Episode, result_of
from envfactory.records.models import Node, ToolCall, ToolResult

UNKNOWN_SERVER = "unknown"


class Toolset:
    """The tools of some environments as OpenAI-style function specs, and the way back to (env, tool)."""

    def __init__(
        self, pool: EnvPool, servers: list[str], exclude: set[str] | None = None, only: set[str] | None = None
    ) -> None:
        """`exclude` / `only`: qualified names ("env.tool") to leave out / to keep exclusively."""
        exclude = exclude or set()
        owners: dict[str, list[str]] = {}
        for server in servers:
            for name in pool.get(server).metadata.tool_names:
                owners.setdefault(name, []).append(server)
        self.specs: list[dict[str, Any]] = []
        self.targets: dict[str, tuple[str, str]] = {}  # exposed name → (env, tool)
        self._exposed: dict[tuple[str, str], str] = {}
        for server in servers:
            for spec in pool.get(server).metadata.tools:
                exposed = spec.name if len(owners[spec.name]) == 1 else f"{server}__{spec.name}"
                self._exposed[(server, spec.name)] = exposed
                qualified = f"{server}.{spec.name}"
                if qualified in exclude or (only is not None and qualified not in only):
                    continue
                self.targets[exposed] = (server, spec.name)
                self.specs.append(
                    {
                        "type": "function",
                        "function": {"name": exposed, "description": spec.description, "parameters": spec.input_schema},
                    }
                )

    def exposed(self, server: str, tool: str) -> str:
        return self._exposed.get((server, tool), tool)

    def execute(self, episode: Episode, name: str, args: Any, call_id: str | None) -> tuple[ToolCall, ToolResult]:
        """Run one call the model made; an unknown tool or bad arguments are failed results, never raised."""
        arguments = args if isinstance(args, dict) else {}
        target = self.targets.get(name)
        if target is None:
            call = ToolCall(server=UNKNOWN_SERVER, name=name, arguments=arguments, id=call_id)
            known = ", ".join(self.targets) or "none"
            error = {"error": {"type": "unknown_tool", "message": f"no tool '{name}'; available: {known}"}}
            return call, ToolResult(server=UNKNOWN_SERVER, name=name, ok=False, result=error, call_id=call_id)
        server, tool = target
        call = ToolCall(server=server, name=tool, arguments=arguments, id=call_id)
        if not isinstance(args, dict):
            error = {"error": {"type": "invalid_arguments", "message": "arguments must be a JSON object"}}
            return call, ToolResult(server=server, name=tool, ok=False, result=error, call_id=call_id)
        return call, result_of(call, episode.call(server, tool, arguments))


def tool_message(result: ToolResult) -> ToolMessage:
    content = json.dumps(result.result, ensure_ascii=False, default=str)
    return ToolMessage(content=content, tool_call_id=result.call_id or "", name=result.name, status=_status(result))


def _status(result: ToolResult) -> Any:
    return "success" if result.ok else "error"


def history_messages(nodes: list[Node], toolset: Toolset) -> list[BaseMessage]:
    """Earlier turns as chat messages: the user's words, the assistant's words, its calls and their results.

    An assistant text directly before a tool_call step is one message with those calls, as the model gave it."""
    out: list[BaseMessage] = []
    for node in nodes:
        text: str | None = None  # an assistant text that may carry the next step's calls
        ids: list[str] = []
        for j, step in enumerate(node.steps):
            if step.role == "tool_call":
                calls = step.calls()
                ids = [c.id or f"n{node.index}s{j}c{k}" for k, c in enumerate(calls)]
                tool_calls = [
                    {"name": toolset.exposed(c.server, c.name), "args": c.arguments, "id": i, "type": "tool_call"}
                    for c, i in zip(calls, ids, strict=True)
                ]
                out.append(AIMessage(content=text or "", tool_calls=tool_calls))
                text = None
                continue
            if text is not None:
                out.append(AIMessage(content=text))
                text = None
            if step.role == "user":
                out.append(HumanMessage(content=str(step.content)))
            elif step.role == "assistant":
                text = str(step.content)
            else:
                for k, r in enumerate(step.results()):
                    call_id = r.call_id or (ids[k] if k < len(ids) else f"n{node.index}s{j}r{k}")
                    out.append(tool_message(r.model_copy(update={"call_id": call_id})))
        if text is not None:
            out.append(AIMessage(content=text))
    return out
