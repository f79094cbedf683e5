"""Chat messages as TRL and transformers chat templates take them (OpenAI-style roles and tool calls).

An assistant message carries `tool_calls` of `{"type": "function", "function": {"name", "arguments"}}`
with `arguments` a dict — what transformers' chat templates and TRL expect (`tojson` is applied in the
template; TRL's own tool-calling checks pass dicts). A `tool` message carries the tool's `name` and the
result as JSON text. `reasoning_content` is the field transformers aliases `thinking`/`reasoning` to and
Qwen-style templates render as a `<think>` block.

No field is ever written as `null`: an unset field is left out (`wire`). OpenAI-compatible servers differ in what
they take, and some refuse a null outright — llama.cpp's server answers `"tool_calls": null`, `"content": null`
beside calls, or a null call id with HTTP 500. `openai()` is the message as such a server takes it: the same,
with each call's `arguments` a JSON string (the wire form; a dict is refused too).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    name: str | None = Field(default=None, description="tool messages: the tool that answered")
    tool_call_id: str | None = None

    def wire(self) -> dict[str, Any]:
        """The message as a plain dict, unset fields left out (what a JSONL row holds)."""
        return self.model_dump(mode="json", exclude_none=True)

    def openai(self) -> dict[str, Any]:
        """The message as an OpenAI-compatible server takes it: `wire()` with each call's arguments JSON text."""
        message = self.wire()
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
        return message


def result_text(result: Any) -> str:
    """A tool result as the model saw it: JSON text (as the solver sends tool messages)."""
    return json.dumps(result, ensure_ascii=False, default=str)


def wire(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [m.wire() for m in messages]
