"""`envfactory eval`: k attempts per item, appended as they finish, resumable, then a summary.

Each attempt is one line of `attempts.jsonl` in the output folder, appended and fsync'ed by the one
writer as it finishes; a rerun with the same folder skips the (item, attempt) pairs already there (a
torn last line from a kill is cut off first), so a killed run loses at most the attempts in flight and
never duplicates one. Before the first attempt the folder gets `settings.json` (`envfactory.run_settings`):
the model and its sampling, the tools and conversation modes, k, the budgets and a sha256 of the data; a
rerun made otherwise is refused before any attempt, naming what differs, so one table never mixes two ways
of making attempts. Every attempt record carries its tools mode, mode and model too.

`summary.json` (and the returned `EvalSummary`) holds the success rate, the mean
reward and its parts, pass@k and pass^k for k = 1 … attempts, and the same per environment, per chain
length and per kind of turn (read / write / mixed).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field, ValidationError

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.errors import DataError, first_error
from envfactory.eval.agent import MODEL_ERROR, AgentLimits, run_agent
from envfactory.eval.items import EvalItem
from envfactory.eval.metrics import PassRates, TaskOutcomes, pass_rates
from envfactory.eval.score import score_attempt
from envfactory.eval.stats import Interval, pass_at_1
from envfactory.executor import Executor, LocalExecutor, Shipped, WorkerLost
from envfactory.inputs import JsonlAppender, read_jsonl_log, write_atomic
from envfactory.records.run_folder import ATTEMPTS as ATTEMPTS  # eval's file names live with the run folders'
from envfactory.records.run_folder import FAILURES as FAILURES
from envfactory.reward import CompositeReward
from envfactory.run_settings import ModelIdentity, RunRecord, check_resume, has_lines, record_or_check

SUMMARY = "summary.json"


class EvalRunError(DataError):
    """The evaluation cannot run or resume (the message says why)."""


EvalMode = Literal["turn", "conversation"]


class EvalData(BaseModel):
    """What is evaluated: a synth run's split, a conversations file or an imported suite, and its sha256."""

    source: Literal["run", "file", "suite"]
    split: Literal["train", "heldout"] | None = None
    suite: str | None = None
    sha256: str = Field(description="of the file(s) the items are read from")


class EvalSettings(BaseModel):
    attempts: int = Field(default=1, ge=1, description="attempts per item (k of pass@k / pass^k)")
    concurrency: int = Field(default=1, ge=1, description="attempts at once")
    limit: int | None = Field(default=None, ge=1, description="the first N items only (see `sample_seed`)")
    sample_seed: int | None = Field(
        default=None,
        description="items in an order drawn with this seed before `limit` cuts them (`sampled`): N spread over "
        "the source, not its first N (a suite's first entries, or a run's first environment, are alike)",
    )
    limits: AgentLimits = Field(default_factory=AgentLimits)
    mode: EvalMode = Field(
        default="turn", description="turn: each verified turn after the ground-truth history; conversation: whole"
    )
    model: ModelIdentity | None = Field(
        default=None, description="the model as configured; None: a caller's factory, named by its class"
    )
    data: EvalData | None = Field(default=None, description="what is evaluated; None: not said (items in memory)")
    context: dict[str, Any] = Field(
        default_factory=dict, description="recorded with the settings, never compared (the source's path...)"
    )

    def recorded(self) -> RunRecord:
        """What `settings.json` holds: the settings a resume must match (concurrency and limit are not among
        them: they change how many attempts run at once and which, not how one is made; a larger limit extends a run).
        A `sample_seed` is: another seed's items are not a run's extension but another sample beside it."""
        shaping = {
            "model": self.model.model_dump() if self.model is not None else None,
            "tools": self.limits.tools,
            "mode": self.mode,
            "attempts": self.attempts,
            "max_steps": self.limits.max_steps,
            "timeout_s": self.limits.timeout_s,
            "data": self.data.model_dump() if self.data is not None else None,
        }
        if self.sample_seed is not None:  # (absent otherwise: runs recorded before it existed resume as they were)
            shaping["sample_seed"] = self.sample_seed
        return RunRecord(command="eval", settings=shaping, context={**self.context, "limit": self.limit})


class AttemptRecord(BaseModel):
    """One line of attempts.jsonl."""

    item: str
    attempt: int = Field(ge=0)
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
    transport_error: bool = Field(
        default=False, description="the model's server was not reached or failed in transport"
    )
    seconds: float = 0.0
    env: str
    kind: str
    chain_length: int
    tools: Literal["direct", "meta"] | None = Field(default=None, description="how it was made: set by run_eval")
    mode: EvalMode | None = None
    model: str | None = Field(default=None, description="provider:model, or the model's class")


