"""BFCL's multi-turn criterion, applied through our `bfcl_*` environments: is an entry solved?

A model's answer to an entry is, per turn, a list of steps, each a list of call strings
(`cd(folder='documents')`), as BFCL decodes a model's replies. `judge_entry` runs them the way
BFCL's `multi_turn_checker` does, on our sessions instead of BFCL's `eval`:

- the model's calls and the ground truth's each run on their own sessions (one per involved class,
  forked from the entry's initial config), which persist across turns;
- a turn whose ground truth is empty is not checked (the model's calls still run: the next turn's
  state depends on them); a turn with ground truth and no model call fails
  (`multi_turn:empty_turn_model_response`);
- after each checked turn, every involved class's public attributes (no leading `_`) must equal the
  ground truth's (`multi_turn:instance_state_mismatch`), and every ground-truth result of the turn
  must be among the model's results so far, as a multiset in any order
  (`multi_turn:execution_response_mismatch`).

Results compare as BFCL's executor writes them: a string as is, a dict as JSON, anything else with
`str`; a failed call as `Error during execution: <message>`; the names BFCL refuses to run (`kill`,
`exit`, ...) fail without running. Where this differs from BFCL (stated, never hidden): a call whose
argument is itself a call (`f(x=g(1))`) is an error here, where BFCL's `eval` would run both; a BFCL
method that changes its state and then raises is rolled back here, where BFCL keeps the change.
`tests/suites/bfcl/test_judge.py` checks the verdicts entry by entry against `bfcl_eval`'s own checker.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from envfactory.env.session import Session
from envfactory.env.tools import ArgumentError
from envfactory.suites.bfcl.adapter import environment
from envfactory.suites.bfcl.calls import CallSyntaxError, parse_call
from envfactory.suites.bfcl.entries import BFCLEntry, route

ErrorType = Literal[
    "multi_turn:empty_turn_model_response",
    "multi_turn:instance_state_mismatch",
    "multi_turn:execution_response_mismatch",
    "multi_turn:turn_count_mismatch",
]

# BFCL's executor refuses these names before it evaluates anything (multi_turn_utils)
REFUSED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})

Answer = list[list[list[str]]]  # turns → steps → call strings


class EntryVerdict(BaseModel):
    """Whether an entry is solved; when not, the first failing turn and BFCL's error type."""

    id: str
    valid: bool
    error_type: ErrorType | None = None
    turn: int | None = None
    message: str = ""


def long_context_of(entry_id: str) -> bool:
    """BFCL loads long-context states for its long-context and composite categories."""
    category = entry_id.rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


def result_text(value: Any) -> str:
    """A result as BFCL's executor writes it: a string as is, a dict as JSON, anything else with `str`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class BFCLExecutor:
    """One side (the model's or the ground truth's) of an entry: its sessions and every result so far."""

    def __init__(self, entry: BFCLEntry, long_context: bool) -> None:
        self.entry = entry
        self.sessions: dict[str, Session] = entry.sessions(long_context=long_context)
        self.results: list[str] = []

    def run(self, text: str) -> str:
        out = self._execute(text)
        self.results.append(out)
        return out

    def _execute(self, text: str) -> str:
        try:
            call = parse_call(text)
        except CallSyntaxError as e:
            return f"Error during execution: {e}"
        if call.name in REFUSED:
            return f"Error during execution: Function call {call.name} is not allowed."
        owner = route(call.name, self.entry.involved_classes)
        if owner is None or owner not in self.sessions:
            return f"Error during execution: name '{call.name}' is not defined"
        try:
            args = environment(owner).call_arguments(call)
        except ArgumentError as e:
            return f"Error during execution: {e}"
        record = self.sessions[owner].call(call.name, args)
        if not record.ok:
            message = record.error.message if record.error is not None else "the call failed"
            return f"Error during execution: {message}"
        return result_text(record.result)


def _public(state: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(state).items() if not k.startswith("_")}


def _state_mismatch(model: BFCLExecutor, truth: BFCLExecutor) -> str | None:
    for class_name, session in truth.sessions.items():
        theirs, ours = _public(session.state), _public(model.sessions[class_name].state)
        differing = sorted(k for k in theirs if ours.get(k) != theirs[k])
        if differing:
            return f"{class_name} differs from the ground truth in {', '.join(differing[:5])}"
    return None


def _missing(expected: list[str], got: list[str]) -> list[str]:
    """The expected results not found in `got` (a multiset: each found result is used once)."""
    pool = list(got)
    missing = []
    for item in expected:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing


def judge_entry(entry: BFCLEntry, answer: Answer) -> EntryVerdict:
    """BFCL's verdict on `answer` for `entry`, computed on our environments (see the module doc)."""
    if len(answer) != len(entry.ground_truth):
        return EntryVerdict(
            id=entry.id,
            valid=False,
            error_type="multi_turn:turn_count_mismatch",
            message=f"{len(answer)} answered turns for {len(entry.ground_truth)} turns",
        )
    long_context = long_context_of(entry.id)
    model, truth = BFCLExecutor(entry, long_context), BFCLExecutor(entry, long_context)
    for turn, (steps, expected_calls) in enumerate(zip(answer, entry.ground_truth, strict=True)):
        for step in steps:
            for text in step:
                model.run(text)
        expected = [truth.run(text) for text in expected_calls]
        if not expected_calls:
            continue  # no ground truth: the turn is not checked (BFCL's irrelevance check is separate)
        if not steps or (len(steps) == 1 and not steps[0]):
            return EntryVerdict(
                id=entry.id,
                valid=False,
                error_type="multi_turn:empty_turn_model_response",
                turn=turn,
                message=f"no call in turn {turn}",
            )
        mismatch = _state_mismatch(model, truth)
        if mismatch is not None:
            return EntryVerdict(
                id=entry.id, valid=False, error_type="multi_turn:instance_state_mismatch", turn=turn, message=mismatch
            )
        missing = _missing(expected, model.results)
        if missing:
            return EntryVerdict(
                id=entry.id,
                valid=False,
                error_type="multi_turn:execution_response_mismatch",
                turn=turn,
                message=f"{len(missing)} ground-truth result(s) of turn {turn} missing: {missing[0][:120]}",
            )
    return EntryVerdict(id=entry.id, valid=True)
