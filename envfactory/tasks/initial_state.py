"""Initial databases Db⁰ for native environments: SynthAPI's data composition, seeded and deterministic.

A state is one *core batch* (batch 0: the records a task targets) plus D−1 *distractor batches*;
S initial databases per task come from S seeds. Values imitate the environment's own shipped
scenarios (its *exemplars*), so that they make sense to its tools. One `random.Random(seed)` and a
Faker seeded from it make everything: never the global RNG, never the wall clock.

Rules. Each record starts from a *template*, a random exemplar record of its collection; values
are read from exemplar records that agree with the template on its Literal and small-vocabulary
fields (a light's levels, Lisbon's hotel names), relaxed until some match.

- Order and counts: a collection comes after those it references (topological; declared order
  otherwise, a cycle broken at the first declared). `batch_size` records per batch; a collection
  with exactly one record in every scenario (a profile) gets one, in the core batch only; one empty
  in every scenario (a log its tools fill) stays empty, or with `fill_logs` gets polyfactory records
  in distractor batches only; an environment with no scenario gets polyfactory records everywhere
  (small non-negative numbers, times around the clock).
- Ids: the template id's stem and a sequential number of its width (`BK-0001`), fresh letters if it
  has none; an inner part spelling a field (`HT-LIS-01`, Lisbon) spells the new value (`HT-POR-01`).
  Unique; a record's `id` is its key.
- References (`<x>_id(s)`, or exemplar values that are a collection's ids): records of the same
  batch (core references core), preferring, in order, one that agrees with the other reference
  where exemplars always agree (a transfer's account and payee have one owner), one no sibling in
  the list took, one not yet taken if exemplars never repeat it (one review per reservation), one
  like the template's referent (same Literals: a light for a light's setting). A nested record's
  reference to its holder's collection is the holder; a field that always equals a field of a
  sibling reference's record copies it (an order line's name and unit price).
- Literal / Enum / bool: the template's value, so frequencies follow the exemplars; with
  `novel_rate` a value no exemplar shows, unless an optional field's presence depends on them.
  Optional fields are None where the template's is.
- Numbers: money and stock (price, amount, balance, fee, stock...) are the template's × U(0.5, 1.5);
  scales (stars, levels, years) uniform in the exemplars' [min, max]; on the exemplars' step
  (fives, halves, cents); ints stay ints; non-negative (positive) when the exemplars are.
- Dates and datetimes: the template's day offset from its scenario's clock × U(0.5, 1.5) from the
  new clock (future stays future), its time of day ± two steps of the exemplars' grid; a field that
  always follows an earlier one (end, arrival) is that one plus the template's gap × U(0.75, 1.25),
  within the exemplars' range. `time` fields keep the template's.
- Strings: empty stays empty; values of a field whose exemplar values all occur in another
  collection's field come from that field's generated values (payee owners are account owners);
  emails from the record's person (or a fresh name) at the template's domain; person names,
  phones, addresses and urls from Faker, people recurring within a batch as in the exemplars;
  names and titles unique mixes of exemplar words (Faker sentences for long titles); long free text
  (≥ 6 words) from Faker; a small reused vocabulary (≤ 8 values: a city, a currency) keeps the
  template's value, with `fresh_rate` a Faker one, and distractors mostly avoid the core batch's
  values so a search by a core record's field tells it apart; codes (IBAN, flight number, seat)
  keep their shape with new digits; anything else keeps the template's value. A string is unique
  where exemplars never repeat it within a scenario, and differs from an earlier field it never
  equals there (an origin is not its destination).
- Lists: the template's length; string vocabularies (amenities, keywords) sample the exemplars'.
- `clock`: the default scenario's ± up to `clock_shift_days` days. `counters`: every prefix in the
  exemplars' counters or of generated ids, at the largest number generated for it, so that
  `state.new_id(prefix)` never collides. Other top-level fields: the rules above, with the default
  scenario as template.
"""

from __future__ import annotations

import random
import re
import weakref
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from typing import Any, ClassVar

from polyfactory.factories.pydantic_factory import ModelFactory
from pydantic import BaseModel, Field, ValidationError

from envfactory.env.compiled import CompiledEnvironment
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.state import DEFAULT_CLOCK
from envfactory.errors import ScenarioError, first_error
from envfactory.tasks.exemplars import Exemplars, fields_of
from envfactory.tasks.fakers import seeded_faker
from envfactory.tasks.state_values import NO, Ctx, FieldGenerationError, Maker, slug
from envfactory.words import singular


class StateGenerationError(ScenarioError):
    """An initial state cannot be generated for an environment (names the environment, collection, field)."""


class InitialState(BaseModel):
    """A generated initial database and which of its records the task should target."""

    env: str
    config: dict[str, Any]  # the state dump; loads with env.new_state(config)
    core_ids: dict[str, list[str]]  # collection → ids of core-batch records
    distractor_ids: dict[str, list[str]]
    seed: int
    depth: int