class Group(BaseModel):
    attempts: int
    items: int
    success_rate: float
    mean_reward: float
    pass_rates: PassRates


class EvalSummary(Group):
    """The whole evaluation (its own figures as a `Group`), its errors and reward parts, and the breakdowns."""

    errors: int
    model_errors: int = Field(default=0, description="of the errors, attempts whose model call itself raised")
    mean_r_traj: float
    mean_r_state: float
    by_env: dict[str, Group]
    by_chain_length: dict[str, Group]
    by_kind: dict[str, Group]
    settings: dict[str, Any] | None = Field(default=None, description="what made the attempts (settings.json's)")
    selection: dict[str, Any] | None = Field(
        default=None, description="which items the figures are over: `limit` and `sample_seed` of the run that wrote it"
    )
    pass_at_1_ci: Interval | None = Field(
        default=None,
        description="pass@1 over items with its 95 % bootstrap interval (seed 0); `success_rate` is over attempts",
    )


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
        transport_error=run.transport_error,
        seconds=round(time.monotonic() - start, 4),
        env=item.env,
        kind=item.kind,
        chain_length=len(item.ground_truth),
    )


FAIL_FAST = 3  # the first attempts of a run that all end unanswered: the model is not there (`run_eval`)


def unanswered(record: AttemptRecord) -> bool:
    """Whether the model's server was not reached or failed in transport in this attempt (a connection refused, a
    timeout, a 5xx after the client's retries): tried again when the run is resumed, not a failure of the model's
    to keep. A server that was down made every attempt one, and a resume after it was started reused them all:
    pass@1 0.000 for a model never asked. A request the server refused (HTTP 400: a prompt past the context) is
    the model's failure, kept: it would be refused again."""
    return record.transport_error


def done_attempts(out: Path) -> list[AttemptRecord]:
    """The attempts made, one per (item, attempt): a line written twice (two processes given one --out) counts
    once, the first kept; an unanswered one (`unanswered`) gives way to a later try of the same attempt."""
    seen: dict[tuple[str, int], AttemptRecord] = {}
    for n, r in enumerate(read_jsonl_log(out / ATTEMPTS, error=EvalRunError), 1):
        try:
            record = AttemptRecord.model_validate(r)
        except ValidationError as e:
            where, what = first_error(e, "the row")
            raise EvalRunError(
                f"{out / ATTEMPTS}: row {n} is no attempt record ({where}: {what}); fix or remove it to resume"
            ) from None
        key = (record.item, record.attempt)
        if key not in seen or unanswered(seen[key]):
            seen[key] = record
    return list(seen.values())


class HasId(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=HasId)
Runner = Callable[[BaseChatModel, Item, int], AttemptRecord]


class TurnRunner(Shipped):
    """Attempts at verified turns: the agent, then success and the composite reward. Shipped to a Ray worker
    as its settings and limits: the worker builds its own pool and reward on first use."""

    shipped = ("settings", "limits")

    def __init__(self, settings: Settings, limits: AgentLimits, pool: EnvPool | None = None) -> None:
        self.settings = settings
        self.limits = limits
        self._pool = pool

    def __call__(self, model: BaseChatModel, item: EvalItem, index: int) -> AttemptRecord:
        pool = self.once("_pool", lambda: EnvPool(self.settings))
        reward = self.once("_reward", lambda: CompositeReward(pool))
        return attempt(model, pool, item, index, reward, self.limits)


def turn_runner(pool: EnvPool, limits: AgentLimits) -> Runner[EvalItem]:
    return TurnRunner(pool.settings, limits, pool)


class Made(BaseModel):
    """How attempts are made, stamped on each record: tools mode, mode, model (None: named by its class)."""

    tools: Literal["direct", "meta"]
    mode: EvalMode
    model: str | None


class Attempts(Shipped, Generic[Item]):
    """One job = (item, attempt index): the runner with this thread's model client (one per worker thread),
    its record stamped with how it was made."""

    shipped = ("model", "runner", "made")

    def __init__(self, model: ModelFactory, runner: Runner[Item], made: Made) -> None:
        self.model = model
        self.runner = runner
        self.made = made
        self._models: dict[int, BaseChatModel] = {}

    def __call__(self, job: tuple[Item, int]) -> AttemptRecord:
        me = threading.get_ident()
        if me not in self._models:
            self._models[me] = self.model()
        client = self._models[me]
        record = self.runner(client, job[0], job[1])
        name = self.made.model or f"{type(client).__name__}:{getattr(client, 'model_name', None) or '-'}"
        return record.model_copy(update={"tools": self.made.tools, "mode": self.made.mode, "model": name})


class Failure(BaseModel):
    """One line of failures.jsonl: an attempt that could not run (not the model's failure); a rerun tries it again."""

    item: str
    attempt: int
    reason: str


