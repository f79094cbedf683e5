"""Chat models per role: `openai` (any OpenAI-compatible endpoint), `local` (llama.cpp GGUF), `scripted`.

`chat_model(role)` reads `settings.llm_for(role)`; every model reports token usage in
`AIMessage.usage_metadata`, so one `UsageTracker` counts usage the same way for every provider.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit
from uuid import UUID

import openai
from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    BaseCallbackHandler,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, convert_to_openai_messages
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator
from rich.table import Table

from envfactory.config import ROLES, LLMSettings, Role, Settings, get_settings
from envfactory.errors import EnvFactoryError, first_error
from envfactory.inputs import InputError, read_yaml
from envfactory.llm.prompts import PROMPT_KEY
from envfactory.terminal import safe

ANY_PROMPT = "*"  # script key for calls whose prompt has no responses of its own (or no prompt name)
ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool


class LLMConfigError(EnvFactoryError):
    """The LLM settings for a role cannot produce a model (provider none, missing file or package)."""


class LLMCallError(EnvFactoryError):
    """A model call failed for a transport reason (timeout, connection, HTTP error) after the client's retries."""


class LLMRequestRefused(LLMCallError):
    """The server refused this request itself (HTTP 400, 413, 422: e.g. a prompt longer than the model's context),
    and would refuse it again: the asking step fails with the reason rather than the whole run."""


REFUSED_STATUSES = frozenset({400, 413, 422})


class ScriptExhaustedError(EnvFactoryError):
    """A scripted model was asked for more responses than its script holds."""


# ---- token counting ------------------------------------------------------------------------------


def approx_tokens(text: str) -> int:
    """Scripted models count ceil(characters / 4): the usual rule of thumb for BPE tokenizers on English."""
    return math.ceil(len(text) / 4)


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


def _message_tokens(message: BaseMessage) -> int:
    text = message_text(message)
    if isinstance(message, AIMessage) and message.tool_calls:
        text += json.dumps([{"name": c["name"], "args": c["args"]} for c in message.tool_calls])
    return approx_tokens(text)


# ---- usage tracking ------------------------------------------------------------------------------


class RoleUsage(BaseModel):
    role: str
    calls: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    structured: int = 0  # structured asks (`envfactory.llm.structured.ask`)
    repaired: int = 0  # of them, answered only after a repair prompt
    unanswered: int = 0  # of them, without a valid answer when the repairs ran out
    unreadable: int = 0  # replies to them that were not the asked form (not JSON, not the schema)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class _RoleUsageHandler(BaseCallbackHandler):
    """Feeds one role's model calls into a tracker."""

    run_inline = True  # cheap and lock-protected: no need for an executor hop in async runs

    def __init__(self, tracker: UsageTracker, role: str) -> None:
        self.tracker, self.role = tracker, role

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kw: Any) -> None:
        input_tokens = output_tokens = 0
        for generations in response.generations:
            for gen in generations:
                message = gen.message if isinstance(gen, ChatGeneration) else None
                usage = message.usage_metadata if isinstance(message, AIMessage) else None
                if usage:
                    input_tokens += usage.get("input_tokens", 0)
                    output_tokens += usage.get("output_tokens", 0)
        if not (input_tokens or output_tokens) and response.llm_output:
            # older integrations report only the provider's raw `token_usage`
            raw = response.llm_output.get("token_usage") or {}
            input_tokens, output_tokens = raw.get("prompt_tokens", 0), raw.get("completion_tokens", 0)
        self.tracker.add(self.role, calls=1, input_tokens=input_tokens, output_tokens=output_tokens)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kw: Any) -> None:
        self.tracker.add(self.role, errors=1)


