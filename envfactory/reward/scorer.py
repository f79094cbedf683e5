"""`CompositeReward`, the scorer: completions scored against RL records, environments and parsed records
cached; and the functional form `composite_reward` (one scorer per pool and settings, kept)."""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from pydantic_core import to_json

from envfactory.config import get_settings
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.env.state import State
from envfactory.env.state_fields import FieldWise, touched_dump
from envfactory.errors import EnvFactoryError
from envfactory.records.models import ToolCall
from envfactory.reward.matching import CallMatcher, best_match
from envfactory.reward.record import (
    CallKey,
    Target,
    _as_calls,
    _as_servers,
    _as_states,
    _index,
    _key,
    _lazy_json,
    _summary,
    first_differences,
)
from envfactory.reward.settings import RecordError, RewardResult, RewardSettings
from envfactory.reward.state_masking import Blank, apply_blanks, fast_canonical, masked_value_blanks
from envfactory.reward.state_term import CallsOutcome, Delta, LiveReplay, Replayed, dump_delta, touched_equal
from envfactory.reward.tool_calls import ParsedCompletion, ToolIndex, parse_tool_calls

log = logging.getLogger("envfactory.reward")  # the package's logger: records keep the name they had

_MAX_REASONS = 12
_MEMO_SIZE = 64  # distinct (replayed) call sequences remembered per record
_OUTCOME_KEY_BYTES = 16_384  # a completion's arguments (as JSON) beyond which its outcome is not remembered
_INDEXES_KEPT = 64  # sets of environments whose tool index is kept
_CANDIDATES_KEPT = 1024
_NORMALIZED_KEPT = 4096  # calls whose normalized arguments are kept
_CHECK_EVERY = 64  # forks from templates between two looks at the template forked from
_UNSET: Any = object()  # distinct predicted calls whose matches are remembered per record


def _call_key(call: ToolCall) -> CallKey | None:
    """A call as a memo key: its tool and its arguments as JSON, which tells 1, 1.0 and true apart (NaN
    kept as NaN); equal keys are equal calls. None for arguments JSON cannot hold (a lone surrogate)."""
    try:
        return call.server, call.name, to_json(call.arguments, inf_nan_mode="constants")
    except (ValueError, TypeError, RecursionError):
        return None


def _remember(memo: dict[Any, Any], key: Any, value: Any, size: int) -> None:
    """`memo[key] = value`, the oldest entries let go beyond `size`. Threads may score one record at once (a
    trainer's reward called from a thread pool): another thread's eviction between a look at the oldest key and
    its removal is no error."""
    memo[key] = value
    while len(memo) > size:
        try:
            memo.pop(next(iter(memo)), None)
        except (RuntimeError, StopIteration):  # changed or emptied by another thread meanwhile: look again
            continue


@dataclass(frozen=True)
class InitialState:
    """A server's validated initial dump, shared by the records that start from the same config (read-only):
    `fork` its JSON (native environments), `canon` its canonical form; `parts` how goal states starting from it
    may be validated in what differs from it alone (None: whole); `template` the state `fork` validates to, what
    sessions fork from sharing its records (`State.fork_sharing_records`; plain-data models only, as `parts`)."""

    env: BaseEnvironment
    dump: dict[str, Any]
    fork: bytes | None
    canon: dict[str, Any]
    parts: FieldWise | None = None
    template: State | None = None

    def goal_dump(self, goal: dict[str, Any], source: str) -> dict[str, Any]:
        """`env.dump_state(env.new_state(goal, source))`, through `parts` where it can."""
        if self.parts is not None and (dump := self.parts.dump(self.dump, goal, source)) is not None:
            return dump
        return self.env.dump_state(self.env.new_state(goal, source))


def _env_in(pool: EnvPool, server: str) -> BaseEnvironment | None:
    """`server`'s environment in `pool`, or None."""
    try:
        return pool.get(server)
    except EnvFactoryError:
        return None


def _zero(reason: str, alpha: float, **counts: int) -> RewardResult:
    return RewardResult(reward=0.0, alpha=alpha, reasons=[reason], **counts)


# ---- the scorer ----------------------------------------------------------------------------------------


