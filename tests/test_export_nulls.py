"""No exported row holds a JSON null a server or trainer would trip on — property over random conversations.

Random conversations (shared tool names across two environments, calls with and without ids, failed calls, thinking
traces, the user speaking and acting mid-turn, turns without an answer, nulls in arguments, results and states)
go through every export: the four training formats (TRL SFT per turn and per conversation, TRL GRPO, LlamaFactory,
VeRL) and the rows of the OpenEnv and verifiers packages (`tasks.jsonl`, the task prompts both send to a model,
verifiers' dataset rows). Every value of every row is walked. A null is allowed in two places only, both said in
the README: inside a call's `arguments` where the call itself carried one (the data, not a missing field — a string
in every format a server reads: LlamaFactory's values, VeRL's and the packages' prompts), and in VeRL's parquet,
whose one Arrow schema holds every message field for every message (`reasoning_content`, `name`, `tool_call_id`,
`tool_calls`: null where a message has none — what VeRL's loader reads back; VeRL renders prompts with the chat
template, which skips them).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.env.metadata import EnvMetadata, ToolKind, ToolSpec
from envfactory.export import ExportOptions, convert_to_rl_data, export_conversations
from envfactory.hubs.episode import Task as HubTask
from envfactory.hubs.episode import task_id, tasks_jsonl
from envfactory.records.models import (
    Conversation,
    Node,
    Provenance,
    StateVerifier,
    Step,
    Task,
    ToolCall,
    ToolResult,
    UserToolCall,
)


def _tool(name: str, kind: ToolKind, *params: str) -> ToolSpec:
    schema = {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params[:1])}
    return ToolSpec(name=name, description=f"{name.replace('_', ' ')}.", kind=kind, input_schema=schema)


CATALOG = {
    "store_a": EnvMetadata(
        name="store_a",
        description="Store A.",
        domain="commerce",
        tools=[_tool("get_item", "read", "item_id", "note"), _tool("buy_item", "write", "item_id")],
    ),
    "store_b": EnvMetadata(
        name="store_b",
        description="Store B.",
        domain="commerce",
        tools=[_tool("get_item", "read", "item_id"), _tool("refund", "write", "order_id", "reason")],
    ),
}
TOOLS = [(s, t.name, list(t.input_schema["properties"])) for s, meta in CATALOG.items() for t in meta.tools]

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _call(draw: st.DrawFn, n: int) -> ToolCall:
    server, name, params = draw(st.sampled_from(TOOLS))
    chosen = draw(st.lists(st.sampled_from(params), unique=True, max_size=len(params)))
    arguments = {p: draw(_json) for p in chosen}
    return ToolCall(server=server, name=name, arguments=arguments, id=draw(st.none() | st.just(f"call_{n}")))


@st.composite
def _node(draw: st.DrawFn, index: int) -> Node:
    query = draw(_text.filter(str.strip)) or "hello"
    steps: list[Step] = [Step(role="user", content=query)]
    user_calls: list[UserToolCall] = []
    for k in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["calls", "calls", "words", "user", "user_acts"]))
        if kind == "calls":
            calls = draw(st.lists(_call(100 * index + 10 * k), min_size=1, max_size=3))
            calls = [c.model_copy(update={"id": c.id and f"{c.id}_{j}"}) for j, c in enumerate(calls)]
            results = [
                ToolResult(server=c.server, name=c.name, ok=draw(st.booleans()), result=draw(_json), call_id=c.id)
                for c in calls
            ]
            steps += [Step(role="tool_call", content=calls), Step(role="tool_result", content=results)]
        elif kind == "words":
            steps.append(Step(role="assistant", content=draw(_text), thinking=draw(st.none() | _text)))
        elif kind == "user":
            steps.append(Step(role="user", content=draw(_text)))
        else:
            call = draw(_call(999))
            result = ToolResult(server=call.server, name=call.name, ok=True, result=draw(_json))
            user_calls.append(UserToolCall(after_step=len(steps) - 1, call=call, result=result))
    if draw(st.integers(0, 4)):  # most turns end with an answer (a valid turn)
        steps.append(
            Step(role="assistant", content=draw(_text.filter(str.strip)) or "done", thinking=draw(st.none() | _text))
        )
    servers = sorted({c.server for s in steps if s.role == "tool_call" for c in s.calls()} | {"store_a"})
    state = {s: draw(st.dictionaries(_text, _json, max_size=2)) for s in servers}
    return Node(
        index=index,
        query=query,
        steps=steps,
        mcp_servers=servers,
        initial_scenario=state,
        final_scenario={s: {**v, "after": draw(_json)} for s, v in state.items()},
        user_calls=user_calls,
    )


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    nodes = [draw(_node(i)) for i in range(draw(st.integers(1, 3)))]
    servers = ["store_a", "store_b"]
    task = Task(
        id="c", instruction="shop", servers=servers, initial_state={}, verifier=StateVerifier(goal={}), solver=[]
    )
    return Conversation(
        id=f"c{draw(st.integers(0, 99))}",
        servers=servers,
        tools=[f"{s}.{t}" for s, t, _ in TOOLS],
        nodes=nodes,
        task=task,
        provenance=Provenance(generator="llm", seed=0),
    )


def nulls(value: Any, path: str = "") -> list[str]:
    """The path of every null in `value` (keys joined with `.`, list items as `[]`)."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nulls(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for v in value for p in nulls(v, f"{path}[]")]
    return []


