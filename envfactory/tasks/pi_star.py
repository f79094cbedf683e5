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
import re
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from envfactory.env.compiled import CompiledEnvironment, CompiledTool
from envfactory.env.diff import StateDiff
from envfactory.env.environment import BaseEnvironment
from envfactory.env.pool import EnvPool
from envfactory.env.session import CallRecord
from envfactory.env.state import DEFAULT_CLOCK, ChangeEntry, State
from envfactory.env.state_fields import touched_dump
from envfactory.env.state_template import StateTemplates
from envfactory.records.episode import Episode, result_of
from envfactory.records.models import Binding, PlannedCall, States, ToolCall, ToolResult
from envfactory.tasks.compiled_refs import (
    ancestors,
    consistent,
    id_arguments,
    id_key,
    links,
    list_tools,
    nesting,
    operation,
)
from envfactory.tasks.values import ValueMaker, fits, learned_bounds
from envfactory.toolgraph.sampler import InputSource, ToolChain
from envfactory.words import is_free_text, singular

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


class PiStarSettings(BaseModel):
    attempts_per_call: int = Field(default=len(_ATTEMPTS), ge=1)
    target_plans: int = Field(default=6, ge=1, description="choices of the records a chain is about, tried in turn")
    ids_from_state: bool = Field(
        default=False, description="bind ids no earlier result gave from the state (health's reachability check)"
    )
    optional_p: float = Field(default=0.3, ge=0, le=1, description="chance to bind an optional input from the state")


class PiStarOutcome(BaseModel):
    """π* executed: the planned calls, their results, the states after each turn; or why it failed."""

    ok: bool
    code: Literal["unsolvable", "incoherent"] | None = None  # why it failed
    planned: list[PlannedCall] = Field(default_factory=list)
    results: list[ToolResult] = Field(default_factory=list)
    initial: States
    final: States = Field(default_factory=dict)
    turn_final: list[States] = Field(default_factory=list)
    spans: list[tuple[int, int]] = Field(default_factory=list)  # [start, end) of each turn among `planned`
    failure: str | None = None


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


Records = dict[str, dict[str, dict[str, Any]]]  # collection → record id → record


@dataclass(frozen=True)
class _CallBinding:
    """The working state of binding one call, handed to the helpers that read it (never kept on the solver):
    the tool's parameter descriptions (lower case), the collection it returns records of, its arguments → the
    record fields they carry, and the sessions' records by environment, each read once while the call is bound
    (nothing runs meanwhile, and binding reads them dozens of times)."""

    views: dict[str, Records]
    descriptions: dict[str, str]
    returns: str | None
    fields: dict[str, str]


class _Choosing(NamedTuple):
    """An environment's initial records, the references between the collections a chain needs, the order they are
    chosen in (`_PiStar._chosen_from`). Read-only."""

    colls: Records
    refs: dict[str, dict[str, str]]
    order: list[str]