class CompositeReward:
    """Scores completions against RL records; keeps environments (an `EnvPool`) and parsed records cached."""

    def __init__(self, pool: EnvPool, settings: RewardSettings | None = None) -> None:
        self.pool = pool
        self.settings = settings or RewardSettings()
        self._targets: OrderedDict[tuple[Any, ...], Target | RecordError] = OrderedDict()
        self._indexes: dict[tuple[tuple[str, BaseEnvironment], ...], ToolIndex] = {}
        self._normalized: dict[tuple[BaseEnvironment, CallKey], dict[str, Any] | None] = {}
        self._initial_configs: dict[Any, dict[str, dict[str, Any]]] = {}  # by initial_config's key
        self._initial_states: dict[tuple[str, Any], InitialState] = {}  # by (server, initial_config's key)
        self._forks = 0  # sessions forked from templates (`_template_intact`)
        self._spoiled: dict[int, State] = {}  # templates a tool changed, by id (held: the id stays theirs)
        self._no_goal: set[str] = set()  # servers a record gave no final state for, logged once each
        s = self.settings
        # the pool's lookup, not a method of this scorer: the matcher holding the scorer would make every scorer
        # (and its cached records) a reference cycle, freed only by a full collection of the cyclic GC
        self.matcher = CallMatcher(
            partial(_env_in, pool), case_sensitive=s.case_sensitive, rel_tol=s.rel_tol, abs_tol=s.abs_tol
        )

    # ---- environments and arguments ----------------------------------------------------------
    def _env(self, server: str) -> BaseEnvironment | None:
        return _env_in(self.pool, server)

    def _kind(self, server: str, name: str) -> str:
        env = self._env(server) if server else None
        binding = env.binding(name) if env is not None else None
        return binding.kind if binding is not None else "write"

    def _kind_of(self, t: Target, server: str, name: str) -> str:
        """`_kind`, remembered per record."""
        kind = t.kinds.get((server, name))
        if kind is None:
            kind = t.kinds[(server, name)] = self._kind(server, name)
        return kind

    def normalize(self, call: ToolCall, *, strict: bool) -> dict[str, Any] | None:
        """The call's arguments as the tool reads them (`CallMatcher.normalize`), remembered per environment
        and call (the same calls recur across a dataset's records and completions). Read-only."""
        env = self._env(call.server) if call.server else None
        key = _call_key(call) if env is not None else None
        if env is None or key is None:
            return self.matcher.normalize(call, strict=strict)
        hit = self._normalized.get((env, key), _UNSET)
        if hit is _UNSET:
            if len(self._normalized) >= _NORMALIZED_KEPT:
                self._normalized.clear()
            hit = self._normalized[(env, key)] = self.matcher.normalize(call, strict=True)
        if hit is None:  # the tool rejects them: nothing for a prediction, the raw arguments for a ground truth
            return None if strict else dict(call.arguments)
        return cast(dict[str, Any], hit)

    # ---- records -----------------------------------------------------------------------------
    def target(self, ground_truth: Any, initial_config: Any, final_config: Any, mcp_servers: Any) -> Target:
        """The parsed record (cached). Raises RecordError for a record that cannot be scored against."""
        try:
            key: tuple[Any, ...] | None = tuple(
                _key(v) for v in (ground_truth, initial_config, final_config, mcp_servers)
            )
        except Exception:  # not serializable: do not cache
            key = None
        hit = self._targets.get(key) if key is not None else None
        if key is not None and hit is not None:
            with contextlib.suppress(KeyError):  # let go by another thread meanwhile: it is still this record's
                self._targets.move_to_end(key)
            if isinstance(hit, RecordError):
                raise hit
            return hit
        try:
            built: Target | RecordError = self._build(
                ground_truth, initial_config, final_config, mcp_servers, key[1] if key is not None else None
            )
        except RecordError as e:
            log.warning("reward: unusable RL record: %s", e)
            built = e
        except Exception as e:  # anything else a malformed record triggers: a data problem too
            log.warning("reward: unusable RL record: %s: %s", type(e).__name__, e)
            built = RecordError(f"{type(e).__name__}: {e}")
        if key is not None and self.settings.cache_size:
            self._targets[key] = built
            while len(self._targets) > self.settings.cache_size:
                with contextlib.suppress(KeyError):  # emptied by another thread meanwhile
                    self._targets.popitem(last=False)
        if isinstance(built, RecordError):
            raise built
        return built

    def _index(self, envs: dict[str, BaseEnvironment]) -> ToolIndex:
        """The record's `ToolIndex` (its own copy: `preferred` is per record), built once per set of environments."""
        key = tuple(envs.items())
        hit = self._indexes.get(key)
        if hit is None:
            if len(self._indexes) >= _INDEXES_KEPT:
                self._indexes.clear()
            hit = self._indexes[key] = _index(envs)
        return hit.copy()

    def _initial_raw(self, initial_config: Any, key: Any) -> dict[str, dict[str, Any]]:
        """`initial_config` read (`_as_states`), kept by its key: a dataset's records share a few initial
        configs (the scenarios their tasks start from). Read-only: callers never change it."""
        if key is None or not self.settings.cache_size:
            return _as_states(initial_config, "initial_config")
        hit = self._initial_configs.get(key)
        if hit is None:
            hit = _as_states(initial_config, "initial_config")
            _remember(self._initial_configs, key, hit, self.settings.cache_size)
        return hit

    def _initial_state(self, env: BaseEnvironment, name: str, config: dict[str, Any], key: Any) -> InitialState:
        """`name`'s validated initial dump, kept per (server, initial_config) for native environments."""
        cache = key is not None and self.settings.cache_size and type(env) is Environment
        if cache:
            hit = self._initial_states.get((name, key))
            if hit is not None and hit.env is env:
                return hit
        try:
            dump = env.dump_state(env.new_state(config, f"initial_config.{name}"))
        except EnvFactoryError as e:
            raise RecordError(f"initial_config.{name}: {e}") from None
        native = type(env) is Environment  # a State with a change log, forked in this process
        fork = to_json(dump) if native else None
        parts = FieldWise.of(env.state_model) if cache and native else None  # type: ignore[attr-defined]
        built = InitialState(
            env,
            dump,
            fork,
            fast_canonical(dump, dump, self.settings.mask),
            parts,
            parts.model.load_bytes(fork) if parts is not None and fork is not None else None,
        )
        if cache:
            _remember(self._initial_states, (name, key), built, self.settings.cache_size)
        return built

    def _build(
        self, ground_truth: Any, initial_config: Any, final_config: Any, mcp_servers: Any, initial_key: Any = None
    ) -> Target:
        s = self.settings
        initial_raw = self._initial_raw(initial_config, initial_key)
        final_raw = _as_states(final_config, "final_config")
        listed = _as_servers(mcp_servers)
        problems: list[str] = []
        names = listed if listed is not None else list(dict.fromkeys([*initial_raw, *final_raw]))
        envs: dict[str, BaseEnvironment] = {}
        for name in dict.fromkeys(names):
            env = self._env(name)
            if env is None:
                problems.append(f"no environment '{name}' in the pool")
            else:
                envs[name] = env
        index = self._index(envs)
        gt, gt_problems = _as_calls(ground_truth, index)
        problems += gt_problems
        if listed is None:  # servers only named by the ground truth's calls
            for c in gt:
                if c.server and c.server not in envs and (env := self._env(c.server)) is not None:
                    envs[c.server] = env
            index = self._index(envs)
        index.preferred = {c.name: c.server for c in reversed(gt)}
        gt_args = [self.normalize(c, strict=False) for c in gt]
        kinds = [self._kind(c.server, c.name) for c in gt]
        succ = [0] * len(gt)
        for i, a in enumerate(gt):
            for j in range(i + 1, len(gt)):
                if a.server == gt[j].server and "write" in (kinds[i], kinds[j]):
                    succ[i] |= 1 << j

        initial: dict[str, dict[str, Any]] = {}
        blanks: dict[str, list[Blank]] = {}
        init_canon: dict[str, dict[str, Any]] = {}
        goal_dump: dict[str, dict[str, Any]] = {}
        goal_canon: dict[str, dict[str, Any]] = {}
        goal_changed: dict[str, bool] = {}
        goal_delta: dict[str, Delta] = {}
        forks: dict[str, bytes] = {}
        templates: dict[str, State] = {}
        texts: dict[str, bytes] = {}
        for name, env in envs.items():
            config = initial_raw.get(name)
            if config is None:
                default = env.default_scenario()
                config = env.scenario(default) if default else {}
            start = self._initial_state(env, name, config, initial_key)
            init_dump = initial[name] = start.dump
            native = start.fork is not None
            if start.fork is not None:
                forks[name] = start.fork
            if start.template is not None:
                templates[name] = start.template
            goal_raw = final_raw.get(name)
            if goal_raw is None:
                problems.append(f"{name}: no final state in final_config; not scored")
                if name not in self._no_goal:  # a reason on each result, and one line in the log: R_state is
                    self._no_goal.add(name)  # left out of such rows' rewards, which a broken export makes silently
                    log.warning(
                        "reward: a record gives no final state for '%s' (final_config lacks it, or is null): its "
                        "state term is not scored, the calls alone are; later ones are not logged",
                        name,
                    )
                blanks[name] = []
                init_canon[name] = start.canon
                continue
            try:
                goal_dump_ = start.goal_dump(goal_raw, f"final_config.{name}")
            except EnvFactoryError as e:
                raise RecordError(f"final_config.{name}: {e}") from None
            goal_dump[name] = goal_dump_
            if native:
                goal_delta[name] = dump_delta(init_dump, goal_dump_)
            values = {
                v
                for c in gt
                if c.server == name
                for k in c.masked_arguments
                if isinstance(v := c.arguments.get(k), str) and v.strip()
            }
            blank = masked_value_blanks(init_dump, goal_dump_, values) if s.mask_masked_values and values else []
            blanks[name] = blank
            base = apply_blanks(init_dump, blank)
            init_canon[name] = fast_canonical(base, base, s.mask) if blank else start.canon
            if not blank and start.fork is not None:
                texts[name] = start.fork  # the JSON fast_canonical looks for generated ids in
            goal_canon[name] = fast_canonical(
                base, apply_blanks(goal_dump_, blank), s.mask, _lazy_json(base, texts, name)
            )
            goal_changed[name] = goal_canon[name] != init_canon[name]
        return Target(
            servers=list(envs),
            envs=envs,
            index=index,
            gt=gt,
            gt_args=gt_args,
            succ=succ,
            initial=initial,
            blanks=blanks,
            goal_dump=goal_dump,
            init_canon=init_canon,
            goal_canon=goal_canon,
            goal_changed=goal_changed,
            goal_delta=goal_delta,
            forks=forks,
            templates=templates,
            problems=problems,
            _json=texts,
        )

    # ---- scoring -----------------------------------------------------------------------------
    def score(
        self,
        completion: Any,
        ground_truth: Any,
        initial_config: Any,
        final_config: Any,
        mcp_servers: Any = None,
        *,
        step: int | None = None,
        total_steps: int | None = None,
    ) -> RewardResult:
        """R for one completion. Never raises: a bad completion scores 0 with a reason, and so does a
        record that cannot be scored against (logged once per record)."""
        alpha = self.settings.alpha_at(step, total_steps)
        try:
            return self._score(completion, ground_truth, initial_config, final_config, mcp_servers, alpha)
        except RecordError as e:
            return _zero(f"record: {e}", alpha)
        except Exception as e:  # a bug must not stop a training run: 0, logged
            log.exception("reward: internal error")
            return _zero(f"internal error: {type(e).__name__}: {e}", alpha)

    def _score(
        self,
        completion: Any,
        ground_truth: Any,
        initial_config: Any,
        final_config: Any,
        mcp_servers: Any,
        alpha: float,
    ) -> RewardResult:
        s = self.settings
        t = self.target(ground_truth, initial_config, final_config, mcp_servers)
        n_gt = len(t.gt)
        blocks = t.blocks if s.memoize_replays else None
        parsed = parse_tool_calls(completion, t.index, max_calls=s.max_calls, max_chars=s.max_chars, memo=blocks)
        n_bad = len(parsed.unparseable)
        if parsed.error is not None:
            return _zero(f"unparseable: {parsed.error}", alpha, n_gt=n_gt)
        if not parsed.calls and not parsed.dropped and n_bad:
            first = parsed.unparseable[0]
            return _zero(f"unparseable: {first.where}: {first.reason}", alpha, n_gt=n_gt, n_unparseable=n_bad)
        reasons = self._parse_reasons(parsed)
        calls = parsed.calls
        n_pred = parsed.n_calls

        keys = [_call_key(c) for c in calls]
        outcome = self._outcome(t, calls, keys)
        matched, failed, r_state_or_none = outcome.matched, outcome.failed, outcome.r_state
        r_traj = 1.0 if n_gt == 0 and n_pred == 0 else 2.0 * matched / (n_gt + n_pred)
        if matched < n_gt:
            reasons.append(f"trajectory: {matched} of {n_gt} ground-truth calls matched")
        if n_pred > matched:
            reasons.append(f"trajectory: {n_pred - matched} predicted calls match no ground-truth call")
        reasons.extend(outcome.reasons)
        n_failed = len(failed)
        r_state = r_traj if r_state_or_none is None else r_state_or_none
        p_length = max(0, n_pred - n_gt)
        length_penalty = min(s.gamma * p_length, s.length_penalty_cap)
        format_penalty = min(s.format_penalty * n_bad, s.format_penalty_cap)
        if p_length:
            reasons.append(f"length: {p_length} more calls than the ground truth")
        raw = alpha * r_traj + (1.0 - alpha) * r_state - length_penalty - format_penalty
        reasons.extend(t.problems)
        if len(reasons) > _MAX_REASONS:
            reasons = [*reasons[:_MAX_REASONS], f"... and {len(reasons) - _MAX_REASONS} more"]
        return RewardResult(  # (validated in Rust: faster than model_construct's Python loop over the fields)
            reward=max(0.0, raw),
            r_traj=r_traj,
            r_state=r_state,
            p_length=p_length,
            length_penalty=length_penalty,
            format_penalty=format_penalty,
            alpha=alpha,
            n_pred=n_pred,
            n_gt=n_gt,
            matched=matched,
            n_unparseable=n_bad,
            n_failed=n_failed,
            reasons=reasons,
        )

    def _outcome(self, t: Target, calls: list[ToolCall], keys: list[CallKey | None]) -> CallsOutcome:
        """The state and trajectory terms of `calls`, memoized per record by the calls (with the replays):
        completions that differ only in their text around the calls, their format or the names' form
        (qualified or not) share them."""
        memo: tuple[CallKey, ...] | None = None
        if self.settings.memoize_replays and None not in keys:
            memo = tuple(k for k in keys if k is not None)
            if sum(len(k[2]) for k in memo) > _OUTCOME_KEY_BYTES:  # a long completion's calls: not kept as a key
                memo = None
        hit = t.outcomes.get(memo) if memo is not None else None
        if hit is not None:
            return hit
        reasons: list[str] = []
        r_state, failed = self._state(t, calls, keys, reasons)
        matched = self._match(t, calls, keys, failed)
        outcome = CallsOutcome(r_state, tuple(failed), tuple(reasons), matched)
        if memo is not None:
            _remember(t.outcomes, memo, outcome, _MEMO_SIZE)
        return outcome

    @staticmethod
    def _parse_reasons(parsed: ParsedCompletion) -> list[str]:
        reasons = [f"unparseable: {b.where}: {b.reason}" for b in parsed.unparseable[:3]]
        if parsed.dropped:
            reasons.append(f"{parsed.dropped} calls beyond the first {len(parsed.calls)} were not run")
        reasons.extend(parsed.problems[:3])
        return reasons

    def _match(self, t: Target, calls: list[ToolCall], keys: list[CallKey | None], failed: Sequence[int] = ()) -> int:
        """M: the most ground-truth calls matched. A call the environment refuses — `failed` (from the replay), and
        a read matched only through `same_value`'s leniency (case, spaces, isclose), run here when reads are not
        replayed — matches only a ground-truth call whose arguments it repeats exactly (`CallMatcher.exact_args`):
        the leniency earns no credit for a call the tool did not accept."""
        if not t.gt or not calls:
            return 0
        candidates: list[tuple[int, ...]] = []
        for c, key in zip(calls, keys, strict=True):
            cands = t.candidates.get(key) if key is not None else None
            if cands is None:
                cands = self._candidates(t, c)
                if key is not None and len(t.candidates) < _CANDIDATES_KEPT:
                    t.candidates[key] = cands
            candidates.append(cands)
        refused = set(failed)
        if not self.settings.replay_reads:
            loose = [
                k
                for k, c in enumerate(calls)
                if candidates[k]
                and k not in refused
                and self._kind_of(t, c.server, c.name) == "read"
                and self._exact(t, c, keys[k], candidates[k]) != candidates[k]
            ]
            if loose:
                refused.update(self._refused_reads(t, calls, keys, loose))
        for k in refused:
            if candidates[k]:
                candidates[k] = self._exact(t, calls[k], keys[k], candidates[k])
        return best_match(candidates, t.succ, self.settings.max_match_states)

    def _exact(self, t: Target, c: ToolCall, key: CallKey | None, candidates: tuple[int, ...]) -> tuple[int, ...]:
        """Of `candidates` (the ground-truth indices `c` matches), those whose arguments `c` repeats exactly."""
        hit = t.exact.get(key) if key is not None else None
        if hit is not None:
            return hit
        args = self.normalize(c, strict=True)
        exact = tuple(
            i
            for i in candidates
            if args is not None
            and (want := t.gt_args[i]) is not None
            and self.matcher.exact_args(want, t.gt[i].masked_arguments, args)
        )
        if key is not None and len(t.exact) < _CANDIDATES_KEPT:
            t.exact[key] = exact
        return exact

    def _refused_reads(
        self, t: Target, calls: list[ToolCall], keys: list[CallKey | None], reads: list[int]
    ) -> set[int]:
        """Which of the read calls `reads` the environment refuses, each run after the writes before it on its server
        (reads change nothing; other servers' writes cannot matter). Remembered per record by the read and those
        writes: a lower-cased city the tool accepts recurs across a group's completions."""
        refused: set[int] = set()
        todo: dict[int, tuple[Any, ...] | None] = {}
        for k in reads:
            c = calls[k]
            before = [
                keys[j]
                for j in range(k)
                if calls[j].server == c.server and self._kind_of(t, c.server, calls[j].name) != "read"
            ]
            memo = (keys[k], *before) if keys[k] is not None and None not in before else None
            hit = t.refused_reads.get(memo) if memo is not None else None
            if hit is None:
                todo[k] = memo
            elif hit:
                refused.add(k)
        if not todo:
            return refused
        servers, last = {calls[k].server for k in todo}, max(todo)
        sessions: dict[str, Session] = {}
        for k, c in enumerate(calls[: last + 1]):
            if c.server not in servers or (k not in todo and self._kind_of(t, c.server, c.name) == "read"):
                continue
            session = sessions.get(c.server)
            if session is None:
                session = sessions[c.server] = self._fork(t, c.server)
            ok = session.call(c.name, c.arguments).ok
            if k in todo:
                if not ok:
                    refused.add(k)
                memo = todo[k]
                if memo is not None and len(t.refused_reads) < _CANDIDATES_KEPT:
                    t.refused_reads[memo] = not ok
        return refused

    def _candidates(self, t: Target, c: ToolCall) -> tuple[int, ...]:
        """The ground-truth calls that the predicted call `c` matches (`CallMatcher`'s rule)."""
        same_tool = [i for i, g in enumerate(t.gt) if g.name == c.name and g.server == c.server]
        if not same_tool:
            return ()
        args = self.normalize(c, strict=True)
        if args is None:
            return ()
        return tuple(
            i
            for i in same_tool
            if (want := t.gt_args[i]) is not None and self.matcher.same_args(want, t.gt[i].masked_arguments, args)
        )

    def _state(
        self, t: Target, calls: list[ToolCall], keys: list[CallKey | None], reasons: list[str]
    ) -> tuple[float | None, list[int]]:
        """(R_state, the indices of the calls that failed: to a server outside the task, or refused when replayed);
        R_state None when no server is relevant (read-only both ways).

        Read tools cannot change a state (sessions enforce it), so only writes — and calls to unknown
        tools, which fail — are replayed, unless `replay_reads`. What a replay gives depends on the
        replayed calls alone, so it is memoized per record by them (tools are deterministic): the
        completions of a GRPO group that differ only in their reads, the place of their reads, or their
        format share one replay."""
        reads = self.settings.replay_reads
        replayed = [
            (k, c)
            for k, c in enumerate(calls)
            if c.server in t.initial and (reads or self._kind_of(t, c.server, c.name) != "read")
        ]
        run: Replayed | None = None
        key: tuple[CallKey, ...] | None = None
        if self.settings.memoize_replays:
            replayed_keys = [keys[k] for k, _ in replayed]
            if None not in replayed_keys:  # every call readable as JSON
                key = tuple(k for k in replayed_keys if k is not None)
                run = t.replays.get(key)
        if run is None:
            run = self._replay(t, [c for _, c in replayed], [keys[k] for k, _ in replayed])
            if key is not None:
                _remember(t.replays, key, run, _MEMO_SIZE)
        failed: list[int] = []
        for k, c in enumerate(calls):
            if c.server not in t.initial:
                failed.append(k)
                if len(failed) <= 3:
                    reasons.append(f"call {k} {c.server or '?'}.{c.name}: no such environment in this task")
        for (k, c), (ok, error) in zip(replayed, run.outcomes, strict=True):
            if not ok:
                failed.append(k)
                if len(failed) <= 3 and error is not None:
                    reasons.append(f"call {k} {c.qualified} failed: {error}")
        reasons.extend(run.reasons)
        return run.r_state, failed

    def _fork(self, t: Target, server: str) -> Session:
        """A fresh session on the record's initial state of `server`: a native environment's from its validated
        template, sharing its records (`State.fork_sharing_records`), or straight from the validated dump's JSON
        (what `Session.fork` does, without re-serializing it every time)."""
        env = self.pool.get(server)
        if env is not t.envs.get(server):
            return Session.fork(env, t.initial[server])
        # untraced: a replay wants the final state, not each call's diff (reads are traced all the same)
        template = t.templates.get(server)
        if template is not None and self._template_intact(template, t.forks[server], server):
            return Session(env, template.fork_sharing_records(), traced=False)
        data = t.forks.get(server)
        if data is not None:
            return Session(env, env.state_model.load_bytes(data), traced=False)  # type: ignore[attr-defined]
        return Session.fork(env, t.initial[server])

    def _template_intact(self, template: State, fork: bytes, server: str) -> bool:
        """Whether forks may still share `template`'s records: every `_CHECK_EVERY`th fork looks at it again (its
        dump, as JSON, against the one it was validated from). A tool that changed a record in place — against
        the contract — changed the template for every later fork: it is dropped (forks from JSON from then on)
        and the environment named once."""
        if id(template) in self._spoiled:
            return False
        self._forks += 1
        if self._forks % _CHECK_EVERY:
            return True
        if to_json(template.dump()) == fork:
            return True
        self._spoiled[id(template)] = template
        log.warning(
            "reward: a tool of '%s' changed a record in place (not through the state's create/update/delete/set): "
            "replays fork from the initial state's JSON from now on, and rewards scored before may be wrong",
            server,
        )
        return False

    def _replay(self, t: Target, calls: list[ToolCall], keys: list[CallKey | None]) -> Replayed:
        """Replay `calls` and compare the final states with the goal. A record keeps its last replay's
        native sessions (`LiveReplay`): the next replay rolls them back to the calls both share (the
        change log undoes a call exactly) instead of forking and replaying those calls again."""
        if not calls:  # nothing replayed: every state as it started
            return self._compare(t, calls, {}, [])
        native = all(c.server in t.forks for c in calls)
        if native and t.lock.acquire(blocking=False):  # another thread on this record: fresh sessions
            try:
                live = t.live if t.live is not None else LiveReplay()
                t.live = None  # while in use: a failure half way leaves no half-rolled-back replay behind
                sessions, outcomes = self._run(t, calls, keys, live)
                result = self._compare(t, calls, sessions, outcomes)
                t.live = live
                return result
            finally:
                t.lock.release()
        sessions, outcomes = self._run(t, calls, keys, None)
        return self._compare(t, calls, sessions, outcomes)

    def _run(
        self, t: Target, calls: list[ToolCall], keys: list[CallKey | None], live: LiveReplay | None
    ) -> tuple[dict[str, Session], list[tuple[bool, str | None]]]:
        """Run `calls` in sessions forked from the record's initial states ((ok, error) per call); with
        `live`, continuing its sessions from the longest prefix of calls it shares with `calls`."""
        sessions: dict[str, Session] = {}
        outcomes: list[tuple[bool, str | None]] = []
        start = 0
        if live is not None:
            start = live.rewind(keys)
            sessions, outcomes = live.sessions, live.outcomes
        for c in calls[start:]:
            session = sessions.get(c.server)
            if session is None:
                session = sessions[c.server] = self._fork(t, c.server)
            if live is not None:
                live.push(keys[len(outcomes)], c.server, session.state.log_mark())
            rec = session.call(c.name, c.arguments)
            if not rec.ok:
                error = rec.error
                outcomes.append((False, f"{error.type}: {error.message[:120]}" if error is not None else None))
            else:
                outcomes.append((True, None))
        if live is not None:
            for session in sessions.values():
                session.history.clear()  # kept sessions: their records would pile up
        return sessions, outcomes

    def _compare(
        self, t: Target, calls: list[ToolCall], sessions: dict[str, Session], outcomes: list[tuple[bool, str | None]]
    ) -> Replayed:
        wrote = {
            c.server
            for c, (ok, _) in zip(calls, outcomes, strict=True)
            if ok and self._kind_of(t, c.server, c.name) == "write"
        }
        reasons: list[str] = []
        equal = changed = 0
        considered = 0
        for srv in t.servers:
            goal = t.goal_canon.get(srv)
            if goal is None:
                continue
            session = sessions[srv] if srv in wrote else None
            exact: bool | None = None
            dump: dict[str, Any] | None = None
            if session is not None:
                delta = t.goal_delta.get(srv)
                if delta is not None and isinstance(session.state, State):
                    exact = touched_equal(session.state, t.goal_dump[srv], delta)
                    if exact is False:  # differs: dumped along what the calls touched
                        dump = touched_dump(session.state, t.initial[srv])
                if not exact and dump is None:
                    dump = session.dump()
                    if exact is None and dump == t.goal_dump[srv]:
                        exact = True
            if exact:  # fast path: the very same state
                same, moved = True, t.goal_changed[srv]
            elif dump is not None:
                blank = t.blanks[srv]
                base = apply_blanks(t.initial[srv], blank)
                actual = fast_canonical(base, apply_blanks(dump, blank), self.settings.mask, t.initial_json(srv))
                same = actual == goal
                moved = actual != t.init_canon[srv]
                if not same:
                    reasons.append(f"state {srv}: differs at {_summary(first_differences(goal, actual))}")
            else:
                same, moved = not t.goal_changed[srv], False
                if not same:
                    reasons.append(f"state {srv}: unchanged; the task changes {t.goal_summary(srv)}")
            if self.settings.state_scope == "all" or t.goal_changed[srv] or moved:
                considered += 1
                equal += same
                changed += moved
        return Replayed(tuple(outcomes), equal / considered if considered else None, tuple(reasons))