class StateGenSettings(BaseModel):
    batch_size: int = Field(3, ge=1, description="records per collection per batch")
    novel_rate: float = Field(0.1, ge=0, le=1, description="chance a Literal takes a value the template lacks")
    fresh_rate: float = Field(0.15, ge=0, le=1, description="chance a small-vocabulary string gets a Faker value")
    distractor_overlap: float = Field(0.25, ge=0, le=1, description="chance a distractor may reuse a core value")
    clock_shift_days: int = Field(3, ge=0, description="the clock moves by up to this many days either way")
    fill_logs: bool = Field(False, description="give collections empty in every scenario distractor records")
    locale: str = "en_US"


_EXEMPLARS: weakref.WeakKeyDictionary[Environment, Exemplars] = weakref.WeakKeyDictionary()


def exemplars(env: Environment) -> Exemplars:
    """The environment's scenarios, normalized through its state model (read once per environment)."""
    if env not in _EXEMPLARS:
        names = env.scenario_names()
        default = env.default_scenario()
        names = [default, *[n for n in names if n != default]] if default else names
        dumps = []
        for n in names:
            try:
                dumps.append(env.new_state(env.scenario(n), f"{env.name}/scenarios/{n}.json").dump())
            except ScenarioError as e:
                raise StateGenerationError(f"environment '{env.name}': exemplar scenario '{n}' is broken: {e}") from e
        _EXEMPLARS[env] = Exemplars(env.state_model, dumps)
    return _EXEMPLARS[env]


def generate_initial_state(
    env: BaseEnvironment, *, seed: int, depth: int = 1, settings: StateGenSettings | None = None
) -> InitialState:
    """A seeded initial database: a core batch plus `depth`−1 distractor batches (see the module rules; a
    compiled environment's records come from its schemas, `envfactory.tasks.compiled_state`)."""
    if depth < 1:
        raise StateGenerationError(f"environment '{env.name}': depth must be at least 1, got {depth}")
    if isinstance(env, CompiledEnvironment):
        from envfactory.tasks.compiled_state import compiled_initial_state

        state, core, distractors = compiled_initial_state(env, seed=seed, depth=depth)
        return InitialState(
            env=env.name, config=state, core_ids=core, distractor_ids=distractors, seed=seed, depth=depth
        )
    if not isinstance(env, Environment):
        raise StateGenerationError(
            f"environment '{env.name}' is not native: it has no Pydantic state model to generate initial states from"
        )
    s = settings or StateGenSettings()
    ex = exemplars(env)
    rng = random.Random(seed)
    faker = seeded_faker(s.locale, rng.getrandbits(64))
    base = ex.clocks[0] if ex.clocks else DEFAULT_CLOCK
    clock = base + timedelta(days=rng.randint(-s.clock_shift_days, s.clock_shift_days))
    maker = Maker(ex, rng, faker, clock, s)
    order = _order(ex)
    batches: dict[str, list[list[str]]] = {c: [] for c in ex.collections}
    for b in range(depth):
        maker.batch = b
        for coll in order:
            made: list[str] = []
            for _ in range(_batch_count(ex, s, coll, b)):
                made.append(_make_record(env, ex, maker, coll))
            batches[coll].append(made)
    config: dict[str, Any] = {"clock": clock}
    config["counters"] = _counters(ex.counters, maker.ids.used)
    for f in env.state_model.model_fields:
        if f in ex.collections:
            config[f] = maker.world[f]
        elif f not in ("counters", "clock") and ex.dumps:
            config[f] = maker.scalar(env.state_model, f, ex.dumps[0].get(f, NO))
    try:
        dump = env.new_state(config, f"generated state for '{env.name}'").dump()
    except ScenarioError as e:
        raise StateGenerationError(f"environment '{env.name}': the generated state does not load: {e}") from e
    return InitialState(
        env=env.name,
        config=dump,
        core_ids={c: list(bs[0]) if bs else [] for c, bs in batches.items()},
        distractor_ids={c: [i for batch in bs[1:] for i in batch] for c, bs in batches.items()},
        seed=seed,
        depth=depth,
    )


def _order(ex: Exemplars) -> list[str]:
    """Collections after those they reference; declared order otherwise; a cycle breaks at the first."""
    deps = {c: [d for d in ex.dependencies(c) if d in ex.collections] for c in ex.collections}
    order: list[str] = []
    left = list(ex.collections)
    while left:
        ready = next((c for c in left if all(d in order for d in deps[c])), left[0])
        order.append(ready)
        left.remove(ready)
    return order


def _batch_count(ex: Exemplars, s: StateGenSettings, coll: str, batch: int) -> int:
    if not ex.dumps:  # nothing to imitate: polyfactory records everywhere
        return s.batch_size
    counts = [len(d.get(coll, {})) for d in ex.dumps]
    if not any(counts):  # filled by tools only (a log)
        return s.batch_size if batch > 0 and s.fill_logs else 0
    if all(n == 1 for n in counts):  # a singleton (a profile)
        return 1 if batch == 0 else 0
    return s.batch_size


