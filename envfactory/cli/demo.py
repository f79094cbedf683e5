"""`envfactory demo`: the main job, offline, on the bundled pool (grows with the pipeline).

1. validate every environment of the pool (bundled + BFCL) and sync configs/mcp_server.json;
2. serve one environment over streamable HTTP and run two concurrent MCP conversations on it,
   each walking a dependency chain (search → book → cancel) in its own isolated state;
3. synthesize verified conversations offline (no LLM): the tool graph, sampled chains, generated
   initial databases, the privileged solver, SynthAPI's filter, template queries; one sample shown;
4. export that run as training data in every format (TRL SFT / GRPO, LlamaFactory, VeRL) and score four
   completions of one RL record with the composite reward (ground truth 1.0 > redundant > wrong > empty).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from mcp.types import TextContent
from rich.console import Console

from envfactory.cli.reward_sanity import SanityReport, reward_sanity
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.envgen.validate import EnvReport, sync_registry, validate_env
from envfactory.errors import EnvFactoryError
from envfactory.serve.net import free_port
from envfactory.tasks.plan import BatchSummary, SynthConfig, load_conversations
from envfactory.tasks.quality import PAPER_STEPS_PER_TURN, PAPER_TURNS_PER_CONVERSATION, QualityFigures, measure
from envfactory.tasks.run import run_batch
from envfactory.terminal import SafeConsole, Table, safe


async def _conversation(url: str, guest: str) -> list[tuple[str, Any]]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    steps: list[tuple[str, Any]] = []
    async with streamable_http_client(url) as (r, w, _), ClientSession(r, w) as s:
        await s.initialize()

        async def call(tool: str, args: dict[str, Any]) -> Any:
            res = await s.call_tool(tool, args)
            block = res.content[0]
            payload = json.loads(block.text) if isinstance(block, TextContent) else None
            steps.append((f"{tool}({json.dumps(args)})", payload))
            if res.isError:
                raise EnvFactoryError(f"demo call {tool} failed: {payload}")
            return payload

        hotels = await call("search_hotels", {"city": "Lisbon", "max_price": 150})
        booking = await call(
            "book_room", {"hotel_id": hotels[0]["id"], "guest_name": guest, "check_in": "2026-03-02", "nights": 2}
        )
        await call("cancel_booking", {"booking_id": booking["id"]})
        await call("list_bookings", {"guest_name": guest})
    return steps


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EnvFactoryError("the demo MCP server exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise EnvFactoryError(f"the demo MCP server did not listen on port {port} within {timeout:.0f} s")


def run_demo(settings: Settings, console: Console | None = None) -> list[EnvReport]:
    console = console or SafeConsole()
    pool = EnvPool(settings)
    console.rule("1. validate the environment pool")
    reports = [validate_env(pool, name) for name in pool.names()]
    sync_registry(pool, reports)
    table = Table("environment", "domain", "tools", "write", "verdict")
    for r in reports:
        verdict = "ok" if r.ok else "; ".join(r.problems)
        table.add_row(safe(r.name), safe(r.domain or ""), str(r.tools), str(r.write_tools), safe(verdict))
    console.print(table)
    ok = sum(r.ok for r in reports)
    console.print(f"{ok}/{len(reports)} verified; registry: {safe(settings.registry_file)}")

    console.rule("2. two isolated MCP conversations on one streamable-HTTP server")
    port = free_port()
    env = {**os.environ, "ENVFACTORY_ROOT": str(settings.root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envfactory.cli", "serve", "hotels", "--transport", "http", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port, proc)
        url = f"http://127.0.0.1:{port}/mcp"

        async def both() -> list[list[tuple[str, Any]]]:
            return list(await asyncio.gather(_conversation(url, "Ana Costa"), _conversation(url, "Rui Alves")))

        for guest, steps in zip(("Ana Costa", "Rui Alves"), asyncio.run(both()), strict=True):
            console.print(f"[bold]{guest}[/bold]")
            for call, payload in steps:
                console.print(f"  {safe(call)}\n    → {safe(json.dumps(payload)[:150])}")
    finally:
        proc.terminate()
        proc.wait(10)

    console.rule("3. verified conversations, offline: A environments × T tasks × S states, depth D")
    synth_demo(settings, console, pool)

    console.rule("4. training data: export the run, and a reward sanity check")
    export_demo(settings, pool, console)
    return reports


def synth_demo(settings: Settings, console: Console, pool: EnvPool | None = None) -> BatchSummary:
    out = settings.data_path / "demo" / "synth"
    shutil.rmtree(out, ignore_errors=True)  # the demo shows a whole run, not a resumed one
    config = SynthConfig.model_validate({"T": 3, "S": 2, "D": 2, "seed": 0, "out": out})
    summary = run_batch(config, settings, console=console, pool=pool)
    conversations = load_conversations(out)
    if not conversations:
        raise EnvFactoryError("demo: the offline synthesis kept no conversation")
    sample = max(conversations, key=lambda c: (len(c.nodes), -len(c.tools), c.id))
    console.print(f"[bold]a sample conversation[/bold] ({safe(sample.id)}: {len(sample.nodes)} turns)")
    for node in sample.nodes:
        console.print(f"  [green]user[/green]       {safe(node.query)}", highlight=False, soft_wrap=True)
        for call in node.raw_tool_call:
            text = f"{call.name}({json.dumps(call.arguments)})"
            console.print(f"  [cyan]tool call[/cyan]  {safe(text)}", highlight=False, soft_wrap=True)
        answer = node.steps[-1].content
        console.print(f"  [magenta]assistant[/magenta]  {safe(answer)}", highlight=False, soft_wrap=True)
    console.print(quality_table(measure(conversations), summary))
    console.print(f"written to {safe(out)}/conversations.jsonl (dropped units and reasons: dropped.jsonl)")
    return summary


def quality_table(figures: QualityFigures, summary: BatchSummary) -> Table:
    """The run's data-quality figures beside the EnvFactory paper's data (`benchmarks/data_quality.py`)."""
    table = Table("figure", "paper's data", "this run", title="data quality (definitions: envfactory/tasks/quality.py)")
    units = summary.kept + summary.dropped
    rows = [
        ("turns per conversation", f"{PAPER_TURNS_PER_CONVERSATION}", f"{figures.turns_per_conversation:.2f}"),
        ("tool calls per turn", f"{PAPER_STEPS_PER_TURN} (steps)", f"{figures.calls_per_turn:.2f}"),
        ("requests with an internal id", "", f"{100 * figures.requests_with_internal_id:.1f} %"),
        ("id arguments found in no earlier result", "", f"{100 * figures.incoherent_id_arguments:.1f} %"),
        ("canned answers", "", f"{100 * figures.canned_answers:.1f} %"),
        ("distinct-2 over requests", "", f"{figures.distinct_2_requests:.2f}"),
        ("keep-rate", "", f"{100 * summary.kept / units:.0f} %" if units else "-"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def export_demo(settings: Settings, pool: EnvPool, console: Console) -> SanityReport:
    from envfactory.export import FORMATS, convert_to_rl_data, export_conversations
    from envfactory.export.options import ExportOptions, default_per
    from envfactory.export.tools_schema import catalog_for

    synth = settings.data_path / "demo" / "synth"
    conversations = load_conversations(synth)
    catalog = catalog_for(pool, conversations)
    table = Table("format", "samples", "skipped turns", "files")
    for fmt in FORMATS:
        out = settings.data_path / "demo" / "export" / fmt
        shutil.rmtree(out, ignore_errors=True)
        report = export_conversations(conversations, fmt, out, catalog, ExportOptions(per=default_per(fmt)))
        files = ", ".join(p.name for p in report.files)
        table.add_row(fmt, str(report.samples), str(report.skipped_turns), safe(files))
    console.print(table)
    where = settings.data_path / "demo" / "export"
    console.print(f"written to {safe(where)}/<format>/ (`envfactory export` does one)")

    samples = [s for c in conversations for s in convert_to_rl_data(c, catalog)]
    sanity = reward_sanity(pool, samples)
    console.print(
        f"[bold]composite reward[/bold] on {safe(sanity.conversation_id)} turn {sanity.turn} "
        f"({safe(' → '.join(sanity.tools))}), α = 0.5, Hermes <tool_call> completions:"
    )
    scores = Table("completion", "calls", "R_traj", "R_state", "P_length", "reward")
    for row in sanity.rows:
        r = row.result
        scores.add_row(
            safe(row.kind), str(r.n_pred), f"{r.r_traj:.3f}", f"{r.r_state:.3f}", str(r.p_length), f"{r.reward:.3f}"
        )
    console.print(scores)
    if not sanity.ordered:
        raise EnvFactoryError(f"demo: the reward sanity order does not hold: {[r.result for r in sanity.rows]}")
    console.print("ground truth 1.0 > redundant call > wrong argument > empty: holds")
    return sanity
