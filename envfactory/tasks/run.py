"""Run a batch end to end: the tool graph, the plan, the units (offline by default), the summary, the
statistics and plot, `summary.json` (what it prints: `envfactory.tasks.report`). `envfactory synth` and
`envfactory demo` call `run_batch`; the LLM mode passes the QueryGen runner from graphs/ (envfactory/ never
imports LangGraph)."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.executor import Executor, Shipped
from envfactory.inputs import exclusive_folder
from envfactory.llm.usage import process_usage
from envfactory.records.run_folder import DROPPED, HELDOUT, SUMMARY
from envfactory.tasks.offline import UnitOutcome, synthesize_offline
from envfactory.tasks.plan import (
    BatchSummary,
    Plan,
    RunLog,
    SynthConfig,
    SynthConfigError,
    SynthError,
    Unit,
    UnitRunner,
    choose_envs,
    plan_units,
    run_units,
    summarize,
)
from envfactory.tasks.report import say_extras, say_plan, say_results, say_where, unit_progress
from envfactory.tasks.stats import dataset_stats, plot_stats
from envfactory.tasks.synth_settings import graph_file
from envfactory.terminal import SafeConsole, safe
from envfactory.toolgraph.graph import ToolGraph


def tool_graph(
    settings: Settings,
    config: SynthConfig,
    plan_envs: list[str] | None = None,
    err: Console | None = None,
    pool: EnvPool | None = None,
) -> ToolGraph:
    """The run's graph (`graph_file`); built over `plan_envs` (None or none: the whole pool) and saved when there is
    none (said on `err`)."""
    from envfactory.progress import phase_bars
    from envfactory.toolgraph.build import build_pool_graph
    from envfactory.toolgraph.io import load_graph, save_graph

    plan_envs = plan_envs or None  # no environments: the pool's graph, as `build_pool_graph` reads it
    pool = pool if pool is not None else EnvPool(settings)
    path = graph_file(settings, config, plan_envs, pool)
    if config.graph is not None or path.exists():
        return load_graph(path)
    err = err or SafeConsole(stderr=True)
    over = "the pool" if plan_envs is None else f"the run's {len(plan_envs)} environment(s)"
    err.print(f"no tool graph at {safe(path)}: building one over {over} (embeddings are cached)", highlight=False)
    with phase_bars(err) as progress:
        graph, _ = build_pool_graph(settings, plan_envs, progress=progress, pool=pool)
    save_graph(graph, path)
    return graph


class OfflineRunner(Shipped):
    """Offline synthesis of one unit (templates + π*). Shipped to a Ray worker as its settings: the worker
    builds its own pool on first use."""

    shipped = ("settings",)

    def __init__(self, settings: Settings, pool: EnvPool | None = None) -> None:
        self.settings = settings
        self._pool = pool

    @property
    def pool(self) -> EnvPool:
        return self.once("_pool", lambda: EnvPool(self.settings))

    def __call__(self, unit: Unit) -> UnitOutcome:
        return synthesize_offline(
            self.pool,
            unit.chain,
            key=unit.key,
            seed=unit.seed,
            state_variant=unit.state_variant,
            depth=unit.depth,
            prompts_dir=self.settings.prompts_path,
            more=unit.more,
            turns=unit.turns,
            ambiguity=unit.ambiguity,
        )


def offline_runner(pool: EnvPool, settings: Settings) -> UnitRunner:
    return OfflineRunner(settings, pool)


def plan_batch(config: SynthConfig, settings: Settings, pool: EnvPool, err: Console | None = None) -> Plan:
    """The batch's units, over the run's tool graph; a plan with no unit is a `SynthError` saying why, before
    the run's folder holds anything of it."""
    envs = choose_envs(config, pool)
    graph = tool_graph(settings, config, envs, err=err or SafeConsole(stderr=True), pool=pool)
    plan = plan_units(config, pool, graph, settings.toolgraph)
    if not plan.units:  # the graph gave no chain of these lengths
        short = ", ".join(f"{env} {n}" for env, n in plan.shortfall.items())
        why = f" (chains the tool graph could not give: {short}; try a shorter chain_length)" if short else ""
        raise SynthError(f"nothing to run: the plan has no unit{why}")
    return plan


