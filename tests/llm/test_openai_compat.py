"""The `openai` provider (`envfactory.llm.openai_compat`) against a real OpenAI-compatible HTTP server on 127.0.0.1:
retries on 429/5xx, timeouts, refused requests, the token cap's field, the structured-answer form the server
takes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from envfactory.config import Settings
from envfactory.llm.errors import LLMCallError, LLMConfigError, LLMRequestRefused
from envfactory.llm.models import chat_model
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.structured import ask_structured, expect_model
from envfactory.llm.usage import UsageTracker
from tests.support.llm import Person, named, settings_with
from tests.support.paths import ROOT
from tests.support.serve import serving_on_socket


def test_openai_needs_an_endpoint_or_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LLMConfigError, match=r"ENVFACTORY_LLM__BASE_URL"):
        chat_model("code", settings_with(tmp_path, provider="openai"))


class FakeOpenAI:
    """An OpenAI-compatible /v1/chat/completions endpoint that plays a planned list of behaviours."""

    def __init__(self) -> None:
        self.plan: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.sleep_s = 0.0
        self.port = 0
        self.content = "pong"
        self.takes = ("json_schema", "json_object")  # the response_format types it accepts

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        form = (body.get("response_format") or {}).get("type")
        if form is not None and form not in self.takes:  # as llama-cpp-python's server answers json_schema
            message = f"1 validation error: ('body', 'response_format', 'type') Input should be {self.takes}"
            return JSONResponse({"error": {"message": message, "type": "internal_server_error"}}, status_code=500)
        step = self.plan.pop(0) if self.plan else "ok"
        if step == "429":
            error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            return JSONResponse(error, status_code=429, headers={"retry-after": "0"})
        if step == "500":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if step == "400":  # as llama.cpp's server answers a prompt longer than its context
            message = "This model's maximum context length is 8192 tokens. However, you requested 8275 tokens"
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)
        if step == "401":
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_api_key"}}, status_code=401)
        if step == "sleep":
            await asyncio.sleep(self.sleep_s)
        finish = "length" if step == "length" else "stop"
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "test-model",
                "choices": [
                    {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": self.content}}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }
        )


@pytest.fixture()
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a proxy in the environment must not intercept us
    fake = FakeOpenAI()
    app = Starlette(routes=[Route("/v1/chat/completions", fake.completions, methods=["POST"])])
    with serving_on_socket(app, "the local OpenAI-compatible server") as fake.port:
        yield fake


def openai_settings(tmp_path: Path, fake: FakeOpenAI, **llm: Any) -> Settings:
    base = {"provider": "openai", "base_url": f"http://127.0.0.1:{fake.port}/v1", "model": "test-model"}
    return settings_with(tmp_path, **{**base, **llm})


def test_openai_retries_429_and_500_then_succeeds(
    tmp_path: Path, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.plan = ["429", "500", "ok"]
    usage = UsageTracker()
    settings = openai_settings(tmp_path, server, max_retries=2, temperature=0.2, top_p=0.9, max_tokens=64)
    model = chat_model("code", settings, usage=usage)
    reply = model.invoke(named("code/generate", "ping"))
    assert reply.content == "pong"
    assert len(server.requests) == 3
    body = server.requests[-1]
    assert body["model"] == "test-model" and body["temperature"] == 0.2 and body["top_p"] == 0.9
    assert body["messages"] == [{"role": "user", "content": "ping"}]  # the prompt name is not sent
    assert server.headers[-1]["authorization"] == "Bearer EMPTY"
    [row] = usage.report()
    assert (row.role, row.calls, row.errors, row.input_tokens, row.output_tokens) == ("code", 1, 0, 11, 7)


@pytest.mark.parametrize(
    ("field", "sent"),
    [
        ("auto", {"max_tokens": 64, "max_completion_tokens": 64}),
        ("max_tokens", {"max_tokens": 64}),
        ("max_completion_tokens", {"max_completion_tokens": 64}),
        ("both", {"max_tokens": 64, "max_completion_tokens": 64}),
    ],
)
def test_the_token_cap_reaches_a_self_hosted_server_in_a_field_it_reads(
    tmp_path: Path, server: FakeOpenAI, field: str, sent: dict[str, int]
) -> None:
    """langchain-openai sends `max_tokens` as `max_completion_tokens`, which llama-cpp-python's server ignores: a
    self-hosted endpoint gets both fields unless the settings name one."""
    model = chat_model("code", openai_settings(tmp_path, server, max_tokens=64, max_tokens_field=field))
    model.invoke(named("code/generate", "ping"))
    body = server.requests[-1]
    assert {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body} == sent


def test_a_reply_cut_at_the_token_cap_is_repaired_knowing_it_was_cut(tmp_path: Path, server: FakeOpenAI) -> None:
    """A reply the server stopped at max_tokens (finish_reason "length") is unfinished, not wrong: the re-ask says
    so, and the recorded error too when no answer comes."""
    from envfactory_agents.common import AgentDeps, reset_model_cache

    settings = openai_settings(tmp_path, server, max_retries=0).model_copy(
        update={"prompts_dir": ROOT / "prompts", "structured_retries": 1}
    )
    reset_model_cache()
    server.plan, server.content = ["length", "length"], '{"name": "Ana", "ag'
    result = AgentDeps(settings=settings).ask("code", [HumanMessage("a person")], expect_model(Person))
    assert not result.ok and result.error is not None and "max_tokens limit" in result.error
    repair = server.requests[1]["messages"][-1]["content"]
    assert "max_tokens limit" in repair and "not valid JSON" in repair
    from envfactory.llm.structured import aask

    server.plan = ["length", "ok"]  # the async path (QueryGen's) takes the cut reply the same way
    model, library = AgentDeps(settings=settings).model("code"), AgentDeps(settings=settings).prompts
    result = asyncio.run(aask(model, [HumanMessage("a person")], expect_model(Person), library=library, retries=1))
    assert result.unreadable == 2 and "max_tokens limit" in server.requests[-1]["messages"][-1]["content"]
    server.plan, server.content = ["stop"], '{"name": "Ana", "ag'  # stopped for another reason: no such note
    result = AgentDeps(settings=settings).ask("code", [HumanMessage("a person")], expect_model(Person))
    assert result.error is not None and "max_tokens" not in result.error
    reset_model_cache()


@pytest.mark.parametrize(
    ("base_url", "hosted"),
    [
        (None, True),
        ("https://api.openai.com/v1", True),
        ("https://team.openai.azure.com/openai/deployments/x", True),
        ("http://127.0.0.1:8000/v1", False),
        ("https://api.together.xyz/v1", False),
        ("https://openai.com.example.net/v1", False),
    ],
)
def test_openais_own_endpoints_get_max_completion_tokens_alone(
    tmp_path: Path, base_url: str | None, hosted: bool
) -> None:
    settings = settings_with(tmp_path, provider="openai", base_url=base_url, model="m", api_key="k", max_tokens=32)
    payload = chat_model("code", settings)._get_request_payload([HumanMessage("ping")])  # built, not sent
    assert payload["max_completion_tokens"] == 32
    assert ("max_tokens" in payload) is not hosted
    no_cap = settings_with(tmp_path, provider="openai", base_url=base_url, model="m", api_key="k", max_tokens=None)
    payload = chat_model("code", no_cap)._get_request_payload([HumanMessage("ping")])
    assert "max_tokens" not in payload and "max_completion_tokens" not in payload


def test_a_refused_request_fails_the_ask_with_why_and_a_config_error_stops_the_run(
    tmp_path: Path, server: FakeOpenAI
) -> None:
    """A request the server refuses itself (HTTP 400/413/422: a prompt over the context, say) is that step's
    failure, recorded with the server's reason, and the run goes on; a wrong key (401) is everyone's problem
    and stops the run with one line."""
    from envfactory_agents.common import AgentDeps, reset_model_cache

    settings = openai_settings(tmp_path, server, max_retries=0).model_copy(update={"prompts_dir": ROOT / "prompts"})
    deps = AgentDeps(settings=settings)
    reset_model_cache()
    server.plan = ["400"]
    refused = deps.ask("code", [HumanMessage("a person")], expect_model(Person))
    assert not refused.ok and refused.value is None
    assert refused.error is not None and "HTTP 400" in refused.error and "maximum context length" in refused.error
    server.content = json.dumps({"name": "Ana", "age": 31})
    assert deps.ask("code", [HumanMessage("a person")], expect_model(Person)).value == Person(name="Ana", age=31)
    server.plan = ["401"]
    with pytest.raises(LLMCallError, match="HTTP 401") as e:
        deps.ask("code", [HumanMessage("a person")], expect_model(Person))
    assert not isinstance(e.value, LLMRequestRefused)
    reset_model_cache()


def test_openai_timeout_is_a_clear_error(tmp_path: Path, server: FakeOpenAI) -> None:
    server.plan, server.sleep_s = ["sleep"], 1.5
    usage = UsageTracker()
    model = chat_model("test", openai_settings(tmp_path, server, timeout_s=0.3, max_retries=0), usage=usage)
    started = time.monotonic()
    with pytest.raises(LLMCallError) as e:
        model.invoke("ping")
    assert time.monotonic() - started < 1.4
    msg = str(e.value)
    assert "timed out after 0.3 s" in msg and "role 'test'" in msg and "test-model" in msg
    assert f"127.0.0.1:{server.port}" in msg and "max_retries=0" in msg
    assert len(server.requests) == 1
    assert usage.report()[0].errors == 1


def test_openai_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    settings = settings_with(tmp_path, provider="openai", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(LLMCallError, match=r"cannot reach the LLM server \(role 'code'"):
        asyncio.run(chat_model("code", settings).ainvoke("ping"))


def test_the_openai_provider_sends_a_call_only_assistant_message_with_text() -> None:
    """llama.cpp's server refuses `content: null` (HTTP 500); a history holding a call must still go through."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from envfactory.llm.openai_compat import _ChatOpenAI

    model = _ChatOpenAI(envfactory_role="eval", model="m", base_url="http://127.0.0.1:9/v1", api_key="EMPTY")
    call = {"name": "search_hotels", "args": {"city": "Lisbon"}, "id": "c1", "type": "tool_call"}
    history = [HumanMessage("hotels?"), AIMessage(content="", tool_calls=[call]), ToolMessage("[]", tool_call_id="c1")]
    sent = model._get_request_payload(history)["messages"]
    assert sent[1]["role"] == "assistant" and sent[1]["content"] == "" and sent[1]["tool_calls"][0]["id"] == "c1"


