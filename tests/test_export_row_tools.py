"""The tools one row carries (`--tools needed`, `--schemas compact`): properties over random conversations, and the
compact rendering of JSON schemas.

Random catalogs (two to four environments, some tool names shared between them, so some names are `env__tool`)
and random conversations over them (calls that succeed or fail, turns without an answer, the user acting with
their own tools) go through the SFT (per turn, per conversation) and RL converters with random distractor
counts and seeds. For every row: each tool its assistant messages call (and, for RL, its ground truth) is in the
row's list; the list is a subset of its environments' tools with no repeat; the others are exactly
`min(distractors, available)` tools of the same environments; the same row gets the same list again and in the
SFT and RL exports alike.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.env.metadata import EnvMetadata, ToolSpec
from envfactory.export import ExportOptions, conversation_tools, convert_to_rl_data, convert_to_sft_data
from envfactory.export.row_tools import called_names, compact_schema, short_description
from envfactory.export.tools_schema import user_only_tools
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

NAMES = ["get_item", "list_items", "buy_item", "refund", "search", "cancel", "update", "delete_item"]


def _spec(name: str, env: str) -> ToolSpec:
    schema = {
        "title": f"{name}Args",
        "type": "object",
        "properties": {"item_id": {"title": "Item Id", "type": "string", "description": "The item. Any id works."}},
        "required": ["item_id"],
    }
    return ToolSpec(name=name, description=f"{name} in {env}. More words here.", kind="read", input_schema=schema)


@st.composite
def catalogs(draw: st.DrawFn) -> dict[str, EnvMetadata]:
    envs = [f"env_{k}" for k in range(draw(st.integers(2, 4)))]
    return {
        env: EnvMetadata(
            name=env,
            description=env,
            domain="commerce",
            tools=[_spec(n, env) for n in draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))],
        )
        for env in envs
    }


@st.composite
def conversations(draw: st.DrawFn) -> tuple[Conversation, dict[str, EnvMetadata]]:
    catalog = draw(catalogs())
    servers = draw(st.lists(st.sampled_from(sorted(catalog)), min_size=1, max_size=len(catalog), unique=True))
    tools = [(s, t.name) for s in servers for t in catalog[s].tools]
    n = 0

    def call() -> ToolCall:
        nonlocal n
        n += 1
        server, name = draw(st.sampled_from(tools))
        return ToolCall(server=server, name=name, arguments={"item_id": f"i{n}"}, id=f"c{n}")

    nodes: list[Node] = []
    for index in range(draw(st.integers(1, 3))):
        steps = [Step(role="user", content=f"request {index}")]
        user_calls: list[UserToolCall] = []
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.integers(0, 4)) == 0:  # the user acts with their own tools
                c = call()
                result = ToolResult(server=c.server, name=c.name, ok=True, result={}, call_id=c.id)
                user_calls.append(UserToolCall(after_step=len(steps) - 1, call=c, result=result))
                continue
            calls = [call() for _ in range(draw(st.integers(1, 2)))]
            results = [
                ToolResult(server=c.server, name=c.name, ok=draw(st.booleans()), result={"ok": 1}, call_id=c.id)
                for c in calls
            ]
            steps += [Step(role="tool_call", content=calls), Step(role="tool_result", content=results)]
        if draw(st.integers(0, 5)):  # most turns end with an answer
            steps.append(Step(role="assistant", content=f"answer {index}"))
        state = {s: {"v": index} for s in servers}
        nodes.append(
            Node(
                index=index,
                query=f"request {index}",
                steps=steps,
                mcp_servers=servers,
                initial_scenario=state,
                final_scenario=state,
                user_calls=user_calls,
            )
        )
    task = Task(id="t", instruction="x", servers=servers, initial_state={}, verifier=StateVerifier(goal={}), solver=[])
    conversation = Conversation(
        id=f"conv{draw(st.integers(0, 9))}",
        servers=servers,
        tools=[f"{s}.{t}" for s, t in tools],
        nodes=nodes,
        task=task,
        provenance=Provenance(generator="llm", seed=0),
    )
    return conversation, catalog


def check_row(
    names: list[str], called: set[str], conversation: Conversation, catalog: dict[str, EnvMetadata], distractors: int
) -> None:
    namer, every = conversation_tools(conversation, catalog)
    offered = [t.function.name for t in every]
    assert called <= set(names)  # every tool the row calls is offered
    assert len(names) == len(set(names)) and set(names) <= set(offered)  # a subset of its environments' tools
    assert names == [n for n in offered if n in set(names)]  # in the environments' order: place says nothing
    hidden = {namer.name(s, t) for s, t in user_only_tools(conversation)}
    assert not set(names) & hidden  # a tool only the user used stays out, as in the full list
    envs = {route[0] for n in called if (route := namer.resolve(n)) is not None}
    available = [n for n in offered if n not in called and (not envs or namer.resolve(n)[0] in envs)]  # type: ignore[index]
    others = [n for n in names if n not in called]
    assert set(others) <= set(available) and len(others) == min(distractors, len(available))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=conversations(),
    distractors=st.integers(0, 4),
    seed=st.integers(0, 2**31),
    per=st.sampled_from(["turn", "conversation"]),
    schemas=st.sampled_from(["full", "compact"]),
)
def test_a_row_offers_every_tool_it_calls_and_only_its_environments_tools(
    case: tuple[Conversation, dict[str, EnvMetadata]], distractors: int, seed: int, per: str, schemas: str
) -> None:
    conversation, catalog = case
    options = ExportOptions(tools="needed", distractors=distractors, seed=seed, per=per, schemas=schemas)
    sft = convert_to_sft_data(conversation, catalog, options)
    for sample in sft:
        names = [t.function.name for t in sample.tools]
        check_row(names, called_names(sample.messages), conversation, catalog, distractors)
    assert [s.tools for s in convert_to_sft_data(conversation, catalog, options)] == [s.tools for s in sft]
    by_turn = {s.turn: [t.function.name for t in s.tools] for s in convert_to_sft_data(conversation, catalog, options)}
    turn_rows = {
        s.turn: s for s in convert_to_sft_data(conversation, catalog, options.model_copy(update={"per": "turn"}))
    }
    for rl in convert_to_rl_data(conversation, catalog, options):
        names = [t.function.name for t in rl.tool_list()]
        truth = {c.name for c in rl.ground_truth_calls()}
        called = called_names(rl.prompt) | truth
        assert truth <= set(names)
        check_row(names, called_names(turn_rows[rl.extra_info.turn].messages), conversation, catalog, distractors)
        assert names == [t.function.name for t in turn_rows[rl.extra_info.turn].tools]  # the same row, the same tools
        assert called <= set(names)
    if per == "conversation":
        assert set(by_turn) <= {None}


@settings(max_examples=60, deadline=None)
@given(case=conversations(), per=st.sampled_from(["turn", "conversation"]))
def test_the_default_keeps_every_tool_as_declared(case: tuple[Conversation, dict[str, EnvMetadata]], per: str) -> None:
    conversation, catalog = case
    _, every = conversation_tools(conversation, catalog)
    for sample in convert_to_sft_data(conversation, catalog, ExportOptions(per=per)):
        assert sample.tools == every
    for rl in convert_to_rl_data(conversation, catalog):
        assert rl.tool_list() == every


def test_the_seed_chooses_the_distractors() -> None:
    catalog = {
        "shop": EnvMetadata(name="shop", description="s", domain="commerce", tools=[_spec(n, "shop") for n in NAMES]),
        "bank": EnvMetadata(name="bank", description="b", domain="finance", tools=[_spec("balance", "bank")]),
    }
    c = ToolCall(server="shop", name="get_item", arguments={"item_id": "1"}, id="c1")
    steps = [
        Step(role="user", content="find it"),
        Step(role="tool_call", content=[c]),
        Step(
            role="tool_result", content=[ToolResult(server="shop", name="get_item", ok=True, result={}, call_id="c1")]
        ),
        Step(role="assistant", content="found"),
    ]
    node = Node(
        index=0,
        query="find it",
        steps=steps,
        mcp_servers=["shop", "bank"],
        initial_scenario={},
        final_scenario={},
    )
    task = Task(
        id="t", instruction="x", servers=["shop", "bank"], initial_state={}, verifier=StateVerifier(goal={}), solver=[]
    )
    conversation = Conversation(
        id="one",
        servers=["shop", "bank"],
        tools=["shop.get_item"],
        nodes=[node],
        task=task,
        provenance=Provenance(generator="llm", seed=0),
    )
    lists = {
        seed: tuple(
            t.function.name
            for t in convert_to_sft_data(conversation, catalog, ExportOptions(tools="needed", seed=seed))[0].tools
        )
        for seed in range(12)
    }
    assert all("get_item" in names and len(names) == 3 and "balance" not in names for names in lists.values())
    assert len(set(lists.values())) > 1  # 7 candidates, 21 pairs: twelve seeds do not all pick one pair
    again = convert_to_sft_data(conversation, catalog, ExportOptions(tools="needed", seed=5))[0].tools
    assert tuple(t.function.name for t in again) == lists[5]


def test_compact_schema_drops_what_carries_nothing_and_keeps_the_meaning() -> None:
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "BookArgs",
        "type": "object",
        "properties": {
            "title": {"title": "Title", "type": "string", "description": "The book's title.  Case is ignored."},
            "limit": {"type": "integer", "default": 10, "minimum": 1},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Note"},
            "tags": {"type": "array", "items": {"title": "Tag", "type": "string", "enum": ["a", "b"]}},
            "when": {"$ref": "#/$defs/When"},
            "empty": {"type": "string", "description": "  "},
        },
        "required": ["title"],
        "$defs": {"When": {"title": "When", "type": "string", "format": "date"}},
    }
    assert compact_schema(schema) == {
        "type": "object",
        "properties": {
            "title": {"type": "string", "description": "The book's title."},  # a property named title is kept
            "limit": {"type": "integer", "default": 10, "minimum": 1},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            "when": {"$ref": "#/$defs/When"},
            "empty": {"type": "string"},
        },
        "required": ["title"],
        "$defs": {"When": {"type": "string", "format": "date"}},
    }
    assert compact_schema({"type": "object", "properties": {}, "required": []}) == {"type": "object", "properties": {}}


def test_short_description() -> None:
    assert short_description("List accounts.\nEach with its IBAN. And more.") == "List accounts."
    assert short_description("Amount, e.g. 2.50 or 3. Must be positive.") == "Amount, e.g. 2.50 or 3."
    assert short_description("Owner, e.g. Maria Silva. Exact.") == "Owner, e.g. Maria Silva."
    assert short_description("Why? Because.") == "Why?"
    long = "word " * 60
    cut = short_description(long, limit=40)
    assert len(cut) <= 40 and cut.endswith("…") and cut[:-1] == ("word " * 8).strip()
    assert short_description("") == ""
