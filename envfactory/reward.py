"""The composite reward R = α·R_traj + (1−α)·R_state − γ·P_length (EnvFactory §3.5), and the TRL reward function.

One RL record (the reference's format) gives, per turn: `reward_model.ground_truth` — the turn's
tool calls (`name`, `arguments`, `masked_arguments`; `server` or a qualified name optional) — and
`extra_info.mcp_factory_kwargs` — `mcp_servers`, `initial_config`, `final_config` (JSON strings or
parsed objects; both are accepted). A completion is scored against it:

**Parsing** (`envfactory.tool_calls`): the completion's calls in any common format. A completion
that is not text/messages at all, or that tried to call tools but none could be read, scores
**0.0** with the reason in `RewardResult.reasons`; nothing here raises for model output.

**R_traj ∈ [0, 1]** — a graded, order-tolerant masked match:
- a predicted call *matches* a ground-truth call when the tool is the same (server and name) and
  every argument not in the ground-truth call's `masked_arguments` is equal. Both sides are first
  normalized by the tool's own argument validator (so defaults are filled in and an omitted
  optional argument equals its default; dates compare as dates); a predicted call whose arguments
  the tool rejects matches nothing. Values: numbers with `math.isclose` (rel 1e-6), booleans are
  not numbers, strings after stripping and case-folding (settable: `case_sensitive`), lists in
  order, objects key by key;
- order: ground-truth calls form a partial order — call i must stay before call j (i < j) when they
  *conflict*: same server and at least one of them is a `write` tool (an unknown tool counts as a
  write). Reads, and calls on different servers, may be reordered freely; two writes on one server
  keep their order (conservatively: a commuting swap of two creates loses trajectory credit but
  keeps full state credit, generated ids being masked);
- M = the largest set of one-to-one (ground truth, prediction) matches such that no conflicting
  pair appears in the opposite order (exact search over matched-set bitmasks, pred by pred; beam
  `max_match_states`, exact for the short lists of a turn);
- **R_traj = 2M / (|gt| + |pred|)** (the F1 of call precision M/|pred| and recall M/|gt|), and 1
  when both are empty. F1 rather than M / max(|gt|, |pred|): a missing and an extra call both cost
  credit, but the extra one is also charged by P_length, so the trajectory term need not be the
  harsher of the two; and F1 is the usual tool-call metric.

**R_state ∈ [0, 1]**: the predicted calls are replayed in fresh isolated sessions (an `Episode`,
what `envfactory.tasks.episode.replay` runs) forked from `initial_config` (a server missing there
starts from its default scenario), only for the servers the calls write to; read calls are not
replayed — a read tool cannot change a state (sessions enforce it) — unless `replay_reads`. A call
to a server outside `mcp_servers` or to an unknown tool is a failed call, never an exception. Each
server's final state is compared with `final_config` by the verifier's masked equivalence
(`canonical`: generated ids and counters masked; `mask.paths` globs masked); a server missing from
`final_config` is not scored (noted). With `mask_masked_values` (default), state fields whose
ground-truth value is a masked argument's value (the free-text `description` a masked argument
wrote) are masked too, so a different wording costs nothing in either term. R_state is the
fraction of *relevant* servers whose state is equivalent (`state_scope="changed"`, default): a
server is relevant when the ground truth or the prediction changed it — untouched servers give no
free credit. On a read-only turn with a read-only prediction (no relevant server) the state cannot
tell doing the reads from doing nothing, so R_state = R_traj there. `state_scope="all"` is the
published code's rule: the fraction of all `mcp_servers` whose state equals the ground truth's.

**Penalties**: P_length = max(0, |pred| − |gt|), charged γ = 0.05 per extra call, capped at 0.5;
format: 0.05 per unparseable call attempt, capped at 0.5 (as the published code). All settable in
`RewardSettings`. **The reward is clipped at ≥ 0** (as the published code), so R ∈ [0, 1].

α = 0.5 by default (the paper's best); `alpha_schedule` gives the published linear 0.9 → 0.1 over
training steps (TRL's `trainer_state.global_step` / `max_steps`).

With the defaults, on a search → book → cancel turn: ground truth 1.0 > the ground truth plus a
redundant read (≈ 0.88) > one wrong argument (≈ 0.33) > an empty completion (0.0).

Speed (`benchmarks/reward.py`): everything a record determines (parsed ground truth, normalized
arguments, the partial order, validated and canonical initial / goal states) is built once and
cached (LRU, keyed by the record's fields); a state equal to the goal as dumped skips the canonical
form, which itself keeps unchanged records as they are (`fast_canonical`, equal to the verifier's);
and completions of one record that make the very same calls share one replay (`memoize_replays`:
tools are deterministic) — the G completions of a GRPO group often do.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json, to_jsonable_python

from envfactory.config import Settings, get_settings
from envfactory.env.environment import BaseEnvironment
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.tasks.episode import Episode
from envfactory.tasks.models import MaskSpec, ToolCall
from envfactory.tasks.verifier import MASKED, canonical
from envfactory.tool_calls import ParsedCompletion, ToolIndex, json_problem, parse_tool_calls

log = logging.getLogger(__name__)

_MAX_REASONS = 12
_MEMO_SIZE = 64  # distinct call sequences remembered per record
_PATH_SHOWN = 3


# ---- settings and results ------------------------------------------------------------------------


class LinearSchedule(BaseModel):
    """α moving linearly from `start` to `end` over `steps` training steps (None: the trainer's max_steps)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: float = Field(default=0.9, ge=0, le=1)
    end: float = Field(default=0.1, ge=0, le=1)
    steps: int | None = Field(default=None, ge=1)

    def value(self, step: int, total: int | None = None) -> float:
        n = self.steps or total
        if not n:
            return self.start
        return self.start + (self.end - self.start) * min(1.0, max(0.0, step / n))


class RewardSettings(BaseModel):
    """Weights, penalties and matching rules of the composite reward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.5, ge=0, le=1, description="weight of R_traj; 1 − α weighs R_state")
    alpha_schedule: LinearSchedule | None = Field(default=None, description="linear α over training steps")
    gamma: float = Field(default=0.05, ge=0, description="penalty per extra call (P_length)")
    length_penalty_cap: float = Field(default=0.5, ge=0)
    format_penalty: float = Field(default=0.05, ge=0, description="penalty per unparseable call attempt")
    format_penalty_cap: float = Field(default=0.5, ge=0)
    state_scope: Literal["changed", "all"] = Field(
        default="changed", description="changed: servers either side changed; all: every server (published)"
    )
    mask: MaskSpec = Field(default_factory=MaskSpec, description="volatile state parts ignored by R_state")
    mask_masked_values: bool = Field(default=True, description="also mask state fields holding masked arguments")
    case_sensitive: bool = Field(default=False, description="compare string arguments case-sensitively")
    rel_tol: float = Field(default=1e-6, ge=0)
    abs_tol: float = Field(default=1e-9, ge=0)
    replay_reads: bool = Field(
        default=False, description="also replay read calls (they cannot change state; only for n_failed)"
    )
    memoize_replays: bool = Field(
        default=True, description="completions of one record with the same calls share a replay (deterministic tools)"
    )
    max_calls: int = Field(default=64, ge=1, description="calls read from one completion; more are only counted")
    max_chars: int = Field(default=200_000, ge=1, description="characters of text read from one completion")
    max_match_states: int = Field(default=512, ge=1, description="beam of the order-tolerant matching")
    cache_size: int = Field(default=256, ge=0, description="records whose parsed form is kept")

    def alpha_at(self, step: int | None = None, total_steps: int | None = None) -> float:
        if self.alpha_schedule is None or step is None:
            return self.alpha
        return self.alpha_schedule.value(step, total_steps)


class RewardResult(BaseModel):
    """One completion's reward and its parts."""

    reward: float
    r_traj: float = 0.0
    r_state: float = 0.0
    p_length: int = Field(default=0, description="max(0, predicted calls − ground-truth calls)")
    length_penalty: float = 0.0
    format_penalty: float = 0.0
    alpha: float = 0.5
    n_pred: int = 0
    n_gt: int = 0
    matched: int = 0
    n_unparseable: int = 0
    n_failed: int = Field(
        default=0,
        description="calls outside the task, and replayed calls that returned an error (writes; reads too "
        "with replay_reads)",
    )
    reasons: list[str] = Field(default_factory=list)


class RecordError(EnvFactoryError):
    """An RL record that cannot be scored against (bad JSON, unknown state shape): a data problem."""


# ---- values and arguments --------------------------------------------------------------------------


def same_value(a: Any, b: Any, *, case_sensitive: bool = False, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Argument equality: numbers with isclose (booleans are not numbers), strings stripped (and
    case-folded unless `case_sensitive`), lists in order, objects key by key (a missing key equals None)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, str) and isinstance(b, str):
        if case_sensitive:
            return a.strip() == b.strip()
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, dict) and isinstance(b, dict):
        return all(
            same_value(a.get(k), b.get(k), case_sensitive=case_sensitive, rel_tol=rel_tol, abs_tol=abs_tol)
            for k in a.keys() | b.keys()
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            same_value(x, y, case_sensitive=case_sensitive, rel_tol=rel_tol, abs_tol=abs_tol)
            for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)


