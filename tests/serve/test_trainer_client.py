"""The trainers' client (`envfactory.serve.trainer_client`) against a real server over real HTTP.

Its answers must be what the environment answers in-process (random call sequences), its sessions isolated,
its errors the named exceptions (an ended session, a JSON-RPC error, a tool's own failure, a dead or
non-HTTP server), and a connection the server closed for idling must be replaced without the caller seeing it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.serve.limits import ServeLimits
from envfactory.serve.mcp_server import EnvMCPServer
from envfactory.serve.net import free_port
from envfactory.serve.trainer_client import (
    ClientOptions,
    ConnectionLostError,
    JSONRPCError,
    ProtocolError,
    ServerHTTPError,
    ToolCallError,
    TrainerClientError,
    TrainerSession,
)
from tests.support.paths import ROOT
from tests.support.serve import PROTOCOL, initialize_body, post_head, read_answers, serving

ANA = {"hotel_id": "HT-LIS-01", "guest_name": "Ana", "check_in": "2026-03-01", "nights": 1}


@pytest.fixture(scope="module")
def hotels() -> Any:
    return EnvPool(Settings(root=ROOT, bfcl=False)).get("hotels")


@pytest.fixture(scope="module")
def served(hotels: Any) -> Iterator[tuple[EnvMCPServer, str]]:
    server = EnvMCPServer(hotels, default_config="default")
    with serving(server) as url:
        yield server, url


def _calls() -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    hotel = st.sampled_from(["HT-LIS-01", "HT-POR-01", "HT-NOPE"])
    booking = st.sampled_from(["BK-0001", "BK-0002", "BK-0003", "BK-9999"])
    return st.one_of(
        st.tuples(st.just("search_hotels"), st.fixed_dictionaries({"city": st.sampled_from(["Lisbon", "Porto", "X"])})),
        st.tuples(
            st.just("book_room"),
            st.fixed_dictionaries(
                {
                    "hotel_id": hotel,
                    "guest_name": st.sampled_from(["Ana Costa", "Bo"]),
                    "check_in": st.just("2026-03-01"),
                    "nights": st.integers(-1, 4),
                }
            ),
        ),
        st.tuples(st.just("get_booking"), st.fixed_dictionaries({"booking_id": booking})),
        st.tuples(st.just("cancel_booking"), st.fixed_dictionaries({"booking_id": booking})),
        st.tuples(st.just("get_booking"), st.fixed_dictionaries({"booking_id": st.integers()})),  # a wrong type
        st.tuples(st.just("no_such_tool"), st.just({})),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(_calls(), max_size=8))
def test_answers_and_state_are_the_environments(
    served: tuple[EnvMCPServer, str], hotels: Any, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    _, url = served
    alone = Session.fork(hotels, "default")

    async def run() -> None:
        async with await TrainerSession.open(url) as env:
            for tool, arguments in calls:
                result = await env.call(tool, arguments)
                record = alone.call(tool, arguments)
                assert result.is_error == (not record.ok), (tool, arguments, result)
                assert result.data == record.payload()
            assert await env.state() == alone.dump()

    asyncio.run(run())


async def test_sessions_are_isolated_and_count_on_the_fast_path(served: tuple[EnvMCPServer, str]) -> None:
    server, url = served
    assert server.fast is not None
    before = server.fast.answered

    async def one(i: int) -> tuple[str, dict[str, Any]]:
        async with await TrainerSession.open(url) as env:
            booked = await env.call(
                "book_room",
                {"hotel_id": "HT-LIS-01", "guest_name": f"Guest {i}", "check_in": "2026-03-01", "nights": 1},
            )
            booking = booked.raise_for_error("book_room").data["id"]
            read = (await env.call("get_booking", {"booking_id": booking})).raise_for_error()
            assert read.data["guest_name"] == f"Guest {i}"
            return booking, await env.state()

    results = await asyncio.gather(*(one(i) for i in range(12)))
    assert {booking for booking, _ in results} == {results[0][0]}  # each session books on its own fresh state
    for i, (_, state) in enumerate(results):
        guests = sorted(b["guest_name"] for b in state["bookings"].values())
        assert guests == sorted(["Maria Silva", f"Guest {i}"])  # the scenario's booking and its own, no other
    assert server.fast.answered - before >= 12 * 3 - 12  # all but each session's first call


async def test_scenario_reset_and_tools(served: tuple[EnvMCPServer, str], hotels: Any) -> None:
    _, url = served
    async with await TrainerSession.open(url, scenario="default") as env:
        names = {t.name for t in await env.tools()}
        assert {"search_hotels", "book_room", "envfactory_state", "envfactory_reset"} <= names
        await env.call("book_room", ANA)
        assert await env.state() != Session.fork(hotels, "default").dump()
        await env.reset(scenario="default")
        assert await env.state() == Session.fork(hotels, "default").dump()
        with pytest.raises(ToolCallError, match="envfactory_reset"):
            await env.reset(scenario="no-such-scenario")


async def test_a_session_on_a_scenario_the_server_lacks_is_refused_when_it_opens(
    served: tuple[EnvMCPServer, str],
) -> None:
    """It opened, and each of its calls answered the scenario's error as a tool result, which a rollout hands the
    model as the tool's answer: a whole GRPO group spent on a typo."""
    server, url = served
    before = server.open_sessions
    with pytest.raises(ServerHTTPError, match=r"no scenario 'nope'.*default") as refused:
        await TrainerSession.open(url, scenario="nope")
    assert refused.value.status == 400 and server.open_sessions <= before  # (ended ones let go meanwhile)
    async with await TrainerSession.open(url, scenario="busy") as env:  # one it has
        assert not (await env.call("search_hotels", {"city": "Lisbon"})).is_error


