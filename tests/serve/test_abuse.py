"""Serving under hostile clients: real servers (the CLI's own, or uvicorn in-process) over real HTTP.

Each test holds a general property with one client behaving badly and another behaving well: the
well-behaved session's calls keep completing within a generous bound (these are not benchmarks:
benchmarks/abuse.py measures), the bad requests get a 4xx/503 with a JSON-RPC error body, the server
stays up and logs no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from envfactory.config import Settings
from envfactory.env import Environment, State
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.metatools import Hub
from envfactory.serve.hub_server import HubMCPServer
from envfactory.serve.limits import ServeLimits
from envfactory.serve.mcp_server import RESET_TOOL, EnvMCPServer
from tests.support.serve import (
    JSON_HEADERS,
    RawSession,
    abuse_project,
    post_head,
    read_answers,
    serve_process,
    serving,
)

HOTEL = {"hotel_id": "HT-LIS-01"}
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}},
}
MB = 1024 * 1024


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return abuse_project(tmp_path_factory.mktemp("abuse") / "project")


@pytest.fixture(scope="module")
def abuse_pool(project: Path) -> EnvPool:
    return EnvPool(Settings(root=project, bfcl=False))


def _text(res: httpx.Response) -> str:
    assert res.status_code == 200, res.text
    body = res.json()
    assert "result" in body, body
    return str(body["result"]["content"][0]["text"])


def _no_traceback(log: Path) -> None:
    text = log.read_text()
    assert "Traceback" not in text and "╭─" not in text, text[-3000:]


class GoodSession:
    """A well-behaved client: one SDK session calling a tool in a loop in its own thread, every call timed."""

    def __init__(self, url: str, tool: str = "get_hotel", arguments: dict[str, Any] | None = None) -> None:
        self.url, self.tool, self.arguments = url, tool, arguments or HOTEL
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with streamable_http_client(self.url) as (r, w, _), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool(self.tool, self.arguments)
            self.ready.set()
            while not self.stop.is_set():
                started = time.perf_counter()
                res = await s.call_tool(self.tool, self.arguments)
                self.latencies.append(time.perf_counter() - started)
                if res.isError:
                    self.errors.append(str(res.content))
                await asyncio.sleep(0.02)

    def __enter__(self) -> GoodSession:
        self.thread.start()
        assert self.ready.wait(30), "the well-behaved session did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


# ---- request bodies ----------------------------------------------------------------------------------


def _arrays(n_bytes: int) -> bytes:
    return b"[" + b"[]," * (n_bytes // 3) + b"[]]"


def test_huge_or_nested_bodies_are_refused_while_other_sessions_go_on(project: Path) -> None:
    bodies: dict[str, Any] = {
        "16 MB of empty arrays": _arrays(16 * MB),
        "4 MB of empty arrays": _arrays(4 * MB - 10),
        "4 MB of numbers": b"[" + b"1," * (2 * MB - 8) + b"1]",
        "5,000 levels deep": b"[" * 5000 + b"]" * 5000,
        "60 levels of 1,000-wide objects": b'{"a":' * 60 + b"[" + b"{}," * 1000 + b"{}]" + b"}" * 60,
        # CPython converts an integer literal in time quadratic in its digits, holding the GIL: 0.23 s here
        "4 MB of 4,299-digit integers": b"[" + b",".join([b"1" * 4299] * 950) + b"]",
    }
    answers: dict[str, list[tuple[int, dict[str, Any]]]] = {}

    def abuse(url: str) -> None:
        with httpx.Client(timeout=120) as http:
            for _ in range(2):
                for label, body in bodies.items():
                    res = http.post(url, content=body, headers=JSON_HEADERS)
                    answers.setdefault(label, []).append((res.status_code, res.json()))
                # the same 4 MB without a declared length: read in chunks, refused at the limit
                chunks = (_arrays(64 * 1024) for _ in range(80))
                res = http.post(url, content=chunks, headers=JSON_HEADERS)
                answers.setdefault("5 MB streamed", []).append((res.status_code, res.json()))

    with serve_process(project, "serve", "hotels") as (url, proc, log), GoodSession(url) as good:
        attacker = threading.Thread(target=abuse, args=(url,))
        attacker.start()
        attacker.join(300)
        time.sleep(0.2)
        alive = proc.poll() is None
    assert not attacker.is_alive() and alive
    assert len(answers) == len(bodies) + 1
    for label, got in answers.items():
        for status, body in got:
            assert status in (400, 413), (label, status, body)
            assert body["jsonrpc"] == "2.0" and body["error"]["message"], (label, body)
    assert all("digits" in body["error"]["message"] for _, body in answers["4 MB of 4,299-digit integers"])
    # the other session's calls went on while the bodies were refused (today's parse took 7 s per 4 MB)
    assert good.latencies and not good.errors
    assert max(good.latencies) < 2.0, sorted(good.latencies)[-5:]
    _no_traceback(log)


# ---- connections -------------------------------------------------------------------------------------


def _closed(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset); False while it is open and silent."""
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        return sock.recv(65536) == b"" or _closed(sock)
    except OSError:
        return True


