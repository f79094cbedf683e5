"""A real streamable-HTTP server for tests: an ASGI app under uvicorn in a background thread, and a raw client."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from envfactory.serve.net import free_port

PROTOCOL = "2025-06-18"
JSON_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@contextmanager
def serving(app: Any, what: str = "the server") -> Iterator[str]:
    """Serve `app` on a free port; yields its `/mcp` URL and stops the server on exit."""
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start on port {port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        uv.should_exit = True
        thread.join(10)


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], what: str, log: Path | None = None, timeout_s: float = 30
) -> None:
    """Wait until `proc` listens on `port`; its exit or `timeout_s` raises with its stderr (or `log`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = log.read_text() if log is not None else proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{what} exited: {said}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not open port {port}")


class RawSession:
    """One MCP session spoken as bare JSON-RPC over HTTP (no SDK): what a lean trainer-side client sends."""

    def __init__(self, http: httpx.Client, url: str, **headers: str) -> None:
        self.http, self.url, self.extra = http, url, headers
        self.next_id = 0
        hello = self.post({"method": "initialize", "params": _hello()}, session=False)
        assert hello.status_code == 200, hello.text
        self.id = hello.headers["mcp-session-id"]
        assert self.post({"method": "notifications/initialized"}, with_id=False).status_code == 202

    def post(
        self, message: dict[str, Any], *, session: bool = True, with_id: bool = True, **headers: str
    ) -> httpx.Response:
        body: dict[str, Any] = {"jsonrpc": "2.0", **message}
        if with_id and "id" not in body:
            self.next_id += 1
            body["id"] = self.next_id
        sent = {**JSON_HEADERS, **self.extra, **headers}
        if session:
            sent.setdefault("mcp-session-id", self.id)
            sent.setdefault("mcp-protocol-version", PROTOCOL)
        return self.http.post(self.url, content=json.dumps(body), headers=sent)

    def call(self, tool: str, arguments: Any) -> httpx.Response:
        return self.post({"method": "tools/call", "params": {"name": tool, "arguments": arguments}})

    def close(self) -> None:
        self.http.delete(self.url, headers={"mcp-session-id": self.id, "mcp-protocol-version": PROTOCOL})


def _hello() -> dict[str, Any]:
    return {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