async def test_a_tools_failure_is_a_result_until_raised(served: tuple[EnvMCPServer, str]) -> None:
    _, url = served
    async with await TrainerSession.open(url) as env:
        result = await env.call("get_booking", {"booking_id": "BK-9999"})
        assert result.is_error and "not_found" in result.text
        with pytest.raises(ToolCallError, match="get_booking"):
            result.raise_for_error("get_booking")


async def test_an_ended_session_and_json_rpc_errors_raise(served: tuple[EnvMCPServer, str]) -> None:
    _, url = served
    env = await TrainerSession.open(url)
    with pytest.raises(ServerHTTPError) as refused:  # refused before the SDK reads it: a 400, the id kept
        await env.call("search_hotels", ["not", "an", "object"])  # type: ignore[arg-type]
    assert refused.value.status == 400 and "a tool's arguments must be an object" in refused.value.message
    assert json.loads(refused.value.body)["error"]["code"] == -32602
    with pytest.raises(JSONRPCError) as unknown:  # a method MCP has not: its JSON-RPC error, answered before the SDK
        await env._request("no/such/method", {})  # (whose warning printed ~18 KB a request, under no log budget)
    assert unknown.value.code == -32601
    with pytest.raises(JSONRPCError) as rpc:  # what the SDK answers itself: a JSON-RPC error (a prompt it lacks)
        await env._request("prompts/get", {"name": "nope"})
    assert "Unknown prompt" in str(rpc.value)
    assert (await env.call("search_hotels", {"city": "Lisbon"})).data  # the session goes on after an error
    async with httpx.AsyncClient() as http:  # the session ended by someone else
        ended = await http.delete(
            url, headers={"mcp-session-id": env.session_id or "", "mcp-protocol-version": PROTOCOL}
        )
        assert ended.status_code == 200
    with pytest.raises(ServerHTTPError) as gone:
        await env.call("search_hotels", {"city": "Lisbon"})
    assert gone.value.status == 404 and "not found" in gone.value.message.lower()
    await env.close()
    await env.close()  # twice is fine
    with pytest.raises(TrainerClientError, match="closed"):
        await env.call("search_hotels", {"city": "Lisbon"})


async def test_close_ends_the_session_on_the_server(served: tuple[EnvMCPServer, str]) -> None:
    _, url = served
    env = await TrainerSession.open(url)
    session_id = env.session_id
    await env.close()
    async with httpx.AsyncClient() as http:
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "search_hotels", "arguments": {}},
        }
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-session-id": session_id or "",
            "mcp-protocol-version": PROTOCOL,
        }
        assert (await http.post(url, json=message, headers=headers)).status_code == 404


