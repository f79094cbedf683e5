"""Message helpers (`envfactory.llm.messages`): a message's text whatever the provider's content form, the prompt
a conversation was rendered from, and a reply the server stopped at its token cap."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from envfactory.llm.messages import message_text, prompt_name, stopped_at_cap
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.scripted import ScriptedChatModel
from tests.support.paths import ROOT


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("plain", "plain"),
        ("", ""),
        ([{"type": "text", "text": "one "}, {"type": "text", "text": "two"}], "one two"),
        (["a", {"type": "text", "text": "b"}, "c"], "abc"),  # strings and blocks, in order
        (
            [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}, {"type": "text", "text": "caption"}],
            "caption",
        ),
        ([], ""),
    ],
)
def test_message_text_joins_the_text_of_every_content_form(
    content: str | list[str | dict[str, object]], text: str
) -> None:
    assert message_text(AIMessage(content=content)) == text
    assert message_text(HumanMessage(content=content)) == text


def test_a_rendered_conversation_names_its_prompt_and_others_do_not() -> None:
    repair = PromptLibrary(ROOT / "prompts").get("common/repair")
    rendered = repair.render(**{name: "x" for name in repair.variables})
    assert prompt_name(rendered) == "common/repair"
    assert prompt_name(rendered[1:]) is None  # only the first message carries the name
    assert prompt_name([]) is None
    assert prompt_name([HumanMessage("hi")]) is None
    assert prompt_name([SystemMessage("s", additional_kwargs={"prompt": 3})]) is None  # not a name


def test_stopped_at_cap_reads_the_finish_reason_of_a_real_reply() -> None:
    model = ScriptedChatModel(script=[{"content": "cut", "finish_reason": "length"}, "whole"])
    assert stopped_at_cap(model.invoke("a")) is True
    assert stopped_at_cap(model.invoke("b")) is False
    assert stopped_at_cap(AIMessage("no metadata")) is False
    assert stopped_at_cap(object()) is False  # anything without response metadata
