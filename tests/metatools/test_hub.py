"""The SynthAPI meta-tool hub: in process, and over real MCP transports with the SDK's own client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from envfactory.env.pool import EnvPool
from envfactory.metatools import META_TOOLS, Hub, HubError, load_tasks
from envfactory.records.models import (
    Assertion,
    Conversation,
    Node,
    PlannedCall,
    Provenance,
    StateVerifier,
    Task,
    ToolCall,
)
from envfactory.serve.hub_server import LOAD_TASK_TOOL, build_hub_server
from envfactory.serve.mcp_server import STATE_TOOL
from tests.support.paths import ROOT
from tests.support.serve import serving

BOOK = {"hotel_id": "HT-POR-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2}
CANCEL = {"booking_id": "BK-0001"}
WRONG = {"booking_id": "BK-0001", "nights": 5}  # modifies the booking the task asks to cancel


def _task(pool: EnvPool, task_id: str, tool: str, args: dict[str, Any], **verifier: Any) -> Task:
    """A hotels task whose goal is the state after `tool(args)` on the default scenario."""
    env = pool.get("hotels")
    session = env.session("default")
    assert session.call(tool, args).ok
    return Task(
        id=task_id,
        instruction=f"please {tool.replace('_', ' ')}",
        servers=["hotels"],
        initial_state={"hotels": env.scenario("default")},
        verifier=StateVerifier(goal={"hotels": session.dump()}, **verifier),
        solver=[PlannedCall(call=ToolCall(server="hotels", name=tool, arguments=args), kind="write")],
    )


def _conversation(task: Task) -> Conversation:
    initial = task.initial_state
    node = Node(index=0, query=task.instruction, mcp_servers=task.servers, initial_scenario=initial, final_scenario={})
    return Conversation(
        id=f"conv-{task.id}",
        servers=task.servers,
        tools=[c.call.qualified for c in task.solver],
        nodes=[node],
        task=task,
        provenance=Provenance(generator="template", seed=0),
    )


@pytest.fixture(scope="module")
def tasks(pool: EnvPool) -> dict[str, Task]:
    book = _task(pool, "book-porto", "book_room", BOOK)
    cancel = _task(pool, "cancel-bk1", "cancel_booking", CANCEL)
    quote = _task(
        pool, "book-and-quote", "book_room", BOOK, assertions=[Assertion(kind="answer_contains", value=140.0)]
    )
    return {t.id: t for t in (book, cancel, quote)}


@pytest.fixture(scope="module")
def hub(pool: EnvPool, tasks: dict[str, Task]) -> Hub:
    return Hub(pool, tasks)


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory: pytest.TempPathFactory, tasks: dict[str, Task]) -> Path:
    """One task as a Conversation record, the others bare: a tasks file may hold either."""
    path = tmp_path_factory.mktemp("hub") / "tasks.jsonl"
    book, *rest = tasks.values()
    lines = [_conversation(book).model_dump_json(), "", *(t.model_dump_json() for t in rest)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- in process ------------------------------------------------------------------------------------


def test_catalogue(hub: Hub, pool: EnvPool) -> None:
    apps = {a.name: a for a in hub.list_apps()}
    assert list(apps) == pool.names()
    assert apps["hotels"].domain == "travel" and apps["hotels"].num_tools == 8
    tools = {t.name: t for t in hub.list_tools("hotels")}
    assert tools["book_room"].kind == "write" and tools["get_hotel"].kind == "read"
    assert tools["book_room"].description == "Book one room at a hotel for a stay."
    doc = hub.get_tool_documentation("hotels", "book_room")
    assert doc.input_schema["required"] == ["hotel_id", "guest_name", "check_in", "nights"]
    assert doc.output_schema is not None and doc.kind == "write"
    with pytest.raises(HubError, match=r"no app 'hotel'; the apps are: .*hotels") as e:
        hub.list_tools("hotel")
    assert e.value.code == "unknown_app"
    with pytest.raises(HubError, match=r"app 'hotels' has no tool 'book'; its tools are: .*book_room") as e:
        hub.get_tool_documentation("hotels", "book")
    assert e.value.code == "unknown_tool"


def test_episodes_are_isolated(hub: Hub) -> None:
    a, b = hub.episode("book-porto"), hub.episode("book-porto")
    rec = hub.call_tool(a, "hotels", "book_room", BOOK)
    assert rec.ok and rec.result["id"] == "BK-0002"
    assert "BK-0002" in hub.state(a)["hotels"]["bookings"]
    assert "BK-0002" not in hub.state(b)["hotels"]["bookings"]
    # b books too, from its own copy: the same next id, not BK-0003
    assert hub.call_tool(b, "hotels", "book_room", BOOK).result["id"] == "BK-0002"
    assert [(c.app, c.record.tool) for c in a.calls] == [("hotels", "book_room")]


def test_complete_task_success_failure_and_ended_episode(hub: Hub) -> None:
    good, bad = hub.episode("cancel-bk1"), hub.episode("cancel-bk1")
    assert hub.call_tool(good, "hotels", "cancel_booking", CANCEL).ok
    assert hub.call_tool(bad, "hotels", "modify_booking", WRONG).ok
    assert hub.complete_task(good).model_dump() == {"success": True, "reasons": []}
    verdict = hub.complete_task(bad)
    assert not verdict.success
    assert "hotels: different bookings.BK-0001.status" in verdict.reasons
    assert "hotels: different bookings.BK-0001.nights" in verdict.reasons
    # the episode has ended: no more calls, no second verdict
    with pytest.raises(HubError, match="episode has ended") as e:
        hub.call_tool(good, "hotels", "get_booking", CANCEL)
    assert e.value.code == "episode_ended"
    with pytest.raises(HubError, match="already ended"):
        hub.complete_task(good)
    # loading a task again starts a fresh episode on the task's initial state
    hub.load_task(bad, "cancel-bk1")
    assert hub.state(bad)["hotels"]["bookings"]["BK-0001"]["nights"] == 3
    assert hub.call_tool(bad, "hotels", "cancel_booking", CANCEL).ok
    assert hub.complete_task(bad).success


def test_answer_assertion_and_no_task(hub: Hub) -> None:
    ep = hub.episode("book-and-quote")
    hub.call_tool(ep, "hotels", "book_room", BOOK)
    assert hub.complete_task(ep).reasons == ["no final answer (expected one mentioning 140.0)"]
    ep = hub.episode("book-and-quote")
    hub.call_tool(ep, "hotels", "book_room", BOOK)
    assert hub.complete_task(ep, "Booked: BK-0002, 140 EUR in total.").success
    free = hub.episode()
    assert hub.call_tool(free, "hotels", "get_booking", CANCEL).ok  # no task: apps start at default
    with pytest.raises(HubError, match="no task is active") as e:
        hub.complete_task(free)
    assert e.value.code == "no_task"


def test_task_apps_fork_from_the_task_others_from_default(hub: Hub, pool: EnvPool) -> None:
    busy = pool.get("hotels").scenario("busy")
    task = Task(
        id="busy",
        instruction="x",
        servers=["hotels"],
        initial_state={"hotels": busy},
        verifier=StateVerifier(goal={"hotels": busy}),
        solver=[],
    )
    ep = hub.episode(task)
    assert set(hub.state(ep)) == {"hotels"}
    assert hub.state(ep)["hotels"] == busy
    assert hub.call_tool(ep, "hotels", "cancel_booking", {"booking_id": "BK-0003"}).ok
    assert busy["bookings"]["BK-0003"]["status"] == "confirmed"  # the task's own data is never mutated
    assert hub.call_tool(ep, "flights", "list_passenger_bookings", {"passenger_name": "Nobody"}).ok
    assert hub.state(ep)["flights"] == pool.get("flights").session("default").dump()
    bad = task.model_copy(update={"id": "odd", "servers": ["hotels", "nowhere"]})
    with pytest.raises(HubError, match="task 'odd' uses app 'nowhere'"):
        hub.load_task(ep, bad)
    # a state of an app the hub serves but the task does not name was ignored without a word
    stray = task.model_copy(update={"id": "stray", "initial_state": {**task.initial_state, "flights": {"x": 1}}})
    with pytest.raises(HubError, match="task 'stray' gives a state of app 'flights', which is not one of its servers"):
        hub.load_task(ep, stray)


def test_invoke_dispatches_meta_tools_by_name(hub: Hub) -> None:
    assert [m.name for m in META_TOOLS] == [
        "list_apps",
        "list_tools",
        "get_tool_documentation",
        "call_tool",
        "complete_task",
    ]
    ep = hub.episode("book-porto")
    listed = hub.invoke(ep, "list_apps")
    assert listed.ok and "hotels" in [a["name"] for a in listed.payload["apps"]]
    assert hub.invoke(ep, "list_tools", {"app": "hotels"}).payload["tools"][0]["name"] == "search_hotels"
    called = hub.invoke(ep, "call_tool", {"app": "hotels", "tool": "book_room", "arguments": BOOK})
    assert called.ok and called.payload["id"] == "BK-0002"
    failed = hub.invoke(ep, "call_tool", {"app": "hotels", "tool": "get_booking", "arguments": {"booking_id": "X"}})
    assert not failed.ok and failed.payload["error"]["type"] == "not_found"
    unknown = hub.invoke(ep, "call_tool", {"app": "hotels", "tool": "teleport"})
    assert unknown.payload["error"]["type"] == "unknown_tool" and "book_room" in unknown.payload["error"]["message"]
    bad_args = hub.invoke(ep, "list_tools", {"app": 3, "extra": 1})
    assert bad_args.payload["error"]["type"] == "invalid_arguments"
    assert "extra: unknown parameter" in bad_args.payload["error"]["message"]
    assert hub.invoke(ep, "teleport").payload["error"]["type"] == "unknown_meta_tool"
    done = hub.invoke(ep, "complete_task", {"answer": None})
    assert done.ok and done.payload == {"success": True, "reasons": []}


def test_tasks_file(tmp_path: Path, tasks_file: Path, tasks: dict[str, Task], pool: EnvPool) -> None:
    assert load_tasks(tasks_file) == tasks
    bad = tmp_path / "bad.jsonl"
    bad.write_text(tasks["cancel-bk1"].model_dump_json() + "\n{not json\n")
    with pytest.raises(HubError, match=r"bad.jsonl: line 2: invalid JSON"):
        load_tasks(bad)
    bad.write_text('\n{"id": "t", "instruction": "x"}\n')
    with pytest.raises(HubError, match=r"line 2: not a valid Task record: servers: Field required"):
        load_tasks(bad)
    bad.write_text(f'{{"id": "c", "nodes": [], "task": {{"id": "t"}}}}\n{tasks["cancel-bk1"].model_dump_json()}')
    with pytest.raises(HubError, match=r"line 1: not a valid Conversation record"):
        load_tasks(bad)
    bad.write_text('{"id": "hotels/t0/s0/0", "record": {"prompt": []}}\n')  # an `envs export` package's row
    with pytest.raises(HubError, match=r"line 1: a row of an exported package's tasks.jsonl \(envs export\)"):
        load_tasks(bad)
    line = tasks["cancel-bk1"].model_dump_json()
    bad.write_text(f"{line}\n{line}\n")
    with pytest.raises(HubError, match="line 2: task id 'cancel-bk1' appears twice"):
        load_tasks(bad)
    with pytest.raises(HubError, match=r"no task 'nope' \(known: book-and-quote, book-porto, cancel-bk1\)"):
        Hub(pool, tasks).task("nope")
    with pytest.raises(HubError, match="uses app 'hotels', which the hub does not serve"):
        Hub(pool, tasks, apps=["flights"])


# ---- over MCP --------------------------------------------------------------------------------------


def _payload(result: Any) -> Any:
    return json.loads(result.content[0].text)


def _structured(result: Any) -> dict[str, Any]:
    assert result.structuredContent is not None, result
    return dict(result.structuredContent)


@pytest.fixture(scope="module")
def hub_url(pool: EnvPool, tasks_file: Path) -> Iterator[str]:
    """A real streamable-HTTP hub server (uvicorn, in a background thread) on a free port."""
    server = build_hub_server(pool, tasks_file, control_tools=True, client_tasks=True)  # a trainer's hub
    server.hub.list_apps()  # load every app here, not concurrently from the server's thread
    with serving(server.streamable_http_app(), "the hub server") as url:
        yield url


async def _discover(s: ClientSession) -> dict[str, Any]:
    """What an agent does first: find the app, its tools and one tool's documentation via the meta-tools."""
    apps = _structured(await s.call_tool("list_apps", {}))["apps"]
    assert "hotels" in [a["name"] for a in apps]
    tools = _structured(await s.call_tool("list_tools", {"app": "hotels"}))["tools"]
    doc = await s.call_tool("get_tool_documentation", {"app": "hotels", "tool": tools[-1]["name"]})
    return _structured(doc)


