"""`langgraph dev` on the project's langgraph.json (as LangGraph Studio uses it), on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from envfactory.serve.net import free_port
from tests.support.paths import ROOT


@contextmanager
def langgraph_dev(tmp_path: Path, graph_id: str) -> Iterator[str]:
    """The dev server's URL once it serves `graph_id` (port 2024 may be taken: a free port, and a check
    that the server answering is ours); stopped on exit. Its log is `tmp_path/dev.log`."""
    port = free_port()
    log_path = tmp_path / "dev.log"
    langgraph = Path(sys.executable).with_name("langgraph")
    cmd = [str(langgraph), "dev", "--config", str(ROOT / "langgraph.json"), "--port", str(port)]
    cmd += ["--no-browser", "--no-reload", "--allow-blocking"]
    with log_path.open("w") as log:
        # langgraph.json paths resolve from the root; .langgraph_api/ is git-ignored and reload is off
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90  # a graph that fails to load leaves the server up, serving nothing
        try:
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    found = httpx.post(f"{url}/assistants/search", json={"graph_id": graph_id}, timeout=2).json()
                    if any(a.get("graph_id") == graph_id for a in found):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
