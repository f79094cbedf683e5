"""Batch runs: a composition plan (A, T, S, D) → units → JSONL, one finished conversation at a time.

SynthAPI's controls: A environments, T tasks (sampled chains) per environment, S initial databases
per task, D data depth (1 core batch + D−1 distractor batches); N = A × T × S units. A unit's key
(`env/t3/s1`) and seeds derive from the run's seed alone, so the plan is the same in every process.

Crash safety: kept conversations go to `conversations.jsonl` and drops to `dropped.jsonl`, one line
per unit, appended and fsync'ed as each unit finishes (only the main thread writes). A resumed run
reads both files, cuts a torn last line (a kill mid-write), and skips every unit already there — no
duplicates, nothing lost. Units that failed with an exception (`code: error`, e.g. an LLM server
down) are retried on resume.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envfactory.config import ToolGraphSettings
from envfactory.env.pool import EnvPool
from envfactory.errors import ConfigError, DataError, first_error
from envfactory.executor import Executor, LocalExecutor, WorkerLost
from envfactory.heap import frozen_heap
from envfactory.inputs import JsonlAppender, iter_jsonl_log, read_jsonl_log, read_yaml
from envfactory.records.models import Conversation
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, HELDOUT, read_conversations
from envfactory.tasks.offline import Dropped, UnitOutcome, stable_seed
from envfactory.tasks.stats import ConversationFacts, facts_of
from envfactory.toolgraph.graph import ToolGraph
from envfactory.toolgraph.sampler import ToolChain, TopologySampler, split_into
from envfactory.toolgraph.settings import sampling_for


class SynthError(DataError):
    """A batch ran but produced nothing to train on."""


class SynthConfigError(ConfigError):
    """A synth config file is missing, malformed or asks for something the pool cannot give."""


MAX_PLANNED = 1_000_000  # units one run plans (SynthAPI's whole study is 458,752 tasks): more is several runs


def check_planned(apps: int, tasks: int, states: int) -> None:
    """Refuse a run of more than `MAX_PLANNED` units (A·T·S: environments, tasks each, states each)."""
    planned = apps * tasks * states
    if planned > MAX_PLANNED:
        raise ValueError(
            f"A·T·S = {planned:,} units is more than one run plans ({MAX_PLANNED:,}): split it into several runs"
        )


class SynthConfig(BaseModel):
    """`envfactory synth --config FILE` (YAML or JSON)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: Literal["offline", "llm"] = "offline"
    envs: list[str] | None = Field(
        default=None,
        min_length=1,
        description="candidate environments (native or compiled); default: every trusted native one",
    )
    # (strict: `T: true` is no count, though Python would take it as 1)
    apps: int | None = Field(
        default=None, ge=1, strict=True, alias="A", description="A: environments used (seeded sample)"
    )
    tasks: int = Field(default=2, ge=1, strict=True, alias="T", description="T: tasks (chains) per environment")
    states: int = Field(default=1, ge=1, strict=True, alias="S", description="S: initial databases per task")
    depth: int = Field(
        default=1, ge=1, le=1000, strict=True, alias="D", description="D: 1 core batch + D-1 distractor batches"
    )
    seed: int = Field(default=0, strict=True)
    chain_length: tuple[int, int] = (2, 4)
    turns: tuple[int, int] = Field(
        default=(3, 5),
        description="turns per conversation, both modes: offline joins chains until it has them; llm mode cuts "
        "its chain into that many turns (at most one per tool)",
    )
    ambiguity: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="offline mode: chance a request leaves out what tells look-alike records apart (then asked)",
    )
    cross_env: bool = Field(default=False, description="chains may reach other environments (up to 3)")
    holdout_envs: list[str] = Field(
        default_factory=list, description="environments held out for evaluation (unseen apps): heldout.jsonl only"
    )
    holdout_tasks: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="share of each other environment's tasks held out (unseen tasks)"
    )
    concurrency: int = Field(default=2, ge=1, strict=True)
    out: Path = Field(
        default=Path(".envfactory/synth/run"), description="output folder (relative: to the working directory)"
    )
    graph: Path | None = Field(
        default=None,
        description="tool graph file; default: the one this run's folder recorded, else the graph of the run's "
        "environments, else the data dir's; built over the run's environments if there is none",
    )
    preset: str = Field(default="SFT_NON_CONV", description="llm mode: SFT_NON_CONV, SFT_CONV or RL_NON_CONV")
    querygen: dict[str, Any] = Field(default_factory=dict, description="llm mode: QueryGenConfig overrides (pass_k...)")
    initial_states: Literal["llm", "generator"] = Field(
        default="llm", description="llm mode: who writes Db0: the LLM (schema_generate) or the seeded generator"
    )
    plot: bool = True

    def folder(self) -> Path:
        """The output folder: `out`, a relative one under the working directory, as every `--out` of the CLI
        (not under the project root, which is the installed checkout when the working directory has no envs/)."""
        return self.out.expanduser().resolve()

    @field_validator("out", mode="before")
    @classmethod
    def _some_place(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():  # (as a path: the working folder, which nobody means)
            raise ValueError("an empty path names no place to write; give a folder")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> SynthConfig:
        check_planned(self.apps or (len(self.envs) if self.envs else 1), self.tasks, self.states)
        lo, hi = self.chain_length
        if lo < 1 or hi < lo:
            raise ValueError(f"chain_length {list(self.chain_length)} must be [MIN, MAX] with 1 <= MIN <= MAX")
        lo, hi = self.turns
        if lo < 1 or hi < lo:
            raise ValueError(f"turns {list(self.turns)} must be [MIN, MAX] with 1 <= MIN <= MAX")
        if self.mode == "llm":  # a bad preset or override: said here, not as an error drop of every unit after the
            from envfactory.querygen.records import QueryGenError, preset_config  # run's settings were recorded

            try:
                preset_config(self.preset, self.querygen)
            except QueryGenError as e:
                raise ValueError(str(e)) from None
        return self


def load_config(path: Path) -> SynthConfig:
    data = read_yaml(path, error=lambda m: SynthConfigError(f"synth config {m}"))
    if data is None:  # an empty file is a mistake (a wrong path, a truncated copy), not "all defaults"
        raise SynthConfigError(
            f"synth config {path} is empty: give at least `mode` and `envs` (see examples/synth.yaml), or `{{}}` for"
            " every default"
        )
    if not isinstance(data, dict):
        raise SynthConfigError(f"synth config {path}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return SynthConfig.model_validate(data)
    except ValidationError as e:
        where, msg = first_error(e, "(top level)")
        raise SynthConfigError(f"synth config {path}: {where}: {msg}") from None


class Unit(BaseModel):
    """One conversation to make: a chain, a state variant s, a depth, a seed."""

    key: str
    env: str
    task: int
    state_variant: int
    depth: int
    seed: int
    chain: ToolChain
    more: list[ToolChain] | None = None  # offline: chains that may join it, for a multi-turn conversation
    turns: tuple[int, int] = (3, 5)
    ambiguity: float = 0.0
    split: Literal["train", "heldout"] = "train"


class Plan(BaseModel):
    envs: list[str]
    units: list[Unit]
    shortfall: dict[str, int] = Field(default_factory=dict)  # env → chains the graph could not give


def choose_envs(config: SynthConfig, pool: EnvPool) -> list[str]:
    # Python environments with a state model (trusted code runs in-process as an `Environment`), and compiled
    # ones: known from their folders, built when a unit uses them
    native = [n for n in pool.native_names() if pool.trusted(n)]
    envs = config.envs or native
    known = pool.names()
    listed = set(known)
    unknown = [e for e in envs if e not in listed]
    if unknown:
        raise SynthConfigError(f"unknown environment(s) {unknown}; the pool has: {', '.join(known)}")
    twice = sorted({e for e in envs if envs.count(e) > 1})
    if twice:
        raise SynthConfigError(f"envs lists {twice} more than once")
    if config.apps is not None and config.apps > len(envs):
        raise SynthConfigError(f"A={config.apps} environments asked, but the run has {len(envs)}: {', '.join(envs)}")
    if config.apps is not None and config.apps < len(envs):
        envs = sorted(random.Random(stable_seed(config.seed, "apps")).sample(sorted(envs), config.apps))
    try:  # (the config checked A·T·S with A or its envs list; with neither, A is the pool's environments)
        check_planned(len(envs), config.tasks, config.states)
    except ValueError as e:
        raise SynthConfigError(f"{e} ({len(envs)} environments)") from None
    stray = sorted(set(config.holdout_envs) - set(envs))
    if stray:
        raise SynthConfigError(f"holdout_envs names environment(s) this run does not use: {stray}; it uses {envs}")
    if config.graph is not None and not config.graph.expanduser().is_file():
        raise SynthConfigError(f"graph: {config.graph}: no tool graph here: build one with `envfactory graph build`")
    return list(envs)


def plan_units(config: SynthConfig, pool: EnvPool, graph: ToolGraph, sampling: ToolGraphSettings | None = None) -> Plan:
    envs = choose_envs(config, pool)
    units: list[Unit] = []
    shortfall: dict[str, int] = {}
    for env in envs:
        if env not in graph.envs():
            raise SynthConfigError(f"the tool graph has no tools of '{env}': rebuild it (`envfactory graph build`)")
        over = graph if config.cross_env else graph.subgraph(env)
        # the caller's sampling settings (the run's), not the ones a kept graph was built with
        sampler = TopologySampler(over, sampling_for(over, sampling) if sampling is not None else None)
        offline = config.mode == "offline"
        # offline: each conversation joins several chains into `turns` goal turns; llm: its chain is cut into them
        pool_of = _chains_from(sampler, graph, env, config, config.tasks * 4 if offline else config.tasks)
        if not offline:
            pool_of = [_cut(chain, config, env, t) for t, chain in enumerate(pool_of)]
        chains = pool_of[: config.tasks]
        if len(chains) < config.tasks:
            shortfall[env] = config.tasks - len(chains)
        held = heldout_tasks(config, env, len(chains))
        held_pool = held | heldout_extras(config, env, len(chains), len(pool_of))
        for t, chain in enumerate(chains):
            more: list[ToolChain] | None = None
            if offline:  # candidates to join after the task's own chain, in a seeded order, from its own split only
                side = t in held_pool
                others = [c for i, c in enumerate(pool_of) if i != t and (i in held_pool) == side]
                more = random.Random(stable_seed(config.seed, env, t, "more")).sample(others, min(len(others), 8))
            for s in range(config.states):
                units.append(
                    Unit(
                        key=f"{env}/t{t}/s{s}",
                        env=env,
                        task=t,
                        state_variant=s,
                        depth=config.depth,
                        seed=stable_seed(config.seed, env, t, s),
                        chain=chain,
                        more=more,
                        turns=config.turns,
                        ambiguity=config.ambiguity if offline else 0.0,
                        split="heldout" if t in held else "train",
                    )
                )
    return Plan(envs=envs, units=units, shortfall=shortfall)


def _cut(chain: ToolChain, config: SynthConfig, env: str, task: int) -> ToolChain:
    """An llm-mode chain cut into a seeded number of turns from the plan's `turns` (at most one per tool)."""
    rng = random.Random(stable_seed(config.seed, env, task, "turns"))
    return chain.model_copy(update={"turns": split_into(chain.tools, rng.randint(*config.turns), rng)})


def heldout_tasks(config: SynthConfig, env: str, n: int) -> set[int]:
    """The task indices of `env` held out: all of a held-out environment, else a seeded share of its tasks
    (every state variant of a task goes the same way, so no held-out task is seen in training)."""
    return _held_share(config, env, range(n), "holdout")


def heldout_extras(config: SynthConfig, env: str, n_tasks: int, n_pool: int) -> set[int]:
    """The chains past the tasks (`n_tasks` to `n_pool`: what offline conversations join after their own) kept for
    held-out conversations: the same share as the tasks, all of a held-out environment. A conversation joins chains
    of its own split only, so no chain a held-out conversation holds is seen in training, nor the other way."""
    return _held_share(config, env, range(n_tasks, n_pool), "holdout extras")


def _held_share(config: SynthConfig, env: str, indices: range, salt: str) -> set[int]:
    """All of `indices` for a held-out environment, else a share `holdout_tasks` of them, seeded by `salt`."""
    if env in config.holdout_envs:
        return set(indices)
    k = round(len(indices) * config.holdout_tasks)
    return set(random.Random(stable_seed(config.seed, env, salt)).sample(indices, k)) if k else set()


def _chains_from(sampler: TopologySampler, graph: ToolGraph, env: str, config: SynthConfig, n: int) -> list[ToolChain]:
    """`n` chains that start in `env` (with cross_env, others may join), distinct by tool sequence."""
    seen: set[tuple[str, ...]] = set()
    chains: list[ToolChain] = []
    for chain in sampler.iter_sample(n * 20, config.chain_length, stable_seed(config.seed, env)):
        key = tuple(chain.tools)
        if chain.servers[0] != env or key in seen:
            continue
        seen.add(key)
        chains.append(chain)
        if len(chains) == n:
            break
    return chains


# ---- the JSONL files ------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return read_jsonl_log(path, error=SynthConfigError)


def _rows_with(path: Path, keys: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """A run log's rows and their numbers, each an object whose `keys` hold text (what a resume reads of it), read a
    line at a time; another row — valid JSON but no record of this run (`{"x": 1}`, `[1, 2]`) — is a one-line error
    naming it, not a traceback."""
    for n, row in enumerate(iter_jsonl_log(path, error=SynthConfigError), 1):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in keys):
            wanted = " and ".join(f"'{k}'" for k in keys)
            raise SynthConfigError(
                f"{path}: row {n} is no record of a run (no text {wanted}); fix or remove it to resume"
            )
        yield n, row


def _facts_of_row(path: Path, n: int, row: dict[str, Any]) -> ConversationFacts:
    try:
        return facts_of(Conversation.model_validate(row))
    except ValidationError as e:
        where, msg = first_error(e, "<root>")
        raise SynthConfigError(
            f"{path}: row {n} is not a conversation: {where}: {msg}; fix or remove it to resume"
        ) from None


def done_keys(out: Path) -> set[str]:
    """Units already finished in `out`: kept ones, and drops other than errors (those are retried)."""
    return RunLog.read(out, facts=False).done()


class RunLog:
    """What a run folder holds, kept in memory as it is written: the lines there before this run (read once,
    for the units to skip) and this run's outcomes in the order they were appended. The summary and the
    statistics come from it, not from reading the (large) files back."""

    def __init__(self) -> None:
        # conversations.jsonl, in file order: what the statistics read of each conversation (the conversations
        # themselves, kept for a large run, would take ~370 KB each), or only its id (`read(facts=False)`)
        self.train: list[ConversationFacts | str] = []
        self.heldout_ids: list[str] = []  # heldout.jsonl's ids
        self.drops: list[tuple[str, str]] = []  # dropped.jsonl's (key, code), in file order

    @classmethod
    def read(cls, out: Path, *, facts: bool = True) -> RunLog:
        """The folder's logs, a line at a time (a resumed run's earlier lines are never held whole). With `facts`,
        each conversation is read as a conversation (a line that is none is an error naming it, before any unit
        runs) and kept as what the statistics read of it; without, as its id."""
        log = cls()
        path = out / CONVERSATIONS
        seen: dict[str, str] = {}  # conversation id -> where it is

        def once(where: Path, n: int, cid: str) -> str:
            at = f"{where.name} row {n}"
            if cid in seen:  # two runs' lines in one file, or an edit: the summary would count it twice
                raise SynthConfigError(
                    f"{out}: conversation {cid!r} is there twice ({seen[cid]} and {at}); remove one to resume"
                )
            seen[cid] = at
            return cid

        for n, row in _rows_with(path, ("id",)):
            once(path, n, row["id"])
            log.train.append(_facts_of_row(path, n, row) if facts else row["id"])
        log.heldout_ids = [once(out / HELDOUT, n, r["id"]) for n, r in _rows_with(out / HELDOUT, ("id",))]
        log.drops = [(r["key"], r["code"]) for _, r in _rows_with(out / DROPPED, ("key", "code"))]
        return log

    def train_ids(self) -> list[str]:
        return [c.id if isinstance(c, ConversationFacts) else c for c in self.train]

    def done(self) -> set[str]:
        return {*self.train_ids(), *self.heldout_ids} | {k for k, code in self.drops if code != "error"}

    def facts(self) -> list[ConversationFacts]:
        """What the statistics read of the training split, as from the conversations `load_conversations` reads."""
        facts = [c for c in self.train if isinstance(c, ConversationFacts)]
        if len(facts) < len(self.train):
            raise ValueError("this log was read without the conversations' facts (RunLog.read(facts=False))")
        return facts


# ---- running --------------------------------------------------------------------------------------


class BatchSummary(BaseModel):
    planned: int
    skipped: int  # already done before this run
    kept: int  # in the output now (all runs), both splits
    heldout: int = 0  # of them, held out (heldout.jsonl)
    heldout_envs: list[str] = Field(default_factory=list)
    heldout_units: list[str] = Field(default_factory=list)
    dropped: int
    dropped_by_code: dict[str, int]
    shortfall: dict[str, int]
    out: Path


UnitRunner = Callable[[Unit], UnitOutcome]
Progress = Callable[[UnitOutcome | int], None]  # each outcome; first, on a resume, how many units ran before


def run_units(
    units: list[Unit],
    runner: UnitRunner,
    out: Path,
    *,
    concurrency: int = 2,
    progress: Progress | None = None,
    executor: Executor | None = None,
    log: RunLog | None = None,
) -> tuple[int, int]:
    """Run the units not yet in `out` on `executor` (default: `concurrency` local threads); returns (skipped,
    ran). This process writes every outcome as it arrives; a unit's exception or a lost worker becomes an
    `error` drop with the reason (a rerun tries it again). A `log` given (empty) ends up holding what the
    folder holds: its earlier lines and this run's."""
    out.mkdir(parents=True, exist_ok=True)
    earlier = RunLog.read(out, facts=log is not None)  # (without a log, only which units are done is wanted)
    if log is not None:
        log.train, log.heldout_ids, log.drops = earlier.train, earlier.heldout_ids, earlier.drops
    done = earlier.done()
    todo = [u for u in units if u.key not in done]
    if progress is not None and len(todo) < len(units):  # a resume: the bar starts at what was done before
        progress(len(units) - len(todo))
    kept, dropped = JsonlAppender(out / CONVERSATIONS), JsonlAppender(out / DROPPED)
    heldout = JsonlAppender(out / HELDOUT)
    split = {u.key: u.split for u in units}
    skipped = len(units) - len(todo)
    with frozen_heap():  # the pool, the graph, earlier lines: out of the collector's way
        for unit, result in (executor or LocalExecutor(concurrency)).map(runner, todo):
            if isinstance(result, UnitOutcome):
                outcome = result
            else:  # a batch records a failure and goes on
                reason = result.reason if isinstance(result, WorkerLost) else f"{type(result).__name__}: {result}"
                outcome = UnitOutcome(
                    key=unit.key, dropped=Dropped(key=unit.key, code="error", reason=reason, tools=unit.chain.tools)
                )
            if outcome.conversation is not None:
                held = split.get(outcome.key) == "heldout"
                (heldout if held else kept).write(outcome.conversation.model_dump_json())
                if log is not None and held:
                    log.heldout_ids.append(outcome.conversation.id)
                elif log is not None:
                    log.train.append(facts_of(outcome.conversation))
            elif outcome.dropped is not None:
                dropped.write(outcome.dropped.model_dump_json())
                if log is not None:
                    log.drops.append((outcome.dropped.key, outcome.dropped.code))
            if progress is not None:
                progress(outcome)
    return skipped, len(todo)


def summarize(plan: Plan, out: Path, skipped: int, log: RunLog | None = None) -> BatchSummary:
    """The counts of `plan` in `out`, from `log` (what `run_units` kept while writing) or else read from
    the folder."""
    log = log if log is not None else RunLog.read(out, facts=False)
    planned = {u.key for u in plan.units}
    train = [k for k in log.train_ids() if k in planned]
    held = [k for k in log.heldout_ids if k in planned]
    kept_keys = {*train, *held}
    # the latest line per key wins: a unit that errored and then succeeded on resume counts once, as kept
    drops: dict[str, str] = {}
    for key, code in log.drops:
        if key in planned and key not in kept_keys:
            drops[key] = code
    codes = Counter(drops.values())
    return BatchSummary(
        planned=len(plan.units),
        skipped=skipped,
        kept=len(train) + len(held),
        heldout=len(held),
        heldout_envs=[e for e in plan.envs if {u.split for u in plan.units if u.env == e} == {"heldout"}],
        heldout_units=sorted(u.key for u in plan.units if u.split == "heldout"),
        dropped=len(drops),
        dropped_by_code=dict(sorted(codes.items())),
        shortfall=plan.shortfall,
        out=out,
    )


def load_conversations(out: Path) -> list[Conversation]:
    """The kept conversations of a run folder (none before the first is kept), through the one reader."""
    path = out / CONVERSATIONS
    if not path.exists():
        return []
    return read_conversations(path, error=SynthConfigError)
