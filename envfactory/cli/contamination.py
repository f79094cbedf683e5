"""`envfactory contamination RUN --against bfcl`: overlap between a run's data and BFCL multi-turn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from envfactory.cli.args import out_file_option, path_to_write, refuse_overwriting_input
from envfactory.errors import EnvFactoryError
from envfactory.eval.items import load_conversations
from envfactory.inputs import write_atomic
from envfactory.records.run_folder import HELDOUT
from envfactory.terminal import SafeConsole, Table, safe

app = typer.Typer(
    add_completion=False,
    help="Check a run's data for overlap with a benchmark (BFCL multi-turn).",
    context_settings={"allow_interspersed_args": True},  # options after RUN
)
out = SafeConsole()


@app.callback(invoke_without_command=True)
def contamination(
    source: Annotated[Path, typer.Argument(help="a synth run's folder, or a conversations JSONL file")],
    against: Annotated[str, typer.Option(help="the benchmark: bfcl")] = "bfcl",
    n: Annotated[int, typer.Option(min=3, max=64, help="word n-gram length")] = 8,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="also write the report here", parser=path_to_write, callback=out_file_option),
    ] = None,
) -> None:
    """Exact matches and n-gram overlap of requests, shared tool names, shared argument values."""
    if against != "bfcl":
        raise EnvFactoryError(f"--against: only 'bfcl' is known, not '{against}'")
    refuse_overwriting_input(json_out, "--json", source)
    from envfactory.eval.contamination import check
    from envfactory.suites.bfcl import available

    if not available():
        raise EnvFactoryError("--against bfcl needs bfcl-eval installed (pip install --no-deps bfcl-eval)")
    conversations = load_conversations(source)
    if source.is_dir() and (source / HELDOUT).is_file():
        conversations += load_conversations(source, "heldout")
    if not conversations:
        raise EnvFactoryError(f"{source}: nothing to check: it holds no conversation")
    report = check(conversations, n=n)
    title = (
        f"overlap with BFCL multi-turn ({report.benchmark_requests:,} user messages, "
        f"{report.benchmark_distinct:,} distinct)"
    )
    table = Table("measure", "value", title=title)
    table.add_row("our requests", str(report.requests))
    table.add_row("exact matches", str(report.exact_matches))
    table.add_row(f"requests sharing a {n}-gram", str(report.requests_with_shared_ngram))
    table.add_row(f"largest share of one request's {n}-grams", f"{report.max_ngram_share:.2%}")
    table.add_row("tool names also BFCL's", f"{len(report.shared_tool_names)} of {report.tools}")
    table.add_row("argument values in BFCL's calls", f"{report.shared_argument_count} of {report.argument_values}")
    out.print(table)
    for example in report.examples:
        out.print(f"  shares a {n}-gram: {safe(example[:160])}", highlight=False, soft_wrap=True)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)  # (`out_file_option` checked it can be made)
        write_atomic(json_out, report.model_dump_json(indent=2) + "\n")