def in_arguments(path: str) -> bool:
    """A null inside a call's arguments: the call's own data."""
    return ".function.arguments" in path


VERL_OPTIONAL = {"reasoning_content", "name", "tool_call_id", "tool_calls"}  # the parquet schema's message fields


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(conversations(), min_size=1, max_size=3), st.booleans(), st.sampled_from(["describe", "drop"]))
def test_no_export_holds_a_null_but_the_data_and_verls_schema(
    batch: list[Conversation], thinking: bool, user_calls: str
) -> None:
    batch = [c.model_copy(update={"id": f"{c.id}-{n}"}) for n, c in enumerate(batch)]  # ids unique in a batch
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for fmt, per in (
            ("trl-sft", "turn"),
            ("trl-sft", "conversation"),
            ("trl-grpo", "turn"),
            ("llamafactory", "conversation"),
            ("verl", "turn"),
        ):
            options = ExportOptions(per=per, keep_thinking=thinking, user_calls=user_calls, include_interactive=True)
            where = out / f"{fmt}-{per}"
            report = export_conversations(batch, fmt, where, CATALOG, options)  # type: ignore[arg-type]
            if fmt == "verl":
                for row in pq.read_table(where / "train.parquet").to_pylist():
                    for path in nulls(row):
                        assert path.startswith("prompt[].") and path.split(".")[1] in VERL_OPTIONAL, (fmt, path)
                continue
            rows = _rows(where / "train.jsonl")
            assert len(rows) == report.samples
            for row in rows:
                found = nulls(row)
                if fmt == "llamafactory":
                    assert not found, (fmt, found)  # arguments sit inside a string value
                else:
                    assert all(in_arguments(p) for p in found), (fmt, found)

        records = [r for c in batch for r in convert_to_rl_data(c, CATALOG, ExportOptions(include_interactive=True))]
        tasks = [HubTask(id=task_id(r), record=r) for r in records]
        for line in filter(None, tasks_jsonl(tasks).split("\n")):  # the packages' tasks.jsonl
            assert all(in_arguments(p) for p in nulls(json.loads(line))), line
        for task in tasks:  # what OpenEnv's reset and verifiers send to a model: the wire form, no null at all
            assert not nulls(task.prompt) and not nulls(task.tools), task.prompt
            for message in task.prompt:
                for call in message.get("tool_calls", []):
                    assert isinstance(call["id"], str) and isinstance(call["function"]["arguments"], str)
                    assert any(m.get("tool_call_id") == call["id"] for m in task.prompt if m["role"] == "tool")
        if tasks:
            from envfactory.hubs.verifiers_env import dataset_rows

            for row in dataset_rows(tasks):  # verifiers' dataset as the library reads it
                assert not nulls(row), row