async def test_http_two_sessions_load_tasks_solve_and_complete(hub_url: str) -> None:
    async with (
        streamable_http_client(hub_url + "?task=book-porto") as (r1, w1, _),
        ClientSession(r1, w1) as a,
        streamable_http_client(hub_url) as (r2, w2, _),
        ClientSession(r2, w2) as b,
    ):
        init, _ = await asyncio.gather(a.initialize(), b.initialize())
        assert init.serverInfo.name == "envfactory-hub"
        names = [t.name for t in (await a.list_tools()).tools]
        assert names == [m.name for m in META_TOOLS] + [LOAD_TASK_TOOL, STATE_TOOL]
        loaded = await b.call_tool(LOAD_TASK_TOOL, {"task_id": "cancel-bk1"})
        assert not loaded.isError and _structured(loaded)["apps"] == ["hotels"]
        doc_a, doc_b = await asyncio.gather(_discover(a), _discover(b))
        assert doc_a["name"] == doc_b["name"] == "cancel_booking"
        assert doc_a["input_schema"]["required"] == ["booking_id"]

        # a books as its task asks; b modifies the booking its task says to cancel
        ra, rb = await asyncio.gather(
            a.call_tool("call_tool", {"app": "hotels", "tool": "book_room", "arguments": BOOK}),
            b.call_tool("call_tool", {"app": "hotels", "tool": "modify_booking", "arguments": WRONG}),
        )
        assert not ra.isError and _structured(ra) == {"result": _payload(ra)}
        assert _payload(ra)["id"] == "BK-0002" and _payload(rb)["nights"] == 5
        failed = await a.call_tool(
            "call_tool", {"app": "hotels", "tool": "get_booking", "arguments": {"booking_id": "X"}}
        )
        assert failed.isError and _payload(failed)["error"]["type"] == "not_found"
        nowhere = await a.call_tool("call_tool", {"app": "motels", "tool": "book_room"})
        assert nowhere.isError and "the apps are: " in _payload(nowhere)["error"]["message"]

        sa, sb = await asyncio.gather(a.call_tool(STATE_TOOL, {}), b.call_tool(STATE_TOOL, {}))
        bookings_a, bookings_b = _payload(sa)["hotels"]["bookings"], _payload(sb)["hotels"]["bookings"]
        assert set(bookings_a) == {"BK-0001", "BK-0002"} and bookings_a["BK-0001"]["nights"] == 3
        assert set(bookings_b) == {"BK-0001"} and bookings_b["BK-0001"]["nights"] == 5

        va, vb = await asyncio.gather(
            a.call_tool("complete_task", {}), b.call_tool("complete_task", {"answer": "done"})
        )
        assert _structured(va) == {"success": True, "reasons": []}
        assert _structured(vb)["success"] is False
        assert "hotels: different bookings.BK-0001.status" in _structured(vb)["reasons"]

        after = await a.call_tool("call_tool", {"app": "hotels", "tool": "get_booking", "arguments": CANCEL})
        assert after.isError and _payload(after)["error"]["type"] == "episode_ended"
        # b restarts its task (no arguments: the current one), this time doing the right thing
        again = await b.call_tool(LOAD_TASK_TOOL, {})
        assert _structured(again)["task_id"] == "cancel-bk1"
        await b.call_tool("call_tool", {"app": "hotels", "tool": "cancel_booking", "arguments": CANCEL})
        assert _structured(await b.call_tool("complete_task", {}))["success"] is True