def test_structured_answers_ride_the_servers_response_format_and_settle_on_the_one_it_takes(
    tmp_path: Path, server: FakeOpenAI
) -> None:
    """`ask` sends the answer's JSON schema as `response_format`: json_schema first (OpenAI, vLLM, SGLang); a
    server that refuses it (llama-cpp-python: HTTP 500) gets json_object + schema, and keeps getting that."""

    library = PromptLibrary(ROOT / "prompts")
    server.content = json.dumps({"name": "Ana", "age": 31})
    server.takes = ("json_object",)
    model = chat_model("code", openai_settings(tmp_path, server, max_retries=0))
    first = ask_structured(model, [HumanMessage("a person")], Person, library=library, retries=1, role="code")
    assert first.ok and first.value == Person(name="Ana", age=31) and first.attempts == 1
    sent = [r.get("response_format") for r in server.requests]
    assert [f["type"] for f in sent] == ["json_schema", "json_object"]
    assert sent[0]["json_schema"] == {"name": "Person", "schema": Person.model_json_schema()}
    assert sent[1]["schema"] == Person.model_json_schema()
    assert ask_structured(model, [HumanMessage("another")], Person, library=library, retries=1, role="code").ok
    assert server.requests[-1]["response_format"]["type"] == "json_object" and len(server.requests) == 3
    model.invoke([HumanMessage("plain text")])
    assert "response_format" not in server.requests[-1]  # only structured asks are constrained

    server.takes = ()  # a server that takes no response_format: the prompt (and repairs) alone
    bare = chat_model("code", openai_settings(tmp_path, server, max_retries=0))
    assert ask_structured(bare, [HumanMessage("a person")], Person, library=library, retries=1, role="code").ok
    assert "response_format" not in server.requests[-1] and len(server.requests) == 7
    pinned = chat_model("code", openai_settings(tmp_path, server, max_retries=0, response_format="none"))
    assert ask_structured(pinned, [HumanMessage("a person")], Person, library=library, retries=1, role="code").ok
    assert "response_format" not in server.requests[-1] and len(server.requests) == 8
