"""The scripted chat model (the fake LLM of tests and step-through runs) and its script file format.

A script is a YAML or JSON file holding a list of responses (replayed in order) or a mapping prompt name → list
of responses; a response is a string or `{content, tool_calls, finish_reason}`.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolCall
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator

from envfactory.errors import ServiceError, first_error
from envfactory.inputs import read_yaml
from envfactory.llm.errors import LLMConfigError
from envfactory.llm.messages import ToolLike, message_text, prompt_name

ANY_PROMPT = "*"  # script key for calls whose prompt has no responses of its own (or no prompt name)


class ScriptExhaustedError(ServiceError):
    """A scripted model was asked for more responses than its script holds."""


# ---- token counting ------------------------------------------------------------------------------


def approx_tokens(text: str) -> int:
    """Scripted models count ceil(characters / 4): the usual rule of thumb for BPE tokenizers on English."""
    return math.ceil(len(text) / 4)


def _message_tokens(message: BaseMessage) -> int:
    text = message_text(message)
    if isinstance(message, AIMessage) and message.tool_calls:
        text += json.dumps([{"name": c["name"], "args": c["args"]} for c in message.tool_calls])
    return approx_tokens(text)


# ---- the script and its replay -------------------------------------------------------------------


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedResponse(BaseModel):
    """One scripted reply: a plain string in the file means `{content: <string>}`."""

    model_config = ConfigDict(extra="forbid")

    content: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "stop"  # "length": a reply the server stopped at max_tokens

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"content": data} if isinstance(data, str) else data


Script = list[ScriptedResponse] | dict[str, list[ScriptedResponse]]


class ScriptedCall(BaseModel):
    """What a scripted model was asked: the record tests and step-through debugging look at."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: int  # 0-based, over all calls of the script
    prompt: str | None
    messages: list[BaseMessage]
    tools: list[str]
    response: ScriptedResponse


class _ScriptPlayer:
    """The replay position of one script; shared by every model replaying the same script file."""

    def __init__(self, script: Script, source: str) -> None:
        self.script, self.source = script, source
        self._lock = threading.Lock()
        self._cursors: dict[str, int] = {}
        self.calls: list[ScriptedCall] = []

    def _key(self, prompt: str | None) -> str:
        if isinstance(self.script, list):
            return ANY_PROMPT
        if prompt is not None and prompt in self.script:
            return prompt
        if ANY_PROMPT in self.script:
            return ANY_PROMPT
        scripted = ", ".join(sorted(self.script)) or "none"
        raise ScriptExhaustedError(
            f"scripted model ({self.source}): no responses scripted for prompt '{prompt or '(unnamed)'}' "
            f"(call {len(self.calls) + 1} overall; scripted prompts: {scripted})"
        )

    def next(self, prompt: str | None, messages: list[BaseMessage], tools: list[str]) -> ScriptedCall:
        with self._lock:  # concurrent branches must never receive the same response twice
            key = self._key(prompt)
            responses = self.script if isinstance(self.script, list) else self.script[key]
            pos = self._cursors.get(key, 0)
            if pos >= len(responses):
                which = "the script" if key == ANY_PROMPT else f"prompt '{key}'"
                raise ScriptExhaustedError(
                    f"scripted model ({self.source}): script exhausted: {which} has {len(responses)} scripted "
                    f"responses and call {pos + 1} for it has none (prompt '{prompt or '(unnamed)'}', "
                    f"call {len(self.calls) + 1} overall)"
                )
            self._cursors[key] = pos + 1
            call = ScriptedCall(
                index=len(self.calls), prompt=prompt, messages=list(messages), tools=tools, response=responses[pos]
            )
            self.calls.append(call)
            return call

    def remaining(self) -> dict[str, int]:
        with self._lock:
            lists = {ANY_PROMPT: self.script} if isinstance(self.script, list) else self.script
            return {k: len(v) - self._cursors.get(k, 0) for k, v in lists.items()}


