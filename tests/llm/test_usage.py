"""Token accounting (`envfactory.llm.usage`): calls, errors and tokens per role from every provider, structured
asks and their repairs, one run's share of a shared tracker, the table."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from rich.console import Console

from envfactory.llm.models import chat_model
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.scripted import ScriptedChatModel, ScriptExhaustedError, approx_tokens
from envfactory.llm.structured import ask_structured
from envfactory.llm.usage import UsageTracker
from tests.support.llm import Person, named, settings_with
from tests.support.paths import ROOT


def test_usage_is_tracked_per_role(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text(
        "code/generate: [hello world]\ntest/scenarios: [{content: ok, tool_calls: [{name: f, args: {x: 1}}]}]\n"
    )
    settings = settings_with(tmp_path, provider="scripted", script=script)
    usage = UsageTracker()
    code, test = chat_model("code", settings, usage=usage), chat_model("test", settings, usage=usage)

    reply = code.invoke(named("code/generate", "write the code please"))
    assert reply.usage_metadata == {"input_tokens": 6, "output_tokens": 3, "total_tokens": 9}  # ceil(chars / 4)
    asyncio.run(test.ainvoke(named("test/scenarios", "abcd")))
    with pytest.raises(ScriptExhaustedError):
        code.invoke(named("code/generate"))

    rows = {r.role: r for r in usage.report()}
    assert [r.role for r in usage.report()] == ["code", "test"]
    assert (rows["code"].calls, rows["code"].errors) == (1, 1)
    assert (rows["code"].input_tokens, rows["code"].output_tokens) == (6, 3)
    tool_text = "ok" + json.dumps([{"name": "f", "args": {"x": 1}}])
    assert (rows["test"].calls, rows["test"].input_tokens) == (1, 1)
    assert rows["test"].output_tokens == approx_tokens(tool_text) == math.ceil(len(tool_text) / 4)
    assert rows["test"].total_tokens == 1 + rows["test"].output_tokens

    console = Console(record=True, width=120)
    console.print(usage.table())
    text = console.export_text()
    assert "code" in text and "test" in text and "all" in text


def test_usage_counts_structured_asks_their_repairs_and_unreadable_replies() -> None:
    usage = UsageTracker()
    usage.asked("code", 1, True)
    usage.asked("code", 3, True, unreadable=2)
    usage.asked("code", 3, False, unreadable=3)
    usage.asked("test", 2, True, unreadable=0)  # a check refused the first answer, not its form
    code, test = usage.report()
    assert (code.structured, code.repaired, code.unanswered, code.unreadable) == (3, 1, 1, 5)
    assert (test.structured, test.repaired, test.unanswered, test.unreadable) == (1, 1, 0, 0)
    console = Console(width=200, record=True)
    console.print(usage.table())
    text = console.export_text()
    assert "repaired" in text and "unreadable" in text
    before = usage.report()  # one run's share of a shared tracker: what each role added since
    assert usage.since(before) == []
    usage.asked("test", 2, False, unreadable=2)
    usage.add("user", calls=1, input_tokens=5)
    grown = {r.role: r for r in usage.since(before)}
    assert set(grown) == {"test", "user"}
    assert (grown["test"].structured, grown["test"].unanswered, grown["test"].unreadable) == (1, 1, 2)
    assert (grown["user"].calls, grown["user"].input_tokens, grown["user"].structured) == (1, 5, 0)


def test_an_ask_given_a_tracker_counts_its_outcome_under_its_role(tmp_path: Path) -> None:
    library = PromptLibrary(ROOT / "prompts")
    model = ScriptedChatModel(script=["not json", '{"name": "Ana", "age": 31}', "no", "no"])
    usage = UsageTracker()
    first, second = (
        ask_structured(model, [HumanMessage("a person")], Person, library=library, retries=1, usage=usage, role="x")
        for _ in range(2)
    )
    assert first.ok and not second.ok
    [row] = usage.report()
    assert (row.role, row.structured, row.repaired, row.unanswered, row.unreadable) == ("x", 2, 1, 1, 3)
