"""The one rule for `<think>` traces (envfactory/llm/thinking.py), and that every reader of model replies follows it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from envfactory.llm.structured import _scan
from envfactory.llm.thinking import split_thinking, strip_thinking
from envfactory.reward.tool_calls import parse_tool_calls


def test_closed_blocks_are_traces_and_the_rest_is_said() -> None:
    split = split_thinking("<think> plan A </think>Hello <think>plan B</think>world")
    assert split == ("Hello world", "plan A\nplan B", False)
    assert strip_thinking("  <think>x</think>  hi  ") == "hi"


def test_a_close_without_an_open_ends_a_trace_the_template_opened() -> None:
    split = split_thinking("the template opened it</think>\nThe answer.")
    assert split == ("\nThe answer.", "the template opened it", False)


def test_an_unclosed_trace_takes_the_rest_of_the_text() -> None:
    split = split_thinking('Sure. <think>I will call {"name": "x"} maybe')
    assert split.visible == "Sure. " and split.unclosed and split.trace == 'I will call {"name": "x"} maybe'


@given(st.text(alphabet=st.characters(blacklist_characters="<>")))
def test_text_without_tags_is_left_as_it_is(text: str) -> None:
    assert split_thinking(text) == (text, None, False)


@given(st.lists(st.tuples(st.text(alphabet="ab <>/", max_size=8), st.text(alphabet="xy /", max_size=8)), max_size=5))
def test_said_text_around_closed_blocks_survives(parts: list[tuple[str, str]]) -> None:
    said = [s.replace("<think>", "").replace("</think>", "").replace("think>", "") for s, _ in parts]
    text = "".join(f"{s}<think>{t}</think>" for s, (_, t) in zip(said, parts, strict=True))
    assert split_thinking(text).visible == "".join(said)


def test_every_reader_follows_the_rule() -> None:
    # structured answers: a JSON object only inside an unclosed trace is not an answer
    assert _scan('<think>{"a": 1}', None) == (None, "the reply is empty")
    assert _scan('<think>no</think>{"a": 1}', None)[0] == {"a": 1}
    # tool calls: a call inside a trace is not made; an unclosed trace is reported
    parsed = parse_tool_calls('<think><tool_call>{"name": "x", "arguments": {}}</tool_call>')
    assert parsed.calls == [] and any("unclosed <think>" in p for p in parsed.problems)