class _PiStar:
    def __init__(
        self,
        pool: EnvPool,
        chain: ToolChain,
        initial: States,
        core: CoreIds,
        seed: int,
        s: PiStarSettings,
        any_record: bool = False,
        templates: StateTemplates | None = None,
        chosen_from: dict[str, _Choosing] | None = None,
    ):
        self.any_record = any_record  # targets from every record, not only the core batch
        # per environment, the initial records and the collections the chain is about (`_chosen_from`): the same for
        # every choice of target records, so `solve_chain` works them out once for all of them
        self.chosen_from = chosen_from if chosen_from is not None else {}
        self.pool, self.chain, self.initial, self.core, self.settings = pool, chain, initial, core, s
        self.rng = random.Random(seed)
        clock = next((d.get("clock") for d in initial.values() if isinstance(d.get("clock"), str)), None)
        self.values = ValueMaker(self.rng, datetime.fromisoformat(clock) if clock else DEFAULT_CLOCK, self._some_id)
        self.episode = Episode(pool, initial, chain.servers, templates)
        # each native session's dump as it started: later reads dump only what its calls touched (`_dump`)
        forked = self.episode.forked
        self.started = {
            name: (session, forked[name].dump if name in forked else session.dump())
            for name, session in self.episode.sessions.items()
        }
        self._walks: dict[int, tuple[Any, list[tuple[str, str, Any]]]] = {}  # results walked (`_walked`)
        self._field_sets: dict[int, tuple[dict[str, Any], set[str]]] = {}  # collections' fields (`_fields`)
        # the last dump of each native session and its records, with where its change log stood (`_dump`)
        self._dumped: dict[str, tuple[Any, int, ChangeEntry | None, dict[str, Any], Records]] = {}
        self.spoken: dict[str, tuple[Any, int]] = {}  # user-provided values already said: name → (value, call)
        self.targets: dict[tuple[str, str], str] = {}  # (env, collection) → record id the chain is about
        self.results: list[ToolResult] = []
        self.force: dict[str, list[str]] = {}  # tool → inputs one of which it says it needs
        self.planned: list[PlannedCall] = []
        self.turn_of: list[int] = []  # the turn of every executed call (inserted lookups join their consumer's)
        self.at: list[int] = []  # chain position → position among the executed calls
        self.learned: dict[tuple[str, str], tuple[float, float]] = {}  # (tool, parameter) → bounds it stated
        self.core_all = {i for env in core.values() for ids in env.values() for i in ids}
        self._plan_targets()

    # ---- the records the conversation is about, chosen together --------------------------------------

    def _chosen_from(self, env: str) -> _Choosing:
        """What `_plan_targets` chooses `env`'s target records from, worked out once for every choice: the initial
        records, the references between the collections the chain needs (`_relevant`) and the order they are
        chosen in (a compiled plan's most deeply filed first, then those referencing the most)."""
        found = self.chosen_from.get(env)
        if found is not None:
            return found
        colls = _records(self.initial.get(env, {}))
        relevant = self._relevant(env, colls)
        environment = self.pool.get(env)
        deep: dict[str, int] = {}
        if isinstance(environment, CompiledEnvironment):  # the plan's links
            refs = {
                coll: {f: o for f, o in links(environment, coll).items() if o in relevant - {coll}} for coll in relevant
            }
            deep = {coll: nesting(environment, coll) for coll in relevant}
        else:
            refs = {coll: _references(colls, coll, relevant) for coll in relevant}
        order = sorted(relevant, key=lambda c: (-deep.get(c, 0), -len(refs[c]), c))
        found = self.chosen_from[env] = _Choosing(colls, refs, order)
        return found

    def _relevant(self, env: str, colls: Records) -> set[str]:
        """Collections of `env` whose existing records the chain needs: named by an id input (`hotel_id`
        → hotels) that no earlier *write* of the chain provides (a booking the chain makes itself is
        no record to choose)."""
        environment = self.pool.get(env)
        out: set[str] = set()
        for index, qualified in enumerate(self.chain.tools):
            tenv, name = qualified.split(".", 1)
            if tenv != env:
                continue
            sources = {src.parameter: src for src in self.chain.steps[index].inputs}
            named = id_arguments(environment, name)
            for pname in environment.metadata.tool(name).parameters:
                if isinstance(environment, CompiledEnvironment):  # the plan says which resource: and where it is filed
                    coll = named.get(pname)
                    if coll is not None:
                        out.update(a for a in ancestors(environment, coll) if a in colls)
                else:
                    coll = collection_for(colls, pname) if pname.endswith(("_id", "_ids")) else None
                if coll is None or coll not in colls:
                    continue
                src = sources.get(pname)
                if src is not None and src.source == "tool" and src.index is not None:
                    penv, ptool = self.chain.tools[src.index].split(".", 1)
                    if self.pool.get(penv).metadata.tool(ptool).kind == "write":
                        continue
                out.add(coll)
        return out

    def _plan_targets(self) -> None:
        """One target record per collection the chain is about, agreeing with each other: the records
        that reference others are chosen first, and what they reference becomes the target there (the
        card's account is the account listed, so listing its cards finds the card). Chosen from the
        chain's end backwards in effect: every lookup then finds the record the next step needs."""
        self.targets = {}
        for env in self.chain.servers:
            colls, refs, order = self._chosen_from(env)

            def refers(record: dict[str, Any], path: str, target: str | None) -> bool:
                return target is None or target in _ref_ids(record, path)

            for coll in order:
                named = refs[coll]
                if (env, coll) not in self.targets:
                    core = [i for i in self.core.get(env, {}).get(coll, []) if i in colls[coll]]
                    candidates = sorted(colls[coll] if self.any_record or not core else core)
                    agreeing = [
                        i
                        for i in candidates
                        if all(refers(colls[coll][i], f, self.targets.get((env, o))) for f, o in named.items())
                    ]
                    choices = agreeing or candidates
                    live = [i for i in choices if _live(colls[coll][i])]  # not a cancelled booking
                    self.targets[(env, coll)] = self.rng.choice(live or choices)
                record = colls[coll][self.targets[(env, coll)]]
                for path, other in named.items():
                    ids = [v for v in _ref_ids(record, path) if v in colls[other]]
                    if (env, other) not in self.targets and ids:
                        # the card's account; one of a reading list's papers; the product of one of an order's lines
                        self.targets[(env, other)] = ids[0] if len(ids) == 1 else self.rng.choice(sorted(ids))

    # ---- values from earlier outputs ------------------------------------------------------------------

    def _fields(self, records: dict[str, dict[str, Any]]) -> set[str]:
        """`_fields_of(records)` of a collection of a session's records view, worked out once per collection
        dict: a view is kept until the session's state moves, and shares the collections no call touched with
        the views before it (read-only)."""
        kept = self._field_sets.get(id(records))
        if kept is None or kept[0] is not records:
            kept = self._field_sets[id(records)] = (records, _fields_of(records))
        return kept[1]

    def _walked(self, result: Any) -> list[tuple[str, str, Any]]:
        """`_walk(result)` of an earlier call's result (or an element of it), walked once: every call bound
        after it reads it again, and results are not changed once made."""
        kept = self._walks.get(id(result))
        if kept is None or kept[0] is not result:
            kept = self._walks[id(result)] = (result, _walk(result))
        return kept[1]

    def _pick_element(self, items: list[Any], shift: int) -> int:
        """The chain's target records first, then core records, then the rest in order; `shift` moves
        along that order on retries."""
        targets = set(self.targets.values())

        def rank(i: int) -> int:
            rid = items[i].get("id") if isinstance(items[i], dict) else None
            return 0 if rid in targets else 1 if rid in self.core_all else 2

        order = sorted(range(len(items)), key=rank)
        return order[shift % len(order)]

    def _from_output(
        self, src: InputSource, schema: dict[str, Any], shift: int, bound: _CallBinding
    ) -> tuple[Any, str] | None:
        # the chain's step `src.index` ran as call `self.at[src.index]` (lookups inserted before it shift it)
        if src.index is None or src.index >= len(self.at) or not self.results[self.at[src.index]].ok:
            return None
        result = self.results[self.at[src.index]].result
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
            for path, key, value in self._walked(result):
                if key == name and fits(value, schema) and self._id_fits(src.parameter, value, bound):
                    return value, f"{prefix}.{path}" if prefix else path
        if not isinstance(result, dict | list) and fits(result, schema):
            return result, prefix or "."
        return None

    def _id_fits(self, pname: str, value: Any, bound: _CallBinding) -> bool:
        """An id goes only to an input of its own kind: a ticket's id is no `assignee_id` (a similarity
        edge of the tool graph may say so). The kind is the collection holding the value; it fits an
        input named after it, or one whose description names it ("assigned to this agent")."""
        if not pname.endswith("_id"):
            return True
        sessions, views = self.episode.sessions, bound.views
        owner = next((c for e in sessions for c, r in self._records_of(e, views).items() if value in r), None)
        if owner is None:
            return True
        noun = singular(owner)
        if pname[:-3] == noun or pname[:-3].endswith(noun) or noun.endswith("_" + pname[:-3]):
            return True
        colls = {c for e in self.episode.sessions for c in self._records_of(e, bound.views)}
        if collection_for(colls, pname) is not None:  # the input names another collection: not this one
            return False
        # an input named otherwise (`assignee_id`) takes a record its description names, unless that is
        # what the tool itself returns (a ticket filter is no place for a ticket's own id)
        return owner != bound.returns and noun.replace("_", " ") in bound.descriptions.get(pname, "")

    def _record_from_earlier(
        self,
        env: str,
        tool: str,
        pname: str,
        coll: str,
        args: dict[str, Any],
        shift: int,
        prefer: int | None,
        views: dict[str, Records],
    ) -> tuple[Any, str, int] | None:
        """A compiled tool's id argument from an earlier result: the id of a record of its resource `coll`
        that exists now and sits where the call's other arguments say (`compiled_refs.consistent`), read
        from a record of that resource, from a field that links to it (a branch's `app_id`), or from a
        field of the argument's name; the chain's target first, then the call the sampler named
        (`prefer`), then the most recent; `shift` moves along that order on retries."""
        environment = self.pool.get(env)
        assert isinstance(environment, CompiledEnvironment)
        state = self._records_of(env, views)
        members = state.get(coll, {})
        linking = {f for r in environment.plan.resources for f, o in links(environment, r.name).items() if o == coll}
        id_field = environment.resources[coll].id_field
        wanted = self.targets.get((env, coll))
        found: list[tuple[Any, str, int]] = []
        for index in range(len(self.results) - 1, -1, -1):
            result = self.results[index]
            if not result.ok or result.server != env:
                continue
            producer = operation(environment, result.name)
            own = producer is not None and producer.resource == coll
            for path, field, value in self._walked(result.result):
                if field not in linking and field != pname and not (own and field == id_field):
                    continue
                if isinstance(value, bool) or not isinstance(value, str | int) or id_key(value) not in members:
                    continue
                if any(f[0] == value for f in found):
                    continue
                if consistent(environment, tool, {**args, pname: value}, state):
                    found.append((value, path, index))
        if not found:
            return None
        found.sort(key=lambda f: (id_key(f[0]) != wanted, f[2] != prefer))  # stable: then the most recent
        return found[shift % len(found)]

    def _from_earlier(
        self, env: str, pname: str, schema: dict[str, Any], shift: int, bound: _CallBinding
    ) -> tuple[Any, str, int] | None:
        """An id for `pname` from any earlier result of the conversation (the chain's target first, then
        the most recent): the booking made two turns ago, the account listed before, one of a paper's
        `author_ids`; `shift` moves along that order on retries."""
        colls = self._records_of(env, bound.views) if env in self.episode.sessions else {}
        coll = collection_for(colls, pname)
        members = set(colls.get(coll or "", {}))
        wanted = self.targets.get((env, coll or ""))
        found: list[tuple[Any, str, int]] = []
        for index in range(len(self.results) - 1, -1, -1):
            result = self.results[index]
            if not result.ok or result.server != env:
                continue
            for path, key, value in self._walked(result.result):
                values = value if key == pname + "s" and isinstance(value, list) else [value]
                for i, item in enumerate(values):
                    is_record_id = key == "id" and item in members
                    named = key == pname or (key == pname + "s" and isinstance(value, list))
                    if (named or is_record_id) and fits(item, schema) and self._id_fits(pname, item, bound):
                        where = f"{path}[{i}]" if values is value else path
                        if all(f[0] != item for f in found):
                            found.append((item, where, index))
        if not found:
            return None
        found.sort(key=lambda f: f[0] != wanted)  # stable: the target, then the most recent
        return found[shift % len(found)]

    # ---- values from the state ------------------------------------------------------------------------

    def _some_id(self, noun: str, views: dict[str, Records] | None = None) -> str | None:
        """An id of a record of collection `<noun>s` in any environment of the chain (core records first)."""
        for env in self.episode.sessions:
            for coll, records in self._records_of(env, views).items():
                if singular(coll) == noun:
                    core = [i for i in self.core.get(env, {}).get(coll, []) if i in records]
                    return self.rng.choice(sorted(core or records))
        return None

    def _target(self, env: str, names: list[str], new: bool, bound: _CallBinding) -> tuple[str, dict[str, Any]] | None:
        """The collection covering most of `names` (fields, or `x_id` of collection `xs`) and its target record."""
        colls = self._records_of(env, bound.views)
        names = [bound.fields.get(n, n) for n in names]
        best, best_score = None, 0
        for coll, records in colls.items():
            fields = self._fields(records)
            score = sum(n in fields or (n.endswith("_id") and singular(coll) == n[:-3]) for n in names)
            if score > best_score:
                best, best_score = coll, score
        if best is None:
            return None
        records = colls[best]
        chosen = self.targets.get((env, best))
        if chosen not in records:
            core = [i for i in self.core.get(env, {}).get(best, []) if i in records]
            pool = core if core and not new else list(records)
            chosen = self.rng.choice(sorted(pool))
            self.targets[(env, best)] = chosen
        return best, {"id": chosen, **records[chosen]}

    def _shared(self, env: str, coll: str, field: str, value: Any, views: dict[str, Records]) -> bool:
        """True if `value` of a record's `field` also occurs in another collection: it refers to something
        (a payee's owner is an account holder), so a new record keeps it rather than making one up."""
        if not isinstance(value, str) or not value:
            return False
        for other, records in self._records_of(env, views).items():
            if other != coll and any(value in r.values() for r in records.values()):
                return True
        return False

    def _field_values(self, env: str, field: str, views: dict[str, Records]) -> list[Any]:
        """Values of a field of that name in the environment's records (the shape a new value should have)."""
        return [r[field] for records in self._records_of(env, views).values() for r in records.values() if field in r]

    def _returned(
        self, env: str, output: dict[str, Any] | None, tool: str | None, views: dict[str, Records]
    ) -> str | None:
        """The collection the tool's output is records of (a record or a list of them): a compiled tool's
        resource; else the one whose records have all of the output's fields, `id` included (a summary may
        leave fields out)."""
        op = operation(self.pool.get(env), tool) if tool is not None else None
        if op is not None:
            return op.resource if op.semantics != "delete" else None
        keys = _item_props(output)
        if "id" not in keys:
            return None
        best: tuple[int, str] | None = None
        for coll, records in self._records_of(env, views).items():
            fields = self._fields(records)
            if keys <= fields | {"id"}:
                extra = len(fields - keys)
                if best is None or extra < best[0]:
                    best = (extra, coll)
        return best[1] if best else None

    # ---- one call -------------------------------------------------------------------------------------

    def _bind_record_ids(
        self,
        env: str,
        tool: str,
        sources: dict[str, InputSource],
        attempt: int,
        say: set[str],
        args: dict[str, Any],
        bindings: list[Binding],
        required: set[str],
        views: dict[str, Records],
    ) -> list[str]:
        """A compiled tool's id arguments, parents first: each from an earlier result (the record it names
        exists and sits under the parents bound before it), else, where no tool finds it (`say`), the id of
        one of the user's own records that fits, said by the user; else missing (a lookup may find it).
        Returns the required ids left missing."""
        how = _ATTEMPTS[min(attempt, len(_ATTEMPTS) - 1)]
        environment = self.pool.get(env)
        assert isinstance(environment, CompiledEnvironment)
        missing: list[str] = []
        for pname, coll in id_arguments(environment, tool).items():
            src = sources.get(pname)
            step = src.index if src is not None and src.source == "tool" else None
            prefer = self.at[step] if step is not None and step < len(self.at) else None
            earlier = self._record_from_earlier(env, tool, pname, coll, args, how.element, prefer, views)
            if earlier is not None:
                args[pname] = earlier[0]
                bindings.append(
                    Binding(parameter=pname, source="output", value=earlier[0], path=earlier[1], call=earlier[2])
                )
                continue
            if pname in say or self.settings.ids_from_state:
                state = self._records_of(env, views)
                records = state.get(coll, {})
                id_field = environment.resources[coll].id_field
                fitting = [
                    k
                    for k in sorted(records)
                    if consistent(environment, tool, {**args, pname: records[k][id_field]}, state)
                ]
                if fitting:
                    chosen = self.targets.get((env, coll))
                    pick = chosen if chosen in fitting and not how.new_target else self.rng.choice(fitting)
                    value = records[pick][id_field]
                    args[pname] = value
                    bindings.append(Binding(parameter=pname, source="state", value=value, path=f"{coll}.{pick}"))
                    continue
            if pname in required:
                missing.append(pname)
        self._bind_scopes(environment, tool, args, bindings, views)
        return missing

    def _bind_scopes(
        self,
        environment: CompiledEnvironment,
        tool: str,
        args: dict[str, Any],
        bindings: list[Binding],
        views: dict[str, Records],
    ) -> None:
        """A compiled tool's namespace arguments (a subscription, a resource group) from the record the call
        names, or the one it is filed under: every record carries its scope, and the call finds it only there.
        The user says them (where their record is)."""
        op = operation(environment, tool)
        if op is None or not op.scopes:
            return
        state = self._records_of(environment.name, views)
        named = [(op.id_param, op.resource)] if op.id_param is not None else []
        anchor = next(
            (
                (resource, record)
                for arg, resource in [*named, *reversed(op.parents)]
                if arg in args and (record := state.get(resource, {}).get(id_key(args[arg]))) is not None
            ),
            None,
        )
        if anchor is None:  # a new record, or a list: the user's words (from the record the chain is about)
            return
        resource, record = anchor
        for arg, field in op.scopes:
            if arg not in args and field in record:
                args[arg] = record[field]
                path = f"{resource}.{id_key(record.get(environment.resources[resource].id_field))}.{field}"
                bindings.append(Binding(parameter=arg, source="state", value=record[field], path=path))

    def _records_of(self, env: str, views: dict[str, Records] | None) -> Records:
        """The records of `env`'s session now, by collection: kept in `views` (a call's binding reads them once:
        nothing runs while a call is bound, and binding reads them dozens of times), else from a fresh dump."""
        view = views.get(env) if views is not None else None
        if view is None:
            view = self._dump(env)[1]
            if views is not None:
                views[env] = view
        return view

    def _dump(self, env: str) -> tuple[dict[str, Any], Records]:
        """`env`'s session's dump and its records (read-only: the dump shares the unchanged fields with the dump
        the session started from). A native session's are kept until its change log moves: a read changes
        nothing, and a failed call's changes are rolled back off the log. (Like `touched_dump`, this reads the
        log: a tool that writes around the state's helpers, against their contract, is not seen here until
        the log moves; what a record holds is dumped whole, `_run`.)"""
        session = self.episode.sessions[env]
        started, dump = self.started.get(env, (None, None))
        state = getattr(session, "state", None)  # a sandboxed session's state is in its worker
        if started is session and dump is not None and isinstance(state, State):
            length, last = state.log_tail()
            kept = self._dumped.get(env)
            if kept is not None and kept[0] is session and kept[1] == length and kept[2] is last:
                return kept[3], kept[4]
            touched = touched_dump(state, dump)
            if touched is not None:
                records = _records(touched)
                self._dumped[env] = (session, length, last, touched, records)
                return touched, records
        whole = session.dump()
        return whole, _records(whole)

    def _bind(
        self, qualified: str, inputs: list[InputSource], attempt: int, say: set[str]
    ) -> tuple[ToolCall, list[Binding], list[str]]:
        """One call's arguments (see the module's rules) and the required ids no earlier result gave (a lookup
        may find them); `say`: id inputs no tool finds, which the user says (ids of their own records). The
        session's records are read once while the call is bound (`_CallBinding.views`)."""
        how = _ATTEMPTS[min(attempt, len(_ATTEMPTS) - 1)]
        env, name = qualified.split(".", 1)
        environment = self.pool.get(env)
        spec = environment.metadata.tool(name)
        fresh = how.fresh_values and spec.kind == "write"
        self.values.defs = spec.input_schema.get("$defs", {})
        sources = {s.parameter: s for s in inputs}
        index = len(self.results)  # this call's position in the conversation
        views: dict[str, Records] = {}
        bound = _CallBinding(
            views=views,
            descriptions={k: str(v.get("description", "")).lower() for k, v in spec.parameters.items()},
            returns=self._returned(env, spec.output_schema, name, views),
            fields=_argument_fields(environment, name),
        )
        required = set(spec.required)
        args: dict[str, Any] = {}
        bindings: list[Binding] = []
        masked: list[str] = []
        user_params: list[str] = []
        missing: list[str] = []
        compiled = isinstance(environment, CompiledEnvironment)
        record_ids = id_arguments(environment, name)
        op = operation(environment, name)
        paging = {op.offset_param, op.page_param} if op is not None else set()  # where a page starts: no user says
        # a compiled tool's other `*_id` inputs name nothing in the state (a client token, an external id): made up
        self.values.id_lookup = None if compiled else partial(self._some_id, views=views)
        if compiled:
            missing += self._bind_record_ids(env, name, sources, attempt, say, args, bindings, required, views)
        for pname, pschema in spec.parameters.items():
            src = sources.get(pname)
            if pname in record_ids or pname in args:  # (a compiled tool's ids and scopes: bound above)
                continue
            if compiled:
                # a compiled tool takes only its record ids from earlier results; every other input is
                # the user's (a similarity edge of the graph relates fields of unrelated records)
                if pname in required or (
                    not _PAGING.search(pname)
                    and pname not in paging
                    and not pname.endswith(("_id", "_ids"))  # an optional id no tool gives: left out
                    and (how.all_optional or self.rng.random() < self.settings.optional_p)
                ):
                    user_params.append(pname)
                continue
            if src is not None and src.source == "tool":
                got = self._from_output(src, pschema, how.element, bound)
                if got is not None:
                    args[pname] = got[0]
                    at = self.at[src.index] if src.index is not None else None
                    bindings.append(Binding(parameter=pname, source="output", value=got[0], path=got[1], call=at))
                    continue
            if pname.endswith("_id") and not (src is not None and src.source == "user" and is_identity(pname)):
                # an id comes back from an earlier call of the conversation, never from the state: a user
                # does not know it, and the agent must be able to find it
                earlier = self._from_earlier(env, pname, pschema, how.element, bound)
                if earlier is not None:
                    args[pname] = earlier[0]
                    bindings.append(
                        Binding(parameter=pname, source="output", value=earlier[0], path=earlier[1], call=earlier[2])
                    )
                elif self.settings.ids_from_state or pname in say:
                    # reachability checks, or an id no tool finds: the user's own record, which they name
                    colls = self._records_of(env, views)
                    coll = collection_for(colls, pname)
                    ids = sorted(colls.get(coll or "", {}))
                    if ids:
                        chosen = self.targets.get((env, coll or ""))
                        value = chosen if chosen in ids and attempt == 0 else self.rng.choice(ids)
                        args[pname] = value
                        bindings.append(Binding(parameter=pname, source="state", value=value, path=f"{coll}.{value}"))
                    elif pname in required:
                        missing.append(pname)
                elif pname in required:
                    missing.append(pname)
                continue
            if pname in required or (
                not _PAGING.search(pname) and (how.all_optional or self.rng.random() < self.settings.optional_p)
            ):
                user_params.append(pname)
        forced = [f for f in self.force.get(qualified, []) if f in spec.parameters and f not in args]
        if forced and not any(f in user_params for f in forced):
            user_params.append(forced[attempt % len(forced)])
        target = self._target(env, user_params, how.new_target, bound) if user_params else None
        if spec.kind == "read" and user_params:
            # a lookup searches for the record the conversation is about: its inputs come from that record
            looked_for = bound.returns
            chosen = self.targets.get((env, looked_for or ""))
            records = self._records_of(env, views).get(looked_for or "", {})
            if looked_for is not None and chosen in records:
                target = (looked_for, {"id": chosen, **records[chosen]})
        # a write returning a record of collection C creates or changes a C: its values are new, not
        # copied from an existing C (a second booking just like Maria's, a no-op update)
        returned = bound.returns if spec.kind == "write" else None
        for pname in user_params:
            pschema = spec.parameters[pname]
            said = self.spoken.get(pname)
            if said is not None and attempt == 0 and fits(said[0], pschema):
                args[pname] = said[0]
                bindings.append(Binding(parameter=pname, source="repeated", value=said[0], call=said[1]))
                continue
            if target is not None and not (
                (fresh or target[0] == returned)
                and not pname.endswith("_id")
                and not self._shared(env, target[0], pname, target[1].get(pname), views)
            ):
                coll, record = target
                field, value = _field_for(record, coll, pname, pschema, bound.fields.get(pname, pname))
                if field is not None and pname not in required and _hollow(value):
                    continue  # nothing a user could say: left out
                if field is not None:
                    args[pname] = value
                    path = f"{coll}.{record['id']}.{field}"
                    bindings.append(Binding(parameter=pname, source="state", value=args[pname], path=path))
                    continue
            if pname not in required and not (fresh and how.all_optional) and pname not in forced:
                continue  # optional and nothing in the state: leave it out
            like = self._field_values(env, pname, views)
            made = self.values.make(pname, pschema, self.learned.get((qualified, pname)), like, by_name=compiled)
            if pname not in required and _hollow(made):  # `metadata: [{}, {}]`: nothing a user could say
                continue
            args[pname] = made
            bindings.append(Binding(parameter=pname, source="generated", value=made))
            if is_free_text(pname):
                masked.append(pname)
        order = {p: i for i, p in enumerate(spec.parameters)}  # the tool's own order of its inputs
        args = {p: args[p] for p in sorted(args, key=order.__getitem__)}
        bindings.sort(key=lambda b: order[b.parameter])
        call = ToolCall(server=env, name=name, arguments=args, masked_arguments=masked, id=f"call_{index}")
        return call, bindings, missing

    # ---- lookups the chain lacks -------------------------------------------------------------------

    def _lookup_tool(self, env: str, tool: str, pname: str, tried: set[str]) -> str | None:
        """A read tool of `env` that returns records of `pname`'s collection and needs no id of its own
        (a search by what the user knows, or a plain list): what an agent would call to find the id. A
        compiled tool's: a list operation of the resource the argument names, whose parents' ids are found
        in turn (list the apps, then the app's branches)."""
        environment = self.pool.get(env)
        if isinstance(environment, CompiledEnvironment):
            coll = id_arguments(environment, tool).get(pname)
            listing = [t for t in list_tools(environment, coll) if f"{env}.{t}" not in tried] if coll else []
            return f"{env}.{listing[0]}" if listing else None
        colls = _records(self.episode.sessions[env].dump())
        coll = collection_for(colls, pname)
        if coll is None:
            return None
        fields = _fields_of(colls[coll])
        candidates: list[tuple[int, str]] = []
        for spec in self.pool.get(env).metadata.tools:
            qualified = f"{env}.{spec.name}"
            needs_id = any(r.endswith("_id") and not is_identity(r) for r in spec.required)  # one it can't find
            if spec.kind != "read" or qualified in tried or needs_id:
                continue
            shapes = _record_shapes(spec.output_schema)  # a cart's lines count: records inside the result
            if not any(props <= fields | {"id"} and "id" in props for props in shapes):
                continue
            # a search whose inputs the target record can fill reads better than a bare list
            fillable = sum(1 for r in spec.required if r in fields)
            candidates.append((-fillable, qualified))
        return min(candidates)[1] if candidates else None

    def _execute(
        self, qualified: str, inputs: list[InputSource], turn: int, depth: int = 0
    ) -> tuple[PlannedCall, CallRecord] | PiStarOutcome:
        """Bind and run one call (inserting the lookups its ids need first); a failed outcome if it cannot."""
        env, name = qualified.split(".", 1)
        kind = self.pool.get(env).metadata.tool(name).kind
        error = "not run"
        tried: set[str] = {qualified}
        say: set[str] = set()  # ids no lookup finds: the user's own records, which they name
        for attempt in range(self.settings.attempts_per_call):
            call, bindings, missing = self._bind(qualified, inputs, attempt, say)
            while missing:
                pname = missing[0]
                lookup = self._lookup_tool(env, name, pname, tried) if depth < _LOOKUP_DEPTH else None
                if lookup is None:
                    if pname in say:  # no record of that kind to name either
                        break
                    say.add(pname)
                else:
                    tried.add(lookup)
                    # a lookup that cannot run leaves the state as it was: another one, or the user says it
                    self._execute(lookup, [], turn, depth + 1)
                call, bindings, missing = self._bind(qualified, inputs, attempt, say)
            if missing:
                return PiStarOutcome(
                    ok=False,
                    code="incoherent",
                    initial=self.initial,
                    failure=f"incoherent: call {len(self.results) + 1} ({qualified}) needs {', '.join(missing)}, "
                    "which no earlier call of the conversation returned, and no lookup finds it",
                )
            rec = self.episode.call(env, name, call.arguments)
            if (
                rec.ok
                and kind == "read"
                and rec.result in ([], None, "", {})
                and attempt + 1 < self.settings.attempts_per_call
            ):
                # an empty read has nothing to report or to look up: try other values (another listed
                # record, another target) before keeping it
                error = "the read found nothing"
                continue
            if rec.ok and kind == "write" and (rec.diff.empty or self._asked_nothing_new(env, name, call, rec.diff)):
                # a write that changes nothing (the same nights again) is no goal a user would have, nor one that
                # changes only what the tool derives (a total recomputed from a stored one that did not add up):
                # retry with other values (a call's own earlier values are not repeated on retries)
                error = "the write changed nothing"
                continue
            if rec.ok:
                break
            error = f"{rec.error.type}: {rec.error.message}" if rec.error else "failed"
            for param, bounds in learned_bounds(error).items():
                self.learned[(qualified, param)] = bounds
            wanted = _AT_LEAST_ONE.search(error)
            if wanted:  # "give at least one of power, level, temperature": bind one of them from now on
                self.force[qualified] = re.findall(r"\w+", wanted.group(1))
        else:
            return PiStarOutcome(
                ok=False,
                code="unsolvable",
                initial=self.initial,
                failure=f"unsolvable: call {len(self.results) + 1} ({qualified}) failed "
                f"{self.settings.attempts_per_call} times; last: {error}",
            )
        for b in bindings:
            if b.source in ("state", "generated"):
                self.spoken.setdefault(b.parameter, (b.value, len(self.results)))
        self.results.append(result_of(call, rec))
        planned = PlannedCall(call=call, bindings=bindings, kind=kind)
        self.planned.append(planned)
        self.turn_of.append(turn)
        return planned, rec

    def _asked_nothing_new(self, env: str, tool: str, call: ToolCall, diff: StateDiff) -> bool:
        """Whether an update left every field its arguments name as it was: every (non-id) argument names a field
        of each record it changed, and none of those fields changed — what changed is what the tool derives
        (`modify_booking` to the nights a booking already has, recomputing a generated total that did not add up).
        A call that creates or removes anything, or with an argument that is no field of a record it changed
        (`reschedule_event(start=..., duration_minutes=120)` moves `end`), is not judged here."""
        if diff.added or diff.removed or not diff.changed:
            return False
        fields = _argument_fields(self.pool.get(env), tool)
        named = {fields.get(p, p) for p in call.arguments if not p.endswith(("_id", "_ids"))}
        if not named:
            return False
        colls = self._records_of(env, None)
        for path in diff.changed:
            coll, _, rest = path.partition(".")
            records = colls.get(coll) or {}
            # the record's key (the longest that fits: a key may hold dots)
            key = max((k for k in records if rest.startswith(f"{k}.")), key=len, default=None)
            if key is None:
                return False  # not a record's field (a counter, a setting): no judgement here
            changed = re.split(r"[.\[]", rest[len(key) + 1 :], maxsplit=1)[0]
            if changed in named or not named <= records[key].keys():
                return False  # a field the user named changed, or an argument that is no field of the record
        return True

    def run(self) -> PiStarOutcome:
        try:
            return self._run()
        finally:  # the value maker looks ids up through this solver: let go of it, or the two are a reference
            self.values.id_lookup = None  # cycle holding the episode's sessions for the cyclic collector

    def _run(self) -> PiStarOutcome:
        spans = turn_spans(self.chain)
        turn_final: list[States] = []
        for turn, (start, end) in enumerate(spans):
            for index in range(start, end):
                done = self._execute(self.chain.tools[index], self.chain.steps[index].inputs, turn)
                if isinstance(done, PiStarOutcome):
                    done.planned, done.results = self.planned, self.results
                    return done
                self.at.append(len(self.results) - 1)
            # whole: what a record holds is never read from the change log alone (a tool that writes a field
            # around the state's helpers, against their contract, still gets its state recorded as it is)
            turn_final.append(self.episode.dumps())
        return PiStarOutcome(
            ok=True,
            planned=self.planned,
            results=self.results,
            initial=self.initial,
            final=turn_final[-1] if turn_final else self.episode.dumps(),
            turn_final=turn_final,
            spans=_spans_of(self.turn_of),
        )


