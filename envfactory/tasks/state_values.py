"""Ids and values for generated initial states.

`IdMaker` makes unique ids in the exemplars' pattern (`BK-0001`, `RM-QXT`). `Maker` makes one value
(a record, a nested line, a number, a date, a string...) from a template record, the exemplars'
statistics and relations (`envfactory.tasks.exemplars`) and the records generated so far; `Ctx` says
where the value goes. The rules are listed in `envfactory.tasks.initial_state`.
"""

from __future__ import annotations

import random
import re
import string
import unicodedata
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, get_args

from faker import Faker
from pydantic import BaseModel

from envfactory.errors import EnvError
from envfactory.tasks.exemplars import (
    Exemplars,
    Kind,
    Plan,
    Sample,
    allowed_values,
    element_type,
    fields_of,
    kind_of,
    parse_value,
    time_gap,
    time_grid,
    unwrap,
)
from envfactory.words import is_long_text, singular

if TYPE_CHECKING:
    from envfactory.tasks.initial_state import StateGenSettings

NO: Any = object()  # "no template value", unlike a template value of None

_PERSON_FIELD = re.compile(
    r"(guest|passenger|owner|customer|author|person|user|employee|member|contact|holder|recipient|client|patient)"
    r"(_name)?$"
)
_PERSON_COLL = re.compile(r"(customer|agent|author|user|person|people|passenger|guest|employee|member|contact|staff)")
_MAGNITUDE = re.compile(r"(price|amount|balance|total|fee|fare|cost|refund|stock|salary|count|budget|revenue)")
_PROVIDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"city"), "city"),
    (re.compile(r"country"), "country"),
    (re.compile(r"(company|affiliation|employer|organi[sz]ation|brand|airline|merchant)"), "company"),
    (re.compile(r"currency"), "currency_code"),
]
# one value per record (no vocabulary to reuse): faker, whatever the exemplars hold
_UNIQUE_PROVIDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(url|website)"), "url"),
    (re.compile(r"phone"), "phone_number"),
    (re.compile(r"(address|street)"), "street_address"),
]
_QUANTA = (1000, 500, 100, 50, 10, 5, 1, 0.5, 0.25, 0.1, 0.05, 0.01)


class FieldGenerationError(EnvError, ValueError):
    """A field cannot be given a value (e.g. a required reference to a collection with no records)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


# ---- numbers and times ---------------------------------------------------------------------
def _quantum(values: list[float], is_int: bool) -> float:
    """The step exemplar numbers keep (prices in fives, temperatures in halves, cents), not coarser than a
    quarter of their spread, so that two exemplars do not collapse the range into one step."""
    spread = max(values) - min(values)
    for q in _QUANTA:
        if is_int and q < 1:
            return 1
        if q > 1 and spread and q > spread / 4:
            continue
        if all(abs(v / q - round(v / q)) < 1e-6 for v in values):
            return q
    return 1 if is_int else 0.01


def _decimals(q: float) -> int:
    """Decimal places of a step below 1 (0.05 → 2)."""
    return len(repr(q).split(".")[1]) if q < 1 else 0


def _sod(v: datetime) -> int:
    """Seconds since the start of the day."""
    return v.hour * 3600 + v.minute * 60 + v.second


def _day_grid(samples: list[Sample]) -> float:
    """The coarsest time unit that divides the times of day of exemplar datetimes."""
    return time_grid([_sod(s.value) for s in samples])


# ---- ids ------------------------------------------------------------------------------------
class IdMaker:
    """Unique ids in the exemplar's pattern: its stem (all before the last run of digits) and a sequential
    number of the same width (`BK-0001`, `HT-LIS-01`); an id with no digits gets fresh letters (`RM-QXT`)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.next: dict[str, int] = {}
        self.width: dict[str, int] = {}  # one width per stem, whichever scenario the template came from
        self.used: dict[str, None] = {}

    def make(self, template: str | None, fallback_prefix: str) -> str:
        m = re.fullmatch(r"(.*?)(\d+)", template) if template else None
        if template is None or m:
            stem, width = (m.group(1), len(m.group(2))) if m else (f"{fallback_prefix}-", 4)
            width = self.width.setdefault(stem, width)
            n = self.next.get(stem, 0)
            while True:
                n += 1
                cand = f"{stem}{n:0{width}d}"
                if cand not in self.used:
                    break
            self.next[stem] = n
        else:  # keep the prefix before the first dash, fresh letters after it
            head, sep, tail = template.partition("-")
            for _ in range(50):
                cand = (head + sep if sep else "") + _shape(self.rng, tail if sep else template, letters=True)
                if cand not in self.used:
                    break
            else:
                cand = f"{cand}{len(self.used)}"
        self.used[cand] = None
        return cand