def best_match(candidates: Sequence[Sequence[int]], successors: Sequence[int], beam: int = 512) -> int:
    """The largest number of one-to-one matches (prediction p → one of `candidates[p]`, ground-truth
    indices) such that no ground-truth pair i ≺ j (`successors[i]` has bit j) is matched in the
    opposite order. Exact unless more than `beam` matched-sets are alive at once."""
    states = {0}
    for cands in candidates:
        if not cands:
            continue
        grown = set(states)
        for m in states:
            for i in cands:
                bit = 1 << i
                if not m & bit and not m & successors[i]:
                    grown.add(m | bit)
        if len(grown) > beam:
            grown = set(sorted(grown, key=int.bit_count, reverse=True)[:beam])
        states = grown
    return max(m.bit_count() for m in states)


# ---- state masking ---------------------------------------------------------------------------------

Blank = tuple[str | None, tuple[str | None, ...]]  # (collection or None for a top-level field, path; None = any index)


def _collections(dump: Mapping[str, Any]) -> list[str]:
    """Top-level fields holding records keyed by id (as the verifier defines them)."""
    return [k for k, v in dump.items() if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values())]


def _find(value: Any, wanted: set[str], path: tuple[str | None, ...], out: set[tuple[str | None, ...]]) -> None:
    if isinstance(value, str):
        if value in wanted:
            out.add(path)
    elif isinstance(value, dict):
        for k, v in value.items():
            _find(v, wanted, (*path, str(k)), out)
    elif isinstance(value, list):
        for v in value:
            _find(v, wanted, (*path, None), out)


