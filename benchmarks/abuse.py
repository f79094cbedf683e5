"""Serving under hostile clients: a well-behaved session's latency alone and while one client misbehaves.

    python benchmarks/abuse.py [--alone 5] [--window 8] [--only NAME ...]

For each abuse a fresh server is started the way the CLI starts it (`envfactory serve hotels` or
`envfactory hub serve`, on 127.0.0.1, over a temporary project holding `hotels` and `slowpoke`, a
trusted app whose tool sleeps). A well-behaved session (bare JSON-RPC over one keep-alive httpx
connection, 20 ms between calls) calls `get_hotel` for `--alone` seconds, then again while an abuser
process (its own interpreter) runs for `--window` seconds:

- large nested body: 4 MB and 16 MB bodies of `[[],[],...]`, back to back;
- slow app flood (hub): 60 sessions calling slowpoke's 4 s tool without pause; the session calls hotels;
- header-less connections: 50 connections that never finish their headers (a third of them sending a
  byte now and then), each reopened once the server closes it, for 14 s (past the 10 s header timeout);
- big histories: 20 sessions, each resetting to a 1,500-hotel state (~0.3 MB) then searching it 40
  times (~0.15 MB answers), for 16 s; the server's resident memory before and after is in the note;
- big histories (hub): the same through the hub (each session loads a task whose hotels start from
  that state, then searches with call_tool), where every call runs on the app's thread, the
  well-behaved session's too;
- descriptor flood: the server runs with 512 file descriptors, the abuser holds 800 idle connections;
- control: a busy core: a process spinning on one core for 16 s that sends nothing (on a shared 2-core
  machine, the part of a row's slowdown that is the machine's, not the server's).

The table gives p50/p99 of the session's calls alone and under abuse, the target (p99 under abuse at
most 3x alone), whether the server was alive after, and what the abuser saw. Bounded: every loop stops
at the end of its window (and after a fixed number of requests); each call has a 30 s timeout. A last
line times how long the server takes to close 50 header-less connections (header timeout 10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import resource
import select
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.serve import JSON_HEADERS, RawSession, abuse_project, serve_process  # noqa: E402

MB = 1024 * 1024
HOTEL = {"hotel_id": "HT-LIS-01"}
LISBON = {"city": "Lisbon"}
CALL_TIMEOUT_S = 30.0
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "abuse", "version": "0"}},
}


# ---- the well-behaved session ---------------------------------------------------------------------------


class Good:
    """One session calling a tool every 20 ms on its own keep-alive connection."""

    def __init__(self, url: str, hub: bool) -> None:
        self.http = httpx.Client(timeout=CALL_TIMEOUT_S)
        self.session = RawSession(self.http, url)
        self.tool, self.args = (
            ("call_tool", {"app": "hotels", "tool": "get_hotel", "arguments": HOTEL})
            if hub
            else (
                "get_hotel",
                HOTEL,
            )
        )
        self.session.call(self.tool, self.args)

    def run(self, seconds: float, max_calls: int = 400) -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(latencies) < max_calls:
            started = time.perf_counter()
            try:
                res = self.session.call(self.tool, self.args)
                ok = res.status_code == 200 and not res.json().get("result", {}).get("isError", True)
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - started)
            errors += not ok
            time.sleep(0.02)
        return latencies, errors

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.http.close()


# ---- the abusers (each in its own process) ----------------------------------------------------------------


def _arrays(n_bytes: int) -> bytes:
    return b"[" + b"[]," * (n_bytes // 3) + b"[]]"


def abuse_bodies(url: str, seconds: float, out: Any) -> None:
    bodies = [_arrays(4 * MB - 10), _arrays(16 * MB)]
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    n = 0
    with httpx.Client(timeout=60) as http:
        while time.monotonic() < deadline and n < 400:
            try:
                seen[str(http.post(url, content=bodies[n % 2], headers=JSON_HEADERS).status_code)] += 1
            except httpx.HTTPError as e:
                seen[type(e).__name__] += 1
            n += 1
    out.put(f"{n} bodies: " + ", ".join(f"{k}×{v}" for k, v in sorted(seen.items())))


async def _open(http: httpx.AsyncClient, url: str) -> str:
    res = await http.post(url, json=INIT, headers=JSON_HEADERS)
    sid = res.headers["mcp-session-id"]
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=_h(sid))
    return sid


def _h(sid: str) -> dict[str, str]:
    return {**JSON_HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}


async def _call(http: httpx.AsyncClient, url: str, sid: str, tool: str, args: dict[str, Any]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}}
    return await http.post(url, json=body, headers=_h(sid))


def abuse_slow_app(url: str, seconds: float, out: Any) -> None:
    async def run() -> str:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        deadline = time.monotonic() + seconds
        done = 0
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            ids = await asyncio.gather(*(_open(http, url) for _ in range(60)))

            async def one(sid: str) -> None:
                nonlocal done
                while time.monotonic() < deadline:
                    slow = {"app": "slowpoke", "tool": "wait", "arguments": {"seconds": 4.0}}
                    with contextlib.suppress(httpx.HTTPError):
                        await _call(http, url, sid, "call_tool", slow)
                        done += 1

            tasks = [asyncio.create_task(one(sid)) for sid in ids]
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return f"60 sessions, {done} slow calls done"

    out.put(asyncio.run(run()))


def _closed(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        return sock.recv(65536) == b""
    except OSError:
        return True


def abuse_headerless(url: str, seconds: float, out: Any) -> None:
    port = int(url.split(":")[2].split("/")[0])
    deadline = time.monotonic() + seconds
    opened: list[tuple[socket.socket, float, int]] = []
    closed_after: list[float] = []
    n = 0

    def new(i: int) -> tuple[socket.socket, float, int]:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 3:  # headers begun, never ended (and every third a slow loris: a byte of a header name now and then)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        return sock, time.monotonic(), i

    with contextlib.suppress(OSError):
        for i in range(50):
            opened.append(new(i))
            n += 1
    while time.monotonic() < deadline:
        for k, (sock, since, i) in enumerate(opened):
            if i % 3 == 2:
                with contextlib.suppress(OSError):
                    sock.send(b"X")
            if _closed(sock):
                closed_after.append(time.monotonic() - since)
                sock.close()
                with contextlib.suppress(OSError):
                    opened[k] = new(i)
                    n += 1
        time.sleep(0.2)
    for sock, _, _ in opened:
        sock.close()
    if closed_after:
        median = statistics.median(closed_after)
        out.put(f"{n} opened; {len(closed_after)} closed by the server after {median:.1f} s (median)")
    else:
        out.put(f"{n} opened; none closed by the server")


def _big_state() -> dict[str, Any]:
    state = json.loads((ROOT / "envs" / "hotels" / "scenarios" / "default.json").read_text())
    template = state["hotels"]["HT-LIS-01"]
    state["hotels"] = {f"HT-B-{i}": {**template, "id": f"HT-B-{i}", "city": "Lisbon"} for i in range(1500)}
    return state


def abuse_histories(url: str, seconds: float, out: Any, hub: bool = False) -> None:
    async def run() -> str:
        deadline = time.monotonic() + seconds
        big = _big_state()
        calls = errors = 0
        if hub:  # a task whose hotels start from the big state, then call_tool searches
            task = {
                "id": "big",
                "instruction": "Search Lisbon.",
                "servers": ["hotels"],
                "initial_state": {"hotels": big},
                "verifier": {"goal": {}},
                "solver": [],
            }
            load, load_args = "envfactory_load_task", {"task": task}
            search, search_args = "call_tool", {"app": "hotels", "tool": "search_hotels", "arguments": LISBON}
        else:
            load, load_args = "envfactory_reset", {"config": big}
            search, search_args = "search_hotels", LISBON
        async with httpx.AsyncClient(timeout=60) as http:
            ids = await asyncio.gather(*(_open(http, url) for _ in range(20)))

            async def one(sid: str) -> None:
                nonlocal calls, errors
                res = await _call(http, url, sid, load, load_args)
                errors += res.status_code != 200 or res.json()["result"].get("isError", False)
                for _ in range(40):
                    if time.monotonic() > deadline:
                        return
                    res = await _call(http, url, sid, search, search_args)
                    calls += 1
                    errors += res.status_code != 200 or res.json()["result"].get("isError", False)
                    await asyncio.sleep(0.05)

            with contextlib.suppress(httpx.HTTPError):
                await asyncio.gather(*(one(sid) for sid in ids))
        return f"20 sessions, {calls} searches, {errors} errors"

    out.put(asyncio.run(run()))


def abuse_histories_hub(url: str, seconds: float, out: Any) -> None:
    abuse_histories(url, seconds, out, hub=True)


def burn_cpu(url: str, seconds: float, out: Any) -> None:
    """The control: a process busy on one core that never talks to the server (what the machine's own contention
    costs the well-behaved session, next to what the abusers' work in the server costs it)."""
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += 1
    out.put(f"{spins:,} spins on one core, no request")


def abuse_descriptors(url: str, seconds: float, out: Any) -> None:
    port = int(url.split(":")[2].split("/")[0])
    held: list[socket.socket] = []
    with contextlib.suppress(OSError):
        for _ in range(800):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    late = "no answer"
    time.sleep(1.0)
    with contextlib.suppress(httpx.HTTPError):
        res = httpx.post(url, json=INIT, headers=JSON_HEADERS, timeout=3)
        late = str(res.status_code)
    time.sleep(max(0.0, seconds - 1.0))
    for sock in held:
        sock.close()
    out.put(f"{len(held)} connections held; a new session then got: {late}")


ABUSES: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "large nested body": (abuse_bodies, "serve", {}),
    "slow app flood (hub)": (abuse_slow_app, "hub", {}),
    "header-less connections": (abuse_headerless, "serve", {"window": 14.0}),  # past the 10 s header timeout
    "big histories": (abuse_histories, "serve", {"window": 16.0}),  # time for the 40 calls of each session
    "big histories (hub)": (abuse_histories_hub, "hub", {"window": 16.0}),
    "descriptor flood": (abuse_descriptors, "serve", {"nofile": 512}),
    "control: a busy core": (burn_cpu, "serve", {"window": 16.0}),
}