def _shape(rng: random.Random, s: str, *, letters: bool = False) -> str:
    """`s` with each digit (and, with letters, each letter) replaced by a random one of the same kind."""
    out = []
    for ch in s:
        if ch.isdigit():
            out.append(str(rng.randint(1, 9) if ch != "0" else rng.randint(0, 9)))
        elif letters and ch.isalpha():
            pool = string.ascii_uppercase if ch.isupper() else string.ascii_lowercase
            out.append(rng.choice(pool))
        else:
            out.append(ch)
    return "".join(out)


def slug(s: str) -> str:
    ascii_ = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9.]", "", ascii_.lower())


# ---- values ---------------------------------------------------------------------------------
@dataclass
class Ctx:
    """Where a value goes: its collection, the top-level record's id, the template's scenario, and for the
    model instance being made its plan, template, stratum and the fields made so far."""

    coll: str
    key: str
    scn: int
    top: bool = True
    avoid: set[str] = field(default_factory=set)  # ids already referenced by sibling list elements
    plan: Plan = field(default_factory=Plan)
    tmpl: dict[str, Any] = field(default_factory=dict)
    stratum: tuple[tuple[str, Any], ...] = ()
    done: dict[str, Any] = field(default_factory=dict)

    def nested(self) -> Ctx:
        return Ctx(self.coll, self.key, self.scn, top=False, avoid=self.avoid)


class _StringKind(NamedTuple):
    """What kind of string a field holds, read from its name and its exemplars (the same for every state)."""

    every: tuple[str, ...]  # the exemplars' strings at its path
    email: bool
    person: bool  # a person's name (no exemplar spells a digit)
    repeat_rate: float  # how often a person recurs
    unique: str | None  # the Faker provider of a value unique to each record (a phone number)
    words: float  # the exemplars' mean number of words
    named: bool  # a name or title, unique in its collection
    long_text: bool  # free text of six words or more
    provider: str | None  # the Faker provider of a fresh value of a small vocabulary (a city)


_STRING_KINDS: weakref.WeakKeyDictionary[Exemplars, dict[tuple[str, str, str], _StringKind]] = (
    weakref.WeakKeyDictionary()
)


def _string_kind(ex: Exemplars, name: str, path: str, coll: str) -> _StringKind:
    """`_StringKind` of field `name` at `path` of collection `coll`, worked out once per environment."""
    kinds = _STRING_KINDS.get(ex)
    if kinds is None:
        kinds = _STRING_KINDS[ex] = {}
    kind = kinds.get((name, path, coll))
    if kind is None:
        low = name.lower()
        every = tuple(v for v in ex.values(path) if isinstance(v, str))
        person = bool(_PERSON_FIELD.search(low)) or (low == "name" and bool(_PERSON_COLL.search(coll)))
        words = sum(len(v.split()) for v in every) / len(every) if every else 2.0
        kind = kinds[(name, path, coll)] = _StringKind(
            every=every,
            email="email" in low or (bool(every) and all("@" in v for v in every)),
            person=person and not any(ch.isdigit() for v in every for ch in v),  # a name never spells a digit
            repeat_rate=ex.repeat_rate([path]),
            unique=next((p for rx, p in _UNIQUE_PROVIDERS if rx.search(low)), None),
            words=words,
            named=low in ("name", "title") or low.endswith(("_name", "_title")),
            long_text=is_long_text(low) and words >= 6,
            provider=next((p for rx, p in _PROVIDERS if rx.search(low)), None),
        )
    return kind