def _hollow(value: Any) -> bool:
    """An object or list with nothing in it but more such (`{}`, `[{}, {}]`): a value no user says."""
    items = value.values() if isinstance(value, dict) else value
    return isinstance(value, dict | list) and all(_hollow(v) for v in items)


def _fields_of(records: dict[str, dict[str, Any]]) -> set[str]:
    """The fields a collection's records hold (every record of a native one holds them all; a compiled one's
    optional fields are in some records only)."""
    out: set[str] = set()
    for record in records.values():
        out.update(record)
    return out


def _argument_fields(env: BaseEnvironment, tool: str) -> dict[str, str]:
    """The record field each argument of a compiled tool carries under its own name (`backup_vault_name` →
    `BackupVaultName`); a native tool's arguments are named after the fields."""
    binding = env.binding(tool)
    return dict(binding.op.fields) | dict(binding.op.scopes) if isinstance(binding, CompiledTool) else {}


def _references(colls: dict[str, dict[str, Any]], coll: str, relevant: set[str]) -> dict[str, str]:
    """Where a collection's records name records of another relevant collection: a field `x_id`, a list
    `x_ids`, or `x_id` inside the items of a list field (`lines[].product_id`) → that collection."""
    first = next(iter(colls[coll].values()))
    out: dict[str, str] = {}
    for field, value in first.items():
        if field.endswith(("_id", "_ids")) and (other := collection_for(colls, field)) in relevant - {coll}:
            out[field] = other
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for key in value[0]:
                if key.endswith("_id") and (other := collection_for(colls, key)) in relevant - {coll}:
                    out[f"{field}[].{key}"] = other
    return out


