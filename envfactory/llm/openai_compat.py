"""The `openai` provider: any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, Ollama, llama.cpp's server), with
transport failures as one-line errors, the structured-answer form the server takes, and the token cap in the
field it reads."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn
from urllib.parse import urlsplit

import openai
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, BaseCallbackHandler, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr

from envfactory.config import LLMSettings, Role
from envfactory.llm.errors import LLMCallError, LLMConfigError, LLMRequestRefused

REFUSED_STATUSES = frozenset({400, 413, 422})


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


def openai_model(role: Role, cfg: LLMSettings, callbacks: list[BaseCallbackHandler]) -> BaseChatModel:
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
