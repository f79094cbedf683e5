"""Records for a compiled environment's state: realistic values and consistent references, seeded.

Each batch fills every resource, parents first: a few records per collection (per parent record for a
nested one), each field's value made from its schema and name (`envfactory.tasks.values`: names,
emails, dates relative to the clock...), the spec's own examples where it gives some, enums from their
values, ids from the same counters the tools use, and every child pointing at a parent of its batch.
A value that does not validate against its field's schema is left out (an optional field) or made
again; a required field that cannot be made valid rejects the environment with that reason.

Two users: the compiler's scenarios (`envfactory.compiler.scenarios`: one batch per scenario) and the
offline synthesis's initial databases (`compiled_initial_state`: a core batch, the records a task is
about, and D-1 distractor batches, SynthAPI's data composition, from the unit's seed).
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from envfactory.env.compiled import CompiledEnvironment, CompiledPlan, Resource, schema_problems, type_of, validator_for
from envfactory.errors import EnvError
from envfactory.tasks.values import URL_FORMATS, ValueMaker, item_schema, pattern_value
from envfactory.words import singular, snake_case

_TRIES = 6


class ScenarioSettings(BaseModel):
    count: int = Field(default=3, ge=1, description="scenarios per environment")
    records: tuple[int, int] = Field(default=(2, 5), description="records per top-level collection (min, max)")
    children: tuple[int, int] = Field(default=(1, 3), description="records per parent for a nested collection")
    optional: float = Field(default=0.7, ge=0, le=1, description="chance an optional field is filled")
    seed: int = 0


MAX_VALUE_SIZE = 200_000  # characters and items one generated field may hold (its nested lists' included)


class ScenarioGenerationError(EnvError):
    """No valid record can be made for a resource (a required field whose schema the generator cannot meet)."""


class _TooLarge(ScenarioGenerationError):
    """A field's value would be larger than `MAX_VALUE_SIZE`."""


class _Values:
    """Values for one scenario: seeded, shaped by each field's schema and name."""

    def __init__(self, rng: random.Random, clock: datetime) -> None:
        self.rng = rng
        self.maker = ValueMaker(rng, clock)
        self.clock = clock
        self.left, self.field = MAX_VALUE_SIZE, ""  # the field being made, and what it may still hold (`_spend`)

    def _spend(self, size: int) -> None:
        """Count `size` (a string's characters, or 1 for any other value) against the field's bound: a schema's
        minimum sizes multiply through nested lists (a 1.5 KB spec asked for 1000 x 1000 x 1000 integers, and
        one list of 1,000 strings of 10,000 characters), which no single keyword's cap bounds."""
        self.left -= size
        if self.left < 0:
            raise _TooLarge(
                f"a value of '{self.field}' would hold more than {MAX_VALUE_SIZE:,} characters and items: its "
                "schema's minimum sizes (minItems, minLength, minProperties) multiply through its nested lists"
            )

    def make(self, name: str, schema: dict[str, Any], attempt: int, depth: int = 0) -> Any:
        if depth == 0:
            self.left, self.field = MAX_VALUE_SIZE, name
        self._spend(1)
        examples = [x for x in schema.get("examples", []) if x is not None]
        if "default" in schema and attempt == 0 and self.rng.random() < 0.3:
            return schema["default"]
        if examples and attempt < 2 and self.rng.random() < 0.6:
            return self.rng.choice(examples)
        if schema.get("enum"):
            return self.rng.choice(schema["enum"])
        if schema.get("anyOf"):
            return self.make(name, self.rng.choice(schema["anyOf"]), attempt, depth + 1)
        kind = type_of(schema) or ("object" if "properties" in schema else "string")
        if kind == "object":
            return self._object(name, schema, attempt, depth)
        if kind == "array":
            items = item_schema(schema)
            lo = schema.get("minItems", 1 if depth == 0 else 0)
            hi = max(lo, min(schema.get("maxItems", 2), 2))
            return [
                self.make(singular(snake_case(name)) or "item", items, attempt, depth + 1)
                for _ in range(self.rng.randint(lo, hi))
            ]
        if kind == "string":
            return self._string(name, schema, attempt)
        if kind == "null":
            return None
        return self.maker.make(snake_case(name) or "value", schema, by_name=True)

    def _object(self, name: str, schema: dict[str, Any], attempt: int, depth: int) -> dict[str, Any]:
        props = schema.get("properties") or {}
        required = set(schema.get("required", []))
        out = {}
        if depth < 3:  # a nested object: what it requires and a couple more, not every field a spec lists
            optional = [k for k in props if k not in required]
            chosen = set(self.rng.sample(optional, min(len(optional), 2)))
            for key, sub in props.items():
                if key in required or key in chosen:
                    out[key] = self.make(key, sub, attempt, depth + 1)
        want = schema.get("minProperties", 0)
        while len(out) < want:  # a free-form map: keys and values the schema does not describe
            self._spend(1)
            out[f"{singular(snake_case(name)) or 'key'}_{len(out) + 1}"] = self.maker.faker.word()
        return out

    def _string(self, name: str, schema: dict[str, Any], attempt: int) -> str:
        fmt = schema.get("format")
        low = snake_case(name)
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and attempt > 0:  # a made-up value did not fit: one that matches the pattern
            value = pattern_value(self.rng, pattern) or str(self.maker.make(low or "value", schema, by_name=True))
        elif fmt == "uuid":
            value = str(uuid.UUID(int=self.rng.getrandbits(128)))
        elif fmt == "date-time":
            day = self.maker.future_date()
            clock = f"{self.rng.randint(8, 18):02d}:{self.rng.choice(['00', '15', '30'])}:00"
            value = _stamp(f"{day.isoformat()}T{clock}", schema)
        elif fmt == "time":
            value = _stamp(f"{self.rng.randint(8, 18):02d}:{self.rng.choice(['00', '30'])}:00", schema)
        elif fmt in URL_FORMATS or low.endswith(("url", "uri", "link", "href")):
            value = f"https://example.com/{self.maker.faker.slug()}"
        else:
            value = str(self.maker.make(low or "value", schema, by_name=True))
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        if isinstance(hi, int) and len(value) > hi:
            value = value[:hi]
        if isinstance(lo, int) and len(value) < lo:
            self._spend(lo)  # before the padding is made
            value = value + "x" * (lo - len(value))
        else:
            self._spend(len(value))
        return value