def test_connections_that_never_finish_their_headers_are_closed(project: Path) -> None:
    timeout = 1.0
    env = {"ENVFACTORY_SERVE_HEADER_TIMEOUT_S": str(timeout)}
    with serve_process(project, "serve", "hotels", env=env) as (url, proc, log), GoodSession(url) as good:
        port = int(url.split(":")[2].split("/")[0])
        socks: list[socket.socket] = []
        for i in range(50):
            sock = socket.create_connection(("127.0.0.1", port))
            if i % 3 == 1:  # headers begun, never ended
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(sock)
        # and one that finished a request, then began the next one's headers
        again = socket.create_connection(("127.0.0.1", port))
        again.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert again.recv(65536).startswith(b"HTTP/1.1 405")
        again.sendall(b"POST /mcp HTTP/1.1\r\n")
        socks.append(again)
        started = time.monotonic()
        closed_at: dict[int, float] = {}
        while len(closed_at) < len(socks) and time.monotonic() - started < timeout + 5:
            for i, sock in enumerate(socks):
                if i in closed_at:
                    continue
                if i % 3 == 2:  # a slow loris: one header byte now and then keeps no connection alive
                    with contextlib.suppress(OSError):
                        sock.send(b"X")
                if _closed(sock):
                    closed_at[i] = time.monotonic() - started
            time.sleep(0.1)
        for sock in socks:
            sock.close()
        n_calls = len(good.latencies)
        alive = proc.poll() is None
    assert alive
    assert len(closed_at) == len(socks), f"{len(socks) - len(closed_at)} connections still open after {timeout + 5} s"
    assert max(closed_at.values()) < timeout + 5
    assert n_calls > 0 and not good.errors and max(good.latencies) < 2.0
    _no_traceback(log)


