"""What the LLM layer's tests share: settings with one LLM configuration, a conversation named for its prompt,
a small structured answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from envfactory.config import LLMSettings, Settings


def settings_with(tmp_path: Path, **llm: Any) -> Settings:
    return Settings(root=tmp_path, llm=LLMSettings(**llm))


def named(prompt: str, text: str = "go") -> list[HumanMessage]:
    """A conversation as `Prompt.render` makes it: the first message carries the prompt name."""
    return [HumanMessage(content=text, additional_kwargs={"prompt": prompt})]


class Person(BaseModel):
    name: str
    age: int