# the same instant written at other precisions and zone forms (RFC 3339), shortest first
_STAMP_ENDS = ("Z", ".000Z", "+00:00", ".000000Z", ".000+00:00", ".000000+00:00")


def _stamp(clock: str, schema: dict[str, Any]) -> str:
    """`clock` (a date-time or a time to the second) in UTC, in the first RFC 3339 form whose length the schema's
    `minLength`/`maxLength` allow: a spec whose stamps are 24 characters long gets `…T17:15:00.000Z`, not a
    shorter stamp padded out with letters. Bounds no form meets get the shortest (the caller cuts or pads it)."""
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    for end in _STAMP_ENDS:
        size = len(clock) + len(end)
        if (not isinstance(lo, int) or size >= lo) and (not isinstance(hi, int) or size <= hi):
            return clock + end
    return clock + _STAMP_ENDS[0]


def _record(r: Resource, values: _Values, settings: ScenarioSettings) -> dict[str, Any]:
    props: dict[str, Any] = r.record_schema.get("properties", {})
    required = set(r.record_schema.get("required", []))
    record: dict[str, Any] = {}
    for name, schema in props.items():
        if name in (r.id_field, r.parent_field):
            continue
        if name not in required and values.rng.random() >= settings.optional:
            continue
        for attempt in range(_TRIES):
            try:
                value = values.make(name, schema, attempt)
            except _TooLarge:
                if name in required:
                    raise
                break  # an optional field no value of a bounded size fits: left out
            if not schema_problems(validator_for(schema), value, name):
                record[name] = value
                break
        else:
            if name in required:
                raise ScenarioGenerationError(f"cannot make a valid value for {r.label}.{name}")
    return record


def fill_state(
    env: CompiledEnvironment, rng: random.Random, settings: ScenarioSettings, depth: int = 1
) -> tuple[dict[str, Any], list[dict[str, list[str]]]]:
    """A state of `depth` batches, and per batch the keys of the records it made, by collection. A nested
    collection's records of a batch are filed under that batch's parents (a distractor order is a
    distractor customer's)."""
    plan = env.plan
    values = _Values(rng, plan.clock)
    state = env.empty_state()
    scopes: dict[str, list[str]] = {}
    batches: list[dict[str, list[str]]] = []
    for _ in range(depth):
        made: dict[str, list[str]] = {}
        for r in _ordered(plan):
            coll: dict[str, Any] = state[r.name]
            keys = made.setdefault(r.name, [])
            owners = [None] if r.parent is None else [state[r.parent][k] for k in made.get(r.parent, [])]
            for owner in owners:
                lo, hi = settings.records if owner is None else settings.children
                for _ in range(rng.randint(lo, hi)):
                    record = _record(r, values, settings)
                    if owner is not None and r.parent is not None and r.parent_field is not None:
                        record[r.parent_field] = owner[env.resources[r.parent].id_field]
                    for f in r.scope_fields:  # a parent's scope carries over; else one of the state's few
                        inherited = owner.get(f) if owner is not None else None
                        record[f] = (
                            inherited if inherited is not None else rng.choice(scopes.setdefault(f, _scope(values, f)))
                        )
                    record[r.id_field] = env.new_id(state, r)
                    record = {k: record[k] for k in sorted(record, key=lambda k: (k != r.id_field, k))}
                    problems = schema_problems(env.record_validators[r.name], record, r.label)
                    if problems:
                        where = f"{problems[0].parameter}: {problems[0].problem}"
                        raise ScenarioGenerationError(f"a generated {r.label} does not fit its schema: {where}")
                    coll[str(record[r.id_field])] = record
                    keys.append(str(record[r.id_field]))
        batches.append(made)
    return state, batches