class ScriptedChatModel(BaseChatModel):
    """Replays scripted responses: a list (in order) or a mapping prompt name → list (in order per prompt).

    The prompt name comes from the conversation's first message (see `envfactory.llm.prompts`), so a
    repair re-ask after bad output takes the next response of the *original* prompt. In a mapping,
    the key `"*"` serves calls whose prompt has no list of its own. Usage: ceil(characters / 4).
    """

    script: Script
    source: str = "inline script"
    _player: _ScriptPlayer = PrivateAttr()
    _bound_tools: list[str] = PrivateAttr(default_factory=list)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)  # keeps langchain-core's version metadata
        self._player = _ScriptPlayer(self.script, self.source)

    @classmethod
    def from_file(cls, path: Path, **kwargs: Any) -> ScriptedChatModel:
        """A model with its own replay position over a YAML or JSON script file."""
        return cls(script=load_script(path), source=str(path), **kwargs)

    @property
    def _llm_type(self) -> str:
        return "envfactory-scripted"

    @property
    def calls(self) -> list[ScriptedCall]:
        return list(self._player.calls)

    @property
    def bound_tools(self) -> list[str]:
        """Names of the tools given to the last `bind_tools` call."""
        return list(self._bound_tools)

    def remaining(self) -> dict[str, int]:
        """Responses left per script key (`"*"` for a list script)."""
        return self._player.remaining()

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        tools = [t.get("function", t).get("name", "?") for t in kwargs.get("tools") or [] if isinstance(t, dict)]
        call = self._player.next(prompt_name(messages), messages, tools)
        resp = call.response
        tool_calls = [
            ToolCall(name=tc.name, args=tc.args, id=tc.id or f"call_{call.index}_{j}", type="tool_call")
            for j, tc in enumerate(resp.tool_calls)
        ]
        message = AIMessage(content=resp.content, tool_calls=tool_calls)
        input_tokens = sum(_message_tokens(m) for m in messages)
        output_tokens = _message_tokens(message)
        message.usage_metadata = UsageMetadata(
            input_tokens=input_tokens, output_tokens=output_tokens, total_tokens=input_tokens + output_tokens
        )
        message.response_metadata = {
            "model_name": "scripted",
            "prompt": call.prompt,
            "call": call.index,
            "finish_reason": resp.finish_reason,
        }
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(
        self, tools: Sequence[ToolLike], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        self._bound_tools = [t["function"]["name"] for t in formatted]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)


def load_script(path: Path) -> Script:
    """Parse a script file: YAML (JSON is YAML too) holding a list or a mapping of lists of responses."""
    raw = read_yaml(Path(path), error=lambda m: LLMConfigError(f"script file {m}"))
    try:
        return _SCRIPT.validate_python(raw)
    except ValidationError as e:
        loc, msg = first_error(e, "(top level)")
        raise LLMConfigError(
            f"script file {path}: {loc}: {msg} "
            "(expected a list of responses or a mapping prompt name -> list of responses)"
        ) from None


_SCRIPT: TypeAdapter[Script] = TypeAdapter(Script)
_players_lock = threading.Lock()
_players: dict[tuple[str, int], _ScriptPlayer] = {}


def shared_scripted(path: Path, **kwargs: Any) -> ScriptedChatModel:
    """Models built by `chat_model` for one script file share its replay position (across roles and calls),
    so a graph that builds its model inside each node still walks the script forward."""
    resolved = path.resolve()
    key = (str(resolved), resolved.stat().st_mtime_ns)
    with _players_lock:
        player = _players.get(key)
        if player is None:
            player = _players[key] = _ScriptPlayer(load_script(resolved), str(path))
    model = ScriptedChatModel(script=player.script, source=str(path), **kwargs)
    model._player = player
    return model


def reset_scripted_models() -> None:
    """Forget the shared replay positions: the next `chat_model` call replays script files from the start."""
    with _players_lock:
        _players.clear()
