"""Run a compiled graph on a thread, or resume it: the one way every command and runner invokes a graph.

With a checkpointer (`durable`), a thread that has checkpoints continues where it stopped (its input
is ignored) and a finished thread is not run again — unless `restart` asks to start it over from the
input (`envfactory envgen run --thread-id T --restart`): the thread's checkpoints are deleted first, so
nothing of the earlier run (its reports, scenarios, plan) carries into the new one, whose channels
would otherwise start from the old values (a `reports` list appended to, a stale plan judged instead of
new code); every node is written synchronously
(`durability="sync"`), so a killed process resumes exactly there. Without one the graph simply runs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph


class Ran(NamedTuple):
    values: dict[str, Any]  # the thread's state after the run
    next: tuple[str, ...]  # nodes still to run: non-empty when the run stopped at an interrupt


def run_or_resume(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread: str,
    payload: dict[str, Any] | None,
    *,
    context: Any,
    durable: bool,
    interrupt_before: list[str] | None = None,
    max_concurrency: int | None = None,
    restart: bool = False,
) -> Ran:
    """Run `graph` on `thread` from `payload`, or continue the thread (see the module)."""
    cfg: RunnableConfig = {"configurable": {"thread_id": thread}}
    if max_concurrency is not None:
        cfg["max_concurrency"] = max_concurrency
    if durable and restart and payload is not None:
        if graph.checkpointer is None or isinstance(graph.checkpointer, bool):
            raise ValueError("a durable run needs a graph compiled with a checkpointer")
        graph.checkpointer.delete_thread(thread)  # from its input, and from nothing else
    elif durable:
        snapshot = graph.get_state(cfg)
        if snapshot.values:
            if not snapshot.next:
                return Ran(dict(snapshot.values), ())
            payload = None  # resume where it stopped
    # durability needs a checkpointer (langgraph 1.2 fails on "sync" without one)
    result = graph.invoke(
        payload, cfg, context=context, durability="sync" if durable else None, interrupt_before=interrupt_before or None
    )
    if not durable:
        return Ran(dict(result), ())
    snapshot = graph.get_state(cfg)
    return Ran(dict(snapshot.values), tuple(snapshot.next))
