"""One chain through QueryGen, run or resumed on its thread: what the batch runner and tests call."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel

from envfactory.env.pool import EnvPool
from envfactory.querygen.records import preset_config
from envfactory.records.models import Conversation, States
from envfactory.toolgraph.sampler import ToolChain
from graphs.querygen.graph import build
from graphs.querygen.state import QueryGenContext
from graphs.running import run_or_resume


class QueryGenOutcome(BaseModel):
    """`kept` when the chain became a conversation; `failure` when it was dropped; neither when interrupted."""

    status: Literal["kept", "dropped", "interrupted"]
    kept: Conversation | None = None
    failure: str | None = None
    thread_id: str


def _outcome(values: dict[str, Any], thread_id: str) -> QueryGenOutcome:
    status = values.get("status")
    if status == "kept" and values.get("conversation"):
        conversation = Conversation.model_validate(values["conversation"])
        return QueryGenOutcome(status="kept", kept=conversation, thread_id=thread_id)
    if status == "dropped":
        return QueryGenOutcome(status="dropped", failure=values.get("failure") or "dropped", thread_id=thread_id)
    return QueryGenOutcome(status="interrupted", thread_id=thread_id)


def run_querygen(
    chain: ToolChain,
    *,
    seed: int,
    conversation_id: str,
    pool: EnvPool,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    thread_id: str | None = None,
    context: QueryGenContext | None = None,
    initial_state: States | None = None,
    core_ids: dict[str, dict[str, list[str]]] | None = None,
    max_concurrency: int | None = None,
    interrupt_before: list[str] | None = None,
) -> QueryGenOutcome:
    """Run QueryGen for one chain (sync, `durability="sync"`). With a checkpointer, calling again with the
    same `thread_id` (default: `conversation_id`) continues from the checkpoint; a finished thread just
    returns its outcome. `max_concurrency` bounds the solver branches running at once (1: in order)."""
    ctx = replace(context or QueryGenContext(), pool=pool)
    preset_config(ctx.preset, ctx.overrides)  # an unknown preset or bad override fails here, not mid-run
    thread = thread_id or conversation_id
    payload: dict[str, Any] = {
        "chain": chain.model_dump(mode="json"),
        "seed": seed,
        "conversation_id": conversation_id,
    }
    if initial_state is not None:
        payload.update(initial_state=initial_state, core_ids=core_ids or {})
    ran = run_or_resume(
        build(checkpointer),
        thread,
        payload,
        context=ctx,
        durable=checkpointer is not None,
        interrupt_before=interrupt_before,
        max_concurrency=max_concurrency,
    )
    return _outcome(ran.values, thread)
