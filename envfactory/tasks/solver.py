"""The privileged solver π* (SynthAPI): execute a sampled chain, binding every argument with full knowledge.

For each tool of the chain, in order, each input gets its value from (first that applies):

1. **an earlier output** — the sampler says which earlier tool provides an internal input (a
   `hotel_id` from `search_hotels`); the value is read from that call's result (from a list, the
   element that is a core record of the initial state, else the first);
2. **the user's earlier words** — a user-provided input with the same name as one already bound in
   the chain keeps its value (the same guest books and then lists bookings);
3. **the state** — user-provided inputs are read from one *target record*: the core record (from
   the initial-state generator's core batch) of the collection whose fields cover most of the
   tool's inputs, so `origin`, `destination` and `date` of a flight search come from one flight;
   `x_id` inputs read the id of a record of collection `xs`;
4. **made up** — from the schema and the name (`ValueMaker`): a new guest's name, a future date.

Optional inputs are bound only from an earlier output or the state (never made up: a random
`max_price` would filter the target away), with probability `optional_p`.

A call that fails is retried (`attempts_per_call`), each attempt loosening one more choice (see
`_ATTEMPTS`): made-up values instead of state values for the inputs of a write (a new scene must not
copy an existing scene's name), every optional input the state can fill (a search that wants "a
query, a category, or both"), another element of an earlier list result (the first order may be
cancelled), another target record. Bounds a tool states in its error ("must be between 15 and
480") are used from then on. A chain whose call still fails is unsolvable: the task is dropped.
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from envfactory.env.pool import EnvPool
from envfactory.env.state import DEFAULT_CLOCK
from envfactory.tasks.episode import Episode, result_of
from envfactory.tasks.models import Binding, PlannedCall, States, ToolCall, ToolResult
from envfactory.tasks.values import ValueMaker, fits, is_free_text, learned_bounds
from envfactory.toolgraph.sampler import InputSource, ToolChain

CoreIds = dict[str, dict[str, list[str]]]  # environment → collection → ids of core records


class _Attempt(BaseModel):
    fresh_values: bool = False  # write tools: made-up values instead of state values (ids excepted)
    all_optional: bool = False  # bind every optional input the state can fill
    element: int = 0  # which element of an earlier list result (after the core-record preference)
    new_target: bool = False  # another target record than the chain's


_ATTEMPTS = [
    _Attempt(),
    _Attempt(fresh_values=True, all_optional=True),
    _Attempt(fresh_values=True, element=1, new_target=True),
    _Attempt(fresh_values=True, all_optional=True, element=2, new_target=True),
    _Attempt(fresh_values=True, element=3, new_target=True),
]


class SolverSettings(BaseModel):
    attempts_per_call: int = Field(default=len(_ATTEMPTS), ge=1)
    optional_p: float = Field(default=0.3, ge=0, le=1, description="chance to bind an optional input from the state")


class SolveOutcome(BaseModel):
    """π* executed: the planned calls, their results, the states after each turn; or why it failed."""

    ok: bool
    planned: list[PlannedCall] = Field(default_factory=list)
    results: list[ToolResult] = Field(default_factory=list)
    initial: States
    final: States = Field(default_factory=dict)
    turn_final: list[States] = Field(default_factory=list)
    failure: str | None = None


def singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") else word


def _records(dump: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        k: v
        for k, v in dump.items()
        if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values()) and k != "counters"
    }


def _walk(value: Any, path: str = "") -> list[tuple[str, str, Any]]:
    """(path, key, value) of every keyed value in a result, shallowest first."""
    out: list[tuple[str, str, Any]] = []
    queue: list[tuple[Any, str]] = [(value, path)]
    while queue:
        node, where = queue.pop(0)
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{where}.{k}" if where else str(k)
                out.append((p, str(k), v))
                if isinstance(v, dict | list):
                    queue.append((v, p))
        elif isinstance(node, list):
            queue.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
    return out


class _Solver:
    def __init__(self, pool: EnvPool, chain: ToolChain, initial: States, core: CoreIds, seed: int, s: SolverSettings):
        self.pool, self.chain, self.initial, self.core, self.settings = pool, chain, initial, core, s
        self.rng = random.Random(seed)
        clock = next((d.get("clock") for d in initial.values() if isinstance(d.get("clock"), str)), None)
        self.values = ValueMaker(self.rng, datetime.fromisoformat(clock) if clock else DEFAULT_CLOCK, self._some_id)
        self.episode = Episode(pool, initial, chain.servers)
        self.spoken: dict[str, tuple[Any, int]] = {}  # user-provided values already said: name → (value, call)
        self.targets: dict[tuple[str, str], str] = {}  # (env, collection) → record id the chain is about
        self.results: list[ToolResult] = []
        self.learned: dict[tuple[str, str], tuple[float, float]] = {}  # (tool, parameter) → bounds it stated
        self.core_all = {i for env in core.values() for ids in env.values() for i in ids}

    # ---- values from earlier outputs ------------------------------------------------------------------

    def _pick_element(self, items: list[Any], shift: int) -> int:
        """Core records first, then the rest in order; `shift` moves along that order on retries."""
        order = sorted(
            range(len(items)), key=lambda i: not (isinstance(items[i], dict) and items[i].get("id") in self.core_all)
        )
        return order[shift % len(order)]

    def _from_output(self, src: InputSource, schema: dict[str, Any], shift: int) -> tuple[Any, str] | None:
        if src.index is None or src.index >= len(self.results) or not self.results[src.index].ok:
            return None
        result = self.results[src.index].result
        prefix = ""
        if isinstance(result, list) and result:
            i = self._pick_element(result, shift)
            result, prefix = result[i], f"[{i}]"
        output = src.output or ""
        wanted = [src.parameter, output]
        # the graph names a returned record's own `id` after the record (`booking_id` of book_room); take
        # it for an input of that name only, not for an `agent_id` some similarity edge related to it
        if output.endswith("_id") and src.parameter.endswith("_id") and output[:-3] in src.parameter:
            wanted.append("id")
        for name in wanted:
            for path, key, value in _walk(result):
                if key == name and fits(value, schema):
                    return value, f"{prefix}.{path}" if prefix else path
        if not isinstance(result, dict | list) and fits(result, schema):
            return result, prefix or "."
        return None

    # ---- values from the state ------------------------------------------------------------------------

    def _some_id(self, noun: str) -> str | None:
        """An id of a record of collection `<noun>s` in any environment of the chain (core records first)."""
        for env, session in self.episode.sessions.items():
            for coll, records in _records(session.dump()).items():
                if singular(coll) == noun:
                    core = [i for i in self.core.get(env, {}).get(coll, []) if i in records]
                    return self.rng.choice(sorted(core or records))
        return None

    def _target(self, env: str, names: list[str], new: bool) -> tuple[str, dict[str, Any]] | None:
        """The collection covering most of `names` (fields, or `x_id` of collection `xs`) and its target record."""
        colls = _records(self.episode.sessions[env].dump())
        best, best_score = None, 0
        for coll, records in colls.items():
            fields = set(next(iter(records.values())))
            score = sum(n in fields or (n.endswith("_id") and singular(coll) == n[:-3]) for n in names)
            if score > best_score:
                best, best_score = coll, score
        if best is None:
            return None
        records = colls[best]
        chosen = self.targets.get((env, best))
        if chosen not in records or new:
            core = [i for i in self.core.get(env, {}).get(best, []) if i in records]
            pool = core if core and not new else list(records)
            chosen = self.rng.choice(sorted(pool))
            self.targets[(env, best)] = chosen
        return best, {"id": chosen, **records[chosen]}

    def _returned(self, env: str, output: dict[str, Any] | None) -> str | None:
        """The collection whose records have exactly the fields of the tool's output, if any."""
        keys = set((output or {}).get("properties") or {})
        if not keys:
            return None
        for coll, records in _records(self.episode.sessions[env].dump()).items():
            if set(next(iter(records.values()))) == keys:
                return coll
        return None

    # ---- one call -------------------------------------------------------------------------------------

    def _bind(self, index: int, attempt: int) -> tuple[ToolCall, list[Binding]]:
        how = _ATTEMPTS[min(attempt, len(_ATTEMPTS) - 1)]
        qualified = self.chain.tools[index]
        env, name = qualified.split(".", 1)
        spec = self.pool.get(env).metadata.tool(name)
        fresh = how.fresh_values and spec.kind == "write"
        self.values.defs = spec.input_schema.get("$defs", {})
        sources = {s.parameter: s for s in self.chain.steps[index].inputs}
        required = set(spec.required)
        args: dict[str, Any] = {}
        bindings: list[Binding] = []
        masked: list[str] = []
        user_params: list[str] = []
        for pname, pschema in spec.parameters.items():
            src = sources.get(pname)
            if src is not None and src.source == "tool":
                got = self._from_output(src, pschema, how.element)
                if got is not None:
                    args[pname] = got[0]
                    bindings.append(
                        Binding(parameter=pname, source="output", value=got[0], path=got[1], call=src.index)
                    )
                    continue
            if pname in required or how.all_optional or self.rng.random() < self.settings.optional_p:
                user_params.append(pname)
        target = self._target(env, user_params, how.new_target) if user_params else None
        # a write returning a record of collection C creates or changes a C: its values are new, not
        # copied from an existing C (a second booking just like Maria's, a no-op update)
        returned = self._returned(env, spec.output_schema) if spec.kind == "write" else None
        for pname in user_params:
            pschema = spec.parameters[pname]
            said = self.spoken.get(pname)
            if said is not None and attempt == 0 and fits(said[0], pschema):
                args[pname] = said[0]
                bindings.append(Binding(parameter=pname, source="repeated", value=said[0], call=said[1]))
                continue
            if target is not None and not ((fresh or target[0] == returned) and not pname.endswith("_id")):
                coll, record = target
                field = pname if pname in record else ("id" if pname == f"{singular(coll)}_id" else None)
                if field is not None and fits(record[field], pschema):
                    args[pname] = record[field]
                    path = f"{coll}.{record['id']}.{field}"
                    bindings.append(Binding(parameter=pname, source="state", value=args[pname], path=path))
                    continue
            if pname not in required and not (fresh and how.all_optional):
                continue  # optional and nothing in the state: leave it out
            args[pname] = self.values.make(pname, pschema, self.learned.get((qualified, pname)))
            bindings.append(Binding(parameter=pname, source="generated", value=args[pname]))
            if is_free_text(pname):
                masked.append(pname)
        call = ToolCall(server=env, name=name, arguments=args, masked_arguments=masked, id=f"call_{index}")
        return call, bindings

    def run(self) -> SolveOutcome:
        planned: list[PlannedCall] = []
        turn_ends = {end - 1 for _, end in turn_spans(self.chain)}
        turn_final: list[States] = []
        for index, qualified in enumerate(self.chain.tools):
            env, name = qualified.split(".", 1)
            kind = self.pool.get(env).metadata.tool(name).kind
            error = "not run"
            for attempt in range(self.settings.attempts_per_call):
                call, bindings = self._bind(index, attempt)
                rec = self.episode.call(env, name, call.arguments)
                if rec.ok:
                    break
                error = f"{rec.error.type}: {rec.error.message}" if rec.error else "failed"
                for param, bounds in learned_bounds(error).items():
                    self.learned[(qualified, param)] = bounds
            else:
                return SolveOutcome(
                    ok=False,
                    planned=planned,
                    results=self.results,
                    initial=self.initial,
                    failure=f"unsolvable: call {index + 1} ({qualified}) failed {self.settings.attempts_per_call} "
                    f"times; last: {error}",
                )
            for b in bindings:
                if b.source in ("state", "generated"):
                    self.spoken.setdefault(b.parameter, (b.value, index))
            self.results.append(result_of(call, rec))
            planned.append(PlannedCall(call=call, bindings=bindings, kind=kind))
            if index in turn_ends:
                turn_final.append(self.episode.dumps())
        return SolveOutcome(
            ok=True,
            planned=planned,
            results=self.results,
            initial=self.initial,
            final=self.episode.dumps(),
            turn_final=turn_final,
        )


def turn_spans(chain: ToolChain) -> list[tuple[int, int]]:
    """[start, end) of each turn's calls in the chain."""
    spans, start = [], 0
    for turn in chain.turns:
        spans.append((start, start + len(turn)))
        start += len(turn)
    return spans


def solve_chain(
    pool: EnvPool,
    chain: ToolChain,
    initial: States,
    core: CoreIds | None = None,
    *,
    seed: int = 0,
    settings: SolverSettings | None = None,
) -> SolveOutcome:
    """Execute `chain` from `initial` (one dump per environment) with π*; never raises for a failing call."""
    return _Solver(pool, chain, initial, core or {}, seed, settings or SolverSettings()).run()
