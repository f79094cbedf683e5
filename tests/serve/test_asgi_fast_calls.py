"""The tools/call fast path (`serve.asgi.FastToolCalls`): what it answers equals what the SDK answers.

Two real servers of the same environment, one with the fast path and one without, get the same random
call sequences over HTTP; every status, body and session header must be the same, and the fast one
must have answered the calls itself. Requests the SDK would refuse, and sessions that ended or went
idle, must still reach the SDK. Sessions stay isolated under concurrency.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.env.pool import EnvPool, load_untrusted_folder
from envfactory.env.session import Session
from envfactory.serve.mcp_server import RESET_TOOL, STATE_TOOL, EnvMCPServer
from tests.support.paths import ROOT
from tests.support.serve import JSON_HEADERS, PROTOCOL, RawSession, hello_params, serving


@pytest.fixture(scope="module")
def hotels() -> Any:
    return EnvPool(Settings(root=ROOT, bfcl=False)).get("hotels")


@pytest.fixture(scope="module")
def pair(hotels: Any) -> Iterator[tuple[EnvMCPServer, str, str]]:
    """(the fast server, its URL, the URL of the same environment served through the SDK only). The fast one as
    `envfactory serve` runs it (its own uvicorn configuration: GuardedHTTP and the limits)."""
    fast = EnvMCPServer(hotels, default_config="default")
    plain = EnvMCPServer(hotels, default_config="default", fast_calls=False)
    with serving(fast) as fast_url, serving(plain.streamable_http_app()) as plain_url:
        yield fast, fast_url, plain_url


def _answer(r: httpx.Response) -> tuple[int, Any, str | None, str | None]:
    body = json.loads(r.content) if r.content else None
    return r.status_code, body, r.headers.get("content-type"), r.headers.get("mcp-session-id")


CITIES = st.sampled_from(["Lisbon", "Porto", "Paris", "", "lisbon", 7])
HOTEL_IDS = st.sampled_from(["HT-LIS-01", "HT-POR-01", "HT-NOPE", None, 3])
BOOKING_IDS = st.sampled_from(["BK-0001", "BK-0002", "BK-0003", "BK-9999", ""])
DATES = st.sampled_from(["2026-03-01", "2026-03-05", "03/01/2026", ""])
NIGHTS = st.one_of(st.integers(-1, 9), st.just("2"), st.just(2.5))


def _calls() -> st.SearchStrategy[tuple[str, Any]]:
    def args(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        # any subset of the fields (a missing required argument is a call to get wrong too)
        return st.fixed_dictionaries({}, optional=fields)

    return st.one_of(
        st.tuples(st.just("search_hotels"), args(city=CITIES, max_price=st.integers(0, 400))),
        st.tuples(st.just("get_hotel"), args(hotel_id=HOTEL_IDS)),
        st.tuples(st.just("check_availability"), args(hotel_id=HOTEL_IDS, check_in=DATES, nights=NIGHTS)),
        st.tuples(
            st.just("book_room"),
            args(hotel_id=HOTEL_IDS, guest_name=st.sampled_from(["Ana", "Bo Li", ""]), check_in=DATES, nights=NIGHTS),
        ),
        st.tuples(st.just("get_booking"), args(booking_id=BOOKING_IDS)),
        st.tuples(st.just("list_bookings"), args(guest_name=st.sampled_from(["Ana", "Bo Li"]))),
        st.tuples(st.just("modify_booking"), args(booking_id=BOOKING_IDS, nights=NIGHTS)),
        st.tuples(st.just("cancel_booking"), args(booking_id=BOOKING_IDS)),
        st.tuples(st.just("no_such_tool"), st.just({})),
        st.tuples(st.just(STATE_TOOL), st.just({})),
        st.tuples(st.just(RESET_TOOL), st.sampled_from([{}, {"scenario": "busy"}, {"scenario": "nope"}])),
        st.tuples(st.just("search_hotels"), st.just(None)),  # arguments omitted
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(_calls(), min_size=1, max_size=10))
def test_fast_path_answers_exactly_as_the_sdk(pair: tuple[EnvMCPServer, str, str], calls: list[Any]) -> None:
    fast, fast_url, plain_url = pair
    assert fast.fast is not None
    with httpx.Client(timeout=30) as http:
        a, b = RawSession(http, fast_url), RawSession(http, plain_url)
        first = a.call(STATE_TOOL, {}), b.call(STATE_TOOL, {})  # a session's first call goes through the SDK
        assert json.loads(first[0].content) == json.loads(first[1].content)
        before, gathered = fast.fast.answered, fast.fast.one_write
        for tool, arguments in calls:
            got, want = a.call(tool, arguments), b.call(tool, arguments)
            assert _answer(got)[:3] == _answer(want)[:3], (tool, arguments)
            assert got.headers["mcp-session-id"] == a.id and want.headers["mcp-session-id"] == b.id
        assert fast.fast.answered == before + len(calls)  # every one of them answered by the fast path
        assert fast.fast.one_write == gathered + len(calls)  # each in one write to the socket, under real uvicorn
        a.close()
        b.close()


# each changes one thing about an ordinary tools/call of an open session; the SDK answers all of them
REFUSED: dict[str, dict[str, Any]] = {
    "unknown session": {"headers": {"mcp-session-id": "0" * 32}},
    "protocol version it does not speak": {"headers": {"mcp-protocol-version": "1999-01-01"}},
    "accepts no JSON": {"headers": {"accept": "text/event-stream"}},
    "not a JSON body type": {"headers": {"content-type": "text/plain"}},
    "no session header": {"headers": {"mcp-session-id": ""}},
    "foreign host header": {"headers": {"host": "evil.example:80"}},
    "foreign origin": {"headers": {"origin": "http://evil.example"}},
    "batch": {"body": [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": STATE_TOOL}}]},
    "no id": {"body": {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": STATE_TOOL}}},
    "another method": {"body": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}},
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_sdk_would_refuse_still_reaches_it(pair: tuple[EnvMCPServer, str, str], case: str) -> None:
    fast, fast_url, plain_url = pair
    assert fast.fast is not None
    change = REFUSED[case]
    default = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": STATE_TOOL, "arguments": {}}}
    body = json.dumps(change.get("body", default))
    answers = []
    with httpx.Client(timeout=30) as http:
        for url in (fast_url, plain_url):
            s = RawSession(http, url)
            assert s.call(STATE_TOOL, {}).status_code == 200
            headers = {**JSON_HEADERS, "mcp-session-id": s.id, "mcp-protocol-version": PROTOCOL}
            headers.update(change.get("headers", {}))
            headers = {k: v for k, v in headers.items() if v}
            before = fast.fast.answered
            r = http.post(url, content=body, headers=headers)
            assert fast.fast.answered == before, "the fast path answered a request the SDK must see"
            status, got, _, _ = (
                _answer(r)
                if r.headers.get("content-type", "").startswith("application/json")
                else (
                    r.status_code,
                    r.text,
                    None,
                    None,
                )
            )
            answers.append((status, got))
            s.close()
    assert answers[0][0] == answers[1][0], answers
    if answers[0][0] == 200:  # answered (by the SDK on both): the same answer
        assert answers[0][1] == answers[1][1]


# what no JSON-RPC answer could carry, or what the SDK would meet with a 500, a 202 and no answer, or a 9 KB warning:
# a 400 before the SDK reads it, on both paths alike (a flood of them costs the event loop next to nothing)
_CALL = '{"jsonrpc": "2.0", "id": ID, "method": "tools/call", "params": PARAMS}'
ENVELOPE: dict[str, tuple[str, int, int | None]] = {  # body, the JSON-RPC error code, the id the answer keeps
    "an id no UTF-8 can write": (_CALL.replace("ID", '"\\ud800"').replace("PARAMS", '{"name": "N"}'), -32600, None),
    "a float id": (_CALL.replace("ID", "1.5").replace("PARAMS", '{"name": "N"}'), -32600, None),
    "a null id": (_CALL.replace("ID", "null").replace("PARAMS", '{"name": "N"}'), -32600, None),
    "a boolean id": (_CALL.replace("ID", "true").replace("PARAMS", '{"name": "N"}'), -32600, None),
    "arguments a list": (_CALL.replace("ID", "1").replace("PARAMS", '{"name": "N", "arguments": [1]}'), -32602, 1),
    "params a list": (_CALL.replace("ID", "7").replace("PARAMS", "[1]"), -32602, 7),
    "a tool name no UTF-8 can write": (_CALL.replace("ID", "2").replace("PARAMS", '{"name": "\\udfff"}'), -32602, 2),
    "a method no UTF-8 can write": ('{"jsonrpc": "2.0", "id": 3, "method": "\\ud800"}', -32600, 3),
    "NaN, which JSON has not": (
        _CALL.replace("ID", "1").replace("PARAMS", '{"name": "N", "arguments": {"p": NaN}}'),
        -32700,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(ENVELOPE))
def test_a_request_no_answer_could_carry_is_a_400_on_both_paths(pair: tuple[EnvMCPServer, str, str], case: str) -> None:
    fast, fast_url, plain_url = pair
    assert fast.fast is not None
    text, code, rid = ENVELOPE[case]
    body = text.replace('"N"', json.dumps(STATE_TOOL))
    with httpx.Client(timeout=30) as http:
        for url in (fast_url, plain_url):
            s = RawSession(http, url)
            assert s.call(STATE_TOOL, {}).status_code == 200
            headers = {**JSON_HEADERS, "mcp-session-id": s.id, "mcp-protocol-version": PROTOCOL}
            before = fast.fast.answered
            r = http.post(url, content=body, headers=headers)
            assert r.status_code == 400, (case, r.status_code, r.text)
            assert r.json()["error"]["message"].startswith("the request body: "), r.text
            assert (r.json()["error"]["code"], r.json()["id"]) == (code, rid), r.text
            assert fast.fast.answered == before
            s.close()


# a method the SDK does not know, or knows with params its model refuses: the SDK answered each with a warning printing
# every message type's validation error (~18 KB, ~20 ms on the loop), under no log budget. Answered before it now, as a
# client's session can read it: a request's JSON-RPC error with a 200 (the SDK's client dies on a 400), a
# notification accepted and dropped
UNUSABLE: dict[str, tuple[str, int, int | None]] = {  # body, the HTTP status, the JSON-RPC error code
    "an unknown method": ('{"jsonrpc": "2.0", "id": 4, "method": "foo/bar", "params": {}}', 200, -32601),
    "resources/read without its uri": (
        '{"jsonrpc": "2.0", "id": 5, "method": "resources/read", "params": {}}',
        200,
        -32602,
    ),
    "initialize without its fields": ('{"jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {}}', 200, -32602),
    "an unknown notification": ('{"jsonrpc": "2.0", "method": "notifications/nope"}', 202, None),
    "a notification its model refuses": (
        '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}}',
        202,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_a_message_mcp_has_no_use_for_is_answered_before_the_sdk_and_the_session_goes_on(
    pair: tuple[EnvMCPServer, str, str], case: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, fast_url, _ = pair
    text, status, code = UNUSABLE[case]
    with httpx.Client(timeout=30) as http:
        s = RawSession(http, fast_url)
        headers = {**JSON_HEADERS, "mcp-session-id": s.id, "mcp-protocol-version": PROTOCOL}
        with caplog.at_level("WARNING"):
            r = http.post(fast_url, content=text, headers=headers)
        assert r.status_code == status, (case, r.status_code, r.text)
        if code is not None:
            assert (r.json()["error"]["code"], r.json()["id"]) == (code, json.loads(text)["id"]), r.text
        assert "Failed to validate" not in caplog.text  # the SDK never saw it
        assert s.call(STATE_TOOL, {}).status_code == 200  # the session goes on
        s.close()


def test_a_closed_session_is_gone_for_the_fast_path_too(pair: tuple[EnvMCPServer, str, str]) -> None:
    _, fast_url, _ = pair
    with httpx.Client(timeout=30) as http:
        s = RawSession(http, fast_url)
        book = {"hotel_id": "HT-POR-01", "guest_name": "Ana", "check_in": "2026-03-01", "nights": 2}
        assert s.call("book_room", book).status_code == 200
        assert s.call(STATE_TOOL, {}).status_code == 200
        s.close()
        assert s.call(STATE_TOOL, {}).status_code == 404


async def _race_delete(url: str, method: str, params: dict[str, Any]) -> tuple[int, int, Any]:
    """A fresh session whose request `method` and DELETE are sent at once: (the request's status, the DELETE's,
    the request's body)."""
    async with httpx.AsyncClient(timeout=30) as http:
        hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello_params()}
        opened = await http.post(url, json=hello, headers=JSON_HEADERS)
        headers = {**JSON_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": PROTOCOL}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        request = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
        answer, deleted = await asyncio.gather(request, http.delete(url, headers=headers))
        return answer.status_code, deleted.status_code, answer.json()


def test_a_request_racing_its_sessions_delete_is_answered_200_or_404(pair: tuple[EnvMCPServer, str, str]) -> None:
    """The SDK met its session's closed streams with a 500, or with no answer at all (most races of a tools/list,
    and of an SDK-path call); the request must get its answer or the 404 of an ended session."""
    _, fast_url, plain_url = pair
    call = {"name": "search_hotels", "arguments": {"city": "Lisbon"}}
    for url, method, params in [
        (fast_url, "tools/list", {}),
        (plain_url, "tools/list", {}),
        (plain_url, "tools/call", call),
    ]:
        for _ in range(12):
            status, deleted, body = asyncio.run(_race_delete(url, method, params))
            assert deleted == 200 and status in (200, 404), (method, status, body)
            if status == 404:
                assert body["error"]["message"] == "Session not found", body


def test_fast_calls_keep_a_session_alive_and_idle_ones_expire(hotels: Any) -> None:
    server = EnvMCPServer(hotels, default_config="default")
    server.settings.session_idle_timeout = 0.6
    with serving(server.streamable_http_app()) as url, httpx.Client(timeout=30) as http:
        s = RawSession(http, url)
        assert s.call(STATE_TOOL, {}).status_code == 200
        assert server.fast is not None
        before = server.fast.answered
        for _ in range(8):  # 1.6 s of calls 0.2 s apart: longer than the idle timeout, never idle that long
            asyncio.run(asyncio.sleep(0.2))
            assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 200
        assert server.fast.answered == before + 8
        asyncio.run(asyncio.sleep(1.5))  # idle past the timeout: the SDK ends the session
        assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 404


def test_a_get_is_405_on_the_mcp_endpoint_and_404_elsewhere(hotels: Any) -> None:
    server = EnvMCPServer(hotels, default_config="default")
    with serving(server.streamable_http_app()) as url, httpx.Client(timeout=30) as http:
        stream = http.get(url, headers={"accept": "text/event-stream"})
        assert stream.status_code == 405 and stream.headers["allow"] == "POST, DELETE"
        elsewhere = url.rsplit("/", 1)[0] + "/nosuch"
        assert http.get(elsewhere).status_code == 404 and http.post(elsewhere, json={}).status_code == 404


def test_a_call_off_the_loop_longer_than_the_idle_timeout_keeps_its_session(
    hotels: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK holds a session's idle timer while it serves a request; the fast path does too while a call waits
    off the loop (a control tool, a slow environment): a 1 s call under a 0.6 s idle timeout, then the next."""
    server = EnvMCPServer(hotels, default_config="default")
    server.settings.session_idle_timeout = 0.6
    dispatch = server.dispatch
    during: list[float] = []

    def slow(key: Any, *args: Any, **kwargs: Any) -> Any:  # the environment's call, on its worker thread
        if args[1] == STATE_TOOL:
            during.append(key.idle_scope.deadline)
            time.sleep(1.0)
        return dispatch(key, *args, **kwargs)

    monkeypatch.setattr(server, "dispatch", slow)
    with serving(server.streamable_http_app()) as url, httpx.Client(timeout=30) as http:
        s = RawSession(http, url)
        assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 200  # opens the session's state
        assert server.fast is not None and server.fast.answered == 1
        assert s.call(STATE_TOOL, {}).status_code == 200
        assert server.fast.answered == 2 and during == [math.inf]  # held off while it ran, as the SDK would
        assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 200


def test_back_to_back_fast_calls_leave_the_idle_deadline_in_place_until_it_lags(hotels: Any) -> None:
    """Each push of a session's idle deadline reschedules its timer: calls closer together than the slack
    (1 % of the timeout here: 0.3 s) leave it where it is, a call after a longer pause pushes it a full
    timeout on, and the SDK's own requests still hold the session as before."""
    server = EnvMCPServer(hotels, default_config="default")
    server.settings.session_idle_timeout = 30.0
    with serving(server.streamable_http_app()) as url, httpx.Client(timeout=30) as http:
        s = RawSession(http, url)
        assert s.call(STATE_TOOL, {}).status_code == 200
        scope = server.session_manager._server_instances[s.id].idle_scope
        assert scope is not None and math.isfinite(scope.deadline)
        first = scope.deadline
        for _ in range(5):
            assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 200
        assert scope.deadline == first
        asyncio.run(asyncio.sleep(0.4))
        assert s.call("search_hotels", {"city": "Lisbon"}).status_code == 200
        assert scope.deadline >= first + 0.4


async def test_concurrent_fast_sessions_stay_isolated(pair: tuple[EnvMCPServer, str, str], hotels: Any) -> None:
    fast, fast_url, _ = pair
    guests = [f"Guest {i}" for i in range(16)]

    def plan(guest: str, i: int) -> list[tuple[str, dict[str, Any]]]:
        book = {"hotel_id": "HT-LIS-01" if i % 2 else "HT-POR-01", "guest_name": guest, "check_in": "2026-03-01"}
        return [
            ("book_room", {**book, "nights": 1 + i % 3}),
            ("search_hotels", {"city": "Lisbon"}),
            ("book_room", {**book, "nights": 2}),
            ("modify_booking", {"booking_id": "BK-0002", "nights": 4}),
            ("cancel_booking", {"booking_id": "BK-0003"}),
        ]

    async def run(i: int) -> Any:
        async with httpx.AsyncClient(timeout=30) as http:
            hello = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            }
            r = await http.post(fast_url, content=json.dumps(hello), headers=JSON_HEADERS)
            headers = {**JSON_HEADERS, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": PROTOCOL}
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await http.post(fast_url, content=json.dumps(note), headers=headers)
            for n, (tool, arguments) in enumerate([*plan(guests[i], i), (STATE_TOOL, {})], 1):
                message = {
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": arguments},
                }
                r = await http.post(fast_url, content=json.dumps(message), headers=headers)
                await asyncio.sleep(0)
            return json.loads(r.json()["result"]["content"][0]["text"])

    assert fast.fast is not None
    before = fast.fast.answered
    states = await asyncio.gather(*(run(i) for i in range(16)))
    assert fast.fast.answered - before >= 16 * 5  # all but each session's first call
    for i, state in enumerate(states):
        alone = Session.fork(hotels, "default")
        for tool, arguments in plan(guests[i], i):
            alone.call(tool, arguments)
        assert state == alone.dump(), f"session {i} saw another session's calls"


def test_blocking_environments_take_the_fast_path_in_order(tmp_path: Path) -> None:
    """A sandboxed (untrusted) environment: its calls run off the event loop, one at a time per session."""
    env = load_untrusted_folder(ROOT / "envs" / "hotels", Settings(root=ROOT, bfcl=False, sandbox_workers=1))
    assert env.blocking_io
    fast = EnvMCPServer(env, default_config="default")
    plain = EnvMCPServer(env, default_config="default", fast_calls=False)
    calls = [
        ("book_room", {"hotel_id": "HT-POR-01", "guest_name": "Ana", "check_in": "2026-03-01", "nights": 2}),
        ("modify_booking", {"booking_id": "BK-0002", "nights": 3}),
        ("get_booking", {"booking_id": "BK-0002"}),
        ("cancel_booking", {"booking_id": "BK-0404"}),
        (STATE_TOOL, {}),
    ]
    with (
        serving(fast.streamable_http_app()) as fast_url,
        serving(plain.streamable_http_app()) as plain_url,
        httpx.Client(timeout=60) as http,
    ):
        a, b = RawSession(http, fast_url), RawSession(http, plain_url)
        a.call(STATE_TOOL, {})
        b.call(STATE_TOOL, {})
        assert fast.fast is not None
        before, gathered = fast.fast.answered, fast.fast.one_write
        for tool, arguments in calls:
            assert _answer(a.call(tool, arguments))[:2] == _answer(b.call(tool, arguments))[:2]
        assert fast.fast.answered == before + len(calls)
        assert fast.fast.one_write == gathered  # plain uvicorn (no GuardedHTTP): no cycle in the scope, two writes


# ---- one write an answer --------------------------------------------------------------------------------------


class _RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _cycle(keep_alive: bool) -> tuple[Any, _RecordingTransport, list[bool]]:
    import logging
    import weakref

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from envfactory.serve.http import CYCLE

    transport, done = _RecordingTransport(), []
    scope: dict[str, Any] = {"type": "http", "method": "POST", "http_version": "1.1", "path": "/mcp", "headers": []}
    cycle = RequestResponseCycle(
        scope,  # type: ignore[arg-type]
        transport,
        FlowControl(transport),
        logging.getLogger("t"),
        logging.getLogger("t.access"),
        False,
        [(b"server", b"uvicorn")],
        asyncio.Event(),
        False,
        keep_alive,
        lambda: done.append(True),
    )
    scope[CYCLE] = weakref.ref(cycle)  # as GuardedHTTP puts it there
    return cycle, transport, done


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_a_fast_answer_leaves_in_one_write_as_uvicorn_would_send_it(keep_alive: bool) -> None:
    """uvicorn writes the head and the body of an answer apart (two send system calls on an idle connection);
    the fast path gathers them into one write: the same bytes, the cycle finished as uvicorn finishes it, and
    a connection uvicorn closes after the answer closed after the write."""
    from envfactory.serve.asgi import send_as_one_write

    headers = [(b"content-length", b"11"), (b"content-type", b"application/json")]
    cycle, transport, done = _cycle(keep_alive)
    assert await send_as_one_write(cycle.send, headers, b'{"ok": true}'[:11], cycle.scope)
    two, two_transport, _ = _cycle(keep_alive)  # what uvicorn writes for the same two messages
    await two.send({"type": "http.response.start", "status": 200, "headers": headers})
    await two.send({"type": "http.response.body", "body": b'{"ok": true}'[:11]})
    assert len(transport.writes) == 1 and len(two_transport.writes) == 2
    assert transport.writes[0] == b"".join(two_transport.writes)
    assert cycle.response_complete and done == [True] and cycle.transport is transport
    assert transport.closed is (not keep_alive) is two_transport.closed


async def test_without_uvicorns_cycle_in_the_scope_the_two_asgi_messages_go_as_they_are() -> None:
    from envfactory.serve.asgi import send_as_one_write

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    assert not await send_as_one_write(send, [(b"content-length", b"2")], b"{}", {})
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"] and sent[1]["body"] == b"{}"