def _ref_ids(record: dict[str, Any], path: str) -> list[str]:
    """The ids a record names at `path` (see `_references`)."""
    if "[]." in path:
        field, key = path.split("[].", 1)
        items = record.get(field)
        return (
            [str(i[key]) for i in items if isinstance(i, dict) and isinstance(i.get(key), str)]
            if isinstance(items, list)
            else []
        )
    value = record.get(path)
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, int) and not isinstance(value, bool):  # an integer id (the state keys it as text)
        return [str(value)]
    return [value] if isinstance(value, str) else []


def collection_for(colls: Any, pname: str) -> str | None:
    """The collection an id input names: `hotel_id` → hotels, `from_account_id` → accounts (a prefix
    says which one), `list_id` → reading_lists (the collection says what kind)."""
    noun = pname.removesuffix("_ids").removesuffix("_id")
    names = sorted(colls)
    for coll in names:
        if singular(coll) == noun:
            return coll
    for coll in names:
        one = singular(coll)
        if noun.endswith("_" + one) or one.endswith("_" + noun):
            return coll
    return None


_LOOKUP_DEPTH = 3  # lookups inside lookups: list the space, then its projects, then a project's repositories
# a page cursor of a list: no user says one (a required one is still bound)
_PAGING = re.compile(r"(token|cursor|marker|next_link|skip_token)(_query)?$")
_AT_LEAST_ONE = re.compile(r"at least one of ([\w, ]+?)(?: for | or |$|[.;:])")
_TERMINAL = frozenset(
    {"cancelled", "canceled", "closed", "deleted", "inactive", "completed", "done", "expired", "frozen", "resolved"}
)


