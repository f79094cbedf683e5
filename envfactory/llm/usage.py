"""Token accounting: calls, errors, tokens and structured asks per role, counted from every provider's
`AIMessage.usage_metadata` by one `UsageTracker`, and the table the commands print."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from pydantic import BaseModel

from envfactory.config import ROLES
from envfactory.terminal import Table, safe


class RoleUsage(BaseModel):
    role: str
    calls: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    structured: int = 0  # structured asks (`envfactory.llm.structured.ask`)
    repaired: int = 0  # of them, answered only after a repair prompt
    unanswered: int = 0  # of them, without a valid answer when the repairs ran out
    unreadable: int = 0  # replies to them that were not the asked form (not JSON, not the schema)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class _RoleUsageHandler(BaseCallbackHandler):
    """Feeds one role's model calls into a tracker."""

    run_inline = True  # cheap and lock-protected: no need for an executor hop in async runs

    def __init__(self, tracker: UsageTracker, role: str) -> None:
        self.tracker, self.role = tracker, role

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kw: Any) -> None:
        input_tokens = output_tokens = 0
        for generations in response.generations:
            for gen in generations:
                message = gen.message if isinstance(gen, ChatGeneration) else None
                usage = message.usage_metadata if isinstance(message, AIMessage) else None
                if usage:
                    input_tokens += usage.get("input_tokens", 0)
                    output_tokens += usage.get("output_tokens", 0)
        if not (input_tokens or output_tokens) and response.llm_output:
            # older integrations report only the provider's raw `token_usage`
            raw = response.llm_output.get("token_usage") or {}
            input_tokens, output_tokens = raw.get("prompt_tokens", 0), raw.get("completion_tokens", 0)
        self.tracker.add(self.role, calls=1, input_tokens=input_tokens, output_tokens=output_tokens)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kw: Any) -> None:
        self.tracker.add(self.role, errors=1)


class UsageTracker:
    """Counts calls, errors and tokens per role; safe to share across threads and concurrent branches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, RoleUsage] = {}

    def handler(self, role: str) -> BaseCallbackHandler:
        """A LangChain callback handler that counts into this tracker under `role`."""
        return _RoleUsageHandler(self, role)

    def add(self, role: str, *, calls: int = 0, errors: int = 0, input_tokens: int = 0, output_tokens: int = 0) -> None:
        with self._lock:
            row = self._rows.setdefault(role, RoleUsage(role=role))
            row.calls += calls
            row.errors += errors
            row.input_tokens += input_tokens
            row.output_tokens += output_tokens

    def asked(self, role: str, attempts: int, ok: bool, unreadable: int = 0) -> None:
        """One structured ask's outcome: answered first time, after repairs, or not at all."""
        with self._lock:
            row = self._rows.setdefault(role, RoleUsage(role=role))
            row.structured += 1
            row.repaired += ok and attempts > 1
            row.unanswered += not ok
            row.unreadable += unreadable

    def report(self) -> list[RoleUsage]:
        """One row per role seen, in the order of `ROLES`, then other roles alphabetically."""
        order: dict[str, int] = {r: i for i, r in enumerate(ROLES)}
        with self._lock:
            rows = [r.model_copy() for r in self._rows.values()]
        return sorted(rows, key=lambda r: (order.get(r.role, len(order)), r.role))

    def since(self, before: Sequence[RoleUsage]) -> list[RoleUsage]:
        """What each role added after `before` (an earlier `report()`): one run's share of a shared tracker."""
        earlier = {r.role: r for r in before}
        counts = [f for f in RoleUsage.model_fields if f != "role"]
        rows = []
        for row in self.report():
            old = earlier.get(row.role)
            grown = RoleUsage(role=row.role, **{f: getattr(row, f) - (getattr(old, f) if old else 0) for f in counts})
            if any(getattr(grown, f) for f in counts):
                rows.append(grown)
        return rows

    def table(self) -> Table:
        return usage_table(self.report())


_PROCESS_USAGE = UsageTracker()


def process_usage() -> UsageTracker:
    """The process's tracker: the agents' models and the tool graph's LLM count into it, per role."""
    return _PROCESS_USAGE


def usage_table(rows: Sequence[RoleUsage]) -> Table:
    table = Table(
        "role", "calls", "errors", "input tokens", "output tokens", "total", "structured", "repaired", "unanswered",
        "unreadable", title="LLM usage",
    )  # fmt: skip
    shown = list(rows)
    if len(rows) > 1:
        shown.append(
            RoleUsage(
                role="all",
                calls=sum(r.calls for r in rows),
                errors=sum(r.errors for r in rows),
                input_tokens=sum(r.input_tokens for r in rows),
                output_tokens=sum(r.output_tokens for r in rows),
                structured=sum(r.structured for r in rows),
                repaired=sum(r.repaired for r in rows),
                unanswered=sum(r.unanswered for r in rows),
                unreadable=sum(r.unreadable for r in rows),
            )
        )
    for r in shown:
        counts = [r.calls, r.errors, r.input_tokens, r.output_tokens, r.total_tokens, r.structured, r.repaired]
        counts += [r.unanswered, r.unreadable]
        table.add_row(safe(r.role), *(str(c) for c in counts), end_section=r is rows[-1] and len(shown) > len(rows))
    return table