def masked_value_blanks(initial: Mapping[str, Any], goal: Mapping[str, Any], values: set[str]) -> list[Blank]:
    """Where the ground truth's masked argument values landed in the goal state: fields of records that
    the turn created or changed (as `collection.*.field`), and changed top-level fields."""
    found: set[Blank] = set()
    colls = set(_collections(goal))
    for key, value in goal.items():
        before = initial.get(key)
        if key in colls:
            known = before if isinstance(before, dict) else {}
            for rid, record in value.items():
                if known.get(rid) != record:
                    paths: set[tuple[str | None, ...]] = set()
                    _find(record, values, (), paths)
                    found.update((key, p) for p in paths)
        elif before != value:
            paths = set()
            _find(value, values, (key,), paths)
            found.update((None, p) for p in paths)
    return sorted(found, key=repr)


def _blank_at(value: Any, path: tuple[str | None, ...]) -> Any:
    if not path:
        return MASKED
    head, rest = path[0], path[1:]
    if head is None:
        return [_blank_at(v, rest) for v in value] if isinstance(value, list) else value
    if isinstance(value, dict) and head in value:
        out = dict(value)
        out[head] = _blank_at(value[head], rest)
        return out
    return value


def apply_blanks(dump: dict[str, Any], blanks: Sequence[Blank]) -> dict[str, Any]:
    """A copy of `dump` with the `blanks` set to `<masked>` (shared structure elsewhere: read-only use)."""
    if not blanks:
        return dump
    out = dict(dump)
    for coll, path in blanks:
        if coll is None:
            out = _blank_at(out, path)
        elif isinstance(out.get(coll), dict):
            out[coll] = {k: _blank_at(r, path) for k, r in out[coll].items()}
    return out