def _scope(values: _Values, field: str) -> list[str]:
    """One or two values of a namespace key for a whole scenario: an id as a UUID (an Azure subscription), a
    name as a slug of a few words (a resource group `north-river-data`), never a word of one or two letters
    a user could not be told apart from the sentence around it."""
    out: list[str] = []
    for _ in range(values.rng.randint(1, 2)):
        if snake_case(field).endswith("id"):
            out.append(str(uuid.UUID(int=values.rng.getrandbits(128))))
            continue
        words = [w for w in values.maker.faker.words(3) if len(w) > 2] or ["main"]
        out.append("-".join(w.lower() for w in words))
    return out


def _ordered(plan: CompiledPlan) -> list[Resource]:
    """Parents before children."""
    done: list[Resource] = []
    left = list(plan.resources)
    while left:
        ready = [r for r in left if r.parent is None or r.parent in {d.name for d in done}]
        if not ready:
            raise ScenarioGenerationError("the resources' parents form a cycle")
        done.extend(ready)
        left = [r for r in left if r not in ready]
    return done


_STATE_TRIES = 4


def references(plan: CompiledPlan) -> dict[str, dict[str, str]]:
    """Fields of a resource's records that name a record of another resource, not by the path but by their
    name (`companyId`, `account_id` → companies, accounts): resource → field → the resource it names."""
    nouns: dict[str, str] = {}
    for r in plan.resources:
        nouns.setdefault(singular(r.name), r.name)
        nouns.setdefault(snake_case(r.label), r.name)
    out: dict[str, dict[str, str]] = {}
    for r in plan.resources:
        props = r.record_schema.get("properties") or {}
        for field, schema in props.items():
            name = snake_case(field)
            if field in (r.id_field, r.parent_field) or not name.endswith("_id") or not isinstance(schema, dict):
                continue
            other = nouns.get(name[:-3])
            if other is not None and other != r.name and not schema.get("enum") and type_of(schema) in ("string", None):
                out.setdefault(r.name, {})[field] = other
    return out


def link_references(env: CompiledEnvironment, state: dict[str, Any], rng: random.Random) -> None:
    """Every field `references` finds holds the id of a record that exists (where its schema takes one), so
    a `companyId` in a merchant leads to a company: a lookup by it finds something."""
    for name, fields in references(env.plan).items():
        props = env.resources[name].record_schema.get("properties") or {}
        for record in state[name].values():
            for field, other in fields.items():
                keys = sorted(state[other])
                if field not in record or not keys:
                    continue
                value = rng.choice(keys)
                if env.resources[other].id_type == "integer":
                    continue  # an integer id in a field of another type: leave the field as made
                if not schema_problems(validator_for(props[field]), value, field):
                    record[field] = value
    _inherit_scopes(env, state)


def _inherit_scopes(env: CompiledEnvironment, state: dict[str, Any]) -> None:
    """A record keeps the namespace of the record it is filed under (parents first, so down the whole chain): a
    scope that is also a reference (a card's `board_id`, when the board is a namespace of lists and cards) was
    linked to a record on its own above, and a card on another board than its list sits nowhere a call finds it
    (listing the list's cards on its board misses it)."""
    for r in _ordered(env.plan):
        if r.parent is None or r.parent_field is None or not r.scope_fields:
            continue
        owners: dict[str, Any] = state[r.parent]
        for record in state[r.name].values():
            owner = owners.get(str(record.get(r.parent_field)))
            for field in r.scope_fields:
                if owner is not None and field in owner:
                    record[field] = owner[field]


def compiled_initial_state(
    env: CompiledEnvironment, *, seed: int, depth: int = 1, settings: ScenarioSettings | None = None
) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, list[str]]]:
    """A seeded initial database for a compiled environment: a core batch (the records a task is about) and
    `depth`-1 distractor batches of as many records again, fields that name another resource's records
    pointing at records that exist; (the state, core ids, distractor ids) by collection. The state loads
    into the environment (the checks a scenario file gets). A record no value fits is made again from the
    next seed of the unit (a few times) before the unit is given up."""
    s = settings or ScenarioSettings()
    for attempt in range(_STATE_TRIES):
        rng = random.Random(seed if attempt == 0 else f"{seed}:{attempt}")
        try:
            state, batches = fill_state(env, rng, s, depth)
            break
        except ScenarioGenerationError:
            if attempt + 1 == _STATE_TRIES:
                raise
    link_references(env, state, rng)
    env.new_state(state, f"generated state for '{env.name}'")
    core = {name: list(keys) for name, keys in batches[0].items()}
    distractors = {name: [k for b in batches[1:] for k in b.get(name, [])] for name in core}
    return state, core, distractors
