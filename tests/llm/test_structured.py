"""Structured answers: JSON extraction, validation, repair re-asks with the error and the schema."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic import BaseModel, Field

from envfactory.llm.prompts import PROMPT_KEY, PromptLibrary
from envfactory.llm.scripted import ScriptedChatModel, ScriptExhaustedError
from envfactory.llm.structured import (
    ExtractionError,
    Structured,
    aask_structured,
    ask,
    ask_structured,
    expect_model,
    extract_json,
)
from envfactory.llm.usage import UsageTracker
from tests.support.paths import ROOT


class Tool(BaseModel):
    name: str
    kind: str = Field(pattern="^(read|write)$")


class Proposal(BaseModel):
    name: str
    tools: list[Tool]


GOOD = '{"name": "hotels", "tools": [{"name": "find", "kind": "read"}]}'


@pytest.fixture(scope="module")
def library() -> PromptLibrary:
    return PromptLibrary(ROOT / "prompts")


def ask_messages() -> list[BaseMessage]:
    return [HumanMessage(content="Propose an environment.", additional_kwargs={PROMPT_KEY: "search/propose"})]


def test_valid_first_time(library: PromptLibrary) -> None:
    model = ScriptedChatModel(script={"search/propose": [GOOD]})
    answer = ask_structured(model, ask_messages(), Proposal, library=library, retries=2, role="search")
    assert isinstance(answer, Structured)
    assert answer.ok and answer.error is None and answer.attempts == 1 and answer.raw == [GOOD]
    assert answer.value == Proposal(name="hotels", tools=[Tool(name="find", kind="read")])
    assert answer.role == "search"
    assert len(model.calls) == 1


def test_malformed_json_is_repaired_on_retry(library: PromptLibrary) -> None:
    broken = '{"name": "hotels", "tools": [{"name": "find", "kind": "read"}'  # truncated
    model = ScriptedChatModel(script={"search/propose": [broken, GOOD]})
    messages = ask_messages()
    answer = ask_structured(model, messages, Proposal, library=library, retries=2)
    assert answer.ok and answer.attempts == 2 and answer.raw == [broken, GOOD]
    assert len(messages) == 1  # the caller's list is not touched

    second = model.calls[1].messages
    assert second[0].content == "Propose an environment."
    assert isinstance(second[1], AIMessage) and second[1].content == broken
    repair = str(second[2].content)
    assert second[2].additional_kwargs[PROMPT_KEY] == "common/repair"
    assert "Your previous answer could not be used" in repair  # the repair prompt's own text
    assert "is not valid JSON" in repair  # the error
    assert '"title": "Proposal"' in repair and '"tools"' in repair  # the JSON schema


def test_schema_invalid_then_fixed(library: PromptLibrary) -> None:
    wrong = '{"name": "hotels", "tools": [{"name": "find", "kind": "delete"}]}'
    model = ScriptedChatModel(script=[wrong, GOOD])
    answer = ask_structured(model, ask_messages(), Proposal, library=library, retries=1)
    assert answer.ok and answer.attempts == 2
    repair = str(model.calls[1].messages[-1].content)
    assert "does not match the schema" in repair and "tools.0.kind" in repair


def test_failure_after_retries_is_recorded_not_raised(library: PromptLibrary) -> None:
    usage = UsageTracker()
    model = ScriptedChatModel(script=["no idea", "still prose", '{"name": 3}'], callbacks=[usage.handler("search")])
    answer = ask_structured(model, ask_messages(), Proposal, library=library, retries=2)
    assert not answer.ok and answer.value is None
    assert answer.attempts == 3 and answer.raw == ["no idea", "still prose", '{"name": 3}']
    assert answer.error is not None and "does not match the schema" in answer.error and "name" in answer.error
    assert usage.report()[0].calls == 3
    assert model.remaining() == {"*": 0}  # exactly retries + 1 calls


def test_zero_retries_asks_once(library: PromptLibrary) -> None:
    model = ScriptedChatModel(script=["nothing here"])
    answer = ask_structured(model, ask_messages(), Proposal, library=library, retries=0)
    assert not answer.ok and answer.attempts == 1
    assert answer.error == "the reply holds no JSON object or array"


def test_script_exhaustion_propagates(library: PromptLibrary) -> None:
    model = ScriptedChatModel(script={"search/propose": ["not json"]})
    with pytest.raises(ScriptExhaustedError, match="search/propose"):
        ask_structured(model, ask_messages(), Proposal, library=library, retries=1)


@pytest.mark.parametrize(
    "reply",
    [
        f"```json\n{GOOD}\n```",
        f"Here you go:\n```\n{GOOD}\n```\nHope it helps.",
        f"Sure! The proposal is {GOOD} -- with one tool.",
        f'<think>maybe {{"name": 1}}?</think>\n{GOOD}',
        f'Options: [1, 2]. Example {{"name": "x"}} is wrong; final: {GOOD}',  # the first span that validates
    ],
)
def test_json_in_fences_and_prose(library: PromptLibrary, reply: str) -> None:
    model = ScriptedChatModel(script=[reply])
    answer = ask_structured(model, ask_messages(), Proposal, library=library, retries=0)
    assert answer.ok, answer.error
    assert answer.value is not None and answer.value.name == "hotels"


def test_extract_json() -> None:
    assert extract_json('  {"a": "}{"}  ') == {"a": "}{"}  # brackets inside strings do not count
    assert extract_json('text [1, {"b": [2]}] more') == [1, {"b": [2]}]
    assert extract_json('say \\"hi\\" then {"q": "a \\" b"}') == {"q": 'a " b'}
    with pytest.raises(ExtractionError, match="the reply is empty"):
        extract_json("   ")
    with pytest.raises(ExtractionError, match=r"the reply is not valid JSON: .* line 1 column"):
        extract_json('{"a": 1,}')
    with pytest.raises(ExtractionError, match="holds no JSON"):
        extract_json("just words")


def test_async_variant(library: PromptLibrary) -> None:
    model = ScriptedChatModel(script=["```json\n{}\n```", GOOD])
    answer = asyncio.run(aask_structured(model, ask_messages(), Proposal, library=library, retries=1))
    assert answer.ok and answer.attempts == 2
    assert "Field required" in str(model.calls[1].messages[-1].content)


# ---- the one loop: any form of answer, with a check, tagged with its role ------------------------------------------


def _recording(replies: list[str]) -> tuple[object, list[tuple[list[BaseMessage], dict[str, object]]]]:
    """A model answering `replies` in turn and recording each conversation and config it was given."""
    from langchain_core.runnables import RunnableConfig, RunnableLambda

    seen: list[tuple[list[BaseMessage], dict[str, object]]] = []

    def answer(messages: list[BaseMessage], config: RunnableConfig) -> AIMessage:
        seen.append((list(messages), {"tags": config.get("tags"), "metadata": config.get("metadata")}))
        return AIMessage(content=replies[len(seen) - 1])

    return RunnableLambda(answer), seen


def test_one_loop_reads_code_answers_with_the_same_repair(library: PromptLibrary) -> None:
    from envfactory_agents.code import CODE

    model, seen = _recording(["Here is my plan, no code yet.", "<think>```python\nbad(</think>```python\nx = 1\n```"])
    answer = ask(model, ask_messages(), CODE, library=library, retries=2, role="code")  # type: ignore[arg-type]
    assert answer.ok and answer.value == "x = 1\n" and answer.attempts == 2 and answer.role == "code"
    repair = seen[1][0][-1].content
    assert "no ```python block found" in str(repair) and "a single ```python code block" in str(repair)
    assert all(cfg["tags"] == ["role:code"] for _, cfg in seen)


def test_a_check_refuses_a_value_that_reads(library: PromptLibrary) -> None:
    model, seen = _recording([GOOD, GOOD.replace("hotels", "flights")])
    answer = ask(
        model,  # type: ignore[arg-type]
        ask_messages(),
        expect_model(Proposal, lambda p: "not hotels again" if p.name == "hotels" else None),
        library=library,
        retries=1,
        role="query",
    )
    assert answer.ok and answer.value is not None and answer.value.name == "flights" and answer.attempts == 2
    assert "not hotels again" in str(seen[1][0][-1].content)
    model, _ = _recording([GOOD, GOOD])
    spent = ask(model, ask_messages(), expect_model(Proposal, lambda p: "never"), library=library, retries=1)  # type: ignore[arg-type]
    assert not spent.ok and spent.error == "never" and spent.attempts == 2 and spent.raw == [GOOD, GOOD]
