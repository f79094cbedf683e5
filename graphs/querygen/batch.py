"""The LLM mode of `envfactory synth`: each unit of the batch plan runs the QueryGen graph.

A unit's thread id is derived from the output folder, the run (the `run_id` its `settings.json` records,
made when the folder's record is first written and kept by every resume) and the unit key, and the graph
checkpoints after every node (`durability="sync"`), so a killed batch resumes *inside* a conversation: the
JSONL files skip finished units and the checkpointer continues unfinished ones where they stopped. A new
run in the same folder (its record written anew: the folder removed, or other settings before any result)
gets new threads: a finished thread of the old run would be returned as it stands, its conversation
written as the new run's without asking the model. (A run whose record has no `run_id` — made before
runs had one, or driven without a record — keeps the folder-only thread ids it had.)
Initial databases: by default the LLM writes them (`schema_generate`, the EnvFactory method); with
`initial_states: generator` the unit's generated Db⁰ (seeded, S variants, depth D) is used as is,
keeping SynthAPI's composition controls exact.
"""

from __future__ import annotations

import zlib
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.executor import Shipped
from envfactory.run_settings import read_record
from envfactory.tasks.offline import Dropped, UnitOutcome, initial_states
from envfactory.tasks.plan import SynthConfig, Unit, UnitRunner
from graphs.checkpoint import process_checkpointer
from graphs.querygen.run import run_querygen
from graphs.querygen.state import QueryGenContext


class QueryGenRunner(Shipped):
    """One unit through the QueryGen graph. Shipped to a Ray worker as its settings and config: the worker
    builds its own pool and opens its own checkpointer on first use (Postgres when configured, shared by every
    worker; else the SQLite file under the data dir — per machine), kept for its units."""

    shipped = ("settings", "config")

    def __init__(
        self,
        settings: Settings,
        config: SynthConfig,
        pool: EnvPool | None = None,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self._pool = pool
        self._checkpointer = checkpointer

    def __call__(self, unit: Unit) -> UnitOutcome:
        pool = self.once("_pool", lambda: EnvPool(self.settings))
        checkpointer = process_checkpointer(self, self.settings)
        config = self.config
        # the run's settings, not the process's environment: a Ray worker's may differ
        context = QueryGenContext(preset=config.preset, overrides=dict(config.querygen), settings=self.settings)
        run_tag = thread_tag(config)
        initial = core = None
        if config.initial_states == "generator":
            initial, core = initial_states(pool, unit.chain.servers, unit.seed, unit.depth)
        outcome = run_querygen(
            unit.chain,
            seed=unit.seed,
            conversation_id=unit.key,
            pool=pool,
            checkpointer=checkpointer,
            thread_id=f"querygen-{run_tag}-{unit.key}",
            context=context,
            initial_state=initial,
            core_ids=core,
        )
        if outcome.kept is not None:
            provenance = outcome.kept.provenance.model_copy(
                update={"state_variant": unit.state_variant, "depth": unit.depth}
            )
            return UnitOutcome(key=unit.key, conversation=outcome.kept.model_copy(update={"provenance": provenance}))
        if outcome.status == "interrupted":  # not asked for here: retried on resume
            raise RuntimeError(f"QueryGen stopped before finishing (thread {outcome.thread_id})")
        dropped = Dropped(
            key=unit.key, code="querygen", reason=outcome.failure or "dropped", tools=unit.chain.tools, seed=unit.seed
        )
        return UnitOutcome(key=unit.key, dropped=dropped)


def thread_tag(config: SynthConfig) -> str:
    """What a unit's thread id holds of its run: a crc32 of the output folder and the run's `run_id`."""
    folder = str(config.out.resolve())
    record = read_record(config.folder())
    run_id = record.context.get("run_id") if record is not None and record.command == "synth" else None
    named = folder if not isinstance(run_id, str) else "\0".join((folder, run_id))
    return f"{zlib.crc32(named.encode()):08x}"


def querygen_runner(
    pool: EnvPool, settings: Settings, config: SynthConfig, checkpointer: BaseCheckpointSaver[Any]
) -> UnitRunner:
    return QueryGenRunner(settings, config, pool, checkpointer)
