"""What every agent needs: settings, the prompt library, chat models per role, token usage."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from envfactory.config import Role, Settings, get_settings
from envfactory.llm.errors import LLMRequestRefused
from envfactory.llm.models import chat_model
from envfactory.llm.prompts import PromptLibrary, library_from_settings
from envfactory.llm.structured import Expect, Structured, ask
from envfactory.llm.usage import process_usage

V = TypeVar("V")

# Models are cached per process and per model settings: a scripted model keeps its place in the
# script across the nodes of a run, and a local GGUF model is loaded once.
_MODELS: dict[tuple[str, str], BaseChatModel] = {}
_LOCK = threading.Lock()


@dataclass
class AgentDeps:
    settings: Settings = field(default_factory=get_settings)
    prompt_overrides: dict[str, Any] = field(default_factory=dict)
    _prompts: PromptLibrary | None = None

    @property
    def prompts(self) -> PromptLibrary:
        if self._prompts is None:
            self._prompts = library_from_settings(self.settings, overrides=self.prompt_overrides or None)
        return self._prompts

    def ask(
        self, role: Role, messages: Sequence[BaseMessage], expect: Expect[V], *, retries: int | None = None
    ) -> Structured[V]:
        """The one structured-asking loop (`envfactory.llm.structured.ask`) with `role`'s model, tagged with the
        role; `structured_retries` re-asks unless `retries` says otherwise."""
        retries = self.settings.structured_retries if retries is None else retries
        try:
            model, library = self.model(role), self.prompts
            return ask(model, messages, expect, library=library, retries=retries, role=role, usage=process_usage())
        except LLMRequestRefused as e:  # this request, not the server: the step fails with why, the run goes on
            result = Structured[V](ok=False, error=str(e), attempts=1, role=role)
            process_usage().asked(role, result.attempts, result.ok, result.unreadable)
            return result

    def model(self, role: Role) -> BaseChatModel:
        key = (role, self.settings.llm_for(role).model_dump_json())
        with _LOCK:
            if key not in _MODELS:
                _MODELS[key] = chat_model(role, self.settings, usage=process_usage())
            return _MODELS[key]


def reset_model_cache() -> None:
    """Forget cached models (tests switch scripts between runs in one process)."""
    with _LOCK:
        _MODELS.clear()
