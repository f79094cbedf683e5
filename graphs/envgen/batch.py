"""EnvGen for a batch of requests (`envfactory envgen run --n N`): one thread per environment, run or resumed.

`EnvGenRunner` is what the executor runs per request. It is picklable: a copy in another process (a Ray worker)
opens its own checkpointer from the settings on first use — Postgres when `ENVFACTORY_POSTGRES_DSN` is set
(one store for every worker and machine), else the SQLite file under the data dir, which is per machine — and
keeps it for its requests. A registered environment is written to the worker's `envs/` folder: on a cluster the
project folder must be shared (the same path on every node), as the checkpoints must.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from envfactory.config import Settings
from envfactory.executor import Shipped
from graphs.checkpoint import process_checkpointer
from graphs.envgen.graph import build
from graphs.envgen.state import EnvGenContext
from graphs.running import run_or_resume

Job = tuple[str, dict[str, Any] | None]  # (thread id, the graph's input; None: resume)


def run_one(
    saver: BaseCheckpointSaver[Any],
    thread: str,
    payload: dict[str, Any] | None,
    ctx: EnvGenContext,
    interrupt_before: list[str],
) -> dict[str, Any]:
    """Run (or resume) one EnvGen thread; the row the CLI's summary shows."""
    ran = run_or_resume(
        build(saver), thread, payload, context=ctx, durable=True, interrupt_before=interrupt_before, restart=True
    )
    values = ran.values
    if ran.next:
        values["status"] = f"interrupted before {', '.join(ran.next)}"
    return {"thread": thread, **values}


class EnvGenRunner(Shipped):
    """One request through EnvGen on its own thread id, with a checkpointer opened once per process."""

    shipped = ("settings", "ctx", "interrupt_before")

    def __init__(
        self,
        settings: Settings,
        ctx: EnvGenContext,
        interrupt_before: list[str],
        saver: BaseCheckpointSaver[Any] | None = None,
    ) -> None:
        self.settings = settings
        self.ctx = ctx
        self.interrupt_before = interrupt_before
        self._checkpointer = saver

    def __call__(self, job: Job) -> dict[str, Any]:
        thread, payload = job
        return run_one(process_checkpointer(self, self.settings), thread, payload, self.ctx, self.interrupt_before)
