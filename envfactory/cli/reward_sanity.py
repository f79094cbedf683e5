"""The demo's reward sanity check on real RL records: the ground truth must score 1.0, and a redundant call, a wrong
argument and an empty completion must score less, in that order (what `make demo` prints).

The four completions are made from the record itself, in the Qwen/Hermes `<tool_call>` format a policy
writes: the ground truth; the ground truth plus one repeated read call (harmless to the state, so only the
trajectory term and the length penalty notice); the ground truth with one argument of a write call
changed (the state goes wrong); and an answer with no call at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from pydantic import BaseModel

from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.export.rl import GroundTruthCall, RLSample
from envfactory.reward import CompositeReward, RewardResult

KINDS = ("ground truth", "redundant call", "wrong argument", "empty")


class SanityRow(BaseModel):
    kind: str
    completion: str
    result: RewardResult


class SanityReport(BaseModel):
    conversation_id: str
    turn: int
    tools: list[str]
    rows: list[SanityRow]

    @property
    def ordered(self) -> bool:
        """Ground truth 1.0 and each later kind strictly lower than the one before."""
        scores = [r.result.reward for r in self.rows]
        return scores[0] == 1.0 and all(a > b for a, b in pairwise(scores))


def hermes(calls: Sequence[GroundTruthCall]) -> str:
    """Calls as a Qwen/Hermes completion: one `<tool_call>` JSON block each."""
    blocks = [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>" for c in calls]
    return "\n".join(blocks) if blocks else "I could not find anything to do."


def _kind(pool: EnvPool, call: GroundTruthCall) -> str | None:
    binding = pool.get(call.server).binding(call.name.removeprefix(f"{call.server}__"))
    return binding.kind if binding is not None else None


def _wrong(value: Any) -> Any | None:
    """A plausible wrong value of the same type (None when there is none to make)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str) and value:
        return value[:-1] + ("X" if value[-1] != "X" else "Y")
    return None


def _perturbed(pool: EnvPool, calls: list[GroundTruthCall]) -> list[GroundTruthCall] | None:
    """The calls with one unmasked argument of a write call changed (numbers first: still valid more often)."""
    for i, call in enumerate(calls):
        if _kind(pool, call) != "write":
            continue
        names = [k for k in call.arguments if k not in call.masked_arguments]
        names.sort(key=lambda k: not isinstance(call.arguments[k], int | float))
        for name in names:
            wrong = _wrong(call.arguments[name])
            if wrong is not None:
                changed = call.model_copy(update={"arguments": {**call.arguments, name: wrong}})
                return [*calls[:i], changed, *calls[i + 1 :]]
    return None


def completions(pool: EnvPool, sample: RLSample) -> dict[str, str] | None:
    """The four sanity completions of one record, or None when it has no read call to repeat or no write
    argument to change."""
    calls = sample.ground_truth_calls()
    reads = [c for c in calls if _kind(pool, c) == "read"]
    wrong = _perturbed(pool, calls)
    if not reads or wrong is None:
        return None
    return {
        "ground truth": hermes(calls),
        "redundant call": hermes([*calls, reads[-1]]),
        "wrong argument": hermes(wrong),
        "empty": hermes([]),
    }


def reward_sanity(pool: EnvPool, samples: Sequence[RLSample], scorer: CompositeReward | None = None) -> SanityReport:
    """Score the four completions of the first record that has them (the longest ground truth first)."""
    scorer = scorer or CompositeReward(pool)
    for sample in sorted(samples, key=lambda s: -len(s.ground_truth_calls())):
        made = completions(pool, sample)
        if made is None:
            continue
        kwargs = sample.extra_info.mcp_factory_kwargs
        rows = [
            SanityRow(
                kind=kind,
                completion=text,
                result=scorer.score(
                    text,
                    sample.reward_model.ground_truth,
                    kwargs.initial_config,
                    kwargs.final_config,
                    kwargs.mcp_servers,
                ),
            )
            for kind, text in made.items()
        ]
        return SanityReport(
            conversation_id=sample.extra_info.conversation_id,
            turn=sample.extra_info.turn,
            tools=[c.name for c in sample.ground_truth_calls()],
            rows=rows,
        )
    raise EnvFactoryError(
        "reward sanity: no RL record has both a read call to repeat and a write argument to change; "
        "synthesize deeper chains (D ≥ 2)"
    )
