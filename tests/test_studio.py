"""`langgraph dev` serves the EnvGen graph (as LangGraph Studio uses it), driven through the SDK client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from envfactory.net import free_port
from tests.envgen_helpers import METADATA, ROOT, SCENARIOS, code, fenced, setup_project


@pytest.fixture()
def dev_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    port = free_port()
    log = (tmp_path / "dev.log").open("w")
    langgraph = Path(sys.executable).with_name("langgraph")
    proc = subprocess.Popen(
        [
            str(langgraph),
            "dev",
            "--config",
            str(ROOT / "langgraph.json"),
            "--port",
            str(port),
            "--no-browser",
            "--no-reload",
            "--allow-blocking",
        ],
        cwd=ROOT,  # langgraph.json paths resolve from here; .langgraph_api/ is git-ignored, reload is off
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90  # a graph that fails to load leaves the server up but serving nothing
    try:
        while True:
            assert proc.poll() is None, (tmp_path / "dev.log").read_text()[-3000:]
            try:
                found = httpx.post(f"{url}/assistants/search", json={"graph_id": "envgen"}, timeout=2).json()
                if any(a.get("graph_id") == "envgen" for a in found):  # the server on the port is ours
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "dev.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def test_sdk_run_interrupt_read_state_resume(dev_server: str) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=dev_server)
    thread = await client.threads.create()
    request = {"request": {"metadata_path": str(METADATA)}}
    await client.runs.wait(thread["thread_id"], "envgen", input=request, interrupt_before=["revise"])

    state = await client.threads.get_state(thread["thread_id"])
    assert state["next"] == ["revise"]
    report = state["values"]["report"]
    assert any(e["severity"] == "critical" for e in report["errors"])  # the planted bug, seen before revising

    final = await client.runs.wait(thread["thread_id"], "envgen", input=None)
    assert isinstance(final, dict) and final["status"] == "registered"
    state = await client.threads.get_state(thread["thread_id"])
    assert state["next"] == [] and state["values"]["revision"] == 1
    history = await client.threads.get_history(thread["thread_id"], limit=50)
    assert len(history) >= 7  # input, search, code, test, revise, test, register