# ---- the functional form ----------------------------------------------------------------------------

_DEFAULT_POOL: EnvPool | None = None
_SCORERS: dict[tuple[int, str], CompositeReward] = {}


def default_pool() -> EnvPool:
    global _DEFAULT_POOL
    if _DEFAULT_POOL is None:
        _DEFAULT_POOL = EnvPool(get_settings())
    return _DEFAULT_POOL


def _scorer(pool: EnvPool | None, settings: RewardSettings | None) -> CompositeReward:
    pool = pool if pool is not None else default_pool()
    settings = settings or RewardSettings()
    key = (id(pool), settings.model_dump_json())
    scorer = _SCORERS.get(key)
    if scorer is None or scorer.pool is not pool:
        if len(_SCORERS) >= 8:
            _SCORERS.clear()
        scorer = _SCORERS[key] = CompositeReward(pool, settings)
    return scorer


def composite_reward(
    completion: Any,
    ground_truth: Any,
    initial_config: Any,
    final_config: Any,
    mcp_servers: Any = None,
    *,
    pool: EnvPool | None = None,
    settings: RewardSettings | None = None,
    step: int | None = None,
    total_steps: int | None = None,
) -> RewardResult:
    """R = α·R_traj + (1−α)·R_state − γ·P_length (− format penalty), clipped at 0, for one completion.

    The record's fields may be the RL record's JSON strings or parsed objects. Never raises."""
    return _scorer(pool, settings).score(
        completion, ground_truth, initial_config, final_config, mcp_servers, step=step, total_steps=total_steps
    )