class UsageTracker:
    """Counts calls, errors and tokens per role; safe to share across threads and concurrent branches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, RoleUsage] = {}

    def handler(self, role: str) -> BaseCallbackHandler:
        """A LangChain callback handler that counts into this tracker under `role`."""
        return _RoleUsageHandler(self, role)

    def add(self, role: str, *, calls: int = 0, errors: int = 0, input_tokens: int = 0, output_tokens: int = 0) -> None:
        with self._lock:
            row = self._rows.setdefault(role, RoleUsage(role=role))
            row.calls += calls
            row.errors += errors
            row.input_tokens += input_tokens
            row.output_tokens += output_tokens

    def asked(self, role: str, attempts: int, ok: bool, unreadable: int = 0) -> None:
        """One structured ask's outcome: answered first time, after repairs, or not at all."""
        with self._lock:
            row = self._rows.setdefault(role, RoleUsage(role=role))
            row.structured += 1
            row.repaired += ok and attempts > 1
            row.unanswered += not ok
            row.unreadable += unreadable

    def report(self) -> list[RoleUsage]:
        """One row per role seen, in the order of `ROLES`, then other roles alphabetically."""
        order: dict[str, int] = {r: i for i, r in enumerate(ROLES)}
        with self._lock:
            rows = [r.model_copy() for r in self._rows.values()]
        return sorted(rows, key=lambda r: (order.get(r.role, len(order)), r.role))

    def since(self, before: Sequence[RoleUsage]) -> list[RoleUsage]:
        """What each role added after `before` (an earlier `report()`): one run's share of a shared tracker."""
        earlier = {r.role: r for r in before}
        counts = [f for f in RoleUsage.model_fields if f != "role"]
        rows = []
        for row in self.report():
            old = earlier.get(row.role)
            grown = RoleUsage(role=row.role, **{f: getattr(row, f) - (getattr(old, f) if old else 0) for f in counts})
            if any(getattr(grown, f) for f in counts):
                rows.append(grown)
        return rows

    def table(self) -> Table:
        return usage_table(self.report())


_PROCESS_USAGE = UsageTracker()


def process_usage() -> UsageTracker:
    """The process's tracker: the agents' models and the tool graph's LLM count into it, per role."""
    return _PROCESS_USAGE


def usage_table(rows: Sequence[RoleUsage]) -> Table:
    table = Table(
        "role", "calls", "errors", "input tokens", "output tokens", "total", "structured", "repaired", "unanswered",
        "unreadable", title="LLM usage",
    )  # fmt: skip
    shown = list(rows)
    if len(rows) > 1:
        shown.append(
            RoleUsage(
                role="all",
                calls=sum(r.calls for r in rows),
                errors=sum(r.errors for r in rows),
                input_tokens=sum(r.input_tokens for r in rows),
                output_tokens=sum(r.output_tokens for r in rows),
                structured=sum(r.structured for r in rows),
                repaired=sum(r.repaired for r in rows),
                unanswered=sum(r.unanswered for r in rows),
                unreadable=sum(r.unreadable for r in rows),
            )
        )
    for r in shown:
        counts = [r.calls, r.errors, r.input_tokens, r.output_tokens, r.total_tokens, r.structured, r.repaired]
        counts += [r.unanswered, r.unreadable]
        table.add_row(safe(r.role), *(str(c) for c in counts), end_section=r is rows[-1] and len(shown) > len(rows))
    return table


# ---- scripted ------------------------------------------------------------------------------------


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


def prompt_name(messages: Sequence[BaseMessage]) -> str | None:
    """The prompt a conversation was rendered from: set by `Prompt.render` on the first message."""
    if not messages:
        return None
    name = messages[0].additional_kwargs.get(PROMPT_KEY)
    return name if isinstance(name, str) else None


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
    try:
        raw = read_yaml(Path(path))
    except InputError as e:
        raise LLMConfigError(f"script file {e}") from None
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


def _shared_scripted(path: Path, **kwargs: Any) -> ScriptedChatModel:
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


# ---- local (llama.cpp) ---------------------------------------------------------------------------


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


_LOCAL_HINT = "pip install 'envfactory[local]'"


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise LLMConfigError(f"the local provider needs llama-cpp-python: {_LOCAL_HINT}") from None
    return llama_cpp


# ---- openai-compatible ---------------------------------------------------------------------------


