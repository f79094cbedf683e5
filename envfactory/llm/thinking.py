"""`<think>` traces in a model's reply: the one place that separates them from what the model says.

Rules (every caller — structured answers, the simulated user, the solver agent, tool-call parsing —
uses these):
- every `<think>…</think>` block is a trace; the text around the blocks is what the model says;
- a `</think>` with no `<think>` before it closes a trace the chat template opened in the prompt
  (Qwen3 leaves it so): everything before it is the trace;
- an unclosed `<think>` makes the rest of the text a trace (the model never finished thinking), and
  says so in `unclosed`.
The scan is linear: no regex backtracking over a long unclosed trace.
"""

from __future__ import annotations

from typing import NamedTuple

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Thinking(NamedTuple):
    visible: str  # what the model says, traces removed (not stripped)
    trace: str | None  # the traces, each stripped, joined by newlines; None without any
    unclosed: bool  # a `<think>` was never closed


def split_thinking(text: str) -> Thinking:
    """`text` split into what the model says and its `<think>` traces (see the module's rules)."""
    if "think>" not in text:
        return Thinking(text, None, False)
    traces: list[str] = []
    close = text.rfind(THINK_CLOSE)
    if close >= 0 and text.rfind(THINK_OPEN, 0, close) < 0:  # the template opened <think> in the prompt
        traces.append(text[:close])
        text = text[close + len(THINK_CLOSE) :]
    kept: list[str] = []
    pos, unclosed = 0, False
    while True:
        start = text.find(THINK_OPEN, pos)
        if start < 0:
            kept.append(text[pos:])
            break
        kept.append(text[pos:start])
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            traces.append(text[start + len(THINK_OPEN) :])
            unclosed = True
            break
        traces.append(text[start + len(THINK_OPEN) : end])
        pos = end + len(THINK_CLOSE)
    joined = "\n".join(t.strip() for t in traces if t.strip())
    return Thinking("".join(kept), joined or None, unclosed)


def strip_thinking(text: str) -> str:
    """What the model says, traces removed and the rest stripped."""
    return split_thinking(text).visible.strip()
