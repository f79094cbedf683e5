"""Sessions benchmark: fork, in-process vs sandboxed calls/s, MCP streamable HTTP vs one stdio process per conversation.

    python benchmarks/sessions.py [--env hotels] [--concurrency 8] [--conversations 200] [--baseline 6]
                                  [--sandbox-only | --lean-only]

Tool calls/s over MCP HTTP are measured twice: with the SDK's client (`ClientSession` over
`streamable_http_client`) and with the trainers' client (`envfactory.serve.trainer_client`: the JSON-RPC
messages written on one keep-alive connection per session, asyncio streams, no HTTP library), with N and with
64 sessions: the difference is the SDK client's own cost, what remains the server's. Each session books
first, then reads back in a loop (every result checked: the share of calls that succeeded is printed).
`--lean-only` runs just the trainer client against one server process, with and without the fast path.

The sandboxed rows load the same environment as an untrusted one: its sessions live in one worker
process behind bubblewrap + seccomp, driven over a pipe (what a generated environment costs until
a person trusts it).

A "conversation" is what a QueryGen solver or an RL rollout does: open an MCP session on a fresh
state, call a few tools (search, book, read back), close. The paper's way starts a stdio server
process per conversation; ours opens an MCP session on one long-lived streamable-HTTP server.
The table prints both, measured in this run, and the ratio. The load generator runs in its own
process so that client and server do not share one interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from figures import Figure, add_json_flag, write_figures
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envfactory.config import Settings  # noqa: E402
from envfactory.env.pool import EnvPool, load_untrusted_folder  # noqa: E402
from envfactory.env.sandbox.limits import worker_limits  # noqa: E402
from envfactory.env.session import Session  # noqa: E402
from envfactory.serve.net import free_port  # noqa: E402

LEAN_TARGET = 5_000  # issue 29: tool calls/s from the trainers' client against one server process

# the calls of one conversation, on the default scenario of the chosen environment
CONVERSATIONS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "hotels": [
        ("search_hotels", {"city": "Lisbon"}),
        ("book_room", {"hotel_id": "HT-LIS-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2}),
        ("get_booking", {"booking_id": "BK-0002"}),
    ]
}


def bench_fork(env: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        env.session("default")
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_inprocess(env: Any, calls: list[tuple[str, dict[str, Any]]], seconds: float) -> float:
    """Calls/s on one session: the conversation's read calls repeated (write calls would pile up state)."""
    session = env.session("default")
    for tool, args in calls:
        assert session.call(tool, args).ok
    reads = [(t, a) for t, a in calls if env.binding(t).kind == "read"]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for tool, args in reads:
            session.call(tool, args)
        n += len(reads)
        session.history.clear()
    return n / (time.perf_counter() - start)


def bench_worker_start(sandboxed: Any, env_name: str, n: int = 5) -> tuple[float, float, float, float]:
    """Medians: a cold worker start (the wall's start-up only), a start from a warm spare (a hand-over), and
    loading the environment again plus its first session with a spare ready, beside the same in-process."""
    from envfactory.env.pool import load_env_folder
    from envfactory.env.sandbox.process import SandboxProcess
    from envfactory.env.sandbox.spare import SPARES
    from envfactory.env.sandboxed import release_pool

    pool = sandboxed.pool
    s = pool.settings
    limits = worker_limits(s.memory_mb, s.cpu_s)
    channel = pool.worker_channel()
    release_pool(pool)  # its workers end: each load below starts one
    cold: list[float] = []
    warm: list[float] = []
    use: list[float] = []
    inproc: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        process = SandboxProcess(s.wall, limits, tmpfs_mb=s.tmpfs_mb, channel=channel, monitor=True)
        process.start()
        cold.append(time.perf_counter() - t)
        process.close()
        SPARES.refill(s.wall, limits, s.tmpfs_mb, channel)
        _wait_spare(SPARES, s, limits, channel)
        t = time.perf_counter()
        spare = SPARES.take(s.wall, limits, s.tmpfs_mb, channel)
        warm.append(time.perf_counter() - t)
        assert spare is not None, "no spare came up"
        spare.close()
        SPARES.refill(s.wall, limits, s.tmpfs_mb, channel)
        _wait_spare(SPARES, s, limits, channel)
        t = time.perf_counter()
        again = load_untrusted_folder(ROOT / "envs" / env_name, Settings(root=ROOT, bfcl=False, sandbox_workers=1))
        again.session("default")
        use.append(time.perf_counter() - t)
        release_pool(again.pool)
        t = time.perf_counter()
        load_env_folder(ROOT / "envs" / env_name).session("default")
        inproc.append(time.perf_counter() - t)
    return tuple(statistics.median(x) for x in (cold, warm, use, inproc))  # type: ignore[return-value]


