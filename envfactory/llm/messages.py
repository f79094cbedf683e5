"""What goes into and comes out of a chat model: a message's text, the prompt a conversation was rendered from,
whether a reply stopped at the token cap, and the tools `bind_tools` takes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from envfactory.llm.prompts import PROMPT_KEY

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool  # what a model's `bind_tools` takes


def message_text(message: BaseMessage) -> str:
    """The text of a message, content blocks joined (providers differ in str vs. block content)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = [b if isinstance(b, str) else str(b.get("text", "")) for b in content if isinstance(b, str | dict)]
    return "".join(parts)


def stopped_at_cap(reply: Any) -> bool:
    """The server stopped this reply at its token cap (finish_reason "length": OpenAI, vLLM, llama.cpp)."""
    metadata = getattr(reply, "response_metadata", None) or {}
    return metadata.get("finish_reason") == "length"


def prompt_name(messages: Sequence[BaseMessage]) -> str | None:
    """The prompt a conversation was rendered from: set by `Prompt.render` on the first message."""
    if not messages:
        return None
    name = messages[0].additional_kwargs.get(PROMPT_KEY)
    return name if isinstance(name, str) else None