def run_eval(
    items: Sequence[Item],
    model: ModelFactory,
    runner: Runner[Item],
    out: Path,
    settings: EvalSettings,
    *,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> EvalSummary:
    """Run the attempts not yet in `out` (on `executor`, default: `concurrency` local threads), then write and
    return the summary over every attempt there. An attempt whose runner raised or whose worker was lost is
    not an attempt: it goes to failures.jsonl with the reason, and the next run tries it again. A resume made
    with other settings than `out` recorded is refused first (`RunSettingsError`), before any attempt."""
    items = chosen_items(items, settings)
    if not items:
        raise EvalRunError("nothing to evaluate: the source holds no item")
    check_settings(out, settings)
    records = [r for r in done_attempts(out) if not unanswered(r)]  # read once; the unanswered are tried again
    done = {(r.item, r.attempt) for r in records}
    todo = [(item, k) for item in items for k in range(settings.attempts) if (item.id, k) not in done]
    first: list[AttemptRecord] = []  # this run's first results: all unanswered, the model is not there
    writer = JsonlAppender(out / ATTEMPTS)
    failures = JsonlAppender(out / FAILURES)
    made = Made(tools=settings.limits.tools, mode=settings.mode, model=settings.model.label if settings.model else None)
    for job, result in (executor or LocalExecutor(settings.concurrency)).map(Attempts(model, runner, made), todo):
        if not isinstance(result, AttemptRecord):
            why = result.reason if isinstance(result, WorkerLost) else f"{type(result).__name__}: {result}"
            failures.write(Failure(item=job[0].id, attempt=job[1], reason=why[:1000]).model_dump_json())
            continue
        writer.write(result.model_dump_json())  # the driver is the only writer
        records.append(result)
        if progress is not None:
            progress(result)
        if len(first) < FAIL_FAST:
            first.append(result)
            if len(first) == min(FAIL_FAST, len(todo)) and all(unanswered(r) for r in first):
                raise EvalRunError(
                    f"the model did not answer the first {len(first)} attempt(s) ({first[-1].error}): nothing is "
                    "scored; start its server or fix the model settings, then run again (they are tried again)"
                )
    asked = asked_attempts(records, items, settings.attempts)
    interval = pass_at_1(asked) if asked else None  # over items: what the CLI prints, kept with the figures
    selection = {"limit": settings.limit, "sample_seed": settings.sample_seed}
    update = {"settings": settings.recorded().settings, "pass_at_1_ci": interval, "selection": selection}
    summary = summarize(asked, settings.attempts).model_copy(update=update)
    write_atomic(out / SUMMARY, summary.model_dump_json(indent=2) + "\n")
    return summary


def sampled(items: Sequence[Item], seed: int) -> list[Item]:
    """`items` in an order drawn with `seed`: by a keyed hash of each id, so an item's place does not depend on the
    others (a larger --limit on a resume keeps the items a smaller one chose; a source grown since keeps its order)."""

    def key(item: Item) -> bytes:
        return hashlib.sha256(f"{seed}\0{item.id}".encode()).digest()

    return sorted(items, key=key)


def chosen_items(items: Sequence[Item], settings: EvalSettings) -> Sequence[Item]:
    """The items an evaluation runs: all, or `limit` of them (the first, or with `sample_seed` a seeded sample)."""
    ordered = sampled(items, settings.sample_seed) if settings.sample_seed is not None else items
    return ordered[: settings.limit] if settings.limit else ordered


def asked_attempts(records: list[AttemptRecord], items: Sequence[HasId], attempts: int) -> list[AttemptRecord]:
    """The records of these items' first `attempts` attempts (a folder may hold more, from a wider earlier run)."""
    wanted = {item.id for item in items}
    return [r for r in records if r.item in wanted and r.attempt < attempts]


def check_settings(out: Path, settings: EvalSettings, *, write: bool = True) -> None:
    """Refuse a resume into `out` made otherwise than its attempts were (one line naming what differs), or into
    a folder whose attempts recorded no settings; with `write`, record the settings in a run that has none."""
    if out.exists() and not out.is_dir():
        raise EvalRunError(f"{out} is a file: --out names the folder the results go to")
    holds = has_lines(out / ATTEMPTS)
    if write:
        record_or_check(out, settings.recorded(), holds_results=holds)
    else:
        check_resume(out, settings.recorded(), holds_results=holds)


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
        model_errors=sum(r.error is not None and r.error.startswith(MODEL_ERROR) for r in records),
        mean_r_traj=_mean(r.r_traj for r in records),
        mean_r_state=_mean(r.r_state for r in records),
        by_env=_by(records, lambda r: r.env, k_max),
        by_chain_length=_by(records, lambda r: r.chain_length, k_max),
        by_kind=_by(records, lambda r: r.kind, k_max),
    )