def bench_session_worker(env_name: str, n: int = 10) -> float:
    """Median seconds to open a session on a worker of its own (`sandbox_session_workers`: a hand-over from the warm
    spare, the code's load, its judged canary) and close it (the worker ends with it)."""
    from envfactory.env.sandboxed import release_pool

    env = load_untrusted_folder(
        ROOT / "envs" / env_name, Settings(root=ROOT, bfcl=False, sandbox_workers=1, sandbox_session_workers=True)
    )
    times: list[float] = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            session = Session.fork(env, "default")
            session.close()
            times.append(time.perf_counter() - t)
            time.sleep(0.3)  # the next spare comes up, as between a server's sessions
    finally:
        release_pool(env.pool)
    return statistics.median(times)


def bench_pipe_round_trip(poll: bool, n: int = 20_000) -> float:
    """µs per round trip of a small frame between two bare processes over two pipes, no work on either side: the
    floor under a sandboxed call. `poll`: both sides poll their pipe before reading it (what `sandbox_spin_us`
    does), else both sleep on it (woken through the scheduler)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    msg = b'{"op":"call","id":1,"sid":1,"tool":"get_booking","args":{"booking_id":"BK-0002"}}'
    pid = os.fork()
    if pid == 0:  # the echo: read, answer
        os.close(w1)
        os.close(r2)
        while True:
            if poll:
                while not select.select([r1], [], [], 0)[0]:
                    pass
            data = os.read(r1, 1 << 16)
            if not data:
                os._exit(0)
            os.write(w2, data)
    os.close(r1)
    os.close(w2)
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(w1, msg)
            if poll:
                while not select.select([r2], [], [], 0)[0]:
                    pass
            os.read(r2, 1 << 16)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        os.close(w1)
        os.close(r2)
        os.waitpid(pid, 0)


def _wait_spare(spares: Any, s: Any, limits: Any, channel: Any, timeout_s: float = 30.0) -> None:
    key = (s.wall.kind, s.wall.bwrap, limits.model_dump_json(), s.tmpfs_mb, channel.model_dump_json())
    stop = time.monotonic() + timeout_s
    while key not in spares._ready and time.monotonic() < stop:
        time.sleep(0.01)
    time.sleep(0.2)  # let its start-up CPU settle (an idle worker shows none afterwards)


def _env() -> dict[str, str]:
    return {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "PYTHONPATH": str(ROOT)}


# ---- load generator (runs in a child process: `python sessions.py --client ...`) ----------------
async def _conversation_http(url: str, calls: list[tuple[str, dict[str, Any]]], http: Any) -> float:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    t = time.perf_counter()
    async with streamable_http_client(url, http_client=http) as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()
        for tool, args in calls:
            res = await s.call_tool(tool, args)
            assert not res.isError, res
    return time.perf_counter() - t


async def _conversation_stdio(env_name: str, calls: list[tuple[str, dict[str, Any]]]) -> float:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "envfactory.cli", "serve", env_name], env=_env())
    t = time.perf_counter()
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        for tool, args in calls:
            res = await s.call_tool(tool, args)
            assert not res.isError, res
    return time.perf_counter() - t


async def _run_many(kind: str, target: str, calls: list[Any], total: int, concurrency: int) -> dict[str, float]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    # one HTTP client for all sessions, as a rollout worker keeps one: a new httpx client per
    # session spends ~45 ms loading CA certificates, more than the whole MCP session costs
    http = httpx.AsyncClient(timeout=httpx.Timeout(30, read=300), limits=httpx.Limits(max_connections=4 * concurrency))

    async def one() -> None:
        async with sem:
            if kind == "http":
                latencies.append(await _conversation_http(target, calls, http))
            else:
                latencies.append(await _conversation_stdio(target, calls))

    start = time.perf_counter()
    async with http:
        await asyncio.gather(*(one() for _ in range(total)))
    wall = time.perf_counter() - start
    return {"per_s": total / wall, "median_ms": statistics.median(latencies) * 1000, "n": total}


async def _calls_in_sessions(url: str, calls: list[Any], concurrency: int, seconds: float) -> float:
    """Tool calls/s with `concurrency` MCP sessions open on one server, each calling in a loop."""
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    setup, reads = _reads_after_writes(calls)
    counts = [0] * concurrency
    http = httpx.AsyncClient(timeout=30)

    async def worker(i: int, stop: float) -> None:
        async with streamable_http_client(url, http_client=http) as (r, w, _), ClientSession(r, w) as s:
            await s.initialize()
            for tool, args in setup:  # book before reading it back
                assert not (await s.call_tool(tool, args)).isError
            while time.perf_counter() < stop:
                for tool, args in reads:
                    await s.call_tool(tool, args)
                counts[i] += len(reads)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i, start + seconds) for i in range(concurrency)))
    return sum(counts) / (time.perf_counter() - start)


def _reads_after_writes(calls: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the conversation's calls up to its last write, its read calls): a session makes the first once (book
    before reading back what it booked), then repeats the reads (repeated writes would pile up state)."""
    writes = [k for k, c in enumerate(calls) if c[0].startswith(("book", "cancel", "modify"))]
    setup = calls[: writes[-1] + 1] if writes else []
    return setup, [c for c in calls if not c[0].startswith(("book", "cancel", "modify"))]


