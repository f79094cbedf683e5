"""BFCL's multi-turn criterion on our environments, judged against `bfcl_eval`'s own checker.

The ground truth as the "model" solves every entry of the four multi-turn categories that need no
extra data; on answers made wrong in many ways (seeded mutations of the ground truth: a call left
out, an argument changed, a call repeated, moved to another turn, an unknown function, a turn left
empty, calls split over steps) our verdict equals `multi_turn_checker`'s, entry by entry.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("bfcl_eval")

from envfactory.suites.bfcl import available
from envfactory.suites.bfcl.calls import parse_call
from envfactory.suites.bfcl.entries import BFCLEntry, load_entries
from envfactory.suites.bfcl.judge import Answer, judge_entry, result_text
from envfactory.suites.bfcl.suites import MULTI_TURN_CATEGORIES

pytestmark = pytest.mark.skipif(not available(), reason="bfcl-eval is not installed")

CATEGORIES = MULTI_TURN_CATEGORIES
_RUN = itertools.count()


def bfcl_verdict(entry: BFCLEntry, answer: Answer) -> dict[str, Any]:
    """`bfcl_eval`'s own verdict (its checker keeps instances in globals per model name: a fresh name each run)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    category = entry.id.rsplit("_", 1)[0]
    test_entry = {"id": entry.id, "initial_config": entry.initial_config, "involved_classes": entry.involved_classes}
    return multi_turn_checker(answer, entry.ground_truth, test_entry, category, f"judge_check_{next(_RUN)}")


def call_text(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return f"{name}({', '.join([*(repr(a) for a in args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "_x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return None


def mutations(entry: BFCLEntry, rng: random.Random) -> dict[str, Answer]:
    """Wrong (and a few right) answers made from the ground truth."""
    truth = [list(turn) for turn in entry.ground_truth]
    filled = [i for i, turn in enumerate(truth) if turn]
    out: dict[str, Answer] = {"split_steps": [[[c] for c in turn] for turn in truth]}
    if not filled:
        return out
    t = rng.choice(filled)

    def with_turn(turn_calls: list[str], at: int = t) -> Answer:
        return [[turn_calls] if i == at else [turn] for i, turn in enumerate(truth)]

    out["drop_call"] = with_turn([c for j, c in enumerate(truth[t]) if j != rng.randrange(len(truth[t]))])
    out["repeat_call"] = with_turn([*truth[t], rng.choice(truth[t])])
    out["unknown_function"] = with_turn([*truth[t], "no_such_tool(x=1)"])
    out["empty_turn"] = with_turn([])
    out["reversed_turn"] = with_turn(list(reversed(truth[t])))
    if t + 1 < len(truth):
        moved = [[turn] for turn in truth]
        moved[t + 1] = [truth[t] + truth[t + 1]]
        moved[t] = [[]]
        out["late_calls"] = moved
    call = parse_call(rng.choice(truth[t]))
    if call.kwargs:
        key = rng.choice(sorted(call.kwargs))
        changed = _changed(call.kwargs[key])
        if changed is not None:
            wrong = call_text(call.name, call.args, {**call.kwargs, key: changed})
            out["wrong_argument"] = with_turn([wrong if c == truth[t][0] else c for c in truth[t]])
            out["wrong_argument_added"] = with_turn([*truth[t], wrong])
    return out


def _sample(category: str, n: int, seed: int) -> list[BFCLEntry]:
    entries = load_entries(category)
    return random.Random(seed).sample(entries, min(n, len(entries)))


@pytest.mark.parametrize("category", CATEGORIES)
def test_the_ground_truth_solves_every_entry(category: str) -> None:
    entries = load_entries(category)
    assert len(entries) >= 100
    failed = [
        (e.id, v.message) for e in entries if not (v := judge_entry(e, [[turn] for turn in e.ground_truth])).valid
    ]
    assert failed == []


@pytest.mark.parametrize("category", CATEGORIES)
def test_verdicts_equal_bfcls_own_checker_entry_by_entry(category: str) -> None:
    rng = random.Random(category)
    compared: Counter[str] = Counter()
    invalid = 0
    for entry in _sample(category, 30, seed=len(category)):
        for kind, answer in mutations(entry, rng).items():
            theirs = bfcl_verdict(entry, answer)
            ours = judge_entry(entry, answer)
            where = f"{entry.id} [{kind}]: ours {ours.error_type} ({ours.message}), bfcl {theirs.get('error_type')}"
            assert ours.valid == theirs["valid"], where
            if not ours.valid:
                invalid += 1
                assert ours.error_type == theirs["error_type"], where
            compared[kind] += 1
    assert sum(compared.values()) >= 150 and invalid >= 60, compared  # the mutations did make wrong answers


def test_results_compare_as_bfcls_executor_writes_them() -> None:
    assert result_text("ok") == "ok"
    assert result_text({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert result_text([1, "b"]) == "[1, 'b']" and result_text(None) == "None" and result_text(2.5) == "2.5"


def test_a_wrong_turn_count_is_invalid() -> None:
    entry = load_entries("multi_turn_base")[0]
    verdict = judge_entry(entry, [[turn] for turn in entry.ground_truth][:-1])
    assert not verdict.valid and verdict.error_type == "multi_turn:turn_count_mismatch"
