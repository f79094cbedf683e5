"""MCP serving over real transports, with the SDK's own client and langchain-mcp-adapters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from envfactory.serve.mcp_server import RESET_TOOL, STATE_TOOL
from envfactory.serve.net import free_port
from envfactory.serve.trainer_client import TrainerSession
from tests.support.paths import ROOT

BOOK = {"hotel_id": "HT-POR-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2}


def _payload(result: Any) -> Any:
    return json.loads(result.content[0].text)


async def _initialize(url: str) -> str:
    async with streamable_http_client(url) as (r, w, _), ClientSession(r, w) as s:
        init = await s.initialize()
        return init.serverInfo.name


@contextmanager
def _cli_http_server(**env_vars: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`envfactory serve hotels --transport http` in its own process: (its URL, the process)."""
    port = free_port()
    env = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), **env_vars}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envfactory.cli", "serve", "hotels", "--transport", "http", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            try:
                # the server answering must be ours, not something else on the port
                assert asyncio.run(asyncio.wait_for(_initialize(url), 5)) == "envfactory-hotels"
                break
            except (OSError, TimeoutError, ExceptionGroup, Exception):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with _cli_http_server() as served:
        yield served


@pytest.fixture(scope="module")
def http_url(http_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return http_server[0]


def _runs_on_uvloop(proc: subprocess.Popen[bytes]) -> bool:
    """Whether uvloop's extension is loaded in the server process (read from the kernel's map of it)."""
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    return any("uvloop" in line and "/loop." in line for line in maps.splitlines())


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads a process's memory map (Linux)")
def test_the_cli_http_server_runs_on_the_event_loop_its_limits_name(
    http_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """`ServeLimits.event_loop`: uvloop by default (FastMCP's own `run` would start asyncio's), asyncio when set;
    a tool call answers on either."""

    async def books(url: str) -> bool:
        async with await TrainerSession.open(url) as env:
            return not (await env.call("book_room", BOOK)).is_error

    url, proc = http_server
    assert asyncio.run(books(url))
    assert _runs_on_uvloop(proc)
    with _cli_http_server(ENVFACTORY_SERVE_EVENT_LOOP="asyncio") as (plain_url, plain):
        assert asyncio.run(books(plain_url))
        assert not _runs_on_uvloop(plain)


async def test_stdio_server_keeps_state_within_the_connection() -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "envfactory.cli", "serve", "hotels"],
        env={**os.environ, "ENVFACTORY_ROOT": str(ROOT)},
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert {"search_hotels", "book_room", "cancel_booking", RESET_TOOL, STATE_TOOL} <= tools.keys()
        assert tools["book_room"].inputSchema["required"] == ["hotel_id", "guest_name", "check_in", "nights"]
        assert tools["get_hotel"].annotations.readOnlyHint is True
        booked = await s.call_tool("book_room", BOOK)
        assert not booked.isError and booked.structuredContent["id"] == "BK-0002"
        got = await s.call_tool("get_booking", {"booking_id": "BK-0002"})
        assert _payload(got)["guest_name"] == "Ana Costa"
        listed = await s.call_tool("list_bookings", {"guest_name": "Ana Costa"})
        assert [b["id"] for b in listed.structuredContent["result"]] == ["BK-0002"]
        bad = await s.call_tool("book_room", {**BOOK, "nights": "two"})
        assert bad.isError and _payload(bad)["error"]["type"] == "invalid_arguments"
        missing = await s.call_tool("get_booking", {"booking_id": "BK-0999"})
        assert missing.isError and _payload(missing)["error"]["type"] == "not_found"


async def test_http_sessions_are_isolated(http_url: str) -> None:
    async with (
        streamable_http_client(http_url) as (r1, w1, _),
        ClientSession(r1, w1) as a,
        streamable_http_client(http_url) as (r2, w2, _),
        ClientSession(r2, w2) as b,
    ):
        await asyncio.gather(a.initialize(), b.initialize())
        ra, rb = await asyncio.gather(a.call_tool("book_room", BOOK), b.call_tool("book_room", BOOK))
        # both sessions start from the same default scenario, so both get the same next id
        assert ra.structuredContent["id"] == rb.structuredContent["id"] == "BK-0002"
        await a.call_tool("cancel_booking", {"booking_id": "BK-0002"})
        sa, sb = await asyncio.gather(a.call_tool(STATE_TOOL, {}), b.call_tool(STATE_TOOL, {}))
        assert _payload(sa)["bookings"]["BK-0002"]["status"] == "cancelled"
        assert _payload(sb)["bookings"]["BK-0002"]["status"] == "confirmed"


async def test_http_initial_config_at_session_start_and_by_reset(http_url: str) -> None:
    async with streamable_http_client(http_url + "?scenario=busy") as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        state = _payload(await s.call_tool(STATE_TOOL, {}))
        assert set(state["hotels"]) == {"HT-LIS-01", "HT-BCN-01"}
        await s.call_tool("cancel_booking", {"booking_id": "BK-0001"})
        reset = await s.call_tool(RESET_TOOL, {"scenario": "busy"})
        assert not reset.isError
        again = _payload(await s.call_tool("get_booking", {"booking_id": "BK-0001"}))
        assert again["status"] == "confirmed"
        custom = {
            "hotels": {
                "H1": {
                    "id": "H1",
                    "name": "Solo",
                    "city": "Oslo",
                    "stars": 2,
                    "price_per_night": 50.0,
                    "rooms_total": 1,
                }
            }
        }
        await s.call_tool(RESET_TOOL, {"config": custom})
        found = await s.call_tool("search_hotels", {"city": "Oslo"})
        assert [h["id"] for h in found.structuredContent["result"]] == ["H1"]
        bad = await s.call_tool(RESET_TOOL, {"scenario": "no_such_scenario"})
        assert bad.isError and "no scenario 'no_such_scenario'" in _payload(bad)["error"]["message"]
        # a typo reset to the default and said so as a success; the state tool took anything
        for tool, arguments in ((RESET_TOOL, {"scenarios": "busy"}), (STATE_TOOL, {"x": 1})):
            typo = await s.call_tool(tool, arguments)
            assert typo.isError and _payload(typo)["error"]["type"] == "invalid_arguments", (tool, arguments)
            assert next(iter(arguments)) in _payload(typo)["error"]["message"]
        found = await s.call_tool("search_hotels", {"city": "Oslo"})  # (the custom state is still there)
        assert [h["id"] for h in found.structuredContent["result"]] == ["H1"]


async def test_langchain_adapter_in_one_persistent_session(http_url: str) -> None:
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.tools import load_mcp_tools

    client = MultiServerMCPClient({"hotels": {"url": http_url, "transport": "streamable_http"}})
    async with client.session("hotels") as session:
        tools = {t.name: t for t in await load_mcp_tools(session)}
        await tools["book_room"].ainvoke(BOOK)
        listed = await tools["list_bookings"].ainvoke({"guest_name": "Ana Costa"})
        text = listed if isinstance(listed, str) else json.dumps(listed)
        assert "BK-0002" in text  # the booking made by the previous call is still there
