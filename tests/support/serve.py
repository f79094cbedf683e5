"""A real streamable-HTTP server for tests: an ASGI app under uvicorn in a background thread, and a raw client."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from envfactory.serve.net import free_port
from tests.support.paths import ROOT

PROTOCOL = "2025-06-18"
JSON_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@contextmanager
def running(server: uvicorn.Server, what: str, sockets: list[socket.socket] | None = None) -> Iterator[None]:
    """Run `server` in a background thread (on `sockets` when given) until it has started; stop it on exit."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets} if sockets else {}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def serving(app: Any, what: str = "the server") -> Iterator[str]:
    """Serve `app` (an ASGI app, or a `SessionServer` under its limits) on a free port; yields its `/mcp` URL
    and stops the server on exit."""
    port = free_port()
    if hasattr(app, "http_config"):  # a SessionServer: its own uvicorn configuration, limits and all
        config = app.http_config(host="127.0.0.1", port=port)
    else:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    with running(uvicorn.Server(config), f"{what} on port {port}"):
        yield f"http://127.0.0.1:{port}/mcp"


@contextmanager
def serving_on_socket(app: Any, what: str = "the server") -> Iterator[int]:
    """Serve `app` (a plain ASGI app, no lifespan) on a loopback socket bound here first, so whatever answers on
    the port is this server; yields the port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # a free port, chosen by the OS and held from here on
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        with running(uvicorn.Server(config), what, [sock]):
            yield sock.getsockname()[1]


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], what: str, log: Path | None = None, timeout_s: float = 30
) -> None:
    """Wait until `proc` listens on `port`; its exit or `timeout_s` raises with its stderr (or `log`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {_said(proc, log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not open port {port}")


def wait_for_http(
    url: str, proc: subprocess.Popen[bytes], what: str, log: Path | None = None, timeout_s: float = 60
) -> httpx.Response:
    """GET `url` until `proc` answers it (any HTTP status); its exit or `timeout_s` raises with its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {_said(proc, log)}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer {url}: {_said(proc, log)}") from None
            time.sleep(0.2)


def _said(proc: subprocess.Popen[bytes], log: Path | None) -> str:
    """The last of what `proc` wrote: its log file, or its stderr pipe once it has exited."""
    if log is not None:
        return log.read_text(errors="replace")[-4000:]
    return proc.stderr.read().decode(errors="replace")[-4000:] if proc.stderr and proc.poll() is not None else ""


class RawSession:
    """One MCP session spoken as bare JSON-RPC over HTTP (no SDK): what a lean trainer-side client sends."""

    def __init__(self, http: httpx.Client, url: str, **headers: str) -> None:
        self.http, self.url, self.extra = http, url, headers
        self.next_id = 0
        hello = self.post({"method": "initialize", "params": hello_params()}, session=False)
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


def hello_params() -> dict[str, Any]:
    return {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}


# ---- HTTP written by hand on a socket (what a hostile or a curl-like client sends) --------------------


def post_head(host: str, length: int) -> bytes:
    """The head of an HTTP/1.1 POST to /mcp of a JSON body of `length` bytes (`host`: the Host header)."""
    return (
        b"POST /mcp HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
        b"accept: application/json, text/event-stream\r\ncontent-length: %d\r\n\r\n" % (host.encode(), length)
    )


def initialize_body(request_id: int = 1) -> bytes:
    """An MCP `initialize` request's JSON-RPC body."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": hello_params()}).encode()


def read_answers(sock: socket.socket, n: int = 1) -> list[tuple[int, bytes]]:
    """The next `n` HTTP answers on `sock`, each (status, body read to its content-length); fails if the server
    closes the connection before answering."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection before answering"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        while len(data) < length:
            data += sock.recv(65536)
        out.append((int(lines[0].split()[1]), data[:length]))
        data = data[length:]
    return out


# ---- servers under hostile clients (tests/serve/test_abuse.py, benchmarks/abuse.py) ------------------

SLOWPOKE = '''"""Slowpoke: a trusted app whose one tool takes as long as it is asked (a slow app beside fast ones)."""

from __future__ import annotations

import time

from envfactory.env import Environment, State


class SlowDB(State):
    waited: float = 0.0


env = Environment("slowpoke", SlowDB, description="An app whose tool waits.", domain="utilities")


@env.tool(kind="read")
def wait(db: SlowDB, seconds: float) -> float:
    """Wait some seconds, then say how long.

    Args:
        seconds: How long to wait (at most 30).
    """
    time.sleep(max(0.0, min(seconds, 30.0)))
    return seconds
'''


def abuse_project(root: Path) -> Path:
    """A project folder with `hotels` and `slowpoke` (both trusted, so in-process); returns `root`."""
    from envfactory.env.metadata import dump_metadata
    from envfactory.env.pool import load_env_folder
    from envfactory.env.trust import trust

    shutil.copytree(ROOT / "envs" / "hotels", root / "envs" / "hotels")
    slow = root / "envs" / "slowpoke"
    (slow / "scenarios").mkdir(parents=True)
    (slow / "env.py").write_text(SLOWPOKE)
    (slow / "scenarios" / "default.json").write_text('{"waited": 0.0}')
    dump_metadata(load_env_folder(slow, with_metadata=False).derived_metadata(), slow / "metadata.json")
    (root / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "trusted.json", root / "configs" / "trusted.json")
    trust(root / "configs" / "trusted.json", "slowpoke", slow)
    return root


@contextmanager
def serve_process(
    root: Path, *args: str, env: dict[str, str] | None = None, preexec: Any = None, log: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`envfactory ARGS --transport http --port P` on project `root` (the CLI's own server, uvicorn and all);
    yields its URL, the process and its log, and stops it on exit."""
    port = free_port()
    log = log or root / f"server-{port}.log"
    environ = {**os.environ, "ENVFACTORY_ROOT": str(root), "ENVFACTORY_BFCL": "false", **(env or {})}
    command = [sys.executable, "-m", "envfactory.cli", *args, "--transport", "http", "--port", str(port)]
    with log.open("w") as fh:
        proc = subprocess.Popen(command, env=environ, stdout=fh, stderr=subprocess.STDOUT, preexec_fn=preexec)
    try:
        wait_for_port(port, proc, " ".join(args), log, timeout_s=60)
        yield f"http://127.0.0.1:{port}/mcp", proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