_NUMBER_SHAPES: weakref.WeakKeyDictionary[Exemplars, dict[Any, tuple[float, float, float, bool] | None]] = (
    weakref.WeakKeyDictionary()
)


def _number_shape(
    ex: Exemplars, is_int: bool, path: str, name: str, stratum: tuple[tuple[str, Any], ...]
) -> tuple[float, float, float, bool] | None:
    """(lo, hi, step, a magnitude) of the exemplar numbers a number imitates; None when there are none. Worked out
    once per environment and stratum (a stratum that cannot be a key: each time)."""
    shapes = _NUMBER_SHAPES.get(ex)
    if shapes is None:
        shapes = _NUMBER_SHAPES[ex] = {}
    key: tuple[bool, str, str, tuple[tuple[str, Any], ...]] | None = (is_int, path, name, stratum)
    try:
        return shapes[key]
    except KeyError:
        pass
    except TypeError:  # a list in the stratum
        key = None
    vals = [float(v) for v in ex.values(path, stratum) if isinstance(v, int | float) and not isinstance(v, bool)]
    shape = (min(vals), max(vals), _quantum(vals, is_int), bool(_MAGNITUDE.search(name.lower()))) if vals else None
    if key is not None:
        shapes[key] = shape
    return shape


class Maker:
    """Makes records for one generated state: one rng, one Faker, the clock, the records made so far."""

    def __init__(
        self, ex: Exemplars, rng: random.Random, faker: Faker, clock: datetime, settings: StateGenSettings
    ) -> None:
        self.ex, self.rng, self.faker, self.clock, self.s = ex, rng, faker, clock, settings
        self.world: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in ex.collections}
        self.batch_of: dict[str, int] = {}
        self.batch = 0
        self.ids = IdMaker(rng)
        self._pools: dict[tuple[Any, ...], list[Any]] = {}
        self._core_used: dict[str, set[Any]] = defaultdict(set)
        self._names: dict[str, set[str]] = defaultdict(set)  # names and titles made, per path
        self._distinct: dict[str, set[str]] = defaultdict(set)  # strings made where exemplars never repeat one
        self._taken: dict[str, set[str]] = defaultdict(set)

    def add(self, coll: str, key: str, record: dict[str, Any]) -> None:
        self.world[coll][key] = record
        self.batch_of[key] = self.batch

    def model(self, model: type[BaseModel], path: str, tmpl: Any, ctx: Ctx) -> dict[str, Any]:
        """One model instance (a record, a nested line) from a template instance (a dict) or none."""
        plan = self.ex.plan(model, path)
        t: dict[str, Any] = tmpl if isinstance(tmpl, dict) else {}
        stratum = tuple((f, t.get(f)) for f in plan.strata) if t else ()
        ctx = Ctx(ctx.coll, ctx.key, ctx.scn, ctx.top, ctx.avoid, plan, t, stratum, {})
        fields = fields_of(model)
        for f in [f for f in fields if f not in plan.derived] + list(plan.derived):
            ctx.done[f] = self.field(f, fields[f], f"{path}.{f}", t.get(f, NO) if t else NO, ctx)
            for _ in range(5):  # an origin is not its own destination when exemplars never are
                if not any(ctx.done[f] == ctx.done.get(g) for g in plan.differ.get(f, [])):
                    break
                ctx.done[f] = self.field(f, fields[f], f"{path}.{f}", NO, ctx)
        return {f: ctx.done[f] for f in fields}

    def scalar(self, state_model: type[BaseModel], name: str, t: Any) -> Any:
        """A top-level field of the state that is not a collection (a balance, a current user)."""
        tp, k, optional = fields_of(state_model)[name]
        if optional and t is None:
            return None
        ctx = Ctx("$", "", 0, plan=self.ex.plan(state_model, "$"))
        return self.value(tp, k, f"$.{name}", name, t, ctx)

    def field(self, name: str, spec: tuple[Any, Kind, bool], path: str, t: Any, ctx: Ctx) -> Any:
        tp, k, optional = spec
        plan, done = ctx.plan, ctx.done
        if name == "id" and ctx.top:
            return ctx.key
        if name in plan.derived:
            r, g = plan.derived[name]
            rid = done.get(r)
            ref = self.world[plan.refs[r]].get(rid) if isinstance(rid, str) else None
            if ref is not None:
                return ref.get(g)
        if optional and (t is None or (t is NO and self.rng.random() < self.ex.null_rate(path))):
            return None
        if name in plan.refs:
            return self.ref(name, tp, path, t, ctx, optional)
        if name == "id" and k == "str":  # a nested record's own id (a ticket's comment)
            return self.ids.make(t if isinstance(t, str) else None, singular(ctx.coll)[:2].upper())
        return self.value(tp, k, path, name, t, ctx)

    def value(self, tp: Any, k: Kind, path: str, name: str, t: Any, ctx: Ctx) -> Any:
        rng = self.rng
        if k == "model":
            return self.model(tp, path, t, ctx.nested())
        if k in ("literal", "enum"):
            allowed = allowed_values(tp)
            seen = [v for v in self.ex.values(path) if v in allowed]
            unseen = [v for v in allowed if v not in seen]
            if unseen and ctx.plan.free and rng.random() < self.s.novel_rate:
                return rng.choice(unseen)  # an allowed value no exemplar shows, now and then
            return t if t in allowed else rng.choice(seen or allowed)
        if k == "bool":
            return t if isinstance(t, bool) else rng.choice(self.ex.values(path) or [True, False])
        if k in ("int", "float"):
            # Literal strata only: a city and a cuisine would narrow a range to one exemplar's value
            return self.number(k == "int", path, name, t, ctx.stratum[: len(ctx.plan.literal)])
        if k in ("date", "datetime"):
            return self.temporal(k, path, name, t, ctx)
        if k == "time":
            return parse_value("time", t) if isinstance(t, str) else rng.choice(self.ex.values(path) or [time(12, 0)])
        if k == "str":
            return self.string(name, path, t, ctx)
        if k == "list":
            return self.list_value(tp, path, name, t, ctx)
        if k == "dict":
            kt, vt = get_args(tp) or (str, Any)
            keys = list(t) if isinstance(t, dict) else allowed_values(kt) if kind_of(kt) == "literal" else []
            vtp = unwrap(vt)[0]
            tv: dict[str, Any] = t if isinstance(t, dict) else {}
            return {key: self.value(vtp, kind_of(vtp), f"{path}.{key}", name, tv.get(key, NO), ctx) for key in keys}
        return None if t is NO else t

    def ref(self, name: str, tp: Any, path: str, t: Any, ctx: Ctx, optional: bool) -> Any:
        """An id of the referenced collection, from the current batch (core records reference core
        records), like the template's referent, agreeing with an earlier reference, not a sibling's."""
        plan, target, rng = ctx.plan, ctx.plan.refs[name], self.rng
        if not ctx.top and target == ctx.coll:  # a nested record points at the record that holds it
            return ctx.key
        recs = self.world[target]
        cands = [i for i in recs if i != ctx.key]

        def narrow(keep: Callable[[str], bool]) -> None:
            nonlocal cands
            cands = [c for c in cands if keep(c)] or cands

        narrow(lambda c: self.batch_of[c] == self.batch)
        if kind_of(tp) == "list":
            n = len(t) if isinstance(t, list) else rng.choice(self.ex.lengths.get(path) or [1])
            return rng.sample(cands, min(n, len(cands)))
        if name in plan.coherent:
            r1, g = plan.coherent[name]
            other = self.world[plan.refs[r1]].get(ctx.done.get(r1, ""))
            if other is not None:
                narrow(lambda c: recs[c].get(g) == other.get(g))
        for r2, (r1, g) in plan.coherent.items():
            if r1 == name:  # an account whose owner has a payee, for the transfer's payee to agree with
                partners = {r.get(g) for i, r in self.world[plan.refs[r2]].items() if self.batch_of[i] == self.batch}
                narrow({c for c in cands if recs[c].get(g) in partners}.__contains__)
        narrow(lambda c: c not in ctx.avoid)
        if name in plan.unique_refs:  # one review per reservation
            taken = self._taken[path]
            narrow(lambda c: c not in taken)
        like = self.ex.referent(ctx.scn, target, t) if ctx.scn >= 0 else None
        if like is not None:  # a light for a light's scene setting, an open account for a transfer
            lits = self.ex.plan(self.ex.collections[target], target).literal
            narrow(lambda c: all(recs[c].get(f) == like.get(f) for f in lits))
        if not cands:
            if optional:
                return None
            raise FieldGenerationError(path, f"needs a record of '{target}' to reference, and there is none")
        choice = rng.choice(cands)
        ctx.avoid.add(choice)
        self._taken[path].add(choice)
        return choice

    def number(self, is_int: bool, path: str, name: str, t: Any, stratum: tuple[tuple[str, Any], ...]) -> int | float:
        rng = self.rng
        shape = _number_shape(self.ex, is_int, path, name, stratum)
        if shape is None:  # nothing to imitate: small and non-negative
            return rng.randint(0, 10) if is_int else round(rng.uniform(0, 100), 2)
        lo, hi, q, magnitude = shape
        if magnitude and isinstance(t, int | float) and not isinstance(t, bool):
            x = t * rng.uniform(0.5, 1.5)  # keeps the template's sign and scale (a salary, a coffee)
        elif magnitude:
            x = rng.uniform(lo * 0.5 if lo >= 0 else lo * 1.5, hi * 1.5 if hi >= 0 else hi * 0.5)
        else:
            x = rng.uniform(lo, hi)  # a scale (stars, levels, floors) stays within what exemplars show
        x = round(x / q) * q
        if lo >= 0:
            x = max(x, q if lo > 0 else 0)
        if not magnitude:
            x = min(max(x, lo), hi)
        return round(x) if is_int else round(x, _decimals(q))

    def temporal(self, k: Kind, path: str, name: str, t: Any, ctx: Ctx) -> date | datetime:
        rng, is_dt = self.rng, k == "datetime"
        samples = self.ex.samples.get(path, [])
        offs = [self.ex.offset(s.value, s.scn) for s in samples]
        tv = parse_value(k, t) if isinstance(t, str) else None
        anchor = ctx.plan.anchors.get(name)
        if anchor and isinstance(ctx.done.get(anchor.field), date):
            ta = ctx.tmpl.get(anchor.field)
            if tv is not None and isinstance(ta, str):  # the template's own gap, give or take a quarter
                d = time_gap(k, t, ta) * rng.uniform(0.75, 1.25)
            else:
                d = rng.uniform(anchor.lo, anchor.hi)
            d = min(max(round(d / anchor.grid) * anchor.grid, anchor.lo), anchor.hi)
            v: Any = ctx.done[anchor.field] + (timedelta(seconds=d) if is_dt else timedelta(days=d))
            now: date | datetime = self.clock if is_dt else self.clock.date()
            return min(v, now) if offs and max(offs) <= 0 else v  # stays on the side of "now" exemplars keep
        if tv is not None and ctx.scn >= 0:
            return self._from_template(tv, ctx.scn, samples)
        off = rng.uniform(min(offs), max(offs)) if offs else rng.uniform(-30, 30) * (86400 if is_dt else 1)
        if not is_dt:
            return self.clock.date() + timedelta(days=round(off))
        grid = _day_grid(samples) if samples else 60
        v = self.clock + timedelta(seconds=off)
        v = v.replace(microsecond=0) - timedelta(seconds=_sod(v) % grid)
        return v + timedelta(seconds=grid) if off > 0 and v <= self.clock else v

    def _from_template(self, tv: Any, scn: int, samples: list[Sample]) -> date | datetime:
        """The template's day offset from its clock × U(0.5, 1.5) from the new clock; a datetime keeps
        the template's time of day, give or take two steps of the exemplars' grid."""
        rng, was = self.rng, self.ex.clocks[scn]
        ddays = (tv if not isinstance(tv, datetime) else tv.date()) - was.date()
        days = round(ddays.days * rng.uniform(0.5, 1.5)) or (1 if ddays.days > 0 else -1 if ddays.days < 0 else 0)
        day = self.clock.date() + timedelta(days=days)
        if not isinstance(tv, datetime):
            return day
        grid = _day_grid(samples)
        tod: float = _sod(tv)
        if grid < 86400:
            tod = min(max(tod + rng.randint(-2, 2) * grid, 0), 86400 - grid)
        v = datetime.combine(day, time()) + timedelta(seconds=tod)
        if (v > self.clock) != (tv > was):  # the jitter crossed "now": the template's exact offset instead
            v = self.clock + (tv - was)
        return v

    def list_value(self, tp: Any, path: str, name: str, t: Any, ctx: Ctx) -> list[Any]:
        rng = self.rng
        etp = element_type(tp)
        ek, epath = kind_of(etp), f"{path}[]"
        n = len(t) if isinstance(t, list) else rng.choice(self.ex.lengths.get(path) or [0, 1, 2])
        vocab = list(dict.fromkeys(self.ex.values(epath)))
        if ek == "str" and vocab and not any("@" in v for v in vocab):  # tags, amenities, keywords
            return rng.sample(vocab, min(n, len(vocab)))
        sub = ctx.nested()
        sub.plan, sub.done, sub.tmpl = ctx.plan, ctx.done, ctx.tmpl
        own = {v for v in ctx.done.values() if isinstance(v, str)}  # attendees besides the organizer
        tl: list[Any] = t if isinstance(t, list) else []
        out: list[Any] = []
        for i in range(n):
            et = tl[i] if i < len(tl) else NO
            for _ in range(5):
                v = self.value(etp, ek, epath, name, et, sub)
                if ek == "model" or (v not in out and v not in own):
                    out.append(v)
                    break
                et = NO
        return out

    # ---- strings ---------------------------------------------------------------------------
    def string(self, name: str, path: str, t: Any, ctx: Ctx) -> str:
        """A string; unique in its collection when exemplars never repeat it within a scenario (subjects)."""
        v = self._string(name, path, t, ctx)
        if v and self.ex.unique_in_scenario(path):
            seen = self._distinct[path]
            for _ in range(3):
                if v not in seen:
                    break
                v = self._string(name, path, NO, ctx)
            if v in seen:  # an unused exemplar value, else fresh words
                every = [x for x in dict.fromkeys(self.ex.values(path)) if isinstance(x, str)]
                unused = [x for x in every if x not in seen]
                v = self.rng.choice(unused) if unused else self.text(every, len(v.split()) + 1)
            seen.add(v)
        return v

    def _string(self, name: str, path: str, t: Any, ctx: Ctx) -> str:
        rng, fk = self.rng, self.faker
        kind = _string_kind(self.ex, name, path, ctx.coll)
        every = kind.every
        vals = [v for v in self.ex.values(path, ctx.stratum) if isinstance(v, str)]  # what to imitate
        if t == "":
            return ""
        soft = self.ex.soft.get((ctx.coll, name)) if ctx.top else None
        if soft:
            pool = [r[soft[1]] for i, r in self.world[soft[0]].items() if self.batch_of[i] == self.batch]
            if pool:
                return str(rng.choice(pool))
        if kind.email:
            return self.email(every, t, ctx)
        if kind.person:
            name_ = lambda: f"{fk.first_name()} {fk.last_name()}"  # noqa: E731 - no "Mrs." or "MD"
            return str(self.repeat(("person", path), kind.repeat_rate, name_))
        if kind.unique is not None:
            return str(getattr(fk, kind.unique)())
        words = kind.words
        if kind.named:
            return self.unique_name(path, vals, words)
        if kind.long_text:
            return self.text(every, words)
        provider = getattr(fk, kind.provider) if kind.provider is not None else None
        distinct = self.ex.small_vocabulary(path)
        if distinct:  # a reused vocabulary: cities, currencies
            return self.pick_small(path, distinct, t, provider)
        distinct = list(dict.fromkeys(every))
        if provider is not None:
            return str(provider())
        if isinstance(t, str) and any(ch.isdigit() for ch in t) and " " not in t:
            return _shape(rng, t)  # an IBAN, a flight number, a seat: same shape, new digits
        return t if isinstance(t, str) else rng.choice(vals or distinct) if distinct else fk.word()

    def repeat(self, key: tuple[Any, ...], rate: float, make: Callable[[], Any]) -> Any:
        """A value already made for `key` in this batch with probability `rate`, else a new one."""
        pool = self._pools.setdefault((self.batch, *key), [])
        if pool and self.rng.random() < rate:
            return self.rng.choice(pool)
        v = make()
        pool.append(v)
        return v

    def email(self, every: Sequence[str], t: Any, ctx: Ctx) -> str:
        """An address at the template's (or the record's, or an exemplar) domain; the local part from the
        record's person when it has one, else a fresh name; people recur within a batch."""
        domains = list(dict.fromkeys(v.split("@", 1)[1] for v in every if "@" in v))
        dotted = any("." in v.split("@", 1)[0] for v in every)
        owner = ctx.done.get("name") if _PERSON_COLL.search(ctx.coll) else None
        near = [v.split("@", 1)[1] for v in ctx.done.values() if isinstance(v, str) and "@" in v]

        def make() -> str:
            if isinstance(t, str) and "@" in t and len(domains) <= 8:
                domain = t.split("@", 1)[1]
            elif near:
                domain = near[0]
            else:
                domain = self.rng.choice(domains) if 0 < len(domains) <= 8 else self.faker.domain_name()
            if isinstance(owner, str) and owner.split():
                first, last = owner.split()[0], owner.split()[-1]
            else:
                first, last = self.faker.first_name(), self.faker.last_name()
            return f"{slug(first)}.{slug(last)}@{domain}" if dotted else f"{slug(first)}@{domain}"

        if owner:  # the record's own person: never someone else's address
            return make()
        return str(self.repeat(("email", ctx.coll), self.ex.repeat_rate(self.ex.email_paths(ctx.coll)), make))

    def unique_name(self, path: str, vals: list[str], words: float) -> str:
        """A name unique in its collection: the first word of one exemplar and the last of another ("Tejo
        Lodge", "Desk light") or an unused exemplar name; a Faker sentence for long titles; a Faker
        surname when those run out."""
        rng, fk = self.rng, self.faker
        used = self._names[path]
        multi = [v.split() for v in vals if len(v.split()) >= 2]
        capital = sum(w[:1].isupper() for v in vals for w in v.split()) > sum(len(v.split()) for v in vals) / 2
        cand = ""
        for attempt in range(12):
            if words >= 4:
                cand = fk.sentence(nb_words=max(3, round(words))).rstrip(".")
                cand = string.capwords(cand) if capital else cand
            elif attempt < 8 and len(multi) >= 2 and rng.random() < 0.6:
                cand = f"{rng.choice(multi)[0]} {rng.choice(multi)[-1]}"
            elif attempt < 8 and vals:
                cand = rng.choice(vals)
            else:
                cand = f"{fk.last_name()} {rng.choice(multi)[-1]}" if multi else fk.last_name()
            if cand not in used:
                break
        else:
            cand = f"{cand} {len(used) + 1}"
        used.add(cand)
        return cand

    def text(self, vals: Sequence[str], words: float) -> str:
        n = max(3, round(words * self.rng.uniform(0.7, 1.3)))
        s = " ".join(self.faker.sentence(nb_words=min(n, 14)) for _ in range(max(1, n // 14)))
        return s if any(v.rstrip().endswith(".") for v in vals) else s.rstrip(".")

    def pick_small(self, path: str, distinct: list[str], t: Any, provider: Callable[[], Any] | None) -> str:
        """A value of a small reused vocabulary (a city, a currency): the template's, so that it stays
        consistent with the rest of the record; distractors mostly avoid the core batch's values, so a
        search by a core record's field tells it apart; a field that varies sometimes gets a Faker value."""
        rng = self.rng
        if len(distinct) >= 2 and provider is not None and rng.random() < self.s.fresh_rate:
            return str(provider())
        v = t if isinstance(t, str) and t in distinct else rng.choice(distinct)
        if self.batch > 0 and v in self._core_used[path] and rng.random() >= self.s.distractor_overlap:
            fresh = [d for d in distinct if d not in self._core_used[path]]
            if fresh:
                v = rng.choice(fresh)
            elif provider is not None and len(distinct) >= 2:
                return str(provider())
        if self.batch == 0:
            self._core_used[path].add(v)
        return v