async def test_http_task_errors_and_task_object(hub_url: str, tasks: dict[str, Task]) -> None:
    # a connection whose task the hub lacks is refused when its session opens (it opened, and every call of it
    # answered the unknown task as a tool error)
    from envfactory.serve.trainer_client import ServerHTTPError, TrainerSession

    with pytest.raises(ServerHTTPError, match=r"no task 'nope' \(known: book-and-quote, book-porto, cancel-bk1\)"):
        await TrainerSession.open(hub_url, task="nope")
    with pytest.raises(ServerHTTPError) as long:  # a client's value is not sent back whole
        await TrainerSession.open(hub_url, task="x" * 12_000)
    assert len(long.value.message) < 400, len(long.value.message)
    async with streamable_http_client(hub_url) as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        none = await s.call_tool(LOAD_TASK_TOOL, {"task_id": "nope"})
        assert none.isError and "known: book-and-quote, book-porto, cancel-bk1" in _payload(none)["error"]["message"]
        invalid = await s.call_tool(LOAD_TASK_TOOL, {"task": {"id": "t"}})
        assert invalid.isError and _payload(invalid)["error"]["type"] == "invalid_task"
        # a whole task object, not in the server's file
        custom = tasks["book-porto"].model_copy(update={"id": "custom"}).model_dump(mode="json")
        loaded = await s.call_tool(LOAD_TASK_TOOL, {"task": custom})
        assert _structured(loaded)["task_id"] == "custom"
        no_call = await s.call_tool("complete_task", {})
        assert _structured(no_call) == {"success": False, "reasons": ["hotels: missing bookings.<new>"]}


