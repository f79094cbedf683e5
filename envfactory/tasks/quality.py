"""Data-quality figures of a set of conversations, measured against the EnvFactory paper's data.

What the EnvFactory method argues for, as numbers: trajectories with several turns of a few calls
(the paper's data: 4.82 turns per conversation, 3.29 steps per turn), requests that say what a user
knows (no generated ids), dataflow that is real (every id-valued argument came back from an earlier
call of the same conversation; no call after an empty result it depended on), and answers that
report results instead of listing the tools that ran. `measure` computes them over conversations;
`benchmarks/data_quality.py` prints them beside the paper's figures.

Definitions (one place, used by the tests too):
- an *internal id* is a record key of any state the conversation passed through (`HT-LIS-01`,
  `BK-0002`), except the user's own records: of an identity collection (a customer number: users know
  it, as in τ²-bench), and those the task's solver names by the user's words (`Binding.source` `state`
  on an id-valued parameter: a record no tool of the environment finds, such as a flight order only
  reachable by its id, whose owner knows it); a request *contains* one when the id appears in its text
  and no earlier turn's answer told the user that id (an id the assistant said may be repeated back);
  requests that say one of the user's own ids are counted apart (`requests_with_own_id`);
- an argument is *id-valued* when its parameter is named `id`, `*_id` or `*_ids`; it is *incoherent*
  when a value of it (each element of a list) appears in no earlier tool result of the conversation
  and is not a value the user said: one the solver bound from the user's words (their own record's
  id, a new external id they choose) that a request so far spells out, or the user's own identity id
  said in a request (an id a request spells out that the solver took from nobody's words stays
  incoherent: that is the other failure);
- an *empty result followed by further calls*: a successful call returning `[]`, `{}`, `None` or
  `""` that is not the last call of its turn;
- *distinct-2* is corpus-level (Li et al., 2016), so it falls as a corpus grows; `distinct_2_per_100`
  averages it over chunks of 100 requests, to compare runs of different sizes;
- a *canned answer* names what was done instead of what happened: it contains no scalar value from
  its turn's results (numbers, dates and times in any of the forms users write them), or it lists
  the turn's tool names;
- an answer *tells bookkeeping* when it names a field of its turn's results that the response carries for the
  client (`words.is_bookkeeping`: a page token, an etag, a self link) or says a value no user says
  (`spoken.unsayable`: a uuid, a digest, a type tag), as "next page token political" did.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from pydantic import BaseModel

from envfactory.records.models import Conversation, ToolCall, ToolResult
from envfactory.records.spoken import renderings, unsayable
from envfactory.tasks.pi_star import IDENTITY, is_identity
from envfactory.words import is_bookkeeping, singular, spoken_name

PAPER_TURNS_PER_CONVERSATION = 4.82
PAPER_STEPS_PER_TURN = 3.29


class QualityFigures(BaseModel):
    conversations: int
    turns: int
    calls: int
    turns_per_conversation: float
    calls_per_turn: float
    requests_with_internal_id: float  # share of requests
    requests_with_own_id: float = 0.0  # share of requests saying an id of the user's own record
    id_arguments: int
    incoherent_id_arguments: float  # share of id-valued arguments
    empty_then_more: int  # empty results followed by further calls in the same turn
    canned_answers: float  # share of answers
    answers_telling_bookkeeping: float = 0.0  # share of answers naming a page token, an etag, or saying a uuid
    distinct_answers: float  # distinct answers / answers
    distinct_2_requests: float  # distinct word bigrams / bigrams over all requests
    distinct_2_per_100: float  # the same over chunks of 100 requests, averaged: comparable across run sizes


def is_id_parameter(name: str) -> bool:
    return name == "id" or name.endswith(("_id", "_ids"))


def _record_ids(state: Any) -> tuple[set[str], set[str]]:
    """Keys of the records of every collection in a dump (a collection: a dict of dicts): (internal
    ones, the user's own identity records)."""
    internal: set[str] = set()
    identity: set[str] = set()
    if isinstance(state, dict):
        for name, value in state.items():
            if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
                (identity if singular(name) in IDENTITY else internal).update(str(k) for k in value)
    return internal, identity


def _scalars(value: Any) -> Iterable[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float | str):
            text = str(item)
            if text:
                yield text


def _empty(result: Any) -> bool:
    return result in ([], {}, None, "")


def _words(text: str) -> list[str]:
    return re.findall(r"[\w'-]+", text.lower())


def _mentions(text: str, value: str) -> bool:
    """`value` appears in `text` as a whole token (an id `BK-0002`, a number, a name)."""
    if not value or (len(value) < 2 and not value.isdigit()):
        return False
    return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) is not None