def _live(record: dict[str, Any]) -> bool:
    """No field says the record is over (a cancelled booking, a closed ticket): later calls may act on it."""
    return not any(isinstance(v, str) and v.lower() in _TERMINAL for v in record.values())


def _record_shapes(schema: dict[str, Any] | None) -> list[set[str]]:
    """The property names of every object a result schema describes, nested ones and $defs included."""
    root = schema or {}
    defs = root.get("$defs", {})
    out: list[set[str]] = []
    stack: list[Any] = [root, *defs.values()]
    seen = 0
    while stack and seen < 200:
        seen += 1
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("properties"), dict):
            out.append(set(node["properties"]))
            stack.extend(node["properties"].values())
        for key in ("items", "anyOf", "oneOf", "allOf"):
            value = node.get(key)
            stack.extend(value if isinstance(value, list) else [value] if value is not None else [])
    return out


def _item_props(output: dict[str, Any] | None) -> set[str]:
    """The properties of what a tool returns: a record, or the items of a list of records ($ref resolved)."""
    out = output or {}
    items = out.get("items") if out.get("type") == "array" else out
    items = items if isinstance(items, dict) else {}
    if "$ref" in items:
        items = out.get("$defs", {}).get(str(items["$ref"]).rsplit("/", 1)[-1], {})
    return set(items.get("properties") or {})


