"""What a batch run says on the terminal (Rich): the plan's line, the progress bar, the summary and statistics
tables, the LLM usage, and the files that hold the results. `envfactory.tasks.run` runs the batch and calls these;
nothing here plans, runs or writes.

What a run's data, the pool and the settings hold (names, paths, drop codes) is printed escaped
(`envfactory.terminal`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envfactory.llm.usage import RoleUsage, usage_table
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, HELDOUT, SUMMARY
from envfactory.run_settings import SETTINGS_FILE
from envfactory.tasks.offline import UnitOutcome
from envfactory.tasks.plan import BatchSummary, Plan, SynthConfig
from envfactory.tasks.stats import DatasetStats, stats_table
from envfactory.terminal import Table, safe


def summary_table(summary: BatchSummary) -> Table:
    # kept: for training (conversations.jsonl) and held out (heldout.jsonl) apart, as the statistics count them
    table = Table("units", "already done", "kept for training", "held out", "dropped", "drop reasons", title="synth")
    reasons = ", ".join(f"{safe(k)}: {v}" for k, v in summary.dropped_by_code.items()) or "-"  # codes: run data
    train = summary.kept - summary.heldout
    table.add_row(
        str(summary.planned), str(summary.skipped), str(train), str(summary.heldout), str(summary.dropped), reasons
    )
    return table


def say_plan(out: Console, config: SynthConfig, plan: Plan, outdir: Path, where: str) -> None:
    """The plan's line: SynthAPI's A×T×S, the units to run, how they run and where they are written."""
    a, t, s = len(plan.envs), config.tasks, config.states
    out.print(
        f"A={a} T={t} S={s} D={config.depth}: N = {a}×{t}×{s} = {a * t * s} planned, {len(plan.units)} units "
        f"({config.mode}; {safe(where)}) → {safe(outdir)}",
        highlight=False,
    )


@contextmanager
def unit_progress(err: Console, total: int) -> Iterator[Callable[[UnitOutcome | int], None]]:
    """A progress bar over `total` units on `err`; yields what to call with each unit's outcome (kept, dropped,
    the rate so far). The bar is full when the block ends."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
    ) as progress:
        bar = progress.add_task("synth", total=total)
        kept = dropped = 0
        start = time.perf_counter()

        before = 0

        def advance(outcome: UnitOutcome | int) -> None:
            """One unit's outcome; or, first, how many units an earlier run did (a resume: the bar starts there)."""
            nonlocal kept, dropped, before
            if isinstance(outcome, int):
                before = outcome
                progress.update(bar, completed=before, description=f"synth: {before} done before")
                return
            kept += outcome.conversation is not None
            dropped += outcome.dropped is not None
            rate = (kept + dropped) / max(time.perf_counter() - start, 1e-9)
            earlier = f" (+{before} before)" if before else ""
            description = f"synth: {kept} kept, {dropped} dropped{earlier}, {rate:.1f} units/s"
            progress.update(bar, advance=1, description=description)

        yield advance
        progress.update(bar, completed=total)


def say_results(
    out: Console, summary: BatchSummary, *, ran: int, elapsed: float, tasks: int, stats: DatasetStats
) -> None:
    """The summary table, the rate, the environments the graph gave fewer chains than T, the statistics table."""
    out.print(summary_table(summary))
    if ran:
        out.print(f"{ran} units in {elapsed:.1f} s: {ran / max(elapsed, 1e-9):.1f} units/s", highlight=False)
    for env, missing in summary.shortfall.items():
        out.print(
            f"[yellow]{safe(env)}[/yellow]: the graph gave {missing} chain(s) fewer than T={tasks}", highlight=False
        )
    out.print(stats_table(stats))


def say_extras(out: Console, plot: Path | None, usage: list[RoleUsage]) -> None:
    """Where the statistics plot is, and this run's LLM usage (each only when there is one)."""
    if plot is not None:
        out.print(f"plot: {safe(plot)}", highlight=False)
    if usage:
        out.print(usage_table(usage))


def say_where(out: Console, outdir: Path, summary: BatchSummary) -> None:
    """The files that hold the run's results, last, so they are what the user sees."""
    files = [(CONVERSATIONS, "the training split (what `envfactory export` reads)")]
    if summary.heldout:
        files.append((HELDOUT, "the held-out split (for `envfactory eval`)"))
    files += [(DROPPED, "one line per dropped unit: its code and reason"), (SUMMARY, "counts and composition")]
    files.append((SETTINGS_FILE, "the settings it was made with (a resume must use the same)"))
    for name, what in files:
        if (outdir / name).is_file():
            out.print(f"  {safe(outdir / name)}: {what}", highlight=False, soft_wrap=True)