async def test_control_tools_refuse_arguments_they_do_not_take(hub_url: str) -> None:
    """A typo (`taskId`) restarted the current task and reported success with the old task's id (found by a
    reviewer); the state tool took any arguments."""
    async with streamable_http_client(hub_url + "?task=book-porto") as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        for arguments in ({"taskId": "cancel-bk1"}, {"task_ID": "cancel-bk1"}, {"tasks": {}}):
            typo = await s.call_tool(LOAD_TASK_TOOL, arguments)
            assert typo.isError and _payload(typo)["error"]["type"] == "invalid_arguments", arguments
            assert next(iter(arguments)) in _payload(typo)["error"]["message"]
        state = await s.call_tool(STATE_TOOL, {"x": 1})
        assert state.isError and "takes no arguments" in _payload(state)["error"]["message"]
        assert _structured(await s.call_tool(LOAD_TASK_TOOL, {"task_id": "cancel-bk1"}))["task_id"] == "cancel-bk1"


def test_tool_names_a_client_makes_up_are_not_remembered(pool: EnvPool, tasks_file: Path) -> None:
    """Each expensive `call_tool` was remembered by its app/tool key across sessions, and the key came from the
    client: made-up 3 MB tool names grew the server by ~3 MB a call, for good (found by a reviewer)."""

    class _Key:  # a session's key (held weakly)
        pass

    server = build_hub_server(pool, tasks_file, control_tools=True, client_tasks=True)
    slow = server.limits.inline_cpu_s * 10  # a call expensive enough to be remembered
    for k in range(50):
        made_up = {"app": "hotels", "tool": f"no_such_tool_{k}_" + "x" * 1000, "arguments": {}}
        server.ran(_Key(), "call_tool", made_up, slow, slow, inline=True)
        server.ran(_Key(), "call_tool", {"app": f"nope-{k}", "tool": "book_room"}, slow, slow, inline=True)
    assert len(server._tools_off_loop._marks) == 0
    server.ran(_Key(), "call_tool", {"app": "hotels", "tool": "book_room"}, slow, slow, inline=True)
    assert list(server._tools_off_loop._marks) == ["hotels/book_room"]  # a real tool is remembered