def _openai_hosted(base_url: str | None) -> bool:
    """OpenAI's own API (no base URL, api.openai.com) or Azure OpenAI: the endpoints that refuse `max_tokens` for
    some models and want `max_completion_tokens` alone."""
    if not base_url:
        return True
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "api.openai.com" or host.endswith((".openai.azure.com", ".openai.com"))


class _ChatOpenAI(ChatOpenAI):
    """ChatOpenAI whose transport failures become one-line `LLMCallError`s naming role, model and endpoint.

    Retries happen below this, in the openai client (openai `_base_client.py`, `_should_retry` and
    `_calculate_retry_timeout`, read in openai 3.57): 408, 409, 429, every 5xx, connection errors and
    timeouts are retried `max_retries` times with exponential backoff (0.5 s doubling to 8 s, up to
    25 % jitter), or after the server's `Retry-After` when it is above 0 and at most 120 s (so
    `Retry-After: 0` still backs off 0.5 s). langchain-openai 1.8 passes `max_retries` and `timeout`
    straight to that client.
    """

    envfactory_role: str = ""
    envfactory_structured: bool = True  # `ask` sends a structured answer's JSON schema as `response_format`
    envfactory_response_format: str = "auto"  # LLMSettings.response_format
    envfactory_max_tokens_field: str = "auto"  # LLMSettings.max_tokens_field
    _settled: str = PrivateAttr(default="json_schema")  # auto: the form the server took last

    def _tries(self, kwargs: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
        """The call's keyword arguments with each `response_format` to try, in order, and whether it is the
        last: a structured answer's JSON schema as json_schema, as json_object + schema, then none (auto: the
        next call starts from the form that was taken last)."""
        wanted = kwargs.get("response_format")
        if not (isinstance(wanted, dict) and wanted.get("type") == "json_schema"):
            yield kwargs, True
            return
        rest = {k: v for k, v in kwargs.items() if k != "response_format"}
        schema = {"type": "json_object", "schema": wanted["json_schema"]["schema"]}
        forms = {"json_schema": {**rest, "response_format": wanted}, "json_object": {**rest, "response_format": schema}}
        forms["none"] = rest
        order = ["json_schema", "json_object", "none"]
        mode = self.envfactory_response_format
        if mode != "auto":
            yield forms[mode], True
            return
        for name in order[order.index(self._settled) :]:
            self._settled = name  # kept when the call returns; the next one is tried when the server refused it
            yield forms[name], name == "none"

    @staticmethod
    def _refused(e: Exception) -> bool:
        """A server that does not take this `response_format` (llama-cpp-python answers json_schema with a 500)."""
        return isinstance(e, openai.APIStatusError) and e.status_code in (400, 422, 500) and "response_format" in str(e)

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """The request, with an assistant message's missing text sent as "" rather than null: langchain-openai
        writes `content: null` beside tool calls (OpenAI accepts it), and llama.cpp's server answers that
        with HTTP 500 (its schema wants a string), so every history holding a call would fail there."""
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        self._limit_tokens(payload)
        for message in payload.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "assistant" and message.get("content") is None:
                message["content"] = ""
        return payload

    def _limit_tokens(self, payload: dict[str, Any]) -> None:
        """The token cap in the field the server reads. langchain-openai renames `max_tokens` to
        `max_completion_tokens` (OpenAI's current name), which llama-cpp-python's server ignores without a word:
        there a cap of 1,024 generated until the context was full (4,052 tokens in 253 s, measured). So every
        endpoint but OpenAI's own gets both fields (vLLM and SGLang read either)."""
        cap = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if cap is None:
            return
        field = self.envfactory_max_tokens_field
        if field == "auto":
            field = "max_completion_tokens" if _openai_hosted(self.openai_api_base) else "both"
        payload.pop("max_tokens", None)
        payload.pop("max_completion_tokens", None)
        if field in ("max_tokens", "both"):
            payload["max_tokens"] = cap
        if field in ("max_completion_tokens", "both"):
            payload["max_completion_tokens"] = cap

    def _where(self) -> str:
        return f"role '{self.envfactory_role}', model '{self.model_name}' at {self.openai_api_base or 'api.openai.com'}"

    def _fail(self, e: Exception) -> NoReturn:
        where = self._where()
        if isinstance(e, openai.APITimeoutError):
            raise LLMCallError(
                f"LLM call timed out after {self.request_timeout} s ({where}, max_retries={self.max_retries}); "
                "raise ENVFACTORY_LLM__TIMEOUT_S or check the server"
            ) from e
        if isinstance(e, openai.APIConnectionError):
            raise LLMCallError(f"cannot reach the LLM server ({where}): {e.__cause__ or e}") from e
        if isinstance(e, openai.APIStatusError):
            kind = LLMRequestRefused if e.status_code in REFUSED_STATUSES else LLMCallError
            raise kind(f"LLM server answered HTTP {e.status_code} ({where}): {e.message}") from e
        raise LLMCallError(f"LLM call failed ({where}): {type(e).__name__}: {e}") from e

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn the client's errors into one-line LLMCallErrors, for all four call paths."""
        try:
            yield
        except openai.APIError as e:
            self._fail(e)
        except openai.ContentFilterFinishReasonError as e:  # the server's filter stopped this request's answer
            raise LLMRequestRefused(f"the LLM server's content filter stopped the answer ({self._where()})") from e

    def _cut_off(self, e: openai.LengthFinishReasonError) -> ChatResult:
        """A structured reply the server stopped at max_tokens: openai's `parse` raises LengthFinishReasonError
        instead of returning it. Its text goes back to the asking loop as the reply it is (finish_reason
        "length"), which re-asks with the error, as for any reply that does not read."""
        return self._create_chat_result(e.completion)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._errors():
            for attempt, last in self._tries(kwargs):
                try:
                    return super()._generate(messages, stop=stop, run_manager=run_manager, **attempt)
                except openai.LengthFinishReasonError as e:
                    return self._cut_off(e)
                except Exception as e:
                    if last or not self._refused(e):
                        raise
            raise AssertionError("unreachable: the last try returns or raises")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._errors():
            for attempt, last in self._tries(kwargs):
                try:
                    return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **attempt)
                except openai.LengthFinishReasonError as e:
                    return self._cut_off(e)
                except Exception as e:
                    if last or not self._refused(e):
                        raise
            raise AssertionError("unreachable: the last try returns or raises")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        with self._errors():
            yield from super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        with self._errors():
            async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs):
                yield chunk