async def test_a_connection_closed_for_idling_is_replaced(hotels: Any) -> None:
    server = EnvMCPServer(hotels, default_config="default", limits=ServeLimits(keep_alive_s=1))
    with serving(server) as url:
        # idle_reconnect_s far above the server's keep-alive: the client must notice the server's close itself
        env = await TrainerSession.open(url, options=ClientOptions(idle_reconnect_s=60))
        await env.call("book_room", ANA)
        first = env._conn
        await asyncio.sleep(1.6)
        assert first is not None and first.closed  # the server closed it
        read = await env.call("get_booking", {"booking_id": "BK-0002"})
        assert not read.is_error and read.data["guest_name"] == "Ana"  # same MCP session on a new connection
        assert env._conn is not first
        await env.close()


async def test_no_server_and_not_http_raise() -> None:
    with pytest.raises(ConnectionLostError, match="cannot connect"):
        await TrainerSession.open(f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(TrainerClientError, match="plain-HTTP"):
        await TrainerSession.open("https://127.0.0.1:1/mcp")

    async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")  # then the connection ends
        await writer.drain()
        writer.close()

    for handler, error in ((babble, ProtocolError), (hang_up, ConnectionLostError)):
        port = free_port()
        server = await asyncio.start_server(handler, "127.0.0.1", port)
        async with server:
            with pytest.raises(error):
                await TrainerSession.open(f"http://127.0.0.1:{port}/mcp")


@pytest.fixture
async def slow_server() -> AsyncIterator[str]:
    """A server that reads a request and never answers."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(30)

    port = free_port()
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    async with server:
        yield f"http://127.0.0.1:{port}/mcp"


async def test_a_request_past_its_timeout_raises(slow_server: str) -> None:
    with pytest.raises(ConnectionLostError, match="timeout_s"):
        await TrainerSession.open(slow_server, options=ClientOptions(timeout_s=0.3))


@contextmanager
def _cli_on_socket(path: Path, log: Path, *args: str) -> Iterator[None]:
    """`envfactory ARGS --transport http --uds PATH` (the CLI's own server) until it listens there; stopped on exit,
    after which its socket must be gone (the server removes it on the way out)."""
    environ = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_BFCL": "false"}
    command = [sys.executable, "-m", "envfactory.cli", *args, "--transport", "http", "--uds", str(path)]
    with log.open("w") as fh:
        proc = subprocess.Popen(command, env=environ, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_for_unix_socket(path, proc, log)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # its owner's alone
        yield
    finally:
        proc.terminate()
        proc.wait(10)
    assert not path.exists()


def test_a_session_over_the_servers_unix_socket(tmp_path: Path) -> None:
    """`envfactory serve --uds`: the CLI's own server on a Unix socket that only its user may connect to, and
    trainer sessions reaching it there (`ClientOptions.uds`)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # short: a socket's path is at most 107 bytes
        path, log = Path(tmp) / "hotels.sock", tmp_path / "server.log"
        with _cli_on_socket(path, log, "serve", "hotels"):
            assert f"serving hotels on the Unix socket {path}" in log.read_text()

            async def rollout() -> tuple[Any, Any]:
                options = ClientOptions(uds=str(path))
                async with await TrainerSession.open("http://localhost/mcp", options=options) as env:
                    await env.call("book_room", ANA)
                    read = await env.call("get_booking", {"booking_id": "BK-0002"})
                    return read, await env.state()

            read, state = asyncio.run(rollout())
            assert not read.is_error and read.data["guest_name"] == "Ana"
            assert [b["guest_name"] for b in state["bookings"].values()].count("Ana") == 1

            async def elsewhere() -> None:
                options = ClientOptions(uds=str(Path(tmp) / "none.sock"))
                await TrainerSession.open("http://localhost/mcp", options=options)

            with pytest.raises(ConnectionLostError, match=r"through \S*none\.sock"):
                asyncio.run(elsewhere())

            with socket.socket(socket.AF_UNIX) as raw:  # what curl --unix-socket sends: Host without a port
                raw.connect(str(path))
                body = initialize_body()
                raw.sendall(post_head("localhost", len(body)) + body)
                assert read_answers(raw)[0][0] == 200


def test_the_hub_serves_on_a_unix_socket_too(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path, log = Path(tmp) / "hub.sock", tmp_path / "hub.log"
        with _cli_on_socket(path, log, "hub", "serve"):
            assert f"serving the hub on the Unix socket {path}" in log.read_text()

            async def session() -> str | None:
                options = ClientOptions(uds=str(path))
                async with await TrainerSession.open("http://localhost/mcp", options=options) as hub:
                    return hub.session_id

            assert asyncio.run(session())


def _wait_for_unix_socket(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
                return
            except OSError:
                time.sleep(0.1)
    raise AssertionError(f"the server did not listen on {path}: {log.read_text()}")


# ---- what a trainer's loop does to a session, and what a server may send (found by a reviewer) -----------------

_INIT_BODY = b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{}}}'
_INIT = b"HTTP/1.1 200 OK\r\nmcp-session-id: abc\r\ncontent-length: %d\r\n\r\n%s" % (len(_INIT_BODY), _INIT_BODY)
_NOTIFIED = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"


def _answer(body: bytes, head: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + head
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


_RESULT = _answer(b'{"jsonrpc":"2.0","id":"%ID%","result":{"content":[{"type":"text","text":"ok"}]}}')


async def _scripted(script: list[bytes], heads: list[bytes] | None = None) -> tuple[asyncio.AbstractServer, str]:
    """A server answering its n-th request (on any connection) with `script[n]`, raw bytes (`"%ID%"` in them: the
    request's own id, the content length kept); the requests' heads are kept in `heads`."""
    count = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if heads is not None:
                    heads.append(head)
                answer = script[min(count[0], len(script) - 1)]
                if b'"%ID%"' in answer:
                    answer = answer.replace(b'"%ID%"', json.dumps(json.loads(body)["id"]).encode().ljust(6))
                writer.write(answer)
                count[0] += 1
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"


async def test_a_cancelled_call_leaves_the_next_ones_their_own_answers(served: tuple[EnvMCPServer, str]) -> None:
    """`asyncio.wait_for` or a task group cancels a call after its request went out: its answer must not be read
    as the next request's (before, every later call of the session got the previous one's answer)."""
    _, url = served
    async with await TrainerSession.open(url) as env:
        for _ in range(3):
            task = asyncio.create_task(env.call("get_hotel", {"hotel_id": "HT-LIS-01"}))
            await asyncio.sleep(0)  # the request is written; the answer is not read yet
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            found = await env.call("search_hotels", {"city": "Porto"})
            assert {h["city"] for h in found.data} == {"Porto"}
            assert "hotels" in await env.state()
            assert any(t.name == "book_room" for t in await env.tools())


async def test_an_answer_to_another_request_is_refused_and_the_connection_dropped() -> None:
    stale = _answer(b'{"jsonrpc":"2.0","id":99,"error":{"code":-32602,"message":"answer to request 99"}}')
    server, url = await _scripted([_INIT, _NOTIFIED, stale, _RESULT])
    async with server:
        env = await TrainerSession.open(url)
        with pytest.raises(ProtocolError, match="request 99, not 2"):
            await env.call("t")  # not raised as this call's JSON-RPC error
        assert env._conn is None
        assert (await env.call("t")).text == "ok"  # on a new connection
        env._drop()


@pytest.mark.parametrize(
    ("answer", "match", "framing"),
    [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-1\r\n", "chunk size", True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x5\r\n", "chunk size", True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", "CRLF", True),
        (b"HTTP/1.1 \xb200 OK\r\ncontent-length: 0\r\n\r\n", "not an HTTP", True),
        (b"HTTP/1.1 200 OK\r\ncontent-length: \xb9\r\n\r\n{", "content-length", True),
        (b"HTTP/1.1 200 OK\r\nx: " + b"a" * 70_000 + b"\r\n\r\n", "head of", True),
        (_answer(b'{"jsonrpc":"1.0","id":2,"result":{"content":[]}}'), "JSON-RPC", False),
        (_answer(b"data: {}\n\n", b"content-type: text/event-stream\r\n"), "event stream", False),
    ],
)
async def test_a_malformed_answer_is_a_protocol_error_and_the_next_request_gets_its_own(
    answer: bytes, match: str, framing: bool
) -> None:
    """A bad head or body framing leaves the connection out of step (dropped); a well-framed answer that is no
    JSON-RPC leaves it in step. Either way the next request gets its own answer."""
    server, url = await _scripted([_INIT, _NOTIFIED, answer, _RESULT])
    async with server:
        env = await TrainerSession.open(url, options=ClientOptions(timeout_s=5))
        with pytest.raises(ProtocolError, match=match):
            await env.call("t")
        assert (env._conn is None or env._conn.closed) == framing
        assert (await env.call("t")).text == "ok"
        env._drop()


async def test_answers_without_a_body_and_interim_answers_do_not_wait_for_the_timeout() -> None:
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + _RESULT
    server, url = await _scripted([_INIT, _NOTIFIED, no_content, interim])
    async with server:
        env = await TrainerSession.open(url, options=ClientOptions(timeout_s=5))
        started = time.monotonic()
        with pytest.raises(ProtocolError, match="not a JSON-RPC response"):  # (a 204 to a request is no answer)
            await env.call("t")
        assert (await env.call("t")).text == "ok"
        assert time.monotonic() - started < 2
        env._drop()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scenario": "default\r\nmcp-session-id: someone-else"}, "line break"),
        ({"task": "t\n1"}, "line break"),
        ({"scenario": "東京"}, "Latin-1"),
        ({"headers": {"a\r\nmcp-session-id": "x"}}, "not an HTTP token"),
        ({"headers": {"x-ok": "fine\x00"}}, "NUL"),
        ({"headers": {"Content-Length": "0"}}, "client's own"),
        ({"headers": {"mcp-session-id": "someone-else"}}, "client's own"),
    ],
)
async def test_headers_that_would_start_other_headers_are_refused(kwargs: dict[str, Any], match: str) -> None:
    heads: list[bytes] = []
    server, url = await _scripted([_INIT, _NOTIFIED], heads)
    async with server:
        with pytest.raises(TrainerClientError, match=match):
            await TrainerSession.open(url, **kwargs)
    assert heads == []  # nothing was sent


async def test_url_host_port_path_and_arguments_a_request_cannot_carry() -> None:
    for url, match in (("http://127.0.0.1:99999/mcp", "out of range"), ("http://127.0.0.1:ab/mcp", "Port")):
        with pytest.raises(TrainerClientError, match=match):
            TrainerSession(url)
    heads: list[bytes] = []
    server, url = await _scripted([_INIT, _NOTIFIED, _RESULT], heads)
    async with server:
        port = server.sockets[0].getsockname()[1]
        six = TrainerSession(f"http://[::1]:{port}/m€ b?q=é")
        assert six._head("POST", 0).split(b"\r\n")[:2] == [
            b"POST /m%E2%82%AC%20b?q=%C3%A9 HTTP/1.1",
            b"host: [::1]:%d" % port,
        ]
        env = await TrainerSession.open(url)
        for arguments, what in (({"when": object()}, "not JSON"), ({"x": float("nan")}, "not JSON")):
            with pytest.raises(TrainerClientError, match=what):
                await env.call("t", arguments)
        assert (await env.call("t")).text == "ok"
        await env.close()
        with pytest.raises(TrainerClientError, match="closed"):
            await env.tools()


def test_a_session_used_from_another_event_loop_says_so_and_still_closes(served: tuple[EnvMCPServer, str]) -> None:
    _, url = served
    env = asyncio.run(TrainerSession.open(url))

    async def use() -> None:
        with pytest.raises(TrainerClientError, match="another event loop"):
            await env.call("search_hotels", {"city": "Lisbon"})
        await env.close()  # drops the connection, sends nothing on the other loop's
        assert env.closed

    asyncio.run(use())


async def test_close_after_a_timeout_is_bounded_by_close_timeout_s(slow_server: str) -> None:
    options = ClientOptions(timeout_s=30, close_timeout_s=0.3)
    env = TrainerSession(slow_server, options=options)
    env.session_id = "s"  # as if opened: the server never answers anything
    started = time.monotonic()
    await env.close()
    assert time.monotonic() - started < 5 and env.closed


async def test_reset_to_an_empty_config_is_an_empty_state_and_both_choices_are_refused(
    served: tuple[EnvMCPServer, str],
) -> None:
    """`envfactory_reset {"config": {}}` loaded the default scenario (an empty dict read as "no config"), and a config
    given with a scenario won silently."""
    _, url = served
    async with await TrainerSession.open(url) as env:
        await env.reset(config={})
        state = await env.state()
        assert state["hotels"] == {} and state["bookings"] == {}, state
        with pytest.raises(ToolCallError, match="not both"):
            await env.reset(scenario="default", config={})
        await env.reset()
        assert (await env.state())["hotels"]  # neither: the server's default