def _id_values(value: Any) -> list[str]:
    """The ids an id-valued argument passes: a scalar, or each scalar of a list (an object is settings, not an id)."""
    items = value if isinstance(value, list) else [value]
    return [str(v) for v in items if isinstance(v, str | int) and not isinstance(v, bool)]


def _number_forms(value: str) -> set[str]:
    """A value as an answer may write it: 240.0 as 240 or 240.00; a date or time the ways users write
    them (`conversation.say`: 2026-01-10 as "10 January 2026")."""
    forms = renderings(value)
    try:
        number = float(value)
    except ValueError:
        return forms
    if number == int(number):
        forms.add(str(int(number)))
    forms.add(f"{number:.2f}")
    forms.add(f"{number:,.2f}")
    return forms


class _Counts:
    def __init__(self) -> None:
        self.turns = self.calls = self.requests_with_id = self.requests_with_own = self.id_args = self.incoherent = 0
        self.empty_then_more = self.canned = self.bookkeeping = 0
        self.answers: list[str] = []
        self.bigrams: Counter[tuple[str, str]] = Counter()
        self.requests: list[list[tuple[str, str]]] = []


def _conversation(conv: Conversation, c: _Counts) -> None:
    ids: set[str] = set()
    identity: set[str] = set()
    for node in conv.nodes:
        for states in (node.initial_scenario, node.final_scenario):
            internal, own = _record_ids_of(states)
            ids |= internal
            identity |= own
    # ids the solver took from the user's words: their own records (from the state), values they chose
    users = {
        v
        for p in conv.task.solver
        for b in p.bindings
        if is_id_parameter(b.parameter) and b.source in ("state", "generated", "repeated")
        for v in _id_values(b.value)
    }
    own = {
        v
        for p in conv.task.solver
        for b in p.bindings
        if is_id_parameter(b.parameter) and b.source == "state"
        for v in _id_values(b.value)
    }
    seen_results: set[str] = set()  # scalars of earlier results
    said_identity: set[str] = set()  # words of the requests so far (an identity id the user said)
    said_by_user: set[str] = set()  # the user's ids the requests so far spell out
    told_user: set[str] = set()  # scalars the assistant has said
    for node in conv.nodes:
        c.turns += 1
        request = node.query
        words = _words(request)
        c.bigrams.update(pairwise(words))
        c.requests.append(list(pairwise(words)))
        # a key of digits only (an integer id) is an id where the turn passes it as one, else a quantity
        passed = {
            v
            for step in node.steps
            if step.role == "tool_call" and isinstance(step.content, list)
            for call in step.content
            if isinstance(call, ToolCall)
            for name, value in call.arguments.items()
            if is_id_parameter(name)
            for v in _id_values(value)
        }
        mentioned = {
            i for i in ids if _mentions(request, i) and i not in told_user and (not i.isdigit() or i in passed)
        }
        if mentioned - own:
            c.requests_with_id += 1
        elif mentioned:
            c.requests_with_own += 1
        said = {i for i in identity if _mentions(request, i)}
        seen_results |= said  # the user's own customer number, once said, is known
        said_identity |= set(re.findall(r"[\w-]+", request))
        said_by_user |= {v for v in users if _mentions(request, v)}
        turn_results: list[ToolResult] = []
        calls: list[ToolCall] = []
        for step in node.steps:
            if step.role == "tool_call" and isinstance(step.content, list):
                for call in step.content:
                    if not isinstance(call, ToolCall):
                        continue
                    calls.append(call)
                    for name, value in call.arguments.items():
                        if not is_id_parameter(name):
                            continue
                        for text in _id_values(value):
                            c.id_args += 1
                            if (
                                text not in seen_results
                                and text not in said_by_user
                                and not (is_identity(name) and text in said_identity)
                            ):
                                c.incoherent += 1
            elif step.role == "tool_result" and isinstance(step.content, list):
                for result in step.content:
                    if isinstance(result, ToolResult):
                        turn_results.append(result)
                        if result.ok:
                            seen_results.update(_scalars(result.result))
            elif step.role == "assistant" and isinstance(step.content, str):
                answer = step.content
                c.answers.append(answer)
                values = {v for r in turn_results if r.ok for s in _scalars(r.result) for v in _number_forms(s)}
                reports = any(_mentions(answer, v) for v in values)
                # tool names as words ("list cards", "book room"); a one-word name (transfer) is also a noun
                names = {call.name.replace("_", " ") for call in calls if "_" in call.name}
                named = sum(1 for n in names if n in answer.lower())
                lists_tools = bool(names) and named >= max(1, len(names) // 2 + 1)
                if (turn_results and not reports) or lists_tools:
                    c.canned += 1
                lowered = answer.lower()
                if any(
                    (is_bookkeeping(k) and spoken_name(k) in lowered) or (unsayable(v) and v in answer)
                    for r in turn_results
                    if r.ok
                    for k, v in _fields(r.result)
                ):
                    c.bookkeeping += 1
                told_user.update(v for v in values if _mentions(answer, v))
        c.calls += len(calls)
        c.empty_then_more += sum(1 for r in turn_results[:-1] if r.ok and _empty(r.result))


def _fields(value: Any) -> Iterable[tuple[str, Any]]:
    """(key, value) of every field of a result, nested ones included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                yield str(k), v
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


def _record_ids_of(states: dict[str, Any]) -> tuple[set[str], set[str]]:
    internal: set[str] = set()
    identity: set[str] = set()
    for dump in (states or {}).values():
        a, b = _record_ids(dump)
        internal |= a
        identity |= b
    return internal, identity


def measure(conversations: Iterable[Conversation]) -> QualityFigures:
    """The figures over `conversations` (the keep-rate and speed are the batch's, not measured here)."""
    c = _Counts()
    n = 0
    for conv in conversations:
        n += 1
        _conversation(conv, c)
    bigrams = sum(c.bigrams.values())
    return QualityFigures(
        conversations=n,
        turns=c.turns,
        calls=c.calls,
        turns_per_conversation=c.turns / n if n else 0.0,
        calls_per_turn=c.calls / c.turns if c.turns else 0.0,
        requests_with_internal_id=c.requests_with_id / c.turns if c.turns else 0.0,
        requests_with_own_id=c.requests_with_own / c.turns if c.turns else 0.0,
        id_arguments=c.id_args,
        incoherent_id_arguments=c.incoherent / c.id_args if c.id_args else 0.0,
        empty_then_more=c.empty_then_more,
        canned_answers=c.canned / len(c.answers) if c.answers else 0.0,
        answers_telling_bookkeeping=c.bookkeeping / len(c.answers) if c.answers else 0.0,
        distinct_answers=len(set(c.answers)) / len(c.answers) if c.answers else 0.0,
        distinct_2_requests=len(c.bigrams) / bigrams if bigrams else 0.0,
        distinct_2_per_100=_chunked_distinct(c.requests, 100),
    )


def _chunked_distinct(requests: list[list[tuple[str, str]]], size: int) -> float:
    """Distinct-2 over consecutive chunks of `size` requests (the last one if full, or the only one), averaged:
    a corpus-level distinct-n falls as a corpus grows, so figures of runs of different sizes compare only this way."""
    chunks = [requests[i : i + size] for i in range(0, len(requests), size)]
    chunks = [ch for ch in chunks if len(ch) == size] or chunks[:1]
    ratios = []
    for chunk in chunks:
        grams = [g for r in chunk for g in r]
        if grams:
            ratios.append(len(set(grams)) / len(grams))
    return sum(ratios) / len(ratios) if ratios else 0.0