def _openai_model(role: Role, cfg: LLMSettings, callbacks: list[BaseCallbackHandler]) -> BaseChatModel:
    api_key = cfg.api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if cfg.base_url else None)
    if api_key is None:
        raise LLMConfigError(
            f"role '{role}': the openai provider needs ENVFACTORY_LLM__BASE_URL (an OpenAI-compatible server) "
            "or an API key (ENVFACTORY_LLM__API_KEY or OPENAI_API_KEY)"
        )
    return _ChatOpenAI(
        envfactory_role=role,
        envfactory_response_format=cfg.response_format,
        envfactory_max_tokens_field=cfg.max_tokens_field,
        model=cfg.model,
        base_url=cfg.base_url,
        api_key=api_key,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens,
        timeout=cfg.timeout_s,
        max_retries=cfg.max_retries,
        # vLLM, SGLang, Ollama and llama.cpp servers speak /v1/chat/completions; the Responses API,
        # which langchain-openai picks for some model names, is OpenAI's own.
        use_responses_api=False,
        callbacks=callbacks,
    )


# ---- the factory ---------------------------------------------------------------------------------


def _resolve(path: Path, settings: Settings) -> Path:
    """Relative paths are tried from the working directory, then from the project root."""
    path = path.expanduser()
    if path.is_absolute() or path.exists():
        return path
    return settings.root / path


def setting_var(role: Role, field: str) -> str:
    """The environment variables that set `field` of the LLM settings, for everyone and for `role`."""
    return f"ENVFACTORY_LLM__{field} (or ENVFACTORY_LLM_ROLES__{role.upper()}__{field} for this role only)"


