"""`envfactory eval`: k attempts per item, appended as they finish, resumable, then a summary.

Each attempt is one line of `attempts.jsonl` in the output folder, appended and fsync'ed by the one
writer as it finishes; a rerun with the same folder skips the (item, attempt) pairs already there (a
torn last line from a kill is cut off first), so a killed run loses at most the attempts in flight and
never duplicates one. `summary.json` (and the returned `EvalSummary`) holds the success rate, the mean
reward and its parts, pass@k and pass^k for k = 1 … attempts, and the same per environment, per chain
length and per kind of turn (read / write / mixed).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol, TypeVar

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.eval.agent import AgentLimits, run_agent
from envfactory.eval.items import EvalItem
from envfactory.eval.metrics import PassRates, TaskOutcomes, pass_rates
from envfactory.eval.score import score_attempt
from envfactory.inputs import InputError, JsonlAppender, read_jsonl_log, write_atomic
from envfactory.reward import CompositeReward

ATTEMPTS = "attempts.jsonl"
SUMMARY = "summary.json"


class EvalRunError(EnvFactoryError):
    """The evaluation cannot run or resume (the message says why)."""


class EvalSettings(BaseModel):
    attempts: int = Field(default=1, ge=1, description="attempts per item (k of pass@k / pass^k)")
    concurrency: int = Field(default=1, ge=1, description="attempts at once")
    limit: int | None = Field(default=None, ge=1, description="the first N items only")
    limits: AgentLimits = Field(default_factory=AgentLimits)


class AttemptRecord(BaseModel):
    """One line of attempts.jsonl."""

    item: str
    attempt: int
    success: bool
    reasons: list[str] = Field(default_factory=list)
    reward: float = 0.0
    r_traj: float = 0.0
    r_state: float = 0.0
    length_penalty: float = 0.0
    calls: int = 0
    failed_calls: int = 0
    text_calls: int = 0
    model_steps: int = 0
    error: str | None = None
    seconds: float = 0.0
    env: str
    kind: str
    chain_length: int


class Group(BaseModel):
    attempts: int
    items: int
    success_rate: float
    mean_reward: float
    pass_rates: PassRates


class EvalSummary(Group):
    """The whole evaluation (its own figures as a `Group`), its errors and reward parts, and the breakdowns."""

    errors: int
    mean_r_traj: float
    mean_r_state: float
    by_env: dict[str, Group]
    by_chain_length: dict[str, Group]
    by_kind: dict[str, Group]


ModelFactory = Callable[[], BaseChatModel]
Progress = Callable[[AttemptRecord], None]


def attempt(
    model: BaseChatModel, pool: EnvPool, item: EvalItem, index: int, reward: CompositeReward, limits: AgentLimits
) -> AttemptRecord:
    start = time.monotonic()
    run = run_agent(model, pool, item, limits)
    score = score_attempt(pool, item, run, reward)
    parts = score.reward
    return AttemptRecord(
        item=item.id,
        attempt=index,
        success=score.success,
        reasons=score.reasons,
        reward=parts.reward,
        r_traj=parts.r_traj,
        r_state=parts.r_state,
        length_penalty=parts.length_penalty,
        calls=len(run.results),
        failed_calls=sum(not r.ok for r in run.results),
        text_calls=run.text_calls,
        model_steps=run.model_steps,
        error=run.error,
        seconds=round(time.monotonic() - start, 4),
        env=item.env,
        kind=item.kind,
        chain_length=len(item.ground_truth),
    )


def done_attempts(out: Path) -> list[AttemptRecord]:
    try:
        return [AttemptRecord.model_validate(r) for r in read_jsonl_log(out / ATTEMPTS)]
    except InputError as e:
        raise EvalRunError(str(e)) from None


class HasId(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=HasId)
Runner = Callable[[BaseChatModel, Item, int], AttemptRecord]


def turn_runner(pool: EnvPool, limits: AgentLimits) -> Runner[EvalItem]:
    """Attempts at verified turns: the agent, then success and the composite reward."""
    reward = CompositeReward(pool)

    def run(model: BaseChatModel, item: EvalItem, index: int) -> AttemptRecord:
        return attempt(model, pool, item, index, reward, limits)

    return run


def run_eval(
    items: Sequence[Item],
    model: ModelFactory,
    runner: Runner[Item],
    out: Path,
    settings: EvalSettings,
    *,
    progress: Progress | None = None,
) -> EvalSummary:
    """Run the attempts not yet in `out`, then write and return the summary over every attempt there."""
    items = items[: settings.limit] if settings.limit else items
    if not items:
        raise EvalRunError("nothing to evaluate: the source holds no item")
    out.mkdir(parents=True, exist_ok=True)
    records = done_attempts(out)  # the log is read once: then each new attempt is written and kept
    done = {(r.item, r.attempt) for r in records}
    todo = [(item, k) for item in items for k in range(settings.attempts) if (item.id, k) not in done]
    writer = JsonlAppender(out / ATTEMPTS)
    models: dict[int, BaseChatModel] = {}

    def one(job: tuple[Item, int]) -> AttemptRecord:
        me = threading.get_ident()  # one model client per worker thread
        if me not in models:
            models[me] = model()
        return runner(models[me], job[0], job[1])

    with ThreadPoolExecutor(max_workers=settings.concurrency) as ex:
        futures = [ex.submit(one, job) for job in todo]
        for f in as_completed(futures):
            record = f.result()
            writer.write(record.model_dump_json())  # the driver is the only writer
            records.append(record)
            if progress is not None:
                progress(record)
    wanted = {item.id for item in items}
    asked = [r for r in records if r.item in wanted and r.attempt < settings.attempts]
    summary = summarize(asked, settings.attempts)
    write_atomic(out / SUMMARY, summary.model_dump_json(indent=2) + "\n")
    return summary


def _group(records: list[AttemptRecord], k_max: int) -> Group:
    outcomes = _outcomes(records)
    n = min((o.attempts for o in outcomes), default=1)
    return Group(
        attempts=len(records),
        items=len(outcomes),
        success_rate=_mean(r.success for r in records),
        mean_reward=_mean(r.reward for r in records),
        pass_rates=pass_rates(outcomes, range(1, min(k_max, n) + 1)),
    )


def _outcomes(records: list[AttemptRecord]) -> list[TaskOutcomes]:
    by_item: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        by_item[r.item].append(r.success)
    return [TaskOutcomes(task=i, attempts=len(s), successes=sum(s)) for i, s in sorted(by_item.items())]


def _mean(values: Iterable[float | bool]) -> float:
    xs = [float(v) for v in values]
    return sum(xs) / len(xs) if xs else 0.0


def _by(records: list[AttemptRecord], key: Callable[[AttemptRecord], Any], k_max: int) -> dict[str, Group]:
    groups: dict[str, list[AttemptRecord]] = defaultdict(list)
    for r in records:
        groups[str(key(r))].append(r)
    return {name: _group(rs, k_max) for name, rs in sorted(groups.items())}


def summarize(records: list[AttemptRecord], k_max: int) -> EvalSummary:
    return EvalSummary(
        **_group(records, k_max).model_dump(),
        errors=sum(r.error is not None for r in records),
        mean_r_traj=_mean(r.r_traj for r in records),
        mean_r_state=_mean(r.r_state for r in records),
        by_env=_by(records, lambda r: r.env, k_max),
        by_chain_length=_by(records, lambda r: r.chain_length, k_max),
        by_kind=_by(records, lambda r: r.kind, k_max),
    )