class _Session:
    pass


def test_an_agent_cannot_set_its_own_verdict_or_hear_the_answer(
    pool: EnvPool, tasks_file: Path, tasks: dict[str, Task]
) -> None:
    """What a reviewer did over MCP: load a client-written task (an empty goal, the real task's id) and pass it;
    read the expected answer off a failed `complete_task`, restart, and answer it."""
    agents = asyncio.run(build_hub_server(pool, tasks_file).list_tools())  # a hub with tasks: the meta-tools only
    assert [t.name for t in agents] == [m.name for m in META_TOOLS]
    trainers = build_hub_server(pool)  # a hub without: the trainer's tools, whole tasks taken
    assert trainers.control_tools and trainers.client_tasks
    server = build_hub_server(pool, tasks_file, control_tools=True)  # a hub with tasks takes none from clients
    key = _Session()  # what keys a session's episode on the server (its MCP session object)
    load = next(t for t in asyncio.run(server.list_tools()) if t.name == LOAD_TASK_TOOL)
    assert set(load.inputSchema["properties"]) == {"task_id"}
    forged = tasks["book-and-quote"].model_copy(update={"verifier": StateVerifier(goal={})})
    refused = server.dispatch(key, None, LOAD_TASK_TOOL, {"task": forged.model_dump(mode="json")})
    assert refused.isError and "runs its own tasks only" in _payload(refused)["error"]["message"]
    assert not server.dispatch(key, None, LOAD_TASK_TOOL, {"task_id": "book-and-quote"}).isError
    server.dispatch(key, None, "call_tool", {"app": "hotels", "tool": "book_room", "arguments": BOOK})
    told = _payload(server.dispatch(key, None, "complete_task", {"answer": "booked"}))
    assert told == {"success": False, "reasons": ["the answer does not state what was asked"]}
    assert "140" not in json.dumps(told)
    episode = server.held(key, None)  # the trainer's log keeps the reason in full
    assert episode.result is not None and episode.result.reasons == ["the answer does not mention 140.0"]