IDENTITY = frozenset({"customer", "user", "member", "client", "patient", "profile"})
_SEARCH_TEXT = frozenset({"query", "q", "search", "keyword", "keywords", "text", "term", "name_contains"})
LABEL_FIELDS = ("name", "title", "full_name", "subject", "display_name", "label", "owner", "holder")


def is_identity(pname: str) -> bool:
    """The id of the user's own record (a customer number): something a user knows and may say."""
    return pname.removesuffix("_id") in IDENTITY


def label_of(record: dict[str, Any]) -> tuple[str, str] | None:
    """The field a person would name a record by (its name, its title), and its value."""
    for field in LABEL_FIELDS:
        value = record.get(field)
        if isinstance(value, str) and value:
            return field, value
    return None


def _field_for(
    record: dict[str, Any], coll: str, pname: str, schema: dict[str, Any], field: str | None = None
) -> tuple[str | None, Any]:
    """The field of a target record that fills input `pname`: the same name (or `field`, the one a compiled
    tool's argument carries), its own id (`hotel_id` of a hotel), for a search text the record's name or
    title, or for a date input the date of its first date-time (`day` of an event that starts then)."""
    field = field or pname
    if field in record and fits(record[field], schema):
        return field, record[field]
    if pname == f"{singular(coll)}_id":
        return "id", record["id"]
    if pname in _SEARCH_TEXT and (label := label_of(record)) is not None and fits(label[1], schema):
        return label
    if schema.get("format") == "date":
        for field, value in record.items():
            if isinstance(value, str) and len(value) >= 10 and _ISO_DAY.match(value):
                return field, value[:10]
    return None, None