def test_slow_bodies_at_the_connection_cap_cannot_keep_new_clients_out(project: Path) -> None:
    """One client holds every connection the server allows, each with its headers sent and its body trickling
    (the body's own deadline is 30 s, and the client reconnects). A new client still gets its session: the
    connection stalled longest makes room for it."""
    env = {"ENVFACTORY_SERVE_MAX_CONNECTIONS": "64"}
    head = (
        b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"accept: application/json, text/event-stream\r\ncontent-length: 1000000\r\n\r\n["
    )
    with serve_process(project, "serve", "hotels", env=env) as (url, proc, log), GoodSession(url) as good:
        port = int(url.split(":")[2].split("/")[0])
        slow: list[socket.socket] = []
        for _ in range(4):  # the ones refused over the cap are opened again: the server stays at its cap
            for i, sock in enumerate(slow):
                if _closed(sock):
                    sock.close()
                    slow[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
                    slow[i].sendall(head)
            while len(slow) < 100:
                slow.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                slow[-1].sendall(head)
            time.sleep(0.5)
        with httpx.Client(timeout=30) as http:
            late = RawSession(http, url)
            assert "Casa do Rio" in _text(late.call("get_hotel", HOTEL))
        for sock in slow:
            sock.close()
        alive = proc.poll() is None
    assert alive
    assert good.latencies and not good.errors and max(good.latencies) < 2.0
    _no_traceback(log)


def _post_on(sock: socket.socket, payload: dict[str, Any]) -> int:
    """POST `payload` to /mcp on an open keep-alive socket; the answer's status (its body read off the socket)."""
    body = json.dumps(payload).encode()
    sock.sendall(post_head(f"127.0.0.1:{sock.getpeername()[1]}", len(body)) + body)
    return read_answers(sock)[0][0]


def test_a_flood_at_the_connection_cap_never_closes_an_answered_keep_alive_connection(project: Path) -> None:
    """A session's kept-alive connection, answered and idle past the stall time, is not the one a flood of
    silent connections at the cap closes to make room: the silent ones make room for each other."""
    env = {"ENVFACTORY_SERVE_MAX_CONNECTIONS": "64"}
    with serve_process(project, "serve", "hotels", env=env) as (url, proc, log):
        port = int(url.split(":")[2].split("/")[0])
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert _post_on(kept, INIT) == 200
        silent: list[socket.socket] = []
        until = time.monotonic() + 2.5  # past the 1 s stall time, inside the 5 s keep-alive
        while time.monotonic() < until:
            for i, sock in enumerate(silent):
                if _closed(sock):
                    sock.close()
                    silent[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
            while len(silent) < 100:
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.2)
        assert not _closed(kept)
        assert _post_on(kept, INIT) == 200  # the same connection, answered again
        kept.close()
        for sock in silent:
            sock.close()
        assert proc.poll() is None
    _no_traceback(log)


def _nofile(n: int) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


def test_out_of_descriptors_the_server_answers_503_and_keeps_its_sessions(project: Path) -> None:
    with serve_process(project, "serve", "hotels", preexec=_nofile(256)) as (url, proc, log):
        port = int(url.split(":")[2].split("/")[0])
        with httpx.Client(timeout=30) as http:
            session = RawSession(http, url)  # its connection stays open (keep-alive) through the flood
            assert "Casa do Rio" in _text(session.call("get_hotel", HOTEL))
            flood = []
            for _ in range(400):
                try:
                    flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break
            time.sleep(1.5)
            assert proc.poll() is None, log.read_text()[-3000:]
            assert "Casa do Rio" in _text(session.call("get_hotel", HOTEL))  # the open session is served
            try:  # a new connection now: served (an idle one made room), a 503 saying why, or (while accept()
                late = httpx.post(url, json=INIT, headers=JSON_HEADERS, timeout=3)  # waits for a descriptor) nothing
                assert late.status_code == 200 or (
                    late.status_code == 503 and "connection limit" in late.json()["error"]["message"]
                )
            except httpx.TransportError:
                pass
            for sock in flood:
                sock.close()
            time.sleep(1.5)
            fresh = RawSession(httpx.Client(timeout=30), url)
            assert "Casa do Rio" in _text(fresh.call("get_hotel", HOTEL))
        assert proc.poll() is None
    text = log.read_text()
    assert "Traceback" not in text and text.count("out of resources") <= 10, text[-3000:]


# ---- threads: one app's slow calls never hold another app's ---------------------------------------


async def _open(url: str, n: int, http: httpx.AsyncClient) -> list[str]:
    async def one() -> str:
        res = await http.post(url, json=INIT, headers=JSON_HEADERS)
        sid = res.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(url, json=note, headers={**JSON_HEADERS, "mcp-session-id": sid})
        return sid

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _call(http: httpx.AsyncClient, url: str, sid: str, tool: str, arguments: dict[str, Any]) -> float:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {**JSON_HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
    started = time.perf_counter()
    res = await http.post(url, json=body, headers=headers)
    assert res.status_code == 200 and not res.json()["result"].get("isError"), res.text
    return time.perf_counter() - started


def test_a_slow_app_cannot_delay_another_apps_calls_in_the_hub(project: Path) -> None:
    """More slow calls in flight than anyio's default thread limiter holds (40): the fast app's calls do
    not queue behind them."""
    slow_call = {"app": "slowpoke", "tool": "wait", "arguments": {"seconds": 4.0}}
    fast_call = {"app": "hotels", "tool": "get_hotel", "arguments": HOTEL}

    async def scenario(url: str) -> tuple[list[float], list[float]]:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            slow_ids = await _open(url, 48, http)
            [good] = await _open(url, 1, http)
            await _call(http, url, good, "call_tool", fast_call)
            slow = [asyncio.create_task(_call(http, url, sid, "call_tool", slow_call)) for sid in slow_ids]
            await asyncio.sleep(0.5)
            fast = []
            for _ in range(5):
                fast.append(await _call(http, url, good, "call_tool", fast_call))
                fast.append(await _call(http, url, good, "list_tools", {"app": "hotels"}))
            done = [t for t in slow if t.done()]
            for task in slow:
                task.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
            return fast, [t.result() for t in done]

    with serve_process(project, "hub", "serve") as (url, proc, log):
        fast, slow_done = asyncio.run(scenario(url))
        assert proc.poll() is None
    assert max(fast) < 2.0, fast  # with one thread limiter for all apps: queued behind the slow calls, ~4 s
    assert not slow_done, "the slow calls were over before the fast ones were measured"
    _no_traceback(log)


def test_a_session_whose_calls_are_slow_runs_them_off_the_event_loop(project: Path) -> None:
    """A single-environment server runs a trusted app in-process; once a session's call turned out slow,
    its later calls leave the event loop, so other sessions are not held by them."""

    async def scenario(url: str) -> tuple[list[float], bool]:
        async with httpx.AsyncClient(timeout=60) as http:
            slow, good = await _open(url, 2, http)
            await _call(http, url, slow, "wait", {"seconds": 0.3})  # quick enough to be run inline once
            long = asyncio.create_task(_call(http, url, slow, "wait", {"seconds": 3.0}))
            await asyncio.sleep(0.3)
            times = [await _call(http, url, good, "wait", {"seconds": 0}) for _ in range(5)]
            overlapped = not long.done()
            await long
            return times, overlapped

    with serve_process(project, "serve", "slowpoke") as (url, proc, log):
        times, overlapped = asyncio.run(scenario(url))
        assert proc.poll() is None
    assert max(times) < 1.5, times  # run on the event loop, they waited for the 3 s call
    assert overlapped, "the slow call was over before the other session's calls were measured"
    _no_traceback(log)


# ---- fair turns on the app's threads --------------------------------------------------------------------

ORDER: list[str] = []  # the labels of `gate`'s calls, in the order they ran
GATE = threading.Event()  # `work(hold=True)` holds its thread until the test sets it


class Counter(State):
    calls: int = 0


def _gate_env() -> Environment:
    """An in-process app whose tool notes the order calls run in and can hold the thread it runs on."""
    env = Environment("gate", Counter, description="Calls, in the order they run.", domain="utilities")

    @env.tool(kind="write")
    def work(db: Counter, label: str, hold: bool = False, spin: int = 0) -> int:
        """Note this call's label; with `hold`, keep the thread until the test lets go.

        Args:
            label: Who is calling.
            hold: Wait for the test's gate.
            spin: Steps of busy work to do first (an expensive call).
        """
        ORDER.append(label)
        for _ in range(spin):  # busy work
            pass
        if hold:
            GATE.wait(30)
        db.calls += 1
        return db.calls

    return env


class _Key:
    """Stands for an MCP session's transport: the server keys what it holds per session weakly on an object."""


def test_sessions_flooding_an_apps_thread_cannot_queue_ahead_of_a_quiet_sessions_call() -> None:
    """A server's in-process app lends one thread to the calls that leave the event loop (a hub app's, a slow
    session's). Twelve sessions that have had expensive calls on it keep it busy, four calls queued each, all
    asked before a quiet session's cheap call: that call runs next once the thread is free. Its wait is bounded
    in calls (the one running), not by the backlog; before, the thread's queue was first come, first served and
    the quiet call ran after all twelve sessions' first calls."""
    server = EnvMCPServer(_gate_env(), default_config={"calls": 0}, limits=ServeLimits(cpu_threads=1))
    flooders = [_Key() for _ in range(12)]
    holder, quiet = _Key(), _Key()
    choice = server.default_choice
    for key in (*flooders, holder):
        server.mark_slow(key)  # their calls run on the app's thread, as a slow session's (or a hub app's) do

    async def scenario() -> None:
        await server.answer(quiet, choice, "work", {"label": "quiet-before"})  # it has called before, cheaply
        server.mark_slow(quiet)  # and its next call runs on the app's thread too
        for i, key in enumerate(flooders):  # each has had the thread before, for expensive calls
            await server.answer(key, choice, "work", {"label": f"warm-{i}", "spin": 300_000})
        ORDER.clear()
        GATE.clear()
        held = asyncio.create_task(server.answer(holder, choice, "work", {"label": "holder", "hold": True}))
        while "holder" not in ORDER:  # the thread is taken
            await asyncio.sleep(0.001)
        flood = [
            asyncio.create_task(server.answer(key, choice, "work", {"label": f"flood-{i}"}))
            for i, key in enumerate(flooders)
            for _ in range(4)
        ]
        for _ in range(50):  # every flood call waits (for its session's turn, or for the thread)
            await asyncio.sleep(0)
        late = asyncio.create_task(server.answer(quiet, choice, "work", {"label": "quiet"}))
        for _ in range(50):
            await asyncio.sleep(0)
        GATE.set()
        results = await asyncio.gather(held, late, *flood)
        assert not any(r.isError for r in results), [r.content for r in results if r.isError]

    asyncio.run(scenario())
    assert ORDER[:2] == ["holder", "quiet"], ORDER
    assert sorted(ORDER[2:]) == sorted(f"flood-{i}" for i in range(12) for _ in range(4))  # and all of them ran


def test_a_hub_sessions_cheap_call_does_not_wait_for_the_apps_thread(abuse_pool: EnvPool) -> None:
    """In the hub, a cheap call_tool of an in-process app the episode already holds runs on the event loop, as
    in a single-environment server: it is answered while another session's slow call holds the app's one
    thread (before, every hub call queued for that thread, first come, first served)."""
    server = HubMCPServer(Hub(abuse_pool))
    slow, quiet = _Key(), _Key()
    wait = {"app": "slowpoke", "tool": "wait"}

    async def scenario() -> bool:
        for key in (quiet, quiet, slow):  # each episode forks slowpoke (on a thread: a first call of the app)
            res = await server.answer(key, None, "call_tool", {**wait, "arguments": {"seconds": 0}})
            assert not res.isError, res.content
        server.mark_slow(slow)  # its calls leave the loop: the next one holds the app's thread
        held = asyncio.create_task(server.answer(slow, None, "call_tool", {**wait, "arguments": {"seconds": 3}}))
        for _ in range(50):
            await asyncio.sleep(0)
        res = await server.answer(quiet, None, "call_tool", {**wait, "arguments": {"seconds": 0}})
        assert not res.isError, res.content
        overtaken = not held.done()
        await held
        return overtaken

    assert asyncio.run(scenario()), "the quiet session's call waited for the slow call's thread"


def test_a_hub_session_whose_first_call_of_an_app_was_slow_runs_the_next_off_the_loop(abuse_pool: EnvPool) -> None:
    """A hub session's first call of an app forks the app's session on a thread; if it was slow (here it slept),
    the session's next call of it stays off the event loop too, so other sessions' calls go on meanwhile."""
    server = HubMCPServer(Hub(abuse_pool))
    slow, other = _Key(), _Key()
    get = {"app": "hotels", "tool": "get_hotel", "arguments": HOTEL}

    def wait(seconds: float) -> dict[str, Any]:
        return {"app": "slowpoke", "tool": "wait", "arguments": {"seconds": seconds}}

    async def scenario() -> bool:
        assert not (await server.answer(other, None, "call_tool", get)).isError
        assert not (await server.answer(slow, None, "call_tool", wait(0.3))).isError
        held = asyncio.create_task(server.answer(slow, None, "call_tool", wait(2.0)))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not (await server.answer(other, None, "call_tool", get)).isError
        overtaken = not held.done()
        await held
        return overtaken

    assert asyncio.run(scenario()), "the slow session's second call held the event loop"


def test_a_sessions_first_call_is_answered_off_the_sdk_however_large(abuse_pool: EnvPool) -> None:
    """A session's first tool call (a 250 KB reset config here) is answered by the fast path like the others:
    the SDK would validate it with pydantic on the event loop (~20 ms each, while every session waits), and it
    starts the session from the connection's chosen scenario all the same."""
    env = abuse_pool.get("hotels")
    server = EnvMCPServer(env, default_config="default")
    big = env.scenario("default")
    template = big["hotels"]["HT-LIS-01"]
    big["hotels"] = {f"HT-BIG-{i}": {**template, "id": f"HT-BIG-{i}"} for i in range(1200)}
    with serving(server) as url, httpx.Client(timeout=60) as http:
        assert server.fast is not None
        first = RawSession(http, url)
        res = first.call(RESET_TOOL, {"config": big})
        assert len(res.request.content) > 200_000 and json.loads(_text(res)) == {"reset": True, "source": "<config>"}
        assert server.fast.answered == 1
        assert "HT-BIG-1199" in _text(first.call("search_hotels", {"city": "Lisbon"}))  # the loaded state
        chosen = RawSession(http, url + "?scenario=busy")  # a first call starts from the connection's choice
        assert "HT-LIS-02" not in _text(chosen.call("search_hotels", {"city": "Lisbon"}))
        assert "HT-LIS-02" in _text(RawSession(http, url).call("search_hotels", {"city": "Lisbon"}))
        assert server.fast.answered == 4


# ---- sessions and memory -----------------------------------------------------------------------------


def test_a_full_server_refuses_new_sessions_clearly_and_ends_the_longest_idle(project: Path) -> None:
    env = {"ENVFACTORY_SERVE_MAX_SESSIONS": "3", "ENVFACTORY_SERVE_EVICT_IDLE_S": "2"}
    with serve_process(project, "serve", "hotels", env=env) as (url, _, log), httpx.Client(timeout=30) as http:
        sessions = [RawSession(http, url) for _ in range(3)]
        refused = http.post(url, json=INIT, headers=JSON_HEADERS)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "the server is full" in message and "3 sessions are open" in message, message
        for s in sessions:  # the open sessions are served
            assert "Casa do Rio" in _text(s.call("get_hotel", HOTEL))
        time.sleep(2.5)
        for s in sessions[1:]:  # the first stays idle; the others are active again
            _text(s.call("get_hotel", HOTEL))
        newcomer = RawSession(http, url)  # room made by ending the longest-idle session
        assert "Casa do Rio" in _text(newcomer.call("get_hotel", HOTEL))
        assert sessions[0].call("get_hotel", HOTEL).status_code == 404
        for s in sessions[1:]:
            assert "Casa do Rio" in _text(s.call("get_hotel", HOTEL))
    _no_traceback(log)
    env = {"ENVFACTORY_SERVE_MEMORY_MB": "1"}
    with serve_process(project, "serve", "hotels", env=env) as (url, _, log):
        res = httpx.post(url, json=INIT, headers=JSON_HEADERS, timeout=30)
        assert res.status_code == 503, res.text
        assert "the server is full" in res.json()["error"]["message"] and "memory" in res.json()["error"]["message"]


def test_a_served_sessions_history_and_configs_are_bounded(abuse_pool: EnvPool) -> None:
    env = abuse_pool.get("hotels")
    limits = ServeLimits(history_calls=5, history_bytes=400_000, max_config_bytes=600_000)
    server = EnvMCPServer(env, default_config="default", limits=limits)
    big = env.scenario("default")
    template = big["hotels"]["HT-LIS-01"]
    big["hotels"] = {f"HT-BIG-{i}": {**template, "id": f"HT-BIG-{i}", "city": "Lisbon"} for i in range(1500)}
    huge = json.loads(json.dumps(big))
    huge["hotels"] = {f"HT-HUGE-{i}": {**template, "id": f"HT-HUGE-{i}"} for i in range(6000)}

    async def scenario(url: str) -> list[tuple[bool, str]]:
        out = []
        async with streamable_http_client(url) as (r, w, _), ClientSession(r, w) as s:
            await s.initialize()
            for i in range(40):
                await s.call_tool("get_hotel", {"hotel_id": f"HT-LIS-0{1 + i % 2}"})
            held = next(iter(server._held.values()))
            out.append((len(held.history) <= 5, str([r.arguments for r in held.history])))
            out.append((held.history[-1].arguments == {"hotel_id": "HT-LIS-02"}, "the newest record is kept"))
            res = await s.call_tool(RESET_TOOL, {"config": big})
            out.append((not res.isError, str(res.content)))
            for _ in range(10):  # ~200 KB answers
                res = await s.call_tool("search_hotels", {"city": "Lisbon"})
                assert not res.isError and len(res.content[0].text) > 150_000
            ring = server._rings[next(iter(server._held.keys()))]
            out.append((ring.total <= 400_000 and len(held.history) <= 2, f"{ring.total} bytes, {len(held.history)}"))
            res = await s.call_tool(RESET_TOOL, {"config": huge})
            message = res.content[0].text
            out.append((res.isError and "over this server's limit of 600000 bytes" in message, message[:300]))
            res = await s.call_tool("get_hotel", {"hotel_id": "HT-BIG-7"})  # the session still holds `big`
            out.append((not res.isError, str(res.content)[:200]))
        return out

    with serving(server) as url:
        for ok, why in asyncio.run(scenario(url)):
            assert ok, why
    # in-process library use keeps every record (the reward and exports read them)
    session = Session.fork(env, "default")
    for _ in range(40):
        session.call("get_hotel", HOTEL)
    assert len(session.history) == 40


def test_a_hub_episodes_calls_are_bounded(abuse_pool: EnvPool) -> None:
    server = HubMCPServer(Hub(abuse_pool), limits=ServeLimits(history_calls=4))
    call = {"app": "hotels", "tool": "get_hotel", "arguments": HOTEL}

    async def scenario(url: str) -> None:
        async with streamable_http_client(url) as (r, w, _), ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(30):
                assert not (await s.call_tool("call_tool", call)).isError
            [episode] = list(server._held.values())
            assert len(episode.calls) <= 4
            assert len(episode.sessions["hotels"].history) <= 4
            assert {id(c.record) for c in episode.calls} == {id(r) for r in episode.sessions["hotels"].history}

    with serving(server) as url:
        asyncio.run(scenario(url))
