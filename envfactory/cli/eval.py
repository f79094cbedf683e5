"""`envfactory eval SOURCE --out DIR`: a model as a tool-using agent on verified turns (per-turn mode).

    envfactory eval .envfactory/synth/run --out .envfactory/eval/run1 --attempts 4 [--concurrency 4]

SOURCE is a synth run's folder or a JSONL file of conversations; the model is the `eval` role's
(`ENVFACTORY_LLM_ROLES__EVAL__PROVIDER=openai|local|scripted`, else the default model). DIR/settings.json
records what shapes the results (model, sampling, tools, mode, attempts, budgets, the data's sha256); attempts
go to DIR/attempts.jsonl as they finish (rerun the same command to resume: a rerun with other settings is
refused, naming them), then DIR/summary.json, a table, pass@1 with its 95 % bootstrap interval over items
(`envfactory.eval.stats`), and DIR/eval.png.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from langchain_core.language_models import BaseChatModel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envfactory.cli.args import out_dir_option, path_to_write
from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentLimits
from envfactory.eval.bfcl import SUITES, bfcl_attempt, bfcl_items, suite_files
from envfactory.eval.items import EvalSourceError, items_from_conversations, load_conversations
from envfactory.eval.run import (
    ATTEMPTS,
    FAILURES,
    SUMMARY,
    AttemptRecord,
    EvalData,
    EvalRunError,
    EvalSettings,
    EvalSummary,
    Group,
    HasId,
    Runner,
    TurnRunner,
    check_settings,
    chosen_items,
    run_eval,
)
from envfactory.executor import check_executor_flags, executor_from
from envfactory.export.errors import ExportError
from envfactory.export.files import conversations_file
from envfactory.llm.models import chat_model, check_configured
from envfactory.records.run_folder import HELDOUT
from envfactory.run_settings import SETTINGS_FILE, file_sha256, model_identity
from envfactory.terminal import SafeConsole, Table, safe

app = typer.Typer(
    add_completion=False,
    help="Evaluate a model as a tool-using agent on verified turns.",
    context_settings={"allow_interspersed_args": True},  # `eval SOURCE --out DIR`: options after the source
)
out = SafeConsole()
err = SafeConsole(stderr=True)


@app.callback(invoke_without_command=True)
def evaluate(
    out_dir: Annotated[
        Path,
        typer.Option("--out", help="results folder (rerun to resume)", parser=path_to_write, callback=out_dir_option),
    ],
    source: Annotated[Path | None, typer.Argument(help="a synth run's folder, or a conversations file")] = None,
    suite: Annotated[str | None, typer.Option(help=f"an imported suite instead of SOURCE: {', '.join(SUITES)}")] = None,
    split: Annotated[
        str | None, typer.Option(help="a run's split: heldout (default if the run has one), train")
    ] = None,
    attempts: Annotated[int, typer.Option(min=1, max=1000, help="attempts per turn: k of pass@k and pass^k")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="attempts at once")] = 1,
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="the first N turns only, or N drawn with --sample-seed (conversations in conversation mode, entries "
            "of --suite)",
        ),
    ] = None,
    sample_seed: Annotated[
        int | None,
        typer.Option(help="with --limit: N drawn at random with this seed, not the first N (a larger N keeps them)"),
    ] = None,
    max_steps: Annotated[int, typer.Option(min=1, help="model steps per attempt")] = 8,
    tools: Annotated[
        str | None, typer.Option(help="direct (the turn's tools; the default) or meta (SynthAPI's meta-tools)")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="turn (ground-truth history, then the request; the default) or conversation"),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.001, help="seconds per attempt")] = 300.0,
    executor: Annotated[str, typer.Option(help="local (threads here) or ray (workers on a Ray cluster)")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="ray: 'auto', 'host:port' or 'ray://host:port'; default: a new local instance")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="ray: worker processes (default: its CPUs)")] = None,
) -> None:
    """Run (or resume) an evaluation and print its summary."""
    settings = get_settings()
    check_configured(("eval",), settings)  # no model: one line now, not a table of zeros after every item failed
    check_executor_flags(executor, ray_address, workers)
    if tools not in (None, "direct", "meta"):
        raise EvalRunError(f"--tools is direct or meta, not '{tools}'")
    if mode not in (None, "turn", "conversation"):
        raise EvalRunError(f"--mode is turn or conversation, not '{mode}'")
    clash = [f"--tools {tools}"] * (suite is not None and tools == "meta") + [f"--mode {mode}"] * (
        suite is not None and mode == "turn"
    )
    if clash:
        raise EvalRunError(f"--suite plays BFCL's entries whole, with BFCL's own tools: drop {' and '.join(clash)}")
    if sample_seed is not None and limit is None:
        raise EvalRunError("--sample-seed picks which --limit items run: give --limit N too")
    limits = AgentLimits(max_steps=max_steps, timeout_s=timeout, tools="meta" if tools == "meta" else "direct")
    data, chosen = _data(source, suite, split)
    config = EvalSettings(
        attempts=attempts,
        concurrency=concurrency,
        limit=limit,
        sample_seed=sample_seed,
        limits=limits,
        mode="conversation" if suite is not None or mode == "conversation" else "turn",
        model=model_identity(settings, "eval"),
        data=data,
        context={
            "source": str(source.resolve()) if source is not None else f"suite {suite}",
            "base_url": settings.llm_for("eval").base_url,
        },
    )
    check_settings(out_dir, config, write=False)  # a resume made otherwise: refused before anything is read
    items: Sequence[HasId]
    runner: Runner[Any]
    if suite is not None:
        items = bfcl_items(suite)

        def play(model: BaseChatModel, item: Any, k: int) -> AttemptRecord:
            return bfcl_attempt(model, item, k, limits)

        runner = play
    else:
        assert source is not None  # _data refused neither
        pool = EnvPool(settings)
        conversations = load_conversations(source, "heldout" if chosen == "heldout" else "train")
        items = items_from_conversations(conversations, pool, config.mode)
        what = "conversations" if config.mode == "conversation" else "turns"
        err.print(f"evaluating the {chosen} split of {safe(source)}: {len(items)} verified {what}", highlight=False)
        runner = cast(Runner[Any], TurnRunner(settings, limits, pool))
    total = len(chosen_items(items, config)) * attempts
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
    ) as progress:
        bar = progress.add_task("eval", total=total)
        solved = ran = 0
        runs_on = executor_from(executor, ray_address, workers, concurrency)
        start = time.perf_counter()

        def advance(record: AttemptRecord) -> None:
            nonlocal solved, ran
            ran += 1
            solved += record.success
            rate = ran / max(time.perf_counter() - start, 1e-9)
            progress.update(bar, advance=1, description=f"eval: {solved}/{ran} solved, {rate:.2f} attempts/s")

        summary = run_eval(
            items, partial(chat_model, "eval", settings), runner, out_dir, config, progress=advance, executor=runs_on
        )
        progress.update(bar, completed=total)
    lost = total - summary.attempts
    if lost > 0:
        err.print(
            f"{lost} attempt(s) could not run (reasons in {safe(out_dir / FAILURES)}); rerun to try them again",
            highlight=False,
        )
    unit = "conversations" if config.mode == "conversation" else "turns"
    out.print(summary_table(summary, unit))
    if summary.errors:  # a score of 0 from a model that never answered is not a model that answered wrong
        err.print(
            f"{summary.errors} of {summary.attempts} attempt(s) ended in an error, not an answer (the model or its "
            f"server; each attempt's `error` is in {safe(out_dir / ATTEMPTS)}): they count as failures above; "
            "those whose model call failed are tried again when the command is run again",
            highlight=False,
        )
    ci = summary.pass_at_1_ci
    if ci is not None:
        out.print(
            f"pass@1 {ci.estimate:.3f}, 95% CI [{ci.low:.3f}, {ci.high:.3f}] (bootstrap over {ci.items} items, seed 0)",
            highlight=False,
        )
    plot_summary(summary, out_dir / "eval.png", unit)
    out.print(f"written to {safe(out_dir)} ({SETTINGS_FILE}, {ATTEMPTS}, {SUMMARY}, eval.png)", highlight=False)
    if summary.attempts and summary.model_errors == summary.attempts:  # no model call ever answered: no score
        raise EvalRunError(
            f"every attempt's model call failed (see the errors in {safe(out_dir / ATTEMPTS)}): nothing is scored; "
            "fix the model or its settings and run again with another --out (recorded attempts are kept)"
        )


def _data(source: Path | None, suite: str | None, split: str | None) -> tuple[EvalData, str]:
    """What is evaluated, with its sha256 (the file(s) the items are read from), and the split chosen."""
    if suite is not None:
        if source is not None:
            raise EvalRunError("give either SOURCE (a synth run or a conversations file) or --suite, not both")
        if split is not None:
            raise EvalRunError("--split chooses a synth run's split; a --suite is evaluated whole")
        if suite not in SUITES:
            raise EvalRunError(f"unknown suite '{suite}'; suites: {', '.join(SUITES)}")
        return EvalData(source="suite", suite=suite, sha256=file_sha256(suite_files(suite))), "suite"
    if source is None:
        raise EvalRunError("give SOURCE (a synth run's folder or a conversations file) or --suite NAME")
    named_heldout = source.name == HELDOUT and not source.is_dir()  # a run's held-out file, given itself
    chosen = split or ("heldout" if named_heldout or (source.is_dir() and (source / HELDOUT).is_file()) else "train")
    if chosen not in ("train", "heldout"):
        raise EvalRunError(f"--split is train or heldout, not '{chosen}'")
    if named_heldout and chosen != "heldout":
        raise EvalRunError(f"{source} is a run's held-out split: --split {chosen} contradicts it")
    try:
        path = conversations_file(source, "heldout" if chosen == "heldout" else "train")
    except ExportError as e:
        raise EvalSourceError(str(e)) from None
    kind = "run" if source.is_dir() else "file"
    return EvalData(
        source=kind, split="heldout" if chosen == "heldout" else "train", sha256=file_sha256([path])
    ), chosen


def _row(table: Table, name: str, g: Group, k: int) -> None:
    at, hat = g.pass_rates.pass_at, g.pass_rates.pass_hat
    table.add_row(
        safe(name),
        str(g.items),
        str(g.attempts),
        f"{g.success_rate:.3f}",
        f"{g.mean_reward:.3f}",
        f"{at[k]:.3f}" if k in at else "-",
        f"{hat[k]:.3f}" if k in hat else "-",
    )


def summary_table(summary: EvalSummary, unit: str = "turns") -> Table:
    """One k for every row — the run's (the fewest attempts any item has): a group whose items all have more
    would otherwise show its own larger k under the same header. `success` is over attempts, pass@k over items."""
    k = max(summary.pass_rates.pass_at) if summary.pass_rates.pass_at else 1
    headers = ("group", unit, "attempts", "success (attempts)", "reward (attempts)", f"pass@{k}", f"pass^{k}")
    table = Table(*headers, title="evaluation")
    _row(table, "all", summary, k)
    for title, groups in (("env", summary.by_env), ("kind", summary.by_kind), ("calls", summary.by_chain_length)):
        for name, g in groups.items():
            _row(table, f"{title}={name}", g, k)
    return table


def plot_summary(summary: EvalSummary, path: Path, unit: str = "turns") -> None:
    """Success rate and mean reward per environment (a bar chart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary.by_env)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(names) + 2), 3.2))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [summary.by_env[n].success_rate for n in names], width=0.4, label="success")
    ax.bar([x + 0.2 for x in xs], [summary.by_env[n].mean_reward for n in names], width=0.4, label="reward")
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_title(f"{summary.items} {unit} × {summary.attempts // max(summary.items, 1)} attempts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