_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}(T|$)")


def _spans_of(turn_of: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each turn's calls, from the turn number of every call (lookups included)."""
    spans: list[tuple[int, int]] = []
    for i, turn in enumerate(turn_of):
        if turn == len(spans):
            spans.append((i, i + 1))
        else:
            spans[-1] = (spans[-1][0], i + 1)
    return spans


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
    settings: PiStarSettings | None = None,
    templates: StateTemplates | None = None,
) -> PiStarOutcome:
    """Execute `chain` from `initial` (one dump per environment) with π*; never raises for a failing call.

    The records a chain is about are chosen together (`_plan_targets`); when the chain fails on them
    (the event chosen is already cancelled, its account has no card), it is solved again on other
    records — core ones first, then any — before the unit is given up: the state has records that
    satisfy the chain's preconditions far more often than a first choice does. Sessions fork from `templates`
    where they were validated from `initial`'s very configs (the caller checks them intact afterwards)."""
    s = settings or PiStarSettings()
    first: PiStarOutcome | None = None
    chosen_from: dict[str, _Choosing] = {}  # what every plan chooses its target records from
    for plan in range(s.target_plans):
        rng_seed = seed if plan == 0 else seed * 1_000_003 + plan
        any_record = plan >= s.target_plans // 2
        outcome = _PiStar(pool, chain, initial, core or {}, rng_seed, s, any_record, templates, chosen_from).run()
        if outcome.ok:
            return outcome
        first = first or outcome
    assert first is not None
    return first