def _nofile(n: int) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def run_one(name: str, project: Path, alone_s: float, window_s: float) -> dict[str, Any]:
    target, kind, options = ABUSES[name]
    window_s = max(window_s, options.get("window", 0.0))
    args = ("hub", "serve") if kind == "hub" else ("serve", "hotels")
    preexec = _nofile(options["nofile"]) if "nofile" in options else None
    ctx = mp.get_context("spawn")
    with serve_process(project, *args, preexec=preexec) as (url, proc, log):
        good = Good(url, hub=kind == "hub")
        rss_before = psutil.Process(proc.pid).memory_info().rss / MB
        alone, alone_errors = good.run(alone_s)
        out = ctx.Queue()
        abuser = ctx.Process(target=target, args=(url, window_s, out), daemon=True)
        abuser.start()
        time.sleep(1.0 if kind == "hub" else 0.5)  # the abuse under way
        abused, abused_errors = good.run(window_s)
        abuser.join(window_s + 60)
        if abuser.is_alive():
            abuser.terminate()
        saw = out.get(timeout=5) if not out.empty() else "(no report)"
        time.sleep(0.5)
        alive = proc.poll() is None
        if alive:  # alive means answering too: a new session's call
            try:
                alive = not Good(url, hub=kind == "hub").run(0.1, max_calls=1)[1]
            except (httpx.HTTPError, AssertionError, KeyError):
                alive = False
        rss_after = psutil.Process(proc.pid).memory_info().rss / MB if proc.poll() is None else float("nan")
        good.close()
        traceback = "Traceback" in log.read_text() or "╭─" in log.read_text()
    if name.startswith("big histories"):
        saw += f"; server RSS {rss_before:.0f} → {rss_after:.0f} MB"
    return {
        "name": name,
        "alone": alone,
        "abused": abused,
        "errors": alone_errors + abused_errors,
        "alive": alive,
        "saw": saw + ("; traceback in the log" if traceback else ""),
    }


