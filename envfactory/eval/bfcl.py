"""BFCL multi-turn through our imported environments: the model plays an entry, BFCL's criterion judges it.

For each entry the model gets BFCL's conversation turn by turn — the user's messages, and its own
earlier replies, calls and results (as BFCL's multi-turn inference carries them) — and the function
docs of the involved classes as tools (`excluded_function` left out; a `missed_function` shown only
from its turn on, with BFCL's own "I have updated some more functions" message). Its calls run on the
entry's sessions (results shown as BFCL's executor writes them); per turn, its decoded calls per step
form the answer that `envfactory.suites.bfcl.judge.judge_entry` scores: success is BFCL's `valid`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel

from envfactory.eval.agent import AgentLimits, calls_message, invoke, model_error, read_reply
from envfactory.eval.run import AttemptRecord
from envfactory.suites.bfcl.adapter import environment
from envfactory.suites.bfcl.entries import BFCLEntry, entry_files, load_entries
from envfactory.suites.bfcl.judge import Answer, BFCLExecutor, judge_entry, long_context_of
from envfactory.suites.bfcl.suites import MULTI_TURN_CATEGORIES

SUITES = {f"bfcl-{c.replace('_', '-')}": c for c in MULTI_TURN_CATEGORIES}  # bfcl-multi-turn-base, ...


class BFCLItem(BaseModel):
    """One BFCL entry to play (`id` is BFCL's entry id)."""

    id: str
    entry: BFCLEntry


def bfcl_items(suite: str) -> list[BFCLItem]:
    return [BFCLItem(id=e.id, entry=e) for e in load_entries(SUITES[suite])]


def suite_files(suite: str) -> list[Path]:
    """The files a suite's items come from (what its data fingerprint is taken of)."""
    return entry_files(SUITES[suite])


def _spec(class_name: str, tool: str) -> dict[str, Any]:
    meta = environment(class_name).metadata.tool(tool)
    return {
        "type": "function",
        "function": {"name": tool, "description": meta.description, "parameters": meta.input_schema},
    }


def _tools(entry: BFCLEntry, withheld: set[str]) -> list[dict[str, Any]]:
    owners: dict[str, str] = {}
    for c in entry.involved_classes:  # BFCL's rule: the last involved class with a method runs it
        for name in environment(c).metadata.tool_names:
            owners[name] = c
    hidden = set(entry.excluded_function) | withheld
    return [_spec(c, name) for name, c in owners.items() if name not in hidden]


def _call_text(name: str, args: Any) -> str:
    kwargs = args if isinstance(args, dict) else {}
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def _added_functions_message() -> str:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    return str(DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)


def play_entry(model: BaseChatModel, entry: BFCLEntry, limits: AgentLimits) -> tuple[Answer, str | None, int]:
    """The model's answer to `entry` (turns → steps → call strings), an error if it stopped early, model steps."""
    missed: dict[int, list[str]] = {int(k): v for k, v in (entry.model_extra or {}).get("missed_function", {}).items()}
    withheld = {name for names in missed.values() for name in names}
    executor = BFCLExecutor(entry, long_context_of(entry.id))
    messages: list[BaseMessage] = []
    answer: Answer = []
    steps_used = 0
    start = time.monotonic()
    for turn, question in enumerate(entry.question):
        if turn in missed:
            withheld -= set(missed[turn])
        for m in question or ([{"role": "user", "content": _added_functions_message()}] if turn in missed else []):
            cls = SystemMessage if m.get("role") == "system" else HumanMessage
            messages.append(cls(content=str(m.get("content", ""))))
        bound = model.bind_tools(_tools(entry, withheld))
        turn_steps: list[list[str]] = []
        answer.append(turn_steps)
        for step in range(limits.max_steps):
            if time.monotonic() - start > limits.timeout_s:
                answer.extend([] for _ in range(len(entry.question) - len(answer)))
                return answer, f"timed out: over {limits.timeout_s:g} s", steps_used
            try:
                reply = read_reply(invoke(bound, messages, entry.id), f"t{turn}s{step}")
            except Exception as e:  # a provider's failure ends the attempt, recorded
                answer.extend([] for _ in range(len(entry.question) - len(answer)))
                return answer, model_error(e), steps_used
            steps_used += 1
            calls = reply.calls  # calls whose arguments could not be read are not BFCL calls: left out
            if not calls:
                messages.append(AIMessage(content=reply.text))
                break  # the turn is answered
            texts = [_call_text(n, a) for n, a, _ in calls]
            turn_steps.append(texts)
            messages.append(calls_message("", calls))
            for (name, _, call_id), text in zip(calls, texts, strict=True):
                messages.append(ToolMessage(content=executor.run(text), tool_call_id=call_id, name=name))
    return answer, None, steps_used


def bfcl_attempt(model: BaseChatModel, item: BFCLItem, index: int, limits: AgentLimits) -> AttemptRecord:
    start = time.monotonic()
    answer, error, steps = play_entry(model, item.entry, limits)
    verdict = judge_entry(item.entry, answer)
    reasons = [r for r in (error, None if verdict.valid else f"{verdict.error_type}: {verdict.message}") if r]
    calls = sum(len(s) for turn in answer for s in turn)
    return AttemptRecord(
        item=item.id,
        attempt=index,
        success=verdict.valid and error is None,
        reasons=reasons,
        reward=float(verdict.valid and error is None),
        calls=calls,
        model_steps=steps,
        error=error,
        seconds=round(time.monotonic() - start, 4),
        env=item.entry.involved_classes[0] if item.entry.involved_classes else "none",
        kind=item.id.rsplit("_", 1)[0],
        chain_length=sum(len(t) for t in item.entry.ground_truth),
    )