def run_batch(
    config: SynthConfig,
    settings: Settings,
    runner: UnitRunner | None = None,
    console: Console | None = None,
    executor: Executor | None = None,
    *,
    pool: EnvPool | None = None,
    plan: Plan | None = None,
) -> BatchSummary:
    """Plan (unless `plan` is given: `plan_batch`'s), run what is not done yet, summarize, print statistics
    (`envfactory.tasks.report`), write the plot and `summary.json`; a run that kept nothing is an error (after its
    summary and drop reasons are written: they say why), and so is a plan with no unit (before anything is
    written). `pool`: the caller's (the demo's, the runner's), else one over `settings`. A console of the
    caller's should be a `SafeConsole` (the net under the escaped printing)."""
    out = console or SafeConsole()
    err = SafeConsole(stderr=True) if console is None else console
    pool = pool if pool is not None else EnvPool(settings)
    outdir = config.folder()
    usage_before = process_usage().report()
    if plan is None:
        plan = plan_batch(config, settings, pool, err)
    if runner is None:
        if config.mode != "offline":
            raise SynthConfigError("mode 'llm' needs the QueryGen runner: run it through `envfactory synth`")
        runner = offline_runner(pool, settings)
    where = f"{config.concurrency} at once" if executor is None else f"{executor.name} executor"
    with exclusive_folder(outdir, "envfactory synth", error=SynthError):  # one writer of the folder's logs
        say_plan(out, config, plan, outdir, where)
        with unit_progress(err, len(plan.units)) as advance:
            start = time.perf_counter()
            log = RunLog()
            skipped, ran = run_units(
                plan.units, runner, outdir, concurrency=config.concurrency, progress=advance, executor=executor, log=log
            )
            elapsed = time.perf_counter() - start
        summary = summarize(plan, outdir, skipped, log)
        stats = dataset_stats(log.facts())
        say_results(out, summary, ran=ran, elapsed=elapsed, tasks=config.tasks, stats=stats)
        png = plot_stats(stats, outdir / "stats.png") if config.plot and stats.conversations else None
        usage = process_usage().since(usage_before)  # this run's LLM calls here (Ray workers count in their own)
        say_extras(out, png, usage)
        record: dict[str, Any] = {"summary": summary.model_dump(mode="json"), "stats": stats.model_dump()}
        record["composition"] = training_composition(config, plan, kept=set(log.train_ids())).model_dump()
        record["planned_composition"] = training_composition(config, plan).model_dump()
        if usage:
            record["llm_usage"] = [row.model_dump() for row in usage]
        (outdir / SUMMARY).write_text(json.dumps(record, indent=2) + "\n")
        say_where(out, outdir, summary)
        held = outdir / HELDOUT
        if stats.conversations == 0 and not (held.is_file() and held.stat().st_size > 0):  # the folder, resumed too
            reasons = ", ".join(f"{code} {n}" for code, n in summary.dropped_by_code.items())
            raise SynthError(f"no conversation was kept ({reasons}); the reasons are in {outdir / DROPPED}")
        return summary


class Composition(BaseModel):
    """What the training split of a run is made of, in SynthAPI's variables (what a scaling table needs)."""

    A: int  # environments with training data
    T: int  # tasks per environment in training (the most any environment has; held-out tasks not counted)
    S: int
    D: int
    seed: int
    mode: str


def training_composition(config: SynthConfig, plan: Plan, kept: set[str] | None = None) -> Composition:
    """The training split's composition: of the units kept (`kept`: the keys of the training conversations
    written), or of the plan. An environment whose every training unit was dropped has no training data, so it
    does not count in A — the row `scaling add` makes must say what the model was trained on."""
    train = [u for u in plan.units if u.split == "train" and (kept is None or u.key in kept)]
    envs = sorted({u.env for u in train})
    tasks = max((len({u.task for u in train if u.env == e}) for e in envs), default=0)
    return Composition(A=len(envs), T=tasks, S=config.states, D=config.depth, seed=config.seed, mode=config.mode)