def _make_record(env: Environment, ex: Exemplars, maker: Maker, coll: str) -> str:
    model = ex.collections[coll]
    records = [(scn, key, rec) for scn, d in enumerate(ex.dumps) for key, rec in d.get(coll, {}).items()]
    scn, tkey, tmpl = maker.rng.choice(records) if records else (-1, None, None)
    template_id = tmpl.get("id", tkey) if isinstance(tmpl, dict) else None
    template_id = template_id if isinstance(template_id, str) else None
    prefix = singular(coll)[:2].upper()
    try:
        if tmpl is not None:
            # made under a placeholder key: the id may spell a field of the record (see _recode)
            raw = maker.model(model, coll, tmpl, Ctx(coll, _PLACEHOLDER, scn))
            key = maker.ids.make(_recode(template_id, tmpl, raw), prefix)
            raw = _swap(raw, _PLACEHOLDER, key)
        else:
            key = maker.ids.make(None, prefix)
            raw = _fallback(model, coll, key, maker)
        record = model.model_validate(raw).model_dump()
    except FieldGenerationError as e:
        raise StateGenerationError(f"environment '{env.name}': collection '{coll}': field {e}") from e
    except ValidationError as e:
        where, msg = first_error(e)
        raise StateGenerationError(
            f"environment '{env.name}': collection '{coll}': field '{where}': the generated value does not fit: {msg}"
        ) from e
    maker.add(coll, key, record)
    return key


_PLACEHOLDER = "\x00new record"


def _recode(template_id: str | None, tmpl: dict[str, Any], raw: dict[str, Any]) -> str | None:
    """`HT-LIS-01` is a Lisbon hotel: an inner id part that spells the start of a template field (its city)
    spells the start of that field of the new record (`HT-HAM-..` in Hamburg)."""
    parts = template_id.split("-") if template_id else []
    for i, part in enumerate(parts[1:-1], 1):
        f = next((f for f, v in tmpl.items() if isinstance(v, str) and slug(v).upper().startswith(part)), None)
        code = re.sub("[^A-Z]", "", slug(raw[f]).upper())[: len(part)] if f and isinstance(raw.get(f), str) else ""
        if part.isalpha() and len(code) == len(part):
            parts[i] = code
    return "-".join(parts) if parts else template_id


def _swap(v: Any, old: str, new: str) -> Any:
    if isinstance(v, dict):
        return {k: _swap(x, old, new) for k, x in v.items()}
    if isinstance(v, list):
        return [_swap(x, old, new) for x in v]
    return new if v == old else v


class _SmallFactory(ModelFactory[Any]):
    """Polyfactory with small non-negative numbers and times around the generated clock."""

    __is_base_factory__ = True
    __clock__: ClassVar[datetime] = DEFAULT_CLOCK

    @classmethod
    def get_provider_map(cls) -> dict[Any, Any]:
        r, clock = cls.__random__, cls.__clock__
        return {
            **super().get_provider_map(),
            int: lambda: r.randint(0, 10),
            float: lambda: round(r.uniform(0, 100), 2),
            datetime: lambda: clock + timedelta(hours=r.randint(-30 * 24, 30 * 24)),
            date: lambda: clock.date() + timedelta(days=r.randint(-30, 30)),
        }


def _fallback(model: type[BaseModel], coll: str, key: str, maker: Maker) -> dict[str, Any]:
    """A record for a model with no exemplar: polyfactory, seeded from the generator's rng; the id is the key
    and references point at generated records."""
    factory = ModelFactory.create_factory(
        model,
        bases=(_SmallFactory,),
        __random__=random.Random(maker.rng.getrandbits(64)),
        __faker__=maker.faker,
        __clock__=maker.clock,
        __use_defaults__=True,
    )
    ctx = Ctx(coll, key, -1, plan=maker.ex.plan(model, coll))
    for f, (tp, _, optional) in fields_of(model).items():
        if f == "id":
            ctx.done[f] = key
        elif f in ctx.plan.refs:
            ctx.done[f] = maker.ref(f, tp, f"{coll}.{f}", NO, ctx, optional)
    return factory.build(**ctx.done).model_dump()


def _counters(prefixes: Iterable[str], ids: Iterable[str]) -> dict[str, int]:
    """Every counter prefix at the largest number a generated id of that prefix carries."""
    out = dict.fromkeys(prefixes, 0)
    for i in ids:
        m = re.fullmatch(r"([A-Za-z]+)-(\d+)", i)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)))
    return out


__all__ = [
    "InitialState",
    "StateGenSettings",
    "StateGenerationError",
    "exemplars",
    "generate_initial_state",
]
