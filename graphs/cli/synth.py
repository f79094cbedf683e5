"""`envfactory synth --config FILE`: a batch of verified conversations, offline (templates + π*) or with
an LLM (the QueryGen graph). Registered through the `envfactory.cli` entry point; it lives in graphs/
because the LLM mode runs a LangGraph graph (envfactory/ never imports LangGraph).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from envfactory.cli.args import out_dir_option, output_dir, path_to_write
from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.executor import check_executor_flags, executor_from
from envfactory.inputs import exclusive_folder
from envfactory.llm.models import check_configured
from envfactory.querygen.records import QUERY_ROLE, SOLVER_ROLE, USER_ROLE
from envfactory.tasks.plan import SynthError, choose_envs, load_config
from envfactory.tasks.run import plan_batch, run_batch
from envfactory.tasks.synth_settings import record_synth_settings
from envfactory.terminal import SafeConsole

app = typer.Typer(add_completion=False, help="Synthesize verified multi-turn conversations in a batch.")
out = SafeConsole()
err = SafeConsole(stderr=True)


@app.callback(invoke_without_command=True)
def synth(
    config: Annotated[Path, typer.Option("--config", help="YAML/JSON: mode, envs, A, T, S, D, seed, out, ...")],
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="output folder (overrides the config's)", parser=path_to_write, callback=out_dir_option
        ),
    ] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="units at once (overrides the config's)")] = None,
    executor: Annotated[str, typer.Option(help="local (threads here) or ray (workers on a Ray cluster)")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="ray: 'auto', 'host:port' or 'ray://host:port'; default: a new local instance")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="ray: worker processes (default: the cluster's CPUs)")
    ] = None,
) -> None:
    """Run (or resume) a batch: settings.json, conversations.jsonl, dropped.jsonl, summary.json, stats.png in the
    output folder (a resume with other settings is refused, naming them)."""
    cfg = load_config(config)
    update: dict[str, object] = {}
    if out_dir is not None:
        update["out"] = out_dir
    else:  # the config's `out`: the checks `--out` gets (a file, a place that cannot be made), before any work
        update["out"] = output_dir(cfg.folder(), option="out")
    if concurrency is not None:
        update["concurrency"] = concurrency
    cfg = cfg.model_copy(update=update)
    settings = get_settings()
    check_executor_flags(executor, ray_address, workers)
    pool = EnvPool(settings)
    choose_envs(cfg, pool)  # an unknown environment: one line before the run's folder holds anything
    if cfg.mode == "offline":
        plan = plan_batch(cfg, settings, pool, err)  # a plan with no unit: one line, nothing written
        with exclusive_folder(cfg.folder(), "envfactory synth", error=SynthError):  # before its record is written
            record_synth_settings(
                cfg, settings, config, plan.envs, pool
            )  # what shapes the run; a resume made otherwise stops here
            runs_on = executor_from(executor, ray_address, workers, cfg.concurrency)
            run_batch(cfg, settings, console=out, executor=runs_on, pool=pool, plan=plan)
        return
    check_configured((QUERY_ROLE, SOLVER_ROLE, USER_ROLE), settings)  # before any work, not once per unit
    try:
        from graphs.checkpoint import open_checkpointer
        from graphs.querygen.batch import QueryGenRunner
    except ModuleNotFoundError as e:
        raise EnvFactoryError(
            f"synth in llm mode needs {e.name}, which is not installed: pip install -e '.[graphs]'"
        ) from None

    plan = plan_batch(cfg, settings, pool, err)
    with (
        exclusive_folder(cfg.folder(), "envfactory synth", error=SynthError),
        open_checkpointer(settings) as saver,  # one saver per process, shared by the batch's threads
    ):
        record_synth_settings(cfg, settings, config, plan.envs, pool)
        runs_on = executor_from(executor, ray_address, workers, cfg.concurrency)
        run_batch(cfg, settings, QueryGenRunner(settings, cfg, pool, saver), out, runs_on, pool=pool, plan=plan)
