"""Several server processes behind one port (HAProxy, `envfactory mcp haproxy`): sessions sticky and isolated."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from typer.testing import CliRunner

from envfactory.cli.main import app
from envfactory.serve.affinity import AffinityError, BalancerSettings, haproxy_config
from envfactory.serve.mcp_server import STATE_TOOL
from envfactory.serve.net import free_port
from tests.support.paths import ROOT
from tests.support.serve import wait_for_port

HAPROXY = shutil.which("haproxy")
# needs what `make test` neither installs nor starts: `make test-external` runs it (and .ci/run runs both)
pytestmark = [
    pytest.mark.external,
    pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (make test-external installs it)"),
]  # HAProxy


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the balancer's MCP URL, HAProxy's runtime socket): two `envfactory serve` processes behind HAProxy."""
    folder = tmp_path_factory.mktemp("haproxy")
    env = {**os.environ, "ENVFACTORY_ROOT": str(ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = [free_port() for _ in range(2)]
        for port in ports:
            cmd = [
                sys.executable,
                "-m",
                "envfactory.cli",
                "serve",
                "hotels",
                "--transport",
                "http",
                "--port",
                str(port),
            ]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for port, proc in zip(ports, procs, strict=True):
            wait_for_port(port, proc, "envfactory serve")
        front = free_port()
        config = folder / "haproxy.cfg"
        sock = folder / "haproxy.sock"
        args = ["mcp", "haproxy", "--bind", f"127.0.0.1:{front}", "--stats-socket", str(sock), "--out", str(config)]
        for port in ports:
            args += ["--backend", f"127.0.0.1:{port}"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert HAPROXY is not None
        checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr + checked.stdout
        procs.append(subprocess.Popen([HAPROXY, "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        wait_for_port(front, procs[-1], "haproxy")
        yield f"http://127.0.0.1:{front}/mcp", sock
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def _runtime(sock: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def test_sessions_behind_one_port_are_sticky_and_isolated(balanced: tuple[str, Path]) -> None:
    url, sock = balanced

    async def conversation(i: int) -> tuple[str, Any]:
        # round-robin would send a session's next request to the other process, which does not know it (404)
        async with streamable_http_client(url) as (r, w, session_id), ClientSession(r, w) as s:
            await s.initialize()
            guest = f"Guest {i}"
            for nights in (1, 2, 3):
                booked = await s.call_tool(
                    "book_room",
                    {"hotel_id": "HT-POR-01", "guest_name": guest, "check_in": "2026-03-01", "nights": nights},
                )
                assert not booked.isError, booked.content
            state = json.loads((await s.call_tool(STATE_TOOL, {})).content[0].text)
            return str(session_id()), state

    async def all_of_them() -> list[tuple[str, Any]]:
        return await asyncio.gather(*(conversation(i) for i in range(12)))

    results = asyncio.run(all_of_them())
    for i, (_, state) in enumerate(results):
        guests = {b["guest_name"] for b in state["bookings"].values()} - {"Maria Silva"}  # the scenario's own
        assert guests == {f"Guest {i}"}, f"session {i} saw {guests}"
        assert len(state["bookings"]) == len([1, 2, 3]) + 1
    table = _runtime(sock, "show table envfactory")
    servers = {line.split("server_id=")[1].split()[0] for line in table.splitlines() if "server_id=" in line}
    assert len(servers) == 2, table  # the sessions were spread over both processes
    assert all(sid in table for sid, _ in results)


def test_balancer_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="host:port"):
        BalancerSettings(backends=["127.0.0.1"])
    # the command raises our error, which `envfactory` prints as one line (exit 1)
    result = CliRunner().invoke(app, ["mcp", "haproxy", "--backend", "a:1", "--backend", "a:1"])
    assert isinstance(result.exception, AffinityError) and "listed twice" in str(result.exception)
    result = CliRunner().invoke(app, ["mcp", "haproxy", "--backend", "nope; rm -rf /"])
    assert isinstance(result.exception, AffinityError) and "host:port" in str(result.exception)
    # what HAProxy itself would refuse, or a socket path that would add lines to the configuration
    refused = [
        (["--backend", "127.0.0.1:99999"], "1-65535"),
        (["--backend", "127.0.0.1:0"], "1-65535"),
        (["--backend", "a:1", "--bind", "127.0.0.1:70000"], "1-65535"),
        (["--backend", "a:1", "--stats-socket", "relative.sock"], "absolute socket path"),
        (["--backend", "a:1", "--stats-socket", "/tmp/a.sock\n    user root"], "absolute socket path"),
        # a trailing newline alone (`$` matched before it) split the line too
        (["--backend", "a:1", "--stats-socket", "/tmp/s\n"], "absolute socket path"),
        (["--backend", "127.0.0.1:8001\n"], "host:port"),
    ]
    for args, message in refused:
        result = CliRunner().invoke(app, ["mcp", "haproxy", *args])
        assert isinstance(result.exception, AffinityError) and message in str(result.exception), (args, result)
    config = haproxy_config(BalancerSettings(backends=["127.0.0.1:9001", "127.0.0.1:9002"], stats_socket="/tmp/h.sock"))
    assert "server w0 127.0.0.1:9001 check" in config and "stats socket /tmp/h.sock mode" in config