async def _calls_lean(url: str, calls: list[Any], concurrency: int, seconds: float) -> dict[str, float]:
    """The same load from the trainers' client (`envfactory.serve.trainer_client`: MCP's JSON-RPC messages on a
    keep-alive connection per session, asyncio streams, no HTTP library, no SDK session): each session books,
    then reads in a loop. What is left of a call's time is the server's and the wire's. (An httpx client per
    session did ~1,000 calls/s here, its own cost the limit.) Every call's result is checked: `failed` counts
    the calls whose tool failed."""
    from envfactory.serve.trainer_client import ClientOptions, TrainerSession

    setup, reads = _reads_after_writes(calls)
    counts, failed = [0] * concurrency, [0] * concurrency
    options = ClientOptions()
    if url.startswith("unix:"):  # a server's --uds: the socket, with the HTTP path and host of a local URL
        options, url = ClientOptions(uds=url.removeprefix("unix:")), "http://localhost/mcp"

    async def worker(i: int, stop: float) -> None:
        async with await TrainerSession.open(url, options=options) as env:
            for tool, args in setup:
                failed[i] += (await env.call(tool, args)).is_error
                counts[i] += 1
            while time.perf_counter() < stop:
                for tool, args in reads:
                    failed[i] += (await env.call(tool, args)).is_error
                counts[i] += len(reads)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i, start + seconds) for i in range(concurrency)))
    wall = time.perf_counter() - start
    return {"per_s": sum(counts) / wall, "calls": sum(counts), "failed": sum(failed)}


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--client", choices=["http", "stdio", "calls", "lean"])
    p.add_argument("--target")
    p.add_argument("--env")
    p.add_argument("--total", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--no-calls", action="store_true", help="open and initialize sessions only")
    a = p.parse_args(argv)
    calls = [] if a.no_calls else CONVERSATIONS[a.env]
    if a.client == "calls":
        out: Any = {"per_s": asyncio.run(_calls_in_sessions(a.target, calls, a.concurrency, a.seconds))}
    elif a.client == "lean":
        out = asyncio.run(_calls_lean(a.target, calls, a.concurrency, a.seconds))
    else:
        out = asyncio.run(_run_many(a.client, a.target, calls, a.total, a.concurrency))
    print(json.dumps(out))


def _client(*args: str) -> dict[str, float]:
    res = subprocess.run([sys.executable, __file__, *args], env=_env(), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _start_serving(
    env_name: str, where: list[str], connect: Callable[[], socket.socket], target: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`envfactory serve ENV --transport http WHERE...` once `connect()` reaches it: (the process, `target`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "envfactory.cli", "serve", env_name, "--transport", "http", *where],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with connect():
                return proc, target
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the HTTP server ({' '.join(where)}) did not start")


def _start_unix(env_name: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`envfactory serve --uds` on a socket in `folder`; (the process, "unix:PATH", the lean client's target)."""
    path = folder / f"{env_name}.sock"

    def connect() -> socket.socket:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
        except OSError:
            probe.close()
            raise
        return probe

    return _start_serving(env_name, ["--uds", str(path)], connect, f"unix:{path}")


def _start_http(env_name: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    return _start_serving(
        env_name, ["--port", str(port), *extra], lambda: socket.create_connection(("127.0.0.1", port), 0.5), url
    )


def _lean(server: subprocess.Popen[bytes], target: str, env: str, sessions: int, seconds: float) -> Any:
    """(calls/s, the server's CPU share, calls per CPU-second of the server, the share of calls that succeeded)
    from the trainers' client in its own process."""
    cpu = psutil.Process(server.pid)
    before, t0 = cpu.cpu_times(), time.perf_counter()
    args = ("--target", target, "--env", env, "--concurrency", str(sessions), "--seconds", str(seconds))
    out = _client("--client", "lean", *args)
    after, wall = cpu.cpu_times(), time.perf_counter() - t0
    used = (after.user + after.system) - (before.user + before.system)
    return out["per_s"], used / wall, out["calls"] / used, 1 - out["failed"] / max(out["calls"], 1)


def lean_main(env: str, sessions: list[int], seconds: float) -> list[Figure]:
    """`--lean-only`: the trainers' client against one server process, fast path and SDK path."""
    rates: dict[tuple[str, int], tuple[float, float]] = {}
    t = Table(title=f"trainer client vs one server process: env={env}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    for col in ("server", "sessions", "calls/s", "target", "server busy", "per server CPU-s", "calls succeeded"):
        t.add_column(col)
    servers = (
        ("fast path", ()),
        ("fast path, Unix socket (--uds)", None),
        ("SDK path (--no-fast-calls)", ("--no-fast-calls",)),
    )
    folder = Path(tempfile.mkdtemp(prefix="envf-", dir="/tmp"))  # short: a socket's path is at most 107 bytes
    for path, extra in servers:
        proc, url = _start_http(env, *extra) if extra is not None else _start_unix(env, folder)
        try:
            for n in sessions:
                per_s, busy, per_cpu, ok = _lean(proc, url, env, n, seconds)
                rates[(path, n)] = per_s, ok
                met = "" if extra else ("yes" if per_s >= LEAN_TARGET else "[red]no[/red]")  # () and None: fast
                ok_s = f"{ok:.1%}" + ("" if ok == 1 else " [red]![/red]")
                t.add_row(
                    path,
                    str(n),
                    f"{per_s:,.0f}",
                    f">= {LEAN_TARGET:,} /s {met}",
                    f"{busy:.0%}",
                    f"{per_cpu:,.0f}",
                    ok_s,
                )
        finally:
            proc.terminate()
            proc.wait(10)
    Console(width=160).print(t)
    shutil.rmtree(folder, ignore_errors=True)
    figures = []
    for n in sessions:
        (sdk, _) = rates[("SDK path (--no-fast-calls)", n)]
        for path, how in (("fast path", "loopback TCP"), ("fast path, Unix socket (--uds)", "a Unix socket")):
            fast, ok = rates[(path, n)]
            figures.append(
                Figure(
                    path="trainer client",
                    measure=f"tool calls against one server process over {how}, {n} sessions (book, then read back)",
                    value=fast,
                    shown=f"{fast:,.0f} /s ({ok:.0%} succeeded)",
                    beside=f"through the SDK (TCP): {sdk:,.0f} /s",
                    target=f">= {LEAN_TARGET:,} /s",
                    met=fast >= LEAN_TARGET and ok == 1,
                )
            )
    return figures


def main() -> None:
    if "--client" in sys.argv:
        client_main(sys.argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="hotels", choices=sorted(CONVERSATIONS))
    p.add_argument("--concurrency", type=int, default=8, help="concurrent conversations / sessions (N)")
    p.add_argument("--conversations", type=int, default=200, help="HTTP conversations to run")
    p.add_argument("--baseline", type=int, default=6, help="stdio process-per-conversation runs (slow)")
    p.add_argument("--seconds", type=float, default=3.0, help="duration of the calls/s measurements")
    p.add_argument("--sandbox-only", action="store_true", help="only the in-process and sandboxed rows")
    p.add_argument("--lean-only", action="store_true", help="only the trainer client against one server process")
    add_json_flag(p)
    a = p.parse_args()
    if a.lean_only:
        write_figures(a.json, lean_main(a.env, sorted({a.concurrency, 64}), a.seconds))
        return

    pool = EnvPool(Settings(root=ROOT, bfcl=False))
    env = pool.get(a.env)
    calls = CONVERSATIONS[a.env]
    fork_s = bench_fork(env, 2000)
    inproc = bench_inprocess(env, calls, a.seconds)
    from envfactory.env.sandboxed import release_pool

    # the same code loaded with the pipe not polled (before `sandbox_spin_us`), released before the default load
    unpolled = load_untrusted_folder(
        ROOT / "envs" / a.env, Settings(root=ROOT, bfcl=False, sandbox_workers=1, sandbox_spin_us=0)
    )
    sb_calls_unpolled = bench_inprocess(unpolled, calls, a.seconds)
    release_pool(unpolled.pool)
    started = time.perf_counter()
    sandboxed = load_untrusted_folder(ROOT / "envs" / a.env, Settings(root=ROOT, bfcl=False, sandbox_workers=1))
    sb_start = time.perf_counter() - started
    sb_fork = bench_fork(sandboxed, 500)
    sb_calls = bench_inprocess(sandboxed, calls, a.seconds)
    trip_sleep, trip_poll = bench_pipe_round_trip(False), bench_pipe_round_trip(True)
    cold_start, spare_start, spare_use, inproc_use = bench_worker_start(sandboxed, a.env)
    own_worker = bench_session_worker(a.env)
    sandbox_rows = [
        ("sandboxed worker start + code load (first use)", f"{sb_start * 1e3:.0f} ms", "", None),
        ("worker start, cold (bubblewrap, seccomp, imports)", f"{cold_start * 1e3:.0f} ms", "", None),
        ("worker start, warm spare (hand-over)", f"{spare_start * 1e3:.1f} ms", "<= 50 ms", spare_start <= 0.05),
        (
            "  load + first session, spare ready / in-process",
            f"{spare_use * 1e3:.0f} / {inproc_use * 1e3:.0f} ms",
            "",
            None,
        ),
        ("session fork, sandboxed (median)", f"{sb_fork * 1e6:.0f} µs", "< 5 ms", sb_fork < 5e-3),
        (
            "  a session on a worker of its own (sandbox_session_workers), open + close",
            f"{own_worker * 1e3:.0f} ms",
            "",
            None,
        ),
        ("tool calls, sandboxed, 1 worker", f"{sb_calls:,.0f} /s", ">= 2,000 /s", sb_calls >= 2_000),
        ("  the same, pipe not polled (sandbox_spin_us=0)", f"{sb_calls_unpolled:,.0f} /s", "", None),
        (
            "  pipe round trip, bare processes: sleeping / polling",
            f"{trip_sleep:.0f} / {trip_poll:.0f} µs",
            "",
            None,
        ),
        (
            "  a call in-process + a polled round trip: the floor",
            f"{1e6 / inproc + trip_poll:.0f} µs ({(1e6 / inproc) / (1e6 / inproc + trip_poll):.0%})",
            "",
            None,
        ),
        ("  ratio in-process / sandboxed", f"{inproc / sb_calls:.1f}×", "", None),
        (
            "read-heavy session, sandboxed / in-process",
            f"{sb_calls / inproc:.0%}",
            ">= 50 %",
            sb_calls / inproc >= 0.5,
        ),
    ]
    if a.sandbox_only:
        t = Table(title=f"sessions benchmark (sandbox rows): env={a.env}, {os.cpu_count()} CPUs")
        for col in ("measure", "value", "target", "met"):
            t.add_column(col)
        t.add_row(
            "session fork, in-process (median)", f"{fork_s * 1e6:.1f} µs", "< 1 ms", "yes" if fork_s < 1e-3 else "no"
        )
        t.add_row("tool calls, in-process", f"{inproc:,.0f} /s", ">= 20,000 /s", "yes" if inproc >= 20_000 else "no")
        for name, value, target, met in sandbox_rows:
            t.add_row(name, value, target, "" if met is None else ("yes" if met else "[red]no[/red]"))
        Console(width=120).print(t)
        share = sb_calls / inproc
        write_figures(
            a.json,
            [
                Figure(
                    path="sandboxed sessions",
                    measure="read-heavy session's calls, sandboxed (1 worker) / in-process",
                    value=share,
                    shown=f"{share:.0%} ({sb_calls:,.0f} /s)",
                    beside=f"in-process: {inproc:,.0f} /s; pipe not polled: {sb_calls_unpolled / inproc:.0%}",
                    target=">= 50 %",
                    met=share >= 0.5,
                ),
                Figure(
                    path="sandboxed sessions",
                    measure="worker start, from a warm spare (hand-over)",
                    value=spare_start,
                    shown=f"{spare_start * 1e3:.1f} ms",
                    beside=f"cold: {cold_start * 1e3:.0f} ms",
                    target="<= 50 ms",
                    met=spare_start <= 0.05,
                ),
            ],
        )
        return

    def conv(kind: str, target: str, total: int, concurrency: int, *extra: str) -> dict[str, float]:
        return _client(
            "--client",
            kind,
            "--target",
            target,
            "--env",
            a.env,
            "--total",
            str(total),
            "--concurrency",
            str(concurrency),
            *extra,
        )

    proc, url = _start_http(a.env)
    try:
        conv("http", url, 10, 2)  # warm-up
        http_start = conv("http", url, a.conversations, a.concurrency, "--no-calls")
        http_conv = conv("http", url, a.conversations, a.concurrency)

        def lean(server: subprocess.Popen[bytes], target: str, sessions: int) -> tuple[float, float, float, float]:
            return _lean(server, target, a.env, sessions, a.seconds)  # type: ignore[no-any-return]

        def calls_per_s(client: str, sessions: int) -> float:
            args = ["--target", url, "--env", a.env, "--concurrency", str(sessions), "--seconds", str(a.seconds)]
            return _client("--client", client, *args)["per_s"]

        http_calls = {"per_s": calls_per_s("calls", a.concurrency)}
        raw_calls = {(n, "fast path"): lean(proc, url, n) for n in sorted({a.concurrency, 64})}
    finally:
        proc.terminate()
        proc.wait(10)
    proc, url = _start_http(a.env, "--no-fast-calls")
    try:
        raw_calls[(64, "SDK path")] = lean(proc, url, 64)
    finally:
        proc.terminate()
        proc.wait(10)
    base_n = min(a.concurrency, a.baseline)
    stdio_start = conv("stdio", a.env, a.baseline, base_n, "--no-calls")
    stdio_conv = conv("stdio", a.env, a.baseline, base_n)

    ratio_start = http_start["per_s"] / stdio_start["per_s"]
    ratio_conv = http_conv["per_s"] / stdio_conv["per_s"]
    t = Table(title=f"sessions benchmark: env={a.env}, N={a.concurrency} concurrent, {os.cpu_count()} CPUs")
    for col in ("measure", "value", "target", "met"):
        t.add_column(col)

    def row(name: str, value: str, target: str, met: bool | None) -> None:
        t.add_row(name, value, target, "" if met is None else ("yes" if met else "[red]no[/red]"))

    def rate(m: dict[str, float]) -> str:
        return f"{m['per_s']:.1f} /s (median {m['median_ms']:.0f} ms)"

    row("session fork, in-process (median)", f"{fork_s * 1e6:.1f} µs", "< 1 ms", fork_s < 1e-3)
    row("tool calls, in-process", f"{inproc:,.0f} /s", ">= 20,000 /s", inproc >= 20_000)
    for sandbox_row in sandbox_rows:
        row(*sandbox_row)
    row(f"tool calls, MCP HTTP, {a.concurrency} sessions on 1 process", f"{http_calls['per_s']:,.0f} /s", "", None)
    for (n, path), (per_s, busy, per_cpu_s, ok) in raw_calls.items():
        fast = path == "fast path"
        target = f">= {LEAN_TARGET:,} /s" if fast else ""
        name = f"tool calls, MCP HTTP, {n} sessions, trainer client (serve.trainer_client), {path}"
        row(name, f"{per_s:,.0f} /s", target, per_s >= LEAN_TARGET if fast else None)
        row(f"  per CPU-second of the server process (busy {busy:.0%})", f"{per_cpu_s:,.0f} /s", target, None)
        row("  calls that succeeded (book, then read back)", f"{ok:.1%}", "100 %", ok == 1)
    row("conversations started: HTTP session each", rate(http_start), "", None)
    row("conversations started: stdio process each (baseline)", rate(stdio_start), "", None)
    row("  ratio HTTP / baseline (started)", f"{ratio_start:.0f}×", ">= 50×", ratio_start >= 50)
    row(f"conversations completed ({len(calls)} calls): HTTP", rate(http_conv), "", None)
    row(f"conversations completed ({len(calls)} calls): stdio (baseline)", rate(stdio_conv), "", None)
    row("  ratio HTTP / baseline (completed)", f"{ratio_conv:.0f}×", "", None)
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
