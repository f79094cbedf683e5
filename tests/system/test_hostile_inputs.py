"""Bad input against the real CLI and a real MCP HTTP server: nothing a client sends names a file on the
server, nothing unbounded is read, every refusal is one line (CLI) or a 4xx (HTTP), never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from envfactory.serve.mcp_server import RESET_TOOL, STATE_TOOL
from envfactory.serve.net import free_port
from tests.support.paths import ROOT
from tests.support.serve import initialize_body

BOOK = {"hotel_id": "HT-POR-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2}


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "envs" / "hotels", root / "envs" / "hotels")
    (root / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "trusted.json", root / "configs" / "trusted.json")
    return root


def run(
    project: Path, *args: str, timeout: float = 60, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVFACTORY_ROOT": str(project), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}
    cmd = [*prefix, sys.executable, "-m", "envfactory.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode != 0, res
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ("[" * 5000 + "]" * 5000, "nested deeper than"),
        ('{"hotel_id": "\\ud800"}', "lone surrogate"),
        ('{"hotel_id": ' + "[" * 200 + "]" * 200 + "}", "nested deeper than"),
    ],
)
def test_args_that_cannot_be_read_are_one_line_errors(project: Path, args: str, needle: str) -> None:
    one_line_error(run(project, "call", "hotels", "get_hotel", "--args", args), "--args", needle)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/full", "fifo", "dir", "deep", "binary"])
def test_a_state_file_must_be_a_bounded_regular_json_file(project: Path, tmp_path: Path, special: str) -> None:
    path = {"/dev/zero": Path("/dev/zero"), "/dev/full": Path("/dev/full")}.get(special, tmp_path / f"{special}.json")
    if special == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: reading it would hang forever
    elif special == "dir":
        path.mkdir()
    elif special == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif special == "binary":
        path.write_bytes(b'{"hotels": "\xff\xfe"}')
    started = time.monotonic()
    res = run(project, "call", "hotels", "get_hotel", "--args", '{"hotel_id": "HT-LIS-01"}', "--state", str(path))
    assert time.monotonic() - started < 30  # refused at once, not read until the kernel gives up
    line = one_line_error(res)
    assert str(path) in line
    assert any(w in line for w in ("not a regular file", "nested deeper", "not valid UTF-8")), line


def test_a_state_file_in_a_missing_folder_is_refused_before_the_call(project: Path, tmp_path: Path) -> None:
    state = tmp_path / "no" / "such" / "folder" / "state.json"
    one_line_error(
        run(project, "call", "hotels", "book_room", "--args", json.dumps(BOOK), "--state", str(state)), "does not exist"
    )
    assert not state.parent.exists()


def test_a_state_write_cut_short_leaves_the_old_file_whole(project: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = run(project, "call", "hotels", "book_room", "--args", json.dumps(BOOK), "--state", str(state))
    assert first.returncode == 0, first.stderr
    before = state.read_bytes()
    assert len(before) > 1024
    # the file-size limit cuts the next write short: the rename must never happen
    cut = run(
        project,
        "call",
        "hotels",
        "cancel_booking",
        "--args",
        '{"booking_id": "BK-0002"}',
        "--state",
        str(state),
        prefix=("prlimit", "--fsize=1024"),
    )
    assert cut.returncode != 0 and "Traceback" not in cut.stderr, cut.stderr
    assert state.read_bytes() == before  # byte for byte: not truncated, not half-written
    again = run(
        project, "call", "hotels", "cancel_booking", "--args", '{"booking_id": "BK-0002"}', "--state", str(state)
    )
    assert again.returncode == 0, again.stderr  # the next call reads it fine
    assert json.loads(state.read_text())["bookings"]["BK-0002"]["status"] == "cancelled"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind


@pytest.mark.parametrize("bad", ["deep", "binary", "fifo"])
def test_a_malformed_metadata_or_scenario_file_is_one_line(project: Path, bad: str) -> None:
    folder = project / "envs" / "hotels"
    target = folder / "scenarios" / "default.json"
    target.unlink()
    if bad == "deep":
        target.write_text("[" * 100_000 + "]" * 100_000)
    elif bad == "binary":
        target.write_bytes(b"\xff\xfe{}")
    else:
        os.mkfifo(target)
    res = run(project, "call", "hotels", "get_hotel", "--args", '{"hotel_id": "HT-LIS-01"}', timeout=30)
    one_line_error(res, "default.json")


def test_validate_reports_an_env_that_exits_and_one_whose_code_is_gone(project: Path) -> None:
    assert run(project, "envs", "validate").returncode == 0
    registry = project / "configs" / "mcp_server.json"
    assert list(json.loads(registry.read_text())["mcpServers"]) == ["hotels"]
    exiting = project / "envs" / "exiting"
    shutil.copytree(project / "envs" / "hotels", exiting)
    meta = json.loads((exiting / "metadata.json").read_text())
    (exiting / "metadata.json").write_text(json.dumps({**meta, "name": "exiting"}))
    code = (exiting / "env.py").read_text().replace('"hotels",', '"exiting",', 1)
    (exiting / "env.py").write_text(code + "\nraise SystemExit(0)\n")
    res = run(project, "envs", "validate")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "SystemExit" in res.stdout  # the problem is printed, not obeyed
    shutil.rmtree(exiting)
    (project / "envs" / "hotels" / "env.py").unlink()  # a registered environment loses its code
    res = run(project, "envs", "validate")
    assert res.returncode == 1, res.stdout
    assert "registered in" in res.stdout and "is gone" in res.stdout


# ---- a real MCP server over HTTP ------------------------------------------------------------------


async def _initialize(url: str) -> str:
    async with streamable_http_client(url) as (r, w, _), ClientSession(r, w) as s:
        return (await s.initialize()).serverInfo.name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("served") / "project"
    shutil.copytree(ROOT / "envs" / "hotels", root / "envs" / "hotels")
    (root / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "trusted.json", root / "configs" / "trusted.json")
    secret = root / "planted.json"  # a valid state dump the server could load if it took paths
    token = secrets.token_hex(8)
    state = json.loads((root / "envs" / "hotels" / "scenarios" / "default.json").read_text())
    state["hotels"]["HT-LIS-01"]["name"] = token
    secret.write_text(json.dumps(state))
    port = free_port()
    log = root / "server.log"
    env = {**os.environ, "ENVFACTORY_ROOT": str(root), "ENVFACTORY_BFCL": "false"}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "envfactory.cli",
                "serve",
                "hotels",
                "--transport",
                "http",
                "--port",
                str(port),
            ],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                assert asyncio.run(asyncio.wait_for(_initialize(url), 5)) == "envfactory-hotels"
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {"url": url, "secret": secret, "token": token, "log": log, "proc": proc}
    finally:
        proc.terminate()
        proc.wait(10)


async def _session_calls(
    url: str, calls: list[tuple[str, dict[str, Any]]], headers: dict[str, str] | None = None
) -> list[Any]:
    out = []
    http = httpx.AsyncClient(headers=headers or {})
    async with streamable_http_client(url, http_client=http) as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        for tool, args in calls:
            res = await s.call_tool(tool, args)
            out.append((res.isError, res.content[0].text))
    return out


def test_no_request_names_a_file_on_the_server(server: dict[str, Any]) -> None:
    secret, token, url = str(server["secret"]), server["token"], server["url"]
    missing = str(Path(secret).with_name("absent.json"))
    texts: dict[str, str] = {}
    for label, path in (("present", secret), ("absent", missing)):
        for how, target, headers in (
            ("query", f"{url}?scenario={path}", None),
            ("header", url, {"x-envfactory-scenario": path}),
        ):
            # a session is refused when it opens on a start the server lacks (a 400 naming the scenarios it has)
            opened = httpx.post(
                target,
                content=initialize_body(),
                headers={"content-type": "application/json", "accept": "application/json, text/event-stream"}
                | (headers or {}),
                timeout=30,
            )
            text = opened.text
            assert opened.status_code == 400 and "has no scenario" in text and token not in text, (how, label, text)
            texts[f"{how}-{label}"] = text.replace(path, "<path>")
        results = asyncio.run(
            _session_calls(
                url, [(RESET_TOOL, {"scenario": path}), (STATE_TOOL, {}), (RESET_TOOL, {"scenario": "/dev/zero"})]
            )
        )
        (reset_error, reset_text), (_, state_text), (zero_error, zero_text) = results
        assert reset_error and zero_error and token not in state_text
        assert "has no scenario" in reset_text and "has no scenario" in zero_text
        texts[f"reset-{label}"] = reset_text.replace(path, "<path>")
    # the answer for a file that exists and for one that does not is the same: no oracle for the disk
    assert texts["reset-present"] == texts["reset-absent"]
    assert texts["query-present"] == texts["query-absent"] and texts["header-present"] == texts["header-absent"]


def test_malformed_bodies_get_a_4xx_and_the_server_goes_on(server: dict[str, Any]) -> None:
    url = server["url"]
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    bodies = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "deep object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "binary": b'{"jsonrpc": "2.0", "method": "\xff"}',
        "truncated": b'{"jsonrpc": "2.0", "method": "initialize", "par',
    }
    before = server["log"].read_text()
    for label, body in bodies.items():
        res = httpx.post(url, content=body, headers=headers, timeout=30)
        assert 400 <= res.status_code < 500, (label, res.status_code)
        assert res.json()["error"]["message"], label
    huge = httpx.post(url, content=b" " * (17 * 1024 * 1024), headers=headers, timeout=60)
    assert huge.status_code == 413
    log = server["log"].read_text()[len(before) :]
    assert "Traceback" not in log
    assert log.count("refused a request") == len(bodies) + 1  # one line each
    # and the server still serves sessions, with their own state
    [(is_error, text)] = asyncio.run(_session_calls(url, [("book_room", BOOK)]))
    assert not is_error and json.loads(text)["id"] == "BK-0002"


def _raw_call(url: str, arguments_json: str) -> httpx.Response:
    """A tools/call whose arguments are raw JSON text (escapes a client library would refuse to send)."""
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    with httpx.Client(timeout=30) as http:
        res = http.post(url, json=init, headers=headers)
        sid = res.headers["mcp-session-id"]
        headers["mcp-session-id"] = sid
        http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        body = '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "get_hotel", "arguments": '
        return http.post(url, content=(body + arguments_json + "}}").encode(), headers=headers)


def test_configs_and_arguments_a_client_sends_never_break_the_session(server: dict[str, Any]) -> None:
    nested: Any = "x"
    for _ in range(60):  # under the body's depth limit: it reaches the state model, which refuses it
        nested = {"a": nested}
    calls = [
        (RESET_TOOL, {"config": {"hotels": nested}}),
        (RESET_TOOL, {"config": ["not", "a", "dump"]}),
        (RESET_TOOL, {"scenario": "x" * 100_000}),
        ("get_hotel", {"hotel_id": "x" * 1_000_000}),
        ("get_hotel", {"hotel_id": ["HT-LIS-01"]}),
        ("get_hotel", {}),
        ("get_hotel", {"hotel_id": "HT-LIS-01"}),
    ]
    results = asyncio.run(_session_calls(server["url"], calls))
    assert all(is_error for is_error, _ in results[:-1]), results
    assert len(results[2][1]) < 2000  # a huge name is not echoed back whole
    assert not results[-1][0] and json.loads(results[-1][1])["city"] == "Lisbon"  # the session still works
    # a lone surrogate (valid JSON escape, not valid Unicode) is an invalid-arguments result, not a crash
    res = _raw_call(server["url"], '{"hotel_id": "\\ud800"}')
    assert res.status_code == 200, res.text
    result = res.json()["result"]
    assert result["isError"] and "invalid_arguments" in result["content"][0]["text"]
    assert server["proc"].poll() is None