def _replace_ids(value: Any, ids: set[str]) -> Any:
    if isinstance(value, str):
        return MASKED if value in ids else value
    if isinstance(value, dict):
        return {(MASKED if k in ids else k): _replace_ids(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_ids(v, ids) for v in value]
    return value


def fast_canonical(
    initial: dict[str, Any], final: dict[str, Any], mask: MaskSpec, initial_json: Callable[[], bytes] | None = None
) -> dict[str, Any]:
    """Equal to the verifier's `canonical(initial, final, mask)`, without walking unchanged records.

    Records equal to their initial version are kept as they are — exact when no generated id occurs
    anywhere in the initial state as a string (checked on `initial_json()`, the initial state as
    `pydantic_core.to_json` writes it; a match, even a spurious one, falls back); otherwise, and for
    masks with `paths`, the verifier's own function runs."""
    if mask.paths or not mask.generated_ids:
        return canonical(initial, final, mask)
    colls = _collections(final)
    ids: set[str] = set()
    for coll in colls:
        before = initial.get(coll)
        known = before if isinstance(before, dict) else {}
        ids.update(k for k in final[coll] if k not in known)
    if not ids:
        return {k: v for k, v in final.items() if k != "counters"}
    text = initial_json() if initial_json is not None else to_json(initial)
    if any(to_json(i) in text for i in ids):
        return canonical(initial, final, mask)
    out: dict[str, Any] = {}
    is_coll = set(colls)
    for key, value in final.items():
        if key == "counters":
            continue
        if key not in is_coll:
            out[key] = _replace_ids(value, ids)
            continue
        before = initial.get(key)
        known = before if isinstance(before, dict) else {}
        kept: dict[str, Any] = {}
        created = []
        for rid, record in value.items():
            if rid in ids:
                created.append(_replace_ids(record, ids))
            elif known.get(rid) == record:
                kept[rid] = record
            else:
                kept[rid] = _replace_ids(record, ids)
        if created:
            kept["<new>"] = sorted(created, key=json.dumps)
        out[key] = kept
    return out


# ---- a record, parsed once ---------------------------------------------------------------------------


@dataclass
class Target:
    """A record parsed once: what every completion scored against it shares (and its replay memo)."""

    servers: list[str]  # known servers of the record, in mcp_servers order
    index: ToolIndex
    gt: list[ToolCall]
    gt_args: list[dict[str, Any] | None]  # normalized arguments
    succ: list[int]  # bitmask of the ground-truth calls that must come after call i
    initial: dict[str, dict[str, Any]]  # validated dumps, what episodes fork from
    blanks: dict[str, list[Blank]]
    init_canon: dict[str, dict[str, Any]]
    goal_dump: dict[str, dict[str, Any]]  # validated goal dumps (servers with a goal)
    goal_canon: dict[str, dict[str, Any]]
    goal_changed: dict[str, bool]
    goal_summary: dict[str, str]
    problems: list[str] = field(default_factory=list)
    _json: dict[str, bytes] = field(default_factory=dict)
    replays: dict[str, tuple[float | None, int, list[str]]] = field(default_factory=dict)

    def initial_json(self, server: str) -> Callable[[], bytes]:
        """The server's (blanked) initial state as JSON, made on first use: only needed once ids are created."""
        return _lazy_json(apply_blanks(self.initial[server], self.blanks[server]), self._json, server)


def _lazy_json(value: Any, cache: dict[str, bytes], key: str) -> Callable[[], bytes]:
    def get() -> bytes:
        if key not in cache:
            cache[key] = to_json(value)
        return cache[key]

    return get


def _load_json(value: Any, what: str) -> Any:
    if isinstance(value, str | bytes | bytearray):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:
            raise RecordError(f"{what} is not valid JSON: {str(e)[:120]}") from None
    return value


def _key(value: Any) -> Any:
    if value is None or isinstance(value, str | bytes):
        return value
    return to_json(value)


def _as_states(value: Any, what: str) -> dict[str, dict[str, Any]]:
    data = _load_json(value, what)
    if data is None:
        return {}
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for v in data.values()):
        raise RecordError(f"{what} must map each environment to its state dump")
    return {str(k): dict(v) for k, v in data.items()}


def _as_servers(value: Any) -> list[str] | None:
    data = _load_json(value, "mcp_servers")
    if data is None:
        return None
    if isinstance(data, str):
        return [data]
    if not isinstance(data, Sequence) or not all(isinstance(s, str) for s in data):
        raise RecordError("mcp_servers must be a list of environment names")
    return list(data)


