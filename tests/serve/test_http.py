"""The connection side (`serve.http.GuardedHTTP`) under real uvicorn: deadlines kept by one sweep per server
rather than timers per request — a kept-alive connection idle past `keep_alive_s` is closed, one that began its
next request's headers is closed at the header deadline instead, and pipelined requests are answered in order."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.serve.http import GuardedHTTP
from envfactory.serve.limits import ServeLimits
from envfactory.serve.mcp_server import EnvMCPServer
from tests.support.paths import ROOT
from tests.support.serve import initialize_body, post_head, read_answers, serving

KEEP_ALIVE_S, HEADER_S = 1, 2.0


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    hotels = EnvPool(Settings(root=ROOT, bfcl=False)).get("hotels")
    limits = ServeLimits(keep_alive_s=KEEP_ALIVE_S, header_timeout_s=HEADER_S)
    with serving(EnvMCPServer(hotels, default_config="default", limits=limits)) as url:
        yield int(url.split(":")[2].split("/")[0])


def _initialize(port: int, request_id: int) -> bytes:
    body = initialize_body(request_id)
    return post_head(f"127.0.0.1:{port}", len(body)) + body


def _answers(sock: socket.socket, n: int) -> list[tuple[int, dict[str, object]]]:
    """The next `n` answers on `sock`: (status, JSON body) each."""
    return [(status, json.loads(body)) for status, body in read_answers(sock, n)]


def _closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes `sock` (fails past `limit_s`)."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        pytest.fail(f"still open after {limit_s} s")
    except OSError:
        pass
    return time.monotonic() - started


def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_initialize(port, 1) + _initialize(port, 2) + _initialize(port, 3))
        answers = _answers(sock, 3)
    assert [status for status, _ in answers] == [200, 200, 200]
    assert [body["id"] for _, body in answers] == [1, 2, 3]


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_initialize(port, 1))
        assert _answers(sock, 1)[0][0] == 200
        took = _closed_after(sock, KEEP_ALIVE_S + 3)
    assert KEEP_ALIVE_S * 0.9 <= took <= KEEP_ALIVE_S + 1.0  # the sweep ticks every tenth of it; a busy machine lags


def _closed_late() -> int:
    """Connections closed for late headers, over the servers' protocol classes (`guarded_protocol`'s)."""
    return sum(cls.closed_late for cls in GuardedHTTP.__subclasses__())


def test_a_next_request_begun_is_held_to_the_header_deadline_not_the_keep_alive(port: int) -> None:
    late = _closed_late()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_initialize(port, 1))
        assert _answers(sock, 1)[0][0] == 200
        sock.sendall(b"POST /mcp HTTP/1.1\r\n")  # the next request's headers begin, and stop
        took = _closed_after(sock, HEADER_S + 3)
    assert HEADER_S * 0.9 <= took <= HEADER_S + 1.0
    assert _closed_late() == late + 1


def test_a_pipelined_requests_body_is_not_counted_as_headers(port: int) -> None:
    """A request pipelined behind another: its body, arriving while the first is answered, is a body (before, the
    header limit counted it: a 431 past 64 KiB)."""
    body = initialize_body(2) + b" " * 100_000  # whitespace after the JSON: valid
    head = post_head(f"127.0.0.1:{port}", len(body))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_initialize(port, 1) + head + body[:10])
        time.sleep(0.2)
        sock.sendall(body[10:])
        answers = _answers(sock, 2)
    assert [(status, body["id"]) for status, body in answers] == [(200, 1), (200, 2)]