def _provider_entry_point(role: Role, provider: str) -> EntryPoint:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="envfactory.chat_models") if ep.name == provider]
    if not found:
        raise LLMConfigError(
            f"role '{role}': provider {provider} is not installed (no 'envfactory.chat_models' entry point "
            "named so): install the project with its train extra (pip install -e '.[train]')"
        )
    return found[0]


def _entry_point_model(
    role: Role, cfg: LLMSettings, settings: Settings, callbacks: list[BaseCallbackHandler]
) -> BaseChatModel:
    """A provider another package registers (`envfactory.chat_models` entry points: name -> factory taking the
    role's settings, the settings and the callbacks): the library never imports it itself."""
    try:
        factory = _provider_entry_point(role, cfg.provider).load()
    except ImportError as e:
        raise LLMConfigError(f"role '{role}': provider {cfg.provider} cannot be imported: {e}") from None
    model: BaseChatModel = factory(cfg, settings, callbacks)
    return model


def _local_gguf(role: Role, cfg: LLMSettings, settings: Settings) -> Path:
    """The role's GGUF file, checked: set, present, and llama-cpp-python importable (fail now, not mid-run)."""
    var = setting_var(role, "GGUF_PATH")
    if cfg.gguf_path is None:
        raise LLMConfigError(f"role '{role}': the local provider needs a GGUF file: set {var}")
    gguf = _resolve(cfg.gguf_path, settings)
    if not gguf.is_file():
        raise LLMConfigError(f"role '{role}': GGUF file {gguf} does not exist (set {var})")
    if importlib.util.find_spec("llama_cpp") is None:
        raise LLMConfigError(f"role '{role}': the local provider needs llama-cpp-python: {_LOCAL_HINT}")
    return gguf


def check_configured(roles: Iterable[Role], settings: Settings) -> None:
    """Raise the `LLMConfigError` `chat_model` would raise for any of `roles`, without building a model (a GGUF
    file is not loaded): what a command checks before any work, so a missing model is one line, not a run of
    failures."""
    for role in roles:
        cfg = settings.llm_for(role)
        if cfg.provider == "local":
            _local_gguf(role, cfg, settings)
        elif cfg.provider == "transformers":
            _provider_entry_point(role, cfg.provider)  # found, not loaded: loading reads the checkpoint
        else:
            chat_model(role, settings)  # cheap: a client object or a parsed script; or "no LLM is configured"


def chat_model(role: Role, settings: Settings | None = None, usage: UsageTracker | None = None) -> BaseChatModel:
    """The chat model configured for `role`; with `usage`, its calls are counted under that role."""
    settings = settings or get_settings()
    cfg = settings.llm_for(role)
    callbacks: list[BaseCallbackHandler] = [usage.handler(role)] if usage is not None else []
    if cfg.provider == "openai":
        return _openai_model(role, cfg, callbacks)
    if cfg.provider == "local":
        gguf = _local_gguf(role, cfg, settings)
        return LlamaCppChatModel(
            gguf_path=gguf,
            n_ctx=cfg.n_ctx,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            callbacks=callbacks,
        )
    if cfg.provider == "transformers":
        return _entry_point_model(role, cfg, settings, callbacks)
    if cfg.provider == "scripted":
        if cfg.script is None:
            raise LLMConfigError(
                f"role '{role}': the scripted provider needs a script file: set {setting_var(role, 'SCRIPT')}"
            )
        script = _resolve(cfg.script, settings)
        if not script.is_file():
            var = setting_var(role, "SCRIPT")
            raise LLMConfigError(f"role '{role}': script file {script} does not exist (set {var})")
        return _shared_scripted(script, callbacks=callbacks)
    raise LLMConfigError(
        f"no LLM is configured for role '{role}': set {setting_var(role, 'PROVIDER')} to openai (with "
        "ENVFACTORY_LLM__BASE_URL and ENVFACTORY_LLM__MODEL), local (with ENVFACTORY_LLM__GGUF_PATH) "
        "or scripted (with ENVFACTORY_LLM__SCRIPT)"
    )
