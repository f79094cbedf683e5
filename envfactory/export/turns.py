"""A turn (a `Node`) as chat messages: the user's request, the assistant's calls and their results, its answer.

- **failed tool calls are removed**, with their results; when every call of a step failed, the assistant words
  that only announced them go too (as QueryGen's filter does);
- an assistant text directly followed by a tool-call step is one message: text plus `tool_calls`;
- every call has an id (its own, else its result's, else `n<turn>s<step>c<k>`) and its tool message names it;
- `Step.thinking` becomes `reasoning_content` when `keep_thinking` is on (rendered as a `<think>` block);
- **user-side tool calls** (`Node.user_calls`, conversational variant) are environment dynamics, not assistant
  actions: never assistant `tool_calls`. With `user_calls="describe"` a short note of what the user did and
  what it returned is appended to the user's message that came with it (`after_step`); `drop` leaves them out.

A turn is *valid* when it ends with an assistant answer (text, no calls): the sample's target.
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from envfactory.export.errors import ExportError
from envfactory.export.messages import ChatMessage, ChatToolCall, FunctionCall, result_text
from envfactory.export.options import ExportOptions
from envfactory.export.tools_schema import ToolNamer
from envfactory.inputs import InputError, read_yaml_model
from envfactory.records.models import Node, Step, ToolCall, ToolResult, UserToolCall

# model-facing wording lives in the prompts folder (overridable with ENVFACTORY_PROMPTS_DIR)
WORDING_FILE = Path("template") / "export" / "en.yaml"


class ExportWording(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_action_note: str  # placeholders: {tool}, {arguments}, {result}


@lru_cache(maxsize=8)
def load_wording(prompts_dir: Path) -> ExportWording:
    try:
        return read_yaml_model(prompts_dir / WORDING_FILE, ExportWording)
    except InputError as e:
        raise ExportError(f"export wording {e}") from None


class Turn(BaseModel):
    """One node as messages, with what the converters need to know about it."""

    model_config = ConfigDict(extra="forbid")

    index: int
    messages: list[ChatMessage]
    query_length: int  # leading user messages: the turn's request
    calls: list[ToolCall]  # the assistant's successful calls, in order
    dropped_failed_calls: int
    interactive: bool  # the user spoke again or acted during the turn
    valid: bool


def _pair(calls: list[ToolCall], results: list[ToolResult]) -> list[tuple[ToolCall, ToolResult | None]]:
    """Each call with its result: by call id when both sides carry ids, else by position."""
    by_id = {r.call_id: r for r in results if r.call_id is not None}
    if calls and all(c.id is not None and c.id in by_id for c in calls):
        return [(c, by_id[c.id]) for c in calls if c.id is not None]
    return [(c, results[k] if k < len(results) else None) for k, c in enumerate(calls)]


def export_wording(options: ExportOptions) -> ExportWording:
    """The wording of `options.prompts_dir`, else of the settings' prompt folder (read when a converter starts)."""
    from envfactory.config import get_settings

    return load_wording(options.prompts_dir or get_settings().prompts_path)


def user_action_note(user_call: UserToolCall, wording: ExportWording) -> str:
    """What the user did, appended to their message (user_calls="describe")."""
    return wording.user_action_note.format(
        tool=user_call.call.name,
        arguments=json.dumps(user_call.call.arguments, ensure_ascii=False),
        result=result_text(user_call.result.result),
    )


def turn_messages(node: Node, namer: ToolNamer, options: ExportOptions, wording: ExportWording | None = None) -> Turn:
    """One node as messages. `wording` is read from `options` when a user action needs a note and none is given."""
    notes: dict[int, list[str]] = defaultdict(list)
    if options.user_calls == "describe" and node.user_calls:
        wording = wording or export_wording(options)
        for u in node.user_calls:
            notes[u.after_step].append(user_action_note(u, wording))
    steps = node.steps
    messages: list[ChatMessage] = []
    if not steps or steps[0].role != "user":
        messages.append(ChatMessage(role="user", content=node.query.strip()))
    kept_calls: list[ToolCall] = []
    dropped = 0
    pending: Step | None = None  # an assistant text that may carry the next step's calls

    def assistant(step: Step | None, tool_calls: list[ChatToolCall] | None = None) -> ChatMessage:
        text = str(step.content) if step is not None else ""
        thinking = step.thinking if step is not None and options.keep_thinking else None
        return ChatMessage(role="assistant", content=text, reasoning_content=thinking or None, tool_calls=tool_calls)

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            messages.append(assistant(pending))
            pending = None

    def note_message(index: int) -> None:
        if notes.get(index):
            flush()
            messages.append(ChatMessage(role="user", content="\n".join(notes[index])))

    i = 0
    while i < len(steps):
        step = steps[i]
        if step.role == "assistant":
            flush()
            pending = step
            note_message(i)
            i += 1
        elif step.role == "tool_call":
            has_results = i + 1 < len(steps) and steps[i + 1].role == "tool_result"
            pairs = _pair(step.calls(), steps[i + 1].results() if has_results else [])
            kept = [(c, r) for c, r in pairs if r is not None and r.ok]
            dropped += len(pairs) - len(kept)
            if kept:
                # every call has an id, and its result names it: a server refuses a call without one
                ids = [c.id or r.call_id or f"n{node.index}s{i}c{k}" for k, (c, r) in enumerate(kept)]
                calls = [
                    ChatToolCall(
                        id=cid, function=FunctionCall(name=namer.name(c.server, c.name), arguments=c.arguments)
                    )
                    for cid, (c, _) in zip(ids, kept, strict=True)
                ]
                messages.append(assistant(pending, calls))
                messages += [
                    ChatMessage(
                        role="tool", name=namer.name(c.server, c.name), content=result_text(r.result), tool_call_id=cid
                    )
                    for cid, (c, r) in zip(ids, kept, strict=True)
                ]
                kept_calls += [c for c, _ in kept]
            pending = None  # words that only announced failed calls go with them
            for j in (i, i + 1) if has_results else (i,):
                note_message(j)
            i += 2 if has_results else 1
        elif step.role == "tool_result":  # results without calls before them: nothing to pair them with
            note_message(i)
            i += 1
        else:
            flush()
            text = "\n\n".join([str(step.content), *notes.get(i, [])])
            messages.append(ChatMessage(role="user", content=text))
            i += 1
    flush()
    query_length = next((k for k, m in enumerate(messages) if m.role != "user"), len(messages))
    last = messages[-1]
    valid = last.role == "assistant" and not last.tool_calls and bool(last.content.strip())
    interactive = bool(node.user_calls) or sum(1 for s in steps if s.role == "user") > 1
    return Turn(
        index=node.index,
        messages=messages,
        query_length=query_length,
        calls=kept_calls,
        dropped_failed_calls=dropped,
        interactive=interactive,
        valid=valid,
    )


def conversation_turns(nodes: list[Node], namer: ToolNamer, options: ExportOptions) -> list[Turn]:
    """The turns up to the first invalid one: a later turn builds on an earlier one's answer."""
    wording = export_wording(options) if options.user_calls == "describe" and any(n.user_calls for n in nodes) else None
    turns: list[Turn] = []
    for node in nodes:
        turn = turn_messages(node, namer, options, wording)
        if not turn.valid:
            break
        turns.append(turn)
    return turns
