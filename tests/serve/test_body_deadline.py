"""A request body's deadline (`ServeLimits.body_timeout_s`, `serve.asgi.BoundedJSONBody`) under real uvicorn.

A body that arrives with its headers is read at once (no deadline to keep); one still arriving is read under
the deadline, answered as usual when it comes in time, and with a 408 when it does not."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.serve.asgi import BoundedJSONBody
from envfactory.serve.limits import ServeLimits
from envfactory.serve.mcp_server import EnvMCPServer
from tests.support.paths import ROOT
from tests.support.serve import initialize_body, post_head, read_answers, serving

DEADLINE_S = 0.6
BODY = initialize_body()


@pytest.fixture(scope="module")
def port() -> Any:
    hotels = EnvPool(Settings(root=ROOT, bfcl=False)).get("hotels")
    server = EnvMCPServer(hotels, default_config="default", limits=ServeLimits(body_timeout_s=DEADLINE_S))
    with serving(server) as url:
        yield int(url.split(":")[2].split("/")[0])


def _head(port: int) -> bytes:
    return post_head(f"127.0.0.1:{port}", len(BODY))


def test_a_body_sent_with_its_headers_is_read_without_waiting(port: int) -> None:
    before = BoundedJSONBody.waited
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(3):  # on one keep-alive connection, as a trainer's session sends them
            sock.sendall(_head(port) + BODY)
            status, body = read_answers(sock)[0]
            assert status == 200 and json.loads(body)["result"]["protocolVersion"]
    assert BoundedJSONBody.waited == before


def test_a_body_that_comes_in_time_is_answered(port: int) -> None:
    before = BoundedJSONBody.waited
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head(port) + BODY[:10])
        time.sleep(DEADLINE_S / 3)
        sock.sendall(BODY[10:])
        status, body = read_answers(sock)[0]
    assert status == 200 and json.loads(body)["result"]["protocolVersion"]
    assert BoundedJSONBody.waited == before + 1  # read under the deadline


def test_a_body_that_stops_arriving_gets_a_408_at_its_deadline(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(_head(port) + BODY[:10])
        status, body = read_answers(sock)[0]
        took = time.monotonic() - started
    assert status == 408
    assert json.loads(body)["error"]["message"] == f"the request body did not arrive within {DEADLINE_S:g} s"
    assert DEADLINE_S * 0.9 <= took < DEADLINE_S + 5
