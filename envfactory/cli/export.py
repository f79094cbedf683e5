"""`envfactory export`: a synth run (or a conversations JSONL) as training data for TRL, LlamaFactory or VeRL."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from envfactory.cli.args import out_dir_option, path_to_write, refuse_overwriting_input
from envfactory.run_settings import EXPORT_FILE, SETTINGS_FILE
from envfactory.terminal import SafeConsole, safe

app = typer.Typer(
    add_completion=False,
    help="Export verified conversations as SFT / RL training data.",
    # a group callback with a positional argument: let options follow it (`export RUN --format verl`)
    context_settings={"allow_interspersed_args": True},
    subcommand_metavar="",
)
out = SafeConsole(soft_wrap=True)
err = SafeConsole(stderr=True, soft_wrap=True)


class Format(StrEnum):
    trl_sft = "trl-sft"
    trl_grpo = "trl-grpo"
    llamafactory = "llamafactory"
    verl = "verl"


class Per(StrEnum):
    turn = "turn"
    conversation = "conversation"


class UserCalls(StrEnum):
    describe = "describe"
    drop = "drop"


class Tools(StrEnum):
    all = "all"
    needed = "needed"


class Schemas(StrEnum):
    full = "full"
    compact = "compact"


@app.callback(invoke_without_command=True)
def export(
    ctx: typer.Context,
    source: Annotated[Path, typer.Argument(help="a synth run folder (its conversations.jsonl) or a JSONL file")],
    fmt: Annotated[Format, typer.Option("--format", help="trl-sft | trl-grpo | llamafactory | verl")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="output folder", parser=path_to_write, callback=out_dir_option)
    ],
    per: Annotated[
        Per | None,
        typer.Option(
            help="SFT samples: one per valid turn, or one per conversation (default: turn; llamafactory: "
            "conversation, as it trains every assistant message of a row)"
        ),
    ] = None,
    keep_thinking: Annotated[bool, typer.Option("--keep-thinking", help="keep <think> traces")] = False,
    system: Annotated[str | None, typer.Option(help="a system message for every sample")] = None,
    user_calls: Annotated[
        UserCalls, typer.Option(help="the user's own tool calls: a note in their message, or dropped")
    ] = UserCalls.describe,
    include_interactive: Annotated[
        bool, typer.Option("--include-interactive", help="RL: also turns where the user spoke again mid-turn")
    ] = False,
    tools: Annotated[
        Tools,
        typer.Option(help="each row's tools: all of its environments', or those its calls use plus --distractors"),
    ] = Tools.all,
    distractors: Annotated[
        int, typer.Option(min=0, help="--tools needed: other tools of the same environments added to each row")
    ] = 2,
    schemas: Annotated[
        Schemas, typer.Option(help="tool schemas as declared (full), or compact: no titles, short descriptions")
    ] = Schemas.full,
    seed: Annotated[int, typer.Option(help="--tools needed: seeds the choice of distractor tools")] = 0,
) -> None:
    """Write train.jsonl (TRL; LlamaFactory + dataset_info.json) or train.parquet (VeRL), and export.json (what was
    exported, how, and a sha256 of the source file)."""
    from envfactory.config import get_settings
    from envfactory.env.pool import EnvPool
    from envfactory.export.errors import ExportError
    from envfactory.export.export import ExportSource, check_earlier, export_conversations
    from envfactory.export.files import conversations_file, training_conversations, unfinished
    from envfactory.export.options import ExportOptions, default_per
    from envfactory.export.tools_schema import catalog_for
    from envfactory.run_settings import file_sha256, read_record

    # typed on the command line (typer vendors click: its ParameterSource is compared by name)
    typed = {n for n in ("distractors", "seed") if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"}
    if tools is Tools.all and typed:
        given = " and ".join(f"--{n}" for n in sorted(typed))
        raise ExportError(f"{given} choose{'s' if len(typed) == 1 else ''} distractor tools: add --tools needed")
    if include_interactive and fmt.value in ("trl-sft", "llamafactory"):
        raise ExportError(f"--include-interactive shapes RL rows (trl-grpo, verl); {fmt.value} rows are SFT")
    if per is Per.conversation and fmt.value not in ("trl-sft", "llamafactory"):  # RL rows are turns
        raise ExportError(f"--per conversation shapes SFT rows (trl-sft, llamafactory); {fmt.value} rows are turns")
    if per is None:
        per = Per(default_per(fmt.value))
    elif per is Per.turn and fmt.value == "llamafactory":
        err.print(
            "note: LLaMA-Factory trains every assistant message of a row, so per-turn rows train earlier turns again "
            "(mask_history: true trains only each row's last answer, never its calls); --per conversation avoids both",
            highlight=False,
        )
    refuse_overwriting_input(out_dir, "--out", source)
    run = source if source.is_dir() else source.parent
    inside = out_dir.resolve() != run.resolve() and out_dir.resolve().is_relative_to(run.resolve())
    if inside and (run / SETTINGS_FILE).is_file():  # (the run folder itself is refused below, as a synth folder)
        raise ExportError(f"--out {out_dir} is inside the run folder {run}, which export reads: write elsewhere")
    if (recorded := read_record(out_dir)) is not None:  # a synth run's or an evaluation's folder
        raise ExportError(f"{out_dir} is an `envfactory {recorded.command}` folder: give another --out")
    check_earlier(out_dir, fmt.value)  # before the source is read
    conversations = training_conversations(source)
    if unfinished(source):
        err.print(
            f"note: {source} has no summary.json: the run did not finish (killed, or still running); what it wrote "
            "so far is exported (a line cut off mid-write is left out)",
            highlight=False,
        )
    if not conversations:  # nothing to train on: said before anything is written
        raise ExportError(
            f"{source}: nothing to export: it holds no conversation (give a synth run or its conversations.jsonl)"
        )
    path = conversations_file(source)
    origin = ExportSource(path=str(path.resolve()), sha256=file_sha256([path]))
    pool = EnvPool(get_settings())
    catalog = catalog_for(pool, conversations)
    options = ExportOptions(
        per=per.value,
        keep_thinking=keep_thinking,
        system=system,
        user_calls=user_calls.value,
        include_interactive=include_interactive,
        tools=tools.value,
        distractors=distractors,
        schemas=schemas.value,
        seed=seed,
    )
    report = export_conversations(conversations, fmt.value, out_dir, catalog, options, origin)
    out.print(
        f"{report.format}: {report.samples} samples from {report.conversations} conversations ({report.turns} turns; "
        f"{report.skipped_turns} turns skipped, {report.skipped_rows} rows skipped, "
        f"{report.failed_calls_removed} failed calls removed)",
        highlight=False,
    )
    for path in report.files:  # (recorded relative to the export's folder, where export.json is)
        out.print(f"  {safe(out_dir / path)}", highlight=False, soft_wrap=True)
    out.print(
        f"  {safe(out_dir / EXPORT_FILE)}: what was exported, how, and from which file", highlight=False, soft_wrap=True
    )
