"""An RL record parsed once (`Target`): its fields read from JSON strings or parsed objects, the ground
truth's calls resolved against the record's environments, and the paths where two states differ."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_core import from_json, to_json

from envfactory.env.environment import BaseEnvironment
from envfactory.env.state import State
from envfactory.records.models import ToolCall
from envfactory.reward.settings import RecordError
from envfactory.reward.state_masking import Blank, apply_blanks
from envfactory.reward.state_term import CallKey, CallsOutcome, Delta, LiveReplay, Replayed
from envfactory.reward.tool_calls import BlockMemo, ToolIndex, json_problem

_PATH_SHOWN = 3


@dataclass
class Target:
    """A record parsed once: what every completion scored against it shares (and its replay memo)."""

    servers: list[str]  # known servers of the record, in mcp_servers order
    envs: dict[str, BaseEnvironment]
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
    goal_delta: dict[str, Delta]  # native servers with a goal: where the goal dump differs from the initial one
    forks: dict[str, bytes]  # native servers: the initial dump as JSON, what their sessions fork from
    templates: dict[str, State]  # plain-data native servers: the validated initial state, forked sharing records
    problems: list[str] = field(default_factory=list)
    _json: dict[str, bytes] = field(default_factory=dict)
    kinds: dict[tuple[str, str], str] = field(default_factory=dict)  # (server, tool) -> read / write
    candidates: dict[CallKey, tuple[int, ...]] = field(default_factory=dict)  # a predicted call's gt matches
    exact: dict[CallKey, tuple[int, ...]] = field(default_factory=dict)  # of those, the ones it repeats exactly
    refused_reads: dict[tuple[Any, ...], bool] = field(default_factory=dict)  # by the read and the writes before it
    replays: dict[tuple[CallKey, ...], Replayed] = field(default_factory=dict)  # by the replayed calls
    blocks: BlockMemo = field(default_factory=dict)  # `<tool_call>` blocks read cleanly, by their text
    outcomes: dict[tuple[CallKey, ...], CallsOutcome] = field(default_factory=dict)  # by all the calls, in order
    live: LiveReplay | None = None  # the last replay's native sessions, rolled back by the next one
    lock: threading.Lock = field(default_factory=threading.Lock)  # who uses `live`
    _summaries: dict[str, str] = field(default_factory=dict)

    def goal_summary(self, server: str) -> str:
        """Where the turn changes `server`'s state (the first paths), for a reason; made once per server."""
        summary = self._summaries.get(server)
        if summary is None:
            summary = self._summaries[server] = _summary(
                first_differences(self.init_canon[server], self.goal_canon[server])
            )
        return summary

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
    """A record field's JSON text read (anything else as it is). pydantic-core's parser first (about twice as
    fast on a state's JSON, the same values); what it refuses goes to `json.loads`, whose reading (a lone
    surrogate, 1e400 as inf) and whose error message decide."""
    if isinstance(value, str | bytes | bytearray):
        try:
            return from_json(value)
        except ValueError:
            pass
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