async def test_the_cli_hub_with_tasks_offers_the_agent_the_meta_tools_only(tasks_file: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "envfactory.cli", "hub", "serve", "--tasks", str(tasks_file), "--app", "hotels"],
        env={**os.environ, "ENVFACTORY_ROOT": str(ROOT)},
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        assert [t.name for t in (await s.list_tools()).tools] == [m.name for m in META_TOOLS]
        hidden = await s.call_tool(LOAD_TASK_TOOL, {"task_id": "cancel-bk1"})
        assert hidden.isError


async def test_stdio_hub(tasks_file: Path) -> None:
    script = (
        "import sys; from envfactory.env.pool import EnvPool; from envfactory.serve.hub_server import serve_hub;"
        " serve_hub(EnvPool(), sys.argv[1], 'stdio', default_task='book-porto', apps=['hotels', 'flights'])"
    )
    params = StdioServerParameters(
        command=sys.executable, args=["-c", script, str(tasks_file)], env={**os.environ, "ENVFACTORY_ROOT": str(ROOT)}
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        apps = _structured(await s.call_tool("list_apps", {}))["apps"]
        assert [a["name"] for a in apps] == ["hotels", "flights"]
        await s.call_tool("call_tool", {"app": "hotels", "tool": "book_room", "arguments": BOOK})
        assert _structured(await s.call_tool("complete_task", {})) == {"success": True, "reasons": []}
