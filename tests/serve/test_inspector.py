"""An outside MCP client, from anywhere: the official MCP Inspector's CLI (`npx @modelcontextprotocol/inspector
--cli`, from npm) launches our server from the configuration `envfactory mcp config` prints — started with a bare
PATH (no virtualenv) in another folder — and talks to it over stdio and over HTTP: it lists the tools, calls a
write tool, and reads the state (each CLI call is a new MCP session, so the state it reads is its own: untouched
by the booking another session made).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.serve import serve_process

# needs what `make test` neither installs nor starts: `make test-external` runs it (and .ci/run runs both)
pytestmark = [pytest.mark.slow, pytest.mark.external]  # npm's MCP Inspector
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
BOOKING = ["hotel_id=HT-LIS-01", "guest_name=Ana Costa", "check_in=2026-02-10", "nights=2"]


def inspector(cwd: Path, *args: str) -> Any:
    """One Inspector CLI call with a bare environment (no virtualenv on PATH); its JSON result."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("needs node + npx (the MCP Inspector is an npm package)")
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "MCP_INSPECTOR_SECRET_STORE": "memory"}
    res = subprocess.run(
        [npx, "-y", INSPECTOR, "--cli", *args, "--format", "json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def text_of(result: Any) -> Any:
    return json.loads(result["result"]["content"][0]["text"])


def check_session(cwd: Path, *target: str) -> None:
    tools = inspector(cwd, *target, "--method", "tools/list")["result"]["tools"]
    names = {t["name"] for t in tools}
    assert {"search_hotels", "book_room", "envfactory_state"} <= names
    booked = inspector(cwd, *target, "--method", "tools/call", "--tool-name", "book_room", "--tool-arg", *BOOKING)
    assert not booked["result"].get("isError"), booked
    booking = text_of(booked)
    assert booking["hotel_id"] == "HT-LIS-01" and booking["guest_name"] == "Ana Costa"
    state = text_of(inspector(cwd, *target, "--method", "tools/call", "--tool-name", "envfactory_state"))
    assert "HT-LIS-01" in json.dumps(state) and booking["id"] not in json.dumps(state)  # a new session: its own state


def test_the_inspector_launches_our_server_from_the_printed_config_over_stdio(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    made = subprocess.run(
        [sys.executable, "-m", "envfactory.cli", "mcp", "config", "hotels", "--client", "inspector", "--out", config],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    entry = json.loads(config.read_text())["mcpServers"]["hotels"]
    assert Path(entry["command"]).is_absolute() and entry["env"]["ENVFACTORY_ROOT"] == str(ROOT)
    elsewhere = tmp_path / "elsewhere"  # neither the project folder nor its virtualenv
    elsewhere.mkdir()
    check_session(elsewhere, "--config", str(config), "--server", "hotels")


@pytest.fixture()
def http_server(tmp_path: Path) -> Iterator[str]:
    with serve_process(ROOT, "serve", "hotels", log=tmp_path / "server.log") as (url, _, _):
        yield url


def test_the_inspector_talks_to_our_server_over_http(tmp_path: Path, http_server: str) -> None:
    check_session(tmp_path, http_server, "--transport", "http")