def _as_calls(value: Any, index: ToolIndex) -> tuple[list[ToolCall], list[str]]:
    data = _load_json(value, "ground_truth")
    if data is None:
        raise RecordError("no ground truth")
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, Sequence) or isinstance(data, str):
        raise RecordError("ground_truth must be a list of tool calls")
    calls: list[ToolCall] = []
    problems: list[str] = []
    for i, raw in enumerate(data):
        item = raw.model_dump() if isinstance(raw, BaseModel) else raw
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise RecordError(f"ground_truth[{i}] is not a tool call with a name")
        args = _load_json(item.get("arguments") or {}, f"ground_truth[{i}].arguments")
        if not isinstance(args, dict) or json_problem(args) is not None:
            raise RecordError(f"ground_truth[{i}].arguments must be a JSON object")
        masked = item.get("masked_arguments") or []
        if not isinstance(masked, list) or not all(isinstance(m, str) for m in masked):
            raise RecordError(f"ground_truth[{i}].masked_arguments must be a list of names")
        server = item.get("server") if isinstance(item.get("server"), str) else None
        srv, name, note = index.resolve(item["name"], server)
        if note is not None:
            problems.append(f"ground truth {i}: {note}")
        cid = item.get("id") if isinstance(item.get("id"), str) else None
        calls.append(ToolCall(server=srv, name=name, arguments=args, masked_arguments=masked, id=cid))
    return calls, problems


def first_differences(a: Any, b: Any, prefix: str = "", limit: int = _PATH_SHOWN + 1) -> list[str]:
    """Up to `limit` dotted paths where `a` and `b` differ (equal subtrees are skipped at C speed)."""
    out: list[str] = []
    _differences(a, b, prefix, out, limit)
    return out


def _differences(a: Any, b: Any, prefix: str, out: list[str], limit: int) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            if len(out) >= limit:
                return
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in b:
                out.append(f"-{path}")
            elif k not in a:
                out.append(f"+{path}")
            elif a[k] != b[k]:
                _differences(a[k], b[k], path, out, limit)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if len(out) >= limit:
                return
            if x != y:
                _differences(x, y, f"{prefix}[{i}]", out, limit)
    elif len(out) < limit:
        out.append(prefix or "<root>")


def _index(envs: Mapping[str, BaseEnvironment]) -> ToolIndex:
    strings = {
        (name, t.name): [p for p, schema in t.parameters.items() if schema.get("type") == "string"]
        for name, env in envs.items()
        for t in env.metadata.tools
    }
    return ToolIndex({n: e.metadata.tool_names for n, e in envs.items()}, string_params=strings)


def _summary(paths: list[str]) -> str:
    shown = ", ".join(paths[:_PATH_SHOWN])
    return shown + (", …" if len(paths) > _PATH_SHOWN else "")


def _zero(reason: str, alpha: float, **counts: int) -> RewardResult:
    return RewardResult(reward=0.0, alpha=alpha, reasons=[reason], **counts)


# ---- the scorer ----------------------------------------------------------------------------------------


