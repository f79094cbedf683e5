"""The `local` provider: a GGUF model run in-process by llama.cpp (`llama-cpp-python`, the `local` extra)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, convert_to_openai_messages
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import PrivateAttr

from envfactory.llm.errors import LLMConfigError
from envfactory.llm.messages import ToolLike


class LlamaCppChatModel(BaseChatModel):
    """An embedded llama.cpp model (`llama-cpp-python`), loaded on first use.

    Built on `Llama.create_chat_completion` directly: that is all langchain-community's wrapper
    adds, and it keeps langchain-community out of the dependencies.
    """

    gguf_path: Path
    n_ctx: int = 8192
    envfactory_structured: bool = True  # `ask`'s JSON schema becomes a llama.cpp grammar
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int | None = None
    _llama: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "envfactory-llama-cpp"

    def _client(self) -> Any:
        if self._llama is None:
            llama_cpp = _import_llama_cpp()
            self._llama = llama_cpp.Llama(model_path=str(self.gguf_path), n_ctx=self.n_ctx, verbose=False)
        return self._llama

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request: dict[str, Any] = {
            "messages": convert_to_openai_messages(messages),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "stop": stop,
        }
        for key in ("tools", "tool_choice"):
            if kwargs.get(key) is not None:
                request[key] = kwargs[key]
        wanted = kwargs.get("response_format")
        if isinstance(wanted, dict) and wanted.get("type") == "json_schema":  # llama.cpp: a grammar from the schema
            request["response_format"] = {"type": "json_object", "schema": wanted["json_schema"].get("schema", {})}
        with self._lock:  # a llama.cpp context is not safe for concurrent use
            response = self._client().create_chat_completion(**request)
        return _chat_result(response)

    def bind_tools(
        self, tools: Sequence[ToolLike], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice in ("any", "required"):
            kwargs["tool_choice"] = "required"
        elif tool_choice in ("auto", "none"):
            kwargs["tool_choice"] = tool_choice
        elif tool_choice is not None:  # a tool name
            kwargs["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
        return self.bind(tools=formatted, **kwargs)


def _chat_result(response: Mapping[str, Any]) -> ChatResult:
    """An OpenAI-style completion dict (what llama.cpp returns) as a LangChain result."""
    first = response["choices"][0]
    choice = first["message"]
    tool_calls: list[ToolCall] = []
    invalid: list[dict[str, Any]] = []
    for tc in choice.get("tool_calls") or []:
        fn = tc.get("function", {})
        try:
            args = json.loads(fn.get("arguments") or "{}")
            tool_calls.append(ToolCall(name=fn.get("name", ""), args=args, id=tc.get("id"), type="tool_call"))
        except json.JSONDecodeError as e:
            invalid.append({"name": fn.get("name"), "args": fn.get("arguments"), "id": tc.get("id"), "error": str(e)})
    usage = response.get("usage") or {}
    message = AIMessage(
        content=choice.get("content") or "",
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        usage_metadata=UsageMetadata(
            input_tokens=usage.get("prompt_tokens", 0),
            output_tokens=usage.get("completion_tokens", 0),
            total_tokens=usage.get("total_tokens", 0),
        ),
        response_metadata={
            "model_name": response.get("model", "llama.cpp"),
            "finish_reason": first.get("finish_reason"),
        },
    )
    return ChatResult(generations=[ChatGeneration(message=message)])


LOCAL_HINT = "pip install 'envfactory[local]'"


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise LLMConfigError(f"the local provider needs llama-cpp-python: {LOCAL_HINT}") from None
    return llama_cpp