def time_header_close(project: Path) -> str:
    with serve_process(project, "serve", "hotels") as (url, _, _):
        port = int(url.split(":")[2].split("/")[0])
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        for i, sock in enumerate(socks):
            if i % 2:
                sock.sendall(b"POST /mcp HTTP/1.1\r\n")
        started = time.monotonic()
        closed: dict[int, float] = {}
        while len(closed) < len(socks) and time.monotonic() - started < 20:
            for i, sock in enumerate(socks):
                if i not in closed and _closed(sock):
                    closed[i] = time.monotonic() - started
            time.sleep(0.05)
        for sock in socks:
            sock.close()
    if not closed:
        return "50 header-less connections: none closed within 20 s"
    return (
        f"50 header-less connections: {len(closed)} closed by the server within 20 s, "
        f"the last after {max(closed.values()):.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--alone", type=float, default=5.0, help="seconds of calls alone")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of calls under each abuse")
    parser.add_argument("--only", nargs="*", choices=list(ABUSES), help="run only these abuses")
    opts = parser.parse_args()
    console = Console(width=240)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        project = abuse_project(Path(tmp) / "project")
        for name in opts.only or list(ABUSES):
            console.print(f"[dim]{name}...[/dim]")
            rows.append(run_one(name, project, opts.alone, opts.window))
        header_line = time_header_close(project) if not opts.only else ""
    table = Table(title="A well-behaved session's calls, alone and under abuse (ms)")
    for col in ("abuse", "alone p50", "alone p99", "abused p50", "abused p99", "p99 ×", "target ≤3×", "calls"):
        table.add_column(col, justify="left" if col == "abuse" else "right")
    table.add_column("errors", justify="right")
    table.add_column("alive after")
    table.add_column("the abuser saw")
    for row in rows:
        a99, b99 = _pct(row["alone"], 0.99), _pct(row["abused"], 0.99)
        ratio = b99 / a99 if a99 > 0 else float("inf")
        table.add_row(
            row["name"],
            f"{1000 * statistics.median(row['alone']):.1f}",
            f"{1000 * a99:.1f}",
            f"{1000 * statistics.median(row['abused']):.1f}" if row["abused"] else "-",
            f"{1000 * b99:.1f}",
            f"{ratio:.1f}",
            "met" if ratio <= 3 and row["alive"] else "missed",
            f"{len(row['alone'])}/{len(row['abused'])}",
            str(row["errors"]),
            "yes" if row["alive"] else "NO",
            row["saw"],
        )
    console.print(table)
    if header_line:
        console.print(header_line)


if __name__ == "__main__":
    main()
