"""Does synthesized data copy the benchmark? Overlap between a run's conversations and BFCL multi-turn.

Three views, each against every BFCL multi-turn category installed:

- **requests**: the user's words of each turn (`Node.query`) against BFCL's user messages — exact
  matches after normalizing (lower case, words only), and word n-gram overlap (default n = 8, the
  window contamination checks use for short texts; GPT-3's 13 is for long documents): the share of our
  requests that share any n-gram with BFCL, and the largest share of one request's n-grams found there;
- **tool names**: our tools whose names are BFCL function names;
- **argument values**: string argument values of our calls (6+ characters) that appear in BFCL's
  ground-truth calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, Field

from envfactory.records.models import Conversation
from envfactory.suites.bfcl.calls import CallSyntaxError, parse_call
from envfactory.suites.bfcl.entries import load_entries
from envfactory.suites.bfcl.suites import MULTI_TURN_CATEGORIES, SUITES_BY_CLASS, class_importable

_WORD = re.compile(r"[a-z0-9]+")


class ContaminationReport(BaseModel):
    against: str = "bfcl"
    n: int
    requests: int
    benchmark_requests: int = Field(description="BFCL multi-turn's user messages, over its four categories")
    benchmark_distinct: int = Field(description="of them, different texts (the categories share their questions)")
    exact_matches: int
    requests_with_shared_ngram: int
    max_ngram_share: float
    examples: list[str] = Field(default_factory=list, description="our requests that share an n-gram")
    tools: int
    shared_tool_names: list[str]
    argument_values: int
    shared_argument_count: int
    shared_argument_values: list[str] = Field(default_factory=list, description="the first 50")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def _bfcl_texts() -> tuple[list[str], set[str], set[str]]:
    """BFCL's user messages, its function names, and the string values of its ground-truth calls."""
    texts: list[str] = []
    values: set[str] = set()
    for category in MULTI_TURN_CATEGORIES:
        for entry in load_entries(category):
            texts += [str(m.get("content", "")) for turn in entry.question for m in turn if m.get("role") == "user"]
            for call_text in (c for turn in entry.ground_truth for c in turn):
                try:
                    call = parse_call(call_text)
                except CallSyntaxError:
                    continue
                values |= {v for v in [*call.args, *call.kwargs.values()] if isinstance(v, str)}
    names: set[str] = set()
    from envfactory.suites.bfcl.adapter import environment

    for class_name in filter(class_importable, SUITES_BY_CLASS):  # a class missing a dependency here: left out
        names |= set(environment(class_name).metadata.tool_names)
    return texts, names, values


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def check(conversations: list[Conversation], n: int = 8, examples: int = 5) -> ContaminationReport:
    texts, names, values = _bfcl_texts()
    bench_exact = {" ".join(words(t)) for t in texts}
    bench_grams: set[tuple[str, ...]] = set().union(*(ngrams(words(t), n) for t in texts)) if texts else set()
    requests = [node.query for c in conversations for node in c.nodes if node.query.strip()]
    exact = sum(" ".join(words(r)) in bench_exact for r in requests)
    shared: list[str] = []
    best = 0.0
    for r in requests:
        grams = ngrams(words(r), n)
        if not grams:
            continue
        hit = len(grams & bench_grams)
        if hit:
            shared.append(r)
            best = max(best, hit / len(grams))
    ours_tools = {c.name for conv in conversations for node in conv.nodes for c in node.raw_tool_call}
    ours_values = {
        v for conv in conversations for node in conv.nodes for c in node.raw_tool_call for v in _strings(c.arguments)
    }
    long_values = {v for v in ours_values if len(v) >= 6}
    return ContaminationReport(
        n=n,
        requests=len(requests),
        benchmark_requests=len(texts),
        benchmark_distinct=len(set(texts)),
        exact_matches=exact,
        requests_with_shared_ngram=len(shared),
        max_ngram_share=round(best, 4),
        examples=shared[:examples],
        tools=len(ours_tools),
        shared_tool_names=sorted(ours_tools & names),
        argument_values=len(long_values),
        shared_argument_count=len(long_values & values),
        shared_argument_values=sorted(long_values & values)[:50],
    )
