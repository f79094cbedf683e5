"""An attempt's scores: success by the turn's verifier, and the composite reward with its parts.

Success is BFCL's multi-turn criterion applied to our turns: every environment of the turn ends in a
state equivalent to the ground truth's (the task verifier's comparison: generated ids and masked
fields aside), and every result the ground truth's calls returned is among the attempt's results
(a multiset, any order) — so a read-only turn is solved only by reading what the ground truth read.
The composite reward is the RL reward (`envfactory.reward`), computed on the attempt's messages.
"""

from __future__ import annotations

import json
from collections import Counter

from pydantic import BaseModel, Field

from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentRun
from envfactory.eval.items import EvalItem
from envfactory.records.episode import replay
from envfactory.records.models import StateVerifier, ToolCall
from envfactory.records.verifier import verify
from envfactory.reward import CompositeReward, RewardResult


class Score(BaseModel):
    success: bool
    reasons: list[str] = Field(default_factory=list)
    reward: RewardResult


def _key(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def missing_results(pool: EnvPool, item: EvalItem, run: AgentRun) -> int:
    """How many of the ground truth's successful results the attempt did not also get."""
    calls = [ToolCall(server=c.server, name=c.tool, arguments=c.arguments) for c in item.ground_truth]
    truth = Counter(_key(r.result) for r in replay(pool, calls, item.initial, item.servers).results if r.ok)
    got = Counter(_key(r.result) for r in run.results if r.ok)
    return sum((truth - got).values())


def score_attempt(pool: EnvPool, item: EvalItem, run: AgentRun, reward: CompositeReward) -> Score:
    goal = {s: item.expected[s] for s in item.servers if s in item.expected}
    verdict = verify(StateVerifier(goal=goal), item.initial, run.final)
    reasons = list(verdict.reasons)
    missing = missing_results(pool, item, run)
    if missing:
        reasons.append(f"{missing} ground-truth result(s) not among the attempt's results")
    result = reward.score(
        run.messages,
        [c.model_dump() for c in item.ground_truth],
        item.initial,
        item.expected,
        item.servers,
    )
    if run.error is not None:
        reasons.insert(0, run.error)
    return Score(success=not reasons, reasons=reasons[:8], reward=result)
