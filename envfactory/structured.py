"""Ask a chat model for an answer of a Pydantic type, re-asking with the error when it does not fit.

Bad output never raises: after `retries` re-asks (each with the `common/repair` prompt, the error
and the JSON schema) it becomes a recorded failure. Transport errors and `ScriptExhaustedError`
do propagate: they are not the model's answer.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, Field, ValidationError

from envfactory.llm import message_text
from envfactory.prompts import PromptLibrary
from envfactory.thinking import strip_thinking

T = TypeVar("T", bound=BaseModel)
REPAIR_PROMPT = "common/repair"
log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}


class Structured(BaseModel, Generic[T]):
    """The outcome of `ask_structured`: `value` when `ok`, else the last `error`; `raw` holds every reply."""

    ok: bool
    value: T | None = None
    error: str | None = None
    attempts: int = 0
    raw: list[str] = Field(default_factory=list)
    role: str | None = None


class ExtractionError(ValueError):
    """No JSON value could be taken from a reply."""


def _balanced(text: str, start: int) -> str | None:
    """The bracketed span opening at `start`, skipping brackets inside JSON strings; None if unclosed."""
    stack = [_OPENERS[text[start]]]
    in_string = escaped = False
    for i in range(start + 1, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in _OPENERS:
            stack.append(_OPENERS[ch])
        elif ch in "}]":
            if ch != stack.pop():
                return None
            if not stack:
                return text[start : i + 1]
    return None


_MAX_SPANS = 50  # bracket spans tried per reply: bounds the quadratic scan on long prose full of braces


def _candidates(text: str) -> Iterator[tuple[tuple[int, int], str, str]]:
    """(rank, where, text) of each place JSON may be: the whole reply, each fence, each balanced span.

    The rank says how surely a candidate is *the* answer (lower is surer; longer spans before the
    shorter ones nested in them): when none fits, the error reported is the surest one's.
    """
    if text[0] in _OPENERS:
        yield (0, 0), "the reply", text
    for i, block in enumerate(_FENCE.findall(text)):
        yield (1, i), f"code block {i + 1}", block.strip()
    spans = 0
    for i, ch in enumerate(text):
        if ch in _OPENERS and (span := _balanced(text, i)) is not None:
            yield (2, -len(span)), f"the {ch}...{_OPENERS[ch]} at character {i}", span
            spans += 1
            if spans >= _MAX_SPANS:
                return


def _scan(text: str, schema: type[T] | None) -> tuple[Any, str | None]:
    """The first candidate that decodes (and validates, with a schema); else the surest candidate's error."""
    text = strip_thinking(text)  # reasoning models (Qwen3, DeepSeek-R1 behind vLLM) leave it in the content
    if not text:
        return None, "the reply is empty"
    seen: set[str] = set()
    errors: list[tuple[tuple[int, int], str]] = []
    for rank, where, candidate in _candidates(text):
        if candidate in seen:
            continue
        seen.add(candidate)
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError as e:
            errors.append((rank, f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"))
            continue
        if schema is None:
            return data, None
        try:
            return schema.model_validate(data), None
        except ValidationError as e:
            errors.append((rank, _validation_message(e)))
    if not errors:
        return None, "the reply holds no JSON object or array"
    return None, min(errors, key=lambda item: item[0])[1]


def extract_json(text: str) -> Any:
    """The first JSON value in a reply: the whole text, a ```json fence, or the first balanced {...}/[...]."""
    value, error = _scan(text, None)
    if error is not None:
        raise ExtractionError(error)
    return value


def _validation_message(e: ValidationError) -> str:
    lines = []
    for err in e.errors()[:10]:
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"- {loc}: {err['msg']}")
    more = f"\n- ... and {e.error_count() - 10} more" if e.error_count() > 10 else ""
    return f"the JSON does not match the schema ({e.error_count()} errors):\n" + "\n".join(lines) + more


def parse_reply(text: str, schema: type[T]) -> tuple[T | None, str | None]:
    """(value, None) or (None, error) for one reply."""
    value, error = _scan(text, schema)
    return (value, None) if error is None else (None, error)


def _text(reply: Any) -> str:
    """Chat models return messages; a chain ending in a string parser returns text."""
    return reply if isinstance(reply, str) else message_text(reply)


def _config(role: str | None) -> RunnableConfig | None:
    return {"tags": [f"role:{role}"], "metadata": {"role": role}} if role else None


def _repair(library: PromptLibrary, schema: type[BaseModel], text: str, error: str) -> list[BaseMessage]:
    schema_text = json.dumps(schema.model_json_schema(), indent=2)
    return [AIMessage(content=text), *library.get(REPAIR_PROMPT).render(error=error, schema=schema_text)]


def _done(schema: type[T], replies: list[str], role: str | None, value: T | None, error: str | None) -> Structured[T]:
    if value is None:
        log.warning("no valid %s after %d answers (role %s): %s", schema.__name__, len(replies), role, error)
    return Structured[schema](  # type: ignore[valid-type]
        ok=value is not None, value=value, error=error, attempts=len(replies), raw=replies, role=role
    )


ModelLike = BaseChatModel | Runnable[Any, Any]


def ask_structured(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    schema: type[T],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
) -> Structured[T]:
    """Invoke `model`, parse its reply into `schema`; on failure re-ask up to `retries` times."""
    conversation = list(messages)
    library.get(REPAIR_PROMPT)  # a missing repair prompt is a setup error: fail before spending a call
    replies: list[str] = []
    error: str | None = None
    for attempt in range(retries + 1):
        text = _text(model.invoke(conversation, config=_config(role)))
        replies.append(text)
        value, error = parse_reply(text, schema)
        if value is not None:
            return _done(schema, replies, role, value, None)
        if attempt < retries:
            conversation += _repair(library, schema, text, error or "")
    return _done(schema, replies, role, None, error)


async def aask_structured(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    schema: type[T],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
) -> Structured[T]:
    """`ask_structured` with `ainvoke`."""
    conversation = list(messages)
    library.get(REPAIR_PROMPT)
    replies: list[str] = []
    error: str | None = None
    for attempt in range(retries + 1):
        text = _text(await model.ainvoke(conversation, config=_config(role)))
        replies.append(text)
        value, error = parse_reply(text, schema)
        if value is not None:
            return _done(schema, replies, role, value, None)
        if attempt < retries:
            conversation += _repair(library, schema, text, error or "")
    return _done(schema, replies, role, None, error)