class CompositeReward:
    """Scores completions against RL records; keeps environments (an `EnvPool`) and parsed records cached."""

    def __init__(self, pool: EnvPool | None = None, settings: RewardSettings | None = None) -> None:
        self.pool = pool if pool is not None else EnvPool(get_settings())
        self.settings = settings or RewardSettings()
        self._targets: OrderedDict[tuple[Any, ...], Target | RecordError] = OrderedDict()

    # ---- environments and arguments ----------------------------------------------------------
    def _env(self, server: str) -> BaseEnvironment | None:
        try:
            return self.pool.get(server)
        except EnvFactoryError:
            return None

    def _kind(self, server: str, name: str) -> str:
        env = self._env(server) if server else None
        binding = env.binding(name) if env is not None else None
        return binding.kind if binding is not None else "write"

    def normalize(self, call: ToolCall, *, strict: bool) -> dict[str, Any] | None:
        """The call's arguments as the tool reads them (defaults filled, JSON-typed). A call the tool
        rejects gives None when `strict` (a prediction), else its raw arguments (a ground truth)."""
        env = self._env(call.server) if call.server else None
        binding = env.binding(call.name) if env is not None else None
        if binding is None:
            return None if strict else dict(call.arguments)
        try:
            parsed = to_jsonable_python(binding.parse_args(call.arguments))
        except Exception:  # ArgumentError, or anything a foreign binding raises
            return None if strict else dict(call.arguments)
        return parsed if isinstance(parsed, dict) else dict(call.arguments)

    # ---- records -----------------------------------------------------------------------------
    def target(self, ground_truth: Any, initial_config: Any, final_config: Any, mcp_servers: Any) -> Target:
        """The parsed record (cached). Raises RecordError for a record that cannot be scored against."""
        try:
            key: tuple[Any, ...] | None = tuple(
                _key(v) for v in (ground_truth, initial_config, final_config, mcp_servers)
            )
        except Exception:  # not serializable: do not cache
            key = None
        if key is not None and key in self._targets:
            self._targets.move_to_end(key)
            hit = self._targets[key]
            if isinstance(hit, RecordError):
                raise hit
            return hit
        try:
            built: Target | RecordError = self._build(ground_truth, initial_config, final_config, mcp_servers)
        except RecordError as e:
            log.warning("reward: unusable RL record: %s", e)
            built = e
        except Exception as e:  # anything else a malformed record triggers: a data problem too
            log.warning("reward: unusable RL record: %s: %s", type(e).__name__, e)
            built = RecordError(f"{type(e).__name__}: {e}")
        if key is not None and self.settings.cache_size:
            self._targets[key] = built
            while len(self._targets) > self.settings.cache_size:
                self._targets.popitem(last=False)
        if isinstance(built, RecordError):
            raise built
        return built

    def _build(self, ground_truth: Any, initial_config: Any, final_config: Any, mcp_servers: Any) -> Target:
        s = self.settings
        initial_raw = _as_states(initial_config, "initial_config")
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
        index = _index(envs)
        gt, gt_problems = _as_calls(ground_truth, index)
        problems += gt_problems
        if listed is None:  # servers only named by the ground truth's calls
            for c in gt:
                if c.server and c.server not in envs and (env := self._env(c.server)) is not None:
                    envs[c.server] = env
            index = _index(envs)
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
        goal_summary: dict[str, str] = {}
        texts: dict[str, bytes] = {}
        for name, env in envs.items():
            config = initial_raw.get(name)
            if config is None:
                default = env.default_scenario()
                config = env.scenario(default) if default else {}
            try:
                init_dump = env.dump_state(env.new_state(config, f"initial_config.{name}"))
            except EnvFactoryError as e:
                raise RecordError(f"initial_config.{name}: {e}") from None
            initial[name] = init_dump
            goal_raw = final_raw.get(name)
            if goal_raw is None:
                problems.append(f"{name}: no final state in final_config; not scored")
                blanks[name] = []
                init_canon[name] = fast_canonical(init_dump, init_dump, s.mask)
                continue
            try:
                goal_dump_ = env.dump_state(env.new_state(goal_raw, f"final_config.{name}"))
            except EnvFactoryError as e:
                raise RecordError(f"final_config.{name}: {e}") from None
            goal_dump[name] = goal_dump_
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
            init_canon[name] = fast_canonical(base, base, s.mask)
            goal_canon[name] = fast_canonical(
                base, apply_blanks(goal_dump_, blank), s.mask, _lazy_json(base, texts, name)
            )
            goal_changed[name] = goal_canon[name] != init_canon[name]
            if goal_changed[name]:
                goal_summary[name] = _summary(first_differences(init_canon[name], goal_canon[name]))
        return Target(
            servers=list(envs),
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
            goal_summary=goal_summary,
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
        parsed = parse_tool_calls(completion, t.index, max_calls=s.max_calls, max_chars=s.max_chars)
        n_bad = len(parsed.unparseable)
        if parsed.error is not None:
            return _zero(f"unparseable: {parsed.error}", alpha, n_gt=n_gt)
        if not parsed.calls and not parsed.dropped and n_bad:
            first = parsed.unparseable[0]
            return _zero(f"unparseable: {first.where}: {first.reason}", alpha, n_gt=n_gt, n_unparseable=n_bad)
        reasons = self._parse_reasons(parsed)
        calls = parsed.calls
        n_pred = parsed.n_calls

        matched = self._match(t, calls)
        r_traj = 1.0 if n_gt == 0 and n_pred == 0 else 2.0 * matched / (n_gt + n_pred)
        if matched < n_gt:
            reasons.append(f"trajectory: {matched} of {n_gt} ground-truth calls matched")
        if n_pred > matched:
            reasons.append(f"trajectory: {n_pred - matched} predicted calls match no ground-truth call")

        r_state_or_none, n_failed = self._state(t, calls, reasons)
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
        return RewardResult(
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

    @staticmethod
    def _parse_reasons(parsed: ParsedCompletion) -> list[str]:
        reasons = [f"unparseable: {b.where}: {b.reason}" for b in parsed.unparseable[:3]]
        if parsed.dropped:
            reasons.append(f"{parsed.dropped} calls beyond the first {len(parsed.calls)} were not run")
        reasons.extend(parsed.problems[:3])
        return reasons

    def _match(self, t: Target, calls: list[ToolCall]) -> int:
        if not t.gt or not calls:
            return 0
        s = self.settings
        candidates: list[list[int]] = []
        for c in calls:
            same_tool = [i for i, g in enumerate(t.gt) if g.name == c.name and g.server == c.server]
            if not same_tool:
                candidates.append([])
                continue
            args = self.normalize(c, strict=True)
            if args is None:
                candidates.append([])
                continue
            cands = []
            for i in same_tool:
                want, masked = t.gt_args[i], t.gt[i].masked_arguments
                if want is not None and all(
                    same_value(
                        want.get(k), args.get(k), case_sensitive=s.case_sensitive, rel_tol=s.rel_tol, abs_tol=s.abs_tol
                    )
                    for k in want.keys() | args.keys()
                    if k not in masked
                ):
                    cands.append(i)
            candidates.append(cands)
        return best_match(candidates, t.succ, s.max_match_states)

    def _state(self, t: Target, calls: list[ToolCall], reasons: list[str]) -> tuple[float | None, int]:
        """(R_state, failed calls), memoized per record: tools are deterministic, so the completions of a
        GRPO group that make the same calls share one replay."""
        if not self.settings.memoize_replays:
            return self._replay_state(t, calls, reasons)
        try:
            key = json.dumps([[c.server, c.name, c.arguments] for c in calls], allow_nan=True)
        except (TypeError, ValueError, RecursionError):
            return self._replay_state(t, calls, reasons)
        hit = t.replays.get(key)
        if hit is None:
            mine: list[str] = []
            hit = (*self._replay_state(t, calls, mine), mine)
            if len(t.replays) >= _MEMO_SIZE:
                t.replays.pop(next(iter(t.replays)))
            t.replays[key] = hit
        reasons.extend(hit[2])
        return hit[0], hit[1]

    def _replay_state(self, t: Target, calls: list[ToolCall], reasons: list[str]) -> tuple[float | None, int]:
        """(R_state, failed calls); R_state None when no server is relevant (read-only both ways).

        Read tools cannot change a state (sessions enforce it), so only writes — and calls to unknown
        tools, which fail — are replayed, unless `replay_reads`."""
        reads = self.settings.replay_reads
        replayed = [
            (k, c)
            for k, c in enumerate(calls)
            if c.server in t.initial and (reads or self._kind(c.server, c.name) != "read")
        ]
        servers = dict.fromkeys(c.server for _, c in replayed)
        episode = Episode(self.pool, {srv: t.initial[srv] for srv in servers}) if replayed else None
        wrote: set[str] = set()
        failed = 0
        for k, c in enumerate(calls):
            if c.server not in t.initial:
                failed += 1
                if failed <= 3:
                    reasons.append(f"call {k} {c.server or '?'}.{c.name}: no such environment in this task")
        for k, c in replayed:
            assert episode is not None
            rec = episode.call(c.server, c.name, c.arguments)
            if not rec.ok:
                failed += 1
                if failed <= 3 and rec.error is not None:
                    reasons.append(f"call {k} {c.qualified} failed: {rec.error.type}: {rec.error.message[:120]}")
            elif self._kind(c.server, c.name) == "write":
                wrote.add(c.server)

        equal = changed = 0
        considered = 0
        for srv in t.servers:
            goal = t.goal_canon.get(srv)
            if goal is None:
                continue
            dump = episode.sessions[srv].dump() if srv in wrote and episode is not None else None
            if dump is not None and dump == t.goal_dump[srv]:  # fast path: the very same state
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
                    reasons.append(f"state {srv}: unchanged; the task changes {t.goal_summary[srv]}")
            if self.settings.state_scope == "all" or t.goal_changed[srv] or moved:
                considered += 1
                equal += same
                changed += moved
        if not considered:
            return None, failed
        return equal / considered, failed


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


# ---- TRL -----------------------------------------------------------------------------------------------

_FIELDS = ("ground_truth", "initial_config", "final_config", "mcp_servers")


def record_columns(kwargs: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Per-sample record fields from TRL's dataset columns: flat `ground_truth`, `initial_config`,
    `final_config`, `mcp_servers`, or the reference's nesting (`reward_model.ground_truth`,
    `extra_info.mcp_factory_kwargs.*`, or a `mcp_factory_kwargs` column). Raises ValueError when the
    dataset lacks them (a configuration error, not model output)."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]

    def column(name: str) -> list[Any] | None:
        value = kwargs.get(name)
        if value is None:
            return None
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
            raise ValueError(f"reward column '{name}' must be a list with one value per completion ({n})")
        return list(value)

    for name in _FIELDS:
        col = column(name)
        if col is not None:
            for row, v in zip(rows, col, strict=True):
                row[name] = v
    nested = column("mcp_factory_kwargs")
    extra = column("extra_info")
    model = column("reward_model")
    for i, row in enumerate(rows):
        mfk = nested[i] if nested is not None else None
        if mfk is None and extra is not None and isinstance(extra[i], Mapping):
            mfk = extra[i].get("mcp_factory_kwargs")
        mfk = _load_json(mfk, "mcp_factory_kwargs") if mfk is not None else None
        if isinstance(mfk, Mapping):
            for name in _FIELDS[1:]:
                row.setdefault(name, mfk.get(name))
        if "ground_truth" not in row and model is not None and isinstance(model[i], Mapping):
            row["ground_truth"] = model[i].get("ground_truth")
    missing = [f for f in ("ground_truth", "final_config") if all(f not in r for r in rows)]
    if n and missing:
        raise ValueError(
            f"the dataset gives no {' or '.join(missing)}: pass columns {', '.join(_FIELDS)} "
            "or the RL record's reward_model / extra_info"
        )
    return rows


class ToolUseReward:
    """The composite reward as a TRL reward function: `reward(prompts, completions, **columns) -> list[float]`.

    `GRPOTrainer(reward_funcs=[ToolUseReward()], ...)`. Columns are read per sample (see
    `record_columns`); α follows `settings.alpha_schedule` from `trainer_state` when one is set. Model
    output never raises (0.0, the reason kept in `last_results`); components go to TRL's `log_metric`
    (`<name>/r_traj`, `/r_state`, `/length_penalty`, `/format_penalty`, `/unparseable`) and the first
    reasons to the completions table (`log_extra`). Picklable (caches are rebuilt after unpickling).
    """

    def __init__(
        self,
        pool: EnvPool | None = None,
        settings: RewardSettings | None = None,
        *,
        name: str = "tool_use_reward",
        log_reasons: bool = True,
    ) -> None:
        self.__name__ = name
        self.settings = settings or RewardSettings()
        self.log_reasons = log_reasons
        self._pool_settings: Settings = (pool.settings if pool is not None else get_settings()).model_copy()
        self._scorer: CompositeReward | None = CompositeReward(pool, self.settings) if pool is not None else None
        self.last_results: list[RewardResult] = []

    @property
    def scorer(self) -> CompositeReward:
        if self._scorer is None:
            self._scorer = CompositeReward(EnvPool(self._pool_settings), self.settings)
        return self._scorer

    def __getstate__(self) -> dict[str, Any]:
        return {
            "__name__": self.__name__,
            "settings": self.settings,
            "log_reasons": self.log_reasons,
            "_pool_settings": self._pool_settings,
            "_scorer": None,
            "last_results": [],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        n = len(completions)
        rows = record_columns(kwargs, n)
        trainer_state = kwargs.get("trainer_state")
        step = getattr(trainer_state, "global_step", None)
        total = getattr(trainer_state, "max_steps", None)
        scorer = self.scorer
        results = [
            scorer.score(
                completions[i],
                rows[i].get("ground_truth"),
                rows[i].get("initial_config"),
                rows[i].get("final_config"),
                rows[i].get("mcp_servers"),
                step=step if isinstance(step, int) else None,
                total_steps=total if isinstance(total, int) else None,
            )
            for i in range(n)
        ]
        self.last_results = results
        self._log(results, kwargs)
        return [r.reward for r in results]

    def _log(self, results: list[RewardResult], kwargs: Mapping[str, Any]) -> None:
        if not results:
            return
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        n = len(results)
        try:
            if callable(log_metric):
                log_metric(f"{self.__name__}/r_traj", sum(r.r_traj for r in results) / n)
                log_metric(f"{self.__name__}/r_state", sum(r.r_state for r in results) / n)
                log_metric(f"{self.__name__}/length_penalty", sum(r.length_penalty for r in results) / n)
                log_metric(f"{self.__name__}/format_penalty", sum(r.format_penalty for r in results) / n)
                log_metric(f"{self.__name__}/unparseable", sum(r.n_unparseable > 0 for r in results) / n)
                log_metric(f"{self.__name__}/alpha", results[0].alpha)
            if callable(log_extra) and self.log_reasons:
                log_extra(f"{self.__name__}_why", ["; ".join(r.reasons[:3]) for r in results])
        except Exception:  # logging must never cost a training step
            log.debug("reward: TRL logging failed", exc_info=True)
