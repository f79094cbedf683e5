"""The one way to ask a chat model for an answer of a given form, re-asking with the error when it does not fit.

One loop (`ask` / `aask`): render → call (tagged with its role for token accounting) → strip `<think>`
traces → read the reply (`Expect.read`: JSON into a Pydantic model, or a code block) → an optional
check → on failure the `common/repair` prompt with the error and the expected form, at most
`retries` times → a `Structured` result: the value, or the last error as a recorded failure. Bad
output never raises. Transport errors and `ScriptExhaustedError` do propagate: they are not the
model's answer. `ask_structured` is the loop for a Pydantic model.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, Field, ValidationError

from envfactory.errors import ServiceError
from envfactory.llm.messages import message_text, stopped_at_cap
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.thinking import strip_thinking
from envfactory.llm.usage import UsageTracker

T = TypeVar("T", bound=BaseModel)
V = TypeVar("V")
REPAIR_PROMPT = "common/repair"
log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n(.*?)```", re.DOTALL)
_OPENERS = {"{": "}", "[": "]"}


class Structured(BaseModel, Generic[V]):
    """The outcome of asking: `value` when `ok`, else the last `error`; `raw` holds every reply."""

    ok: bool
    value: V | None = None
    error: str | None = None
    attempts: int = 0
    unreadable: int = 0  # replies that did not read as the expected form (not JSON, not the schema)
    raw: list[str] = Field(default_factory=list)
    role: str | None = None


class ExtractionError(ServiceError, ValueError):
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


@dataclass(frozen=True)
class Expect(Generic[V]):
    """What an answer must be: `read` turns a reply (thinking stripped) into (value, None) or (None, the
    problem); `shape` is what the repair prompt shows as the required form; `check` may still refuse a
    value that reads (a query that is empty, states that do not load)."""

    name: str
    read: Callable[[str], tuple[V | None, str | None]]
    shape: str
    check: Callable[[V], str | None] | None = None
    json_schema: dict[str, Any] | None = None  # sent as `response_format` to models that constrain output


def expect_model(schema: type[T], check: Callable[[T], str | None] | None = None) -> Expect[T]:
    """A JSON answer validated by `schema` (shown to the model as its JSON schema, and — to a model that takes
    one — sent as its `response_format`, so the server constrains the output to it)."""
    json_schema = schema.model_json_schema()
    return Expect(
        name=schema.__name__,
        read=lambda text: parse_reply(text, schema),
        shape=json.dumps(json_schema, indent=2),
        check=check,
        json_schema=json_schema,
    )


def constrained(model: ModelLike, expect: Expect[Any]) -> ModelLike:
    """`model` bound to answer in `expect`'s JSON schema when it can (the openai and local providers: the
    server's structured output or a llama.cpp grammar); other models get the prompt (and repairs) only."""
    if expect.json_schema is None or not getattr(model, "envfactory_structured", False):
        return model
    form = {"type": "json_schema", "json_schema": {"name": _schema_name(expect.name), "schema": expect.json_schema}}
    return model.bind(response_format=form)


def _schema_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "answer"


def _text(reply: Any) -> str:
    """Chat models return messages; a chain ending in a string parser returns text."""
    return reply if isinstance(reply, str) else message_text(reply)


def _config(role: str | None) -> RunnableConfig | None:
    return {"tags": [f"role:{role}"], "metadata": {"role": role}} if role else None


ModelLike = BaseChatModel | Runnable[Any, Any]


class _Asking(Generic[V]):
    """The loop's bookkeeping, shared by `ask` and `aask` (they differ only in how they call the model)."""

    def __init__(
        self,
        messages: Sequence[BaseMessage],
        expect: Expect[V],
        library: PromptLibrary,
        role: str | None,
        usage: UsageTracker | None,
    ):
        self.expect, self.library, self.role, self.usage = expect, library, role, usage
        self.repair = library.get(REPAIR_PROMPT)  # a missing repair prompt is a setup error: fail before a call
        self.conversation = list(messages)
        self.replies: list[str] = []
        self.error: str | None = None
        self.unreadable = 0

    def take(self, reply: Any, last: bool) -> Structured[V] | None:
        """Read one reply: the result when it is usable (or the attempts are spent), else None (re-ask)."""
        text = _text(reply)
        self.replies.append(text)
        value, self.error = self.expect.read(strip_thinking(text))
        self.unreadable += value is None
        if value is None and stopped_at_cap(reply):
            self.error = f"{self.error} (the reply stopped at the max_tokens limit, unfinished)"
        if value is not None and self.expect.check is not None:
            self.error = self.expect.check(value)
        if value is not None and self.error is None:
            return self.done(value)
        if last:
            return self.done(None)
        repair = self.repair.render(error=self.error or "", schema=self.expect.shape)
        self.conversation += [AIMessage(content=text), *repair]
        return None

    def done(self, value: V | None) -> Structured[V]:
        if value is None:
            log.warning(
                "no valid %s after %d answers (role %s): %s", self.expect.name, len(self.replies), self.role, self.error
            )
        if self.usage is not None:
            self.usage.asked(self.role or "", len(self.replies), value is not None, self.unreadable)
        return Structured[Any](
            ok=value is not None,
            value=value,
            error=None if value is not None else self.error,
            attempts=len(self.replies),
            unreadable=self.unreadable,
            raw=self.replies,
            role=self.role,
        )


def ask(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    expect: Expect[V],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
    usage: UsageTracker | None = None,
) -> Structured[V]:
    """Invoke `model` and read its reply as `expect` says; on failure re-ask up to `retries` times. With `usage`,
    the outcome is counted under `role` (answered first time, after repairs, or not; replies that did not read)."""
    asking = _Asking(messages, expect, library, role, usage)
    call = constrained(model, expect)
    for attempt in range(retries + 1):
        result = asking.take(call.invoke(asking.conversation, config=_config(role)), attempt == retries)
        if result is not None:
            return result
    raise AssertionError("unreachable: the last attempt returns")


async def aask(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    expect: Expect[V],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
    usage: UsageTracker | None = None,
) -> Structured[V]:
    """`ask` with `ainvoke`."""
    asking = _Asking(messages, expect, library, role, usage)
    call = constrained(model, expect)
    for attempt in range(retries + 1):
        result = asking.take(await call.ainvoke(asking.conversation, config=_config(role)), attempt == retries)
        if result is not None:
            return result
    raise AssertionError("unreachable: the last attempt returns")


def ask_structured(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    schema: type[T],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
    check: Callable[[T], str | None] | None = None,
    usage: UsageTracker | None = None,
) -> Structured[T]:
    """`ask` for a JSON answer of `schema` (and `check`, when given)."""
    return ask(model, messages, expect_model(schema, check), library=library, retries=retries, role=role, usage=usage)


async def aask_structured(
    model: ModelLike,
    messages: Sequence[BaseMessage],
    schema: type[T],
    *,
    library: PromptLibrary,
    retries: int,
    role: str | None = None,
    check: Callable[[T], str | None] | None = None,
    usage: UsageTracker | None = None,
) -> Structured[T]:
    """`ask_structured` with `ainvoke`."""
    return await aask(
        model, messages, expect_model(schema, check), library=library, retries=retries, role=role, usage=usage
    )
