"""Field values for generated initial states, learned from an environment's shipped scenarios.

`Exemplars` walks every scenario dump with the state model's types and keeps, per value path
(`hotels.price_per_night`, `flights.fares.economy`, `tickets.comments[].created_at`), the values
seen, each with its scenario and its record, so that values can be read per *stratum*: records
that agree on their Literal and small-vocabulary fields (a light's levels apart from a blind's,
Lisbon's hotel names apart from Madrid's). `Plan` reads the relations between a model's fields out of the
exemplar records (references, copied fields, time anchors). `Maker` makes one value from a
template record, those statistics and the records generated so far. The rules are listed in
`envfactory.tasks.initial_state`.
"""

from __future__ import annotations

import random
import re
import string
import types
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from faker import Faker
from pydantic import BaseModel

if TYPE_CHECKING:
    from envfactory.tasks.initial_state import StateGenSettings

NO: Any = object()  # "no template value", unlike a template value of None
Kind = Literal[
    "model", "literal", "enum", "bool", "int", "float", "str", "datetime", "date", "time", "list", "dict", "any"
]

_PERSON_FIELD = re.compile(
    r"(guest|passenger|owner|customer|author|person|user|employee|member|contact|holder|recipient|client|patient)"
    r"(_name)?$"
)
_PERSON_COLL = re.compile(r"(customer|agent|author|user|person|people|passenger|guest|employee|member|contact|staff)")
_TEXT = re.compile(
    r"(description|abstract|text|comment|subject|reason|message|note|notes|request|requests|bio|summary|body)$"
)
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
_TIME_UNITS = (86400, 3600, 1800, 900, 300, 60, 1)


class FieldGenerationError(ValueError):
    """A field cannot be given a value (e.g. a required reference to a collection with no records)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


# ---- types ---------------------------------------------------------------------------------
def unwrap(tp: Any) -> tuple[Any, bool]:
    """(inner type, optional) of `X | None`; a union of several types reads as `Any`."""
    if get_origin(tp) in (Union, types.UnionType):
        args = get_args(tp)
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 else Any), len(inner) < len(args)
    return tp, False


def kind_of(tp: Any) -> Kind:
    origin = get_origin(tp)
    if origin is Literal:
        return "literal"
    if origin in (list, tuple, set, frozenset):
        return "list"
    if origin is dict:
        return "dict"
    if isinstance(tp, type):
        for base, k in _KINDS:  # order matters: Enum before str, bool before int, datetime before date
            if issubclass(tp, base):
                return k
    return "any"


_KINDS: list[tuple[type, Kind]] = [
    (Enum, "enum"),
    (BaseModel, "model"),
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (str, "str"),
    (datetime, "datetime"),
    (date, "date"),
    (time, "time"),
]


def allowed_values(tp: Any) -> list[Any]:
    return [m.value for m in tp] if kind_of(tp) == "enum" else list(get_args(tp))


def fields_of(model: type[BaseModel]) -> dict[str, tuple[Any, Kind, bool]]:
    """name → (inner type, kind, optional) for every field of a model."""
    out: dict[str, tuple[Any, Kind, bool]] = {}
    for name, info in model.model_fields.items():
        inner, optional = unwrap(info.annotation)
        out[name] = (inner, kind_of(inner), optional)
    return out


def collections_of(state_model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Collection fields (`dict[str, SomeRecord]`) of a state model → their record model."""
    out: dict[str, type[BaseModel]] = {}
    for name, (tp, k, _) in fields_of(state_model).items():
        args = get_args(tp)
        if k == "dict" and len(args) == 2 and kind_of(args[1]) == "model":
            out[name] = args[1]
    return out


def _parse(k: Kind, v: Any) -> Any:
    if isinstance(v, str) and k in ("datetime", "date", "time"):
        return {"datetime": datetime.fromisoformat, "date": date.fromisoformat, "time": time.fromisoformat}[k](v)
    return v


def _seconds(v: Any) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v)


def _grid(values: list[float]) -> float:
    """The coarsest time unit (a day, an hour, 15 minutes...) that divides every value."""
    return next((u for u in _TIME_UNITS if all(v % u == 0 for v in values)), 1)


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
    return len(repr(q).split(".")[1]) if q < 1 else 0


def singular(name: str) -> str:
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith(("ses", "xes")):
        return name[:-2]
    return name[:-1] if name.endswith("s") else name


# ---- exemplars ------------------------------------------------------------------------------
@dataclass
class Sample:
    value: Any
    scn: int
    inst: dict[str, Any]  # the model instance (record, nested line) the value belongs to


@dataclass
class Anchor:
    """A time field that follows an earlier one (an end after its start) by a delta in [lo, hi]."""

    field: str
    lo: float
    hi: float
    grid: float


@dataclass
class Plan:
    """What the exemplars say about the fields of one model (at one path)."""

    refs: dict[str, str] = field(default_factory=dict)  # field → referenced collection
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)  # field → (ref field, field of the referent)
    coherent: dict[str, tuple[str, str]] = field(
        default_factory=dict
    )  # ref → (earlier ref, field both referents share)
    anchors: dict[str, Anchor] = field(default_factory=dict)
    differ: dict[str, list[str]] = field(default_factory=dict)  # str field → earlier fields it never equals
    literal: list[str] = field(default_factory=list)
    strata: list[str] = field(default_factory=list)  # Literal fields, then str fields of a small vocabulary
    unique_refs: set[str] = field(default_factory=set)  # refs that never repeat within a scenario
    free: bool = True  # Literal fields may take values the template lacks (no optional field depends on them)


class Exemplars:
    """Statistics of an environment's shipped scenarios (normalized dumps), read with the state model's types."""

    def __init__(self, state_model: type[BaseModel], dumps: list[dict[str, Any]]) -> None:
        self.state_model = state_model
        self.collections = collections_of(state_model)
        self.dumps = dumps
        self.clocks = [datetime.fromisoformat(d["clock"]) for d in dumps]
        self.samples: dict[str, list[Sample]] = defaultdict(list)
        self.nulls: dict[str, int] = defaultdict(int)
        self.lengths: dict[str, list[int]] = defaultdict(list)
        self.instances: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        self.by_id = [{c: d.get(c, {}) for c in self.collections} for d in dumps]
        self.ids = {c: {k for scn in self.by_id for k in scn[c]} for c in self.collections}
        self.counters = list(dict.fromkeys(p for d in dumps for p in d.get("counters", {})))
        for scn, d in enumerate(dumps):
            for c, model in self.collections.items():
                for rec in d.get(c, {}).values():
                    self._walk(model, rec, c, scn, {})
            for f, info in state_model.model_fields.items():
                if f not in self.collections and f not in ("counters", "clock"):
                    self._walk(info.annotation, d.get(f), f"$.{f}", scn, {})
        self._plans: dict[str, Plan] = {}
        self._unique: dict[str, bool] = {}
        self.soft = self._soft_refs()

    def _walk(self, tp: Any, value: Any, path: str, scn: int, inst: dict[str, Any]) -> None:
        inner, _ = unwrap(tp)
        k = kind_of(inner)
        if value is None:
            self.nulls[path] += 1
        elif k == "model" and isinstance(value, dict):
            self.instances[path].append((scn, value))
            for f, info in inner.model_fields.items():
                self._walk(info.annotation, value.get(f), f"{path}.{f}", scn, value)
        elif k == "list" and isinstance(value, list):
            self.lengths[path].append(len(value))
            elem = (get_args(inner) or (Any,))[0]
            for v in value:
                self._walk(elem, v, f"{path}[]", scn, inst)
        elif k == "dict" and isinstance(value, dict):
            vt = (get_args(inner) or (Any, Any))[-1]
            for key, v in value.items():
                self._walk(vt, v, f"{path}.{key}", scn, inst)
        else:
            self.samples[path].append(Sample(_parse(k, value), scn, inst))

    # ---- per-path statistics ---------------------------------------------------------------
    def values(self, path: str, stratum: tuple[tuple[str, Any], ...] = ()) -> list[Any]:
        """Values seen at `path`: those of records that match the stratum ((field, value) pairs), relaxed
        from the last pair on until some match; all of them if none does."""
        samples = self.samples.get(path, [])
        for n in range(len(stratum), 0, -1):
            same = [s.value for s in samples if all(s.inst.get(f) == v for f, v in stratum[:n])]
            if same:
                return same
        return [s.value for s in samples]

    def small_vocabulary(self, path: str) -> list[Any]:
        """The distinct values at `path` when they are few (≤ 8) and reused (a city, a currency), else []."""
        every = [s.value for s in self.samples.get(path, [])]
        distinct = list(dict.fromkeys(every))
        return distinct if len(distinct) <= 8 and len(distinct) < len(every) else []

    def null_rate(self, path: str) -> float:
        n = self.nulls.get(path, 0)
        return n / (n + len(self.samples.get(path, []))) if n else 0.0

    def offset(self, value: Any, scn: int) -> float:
        """A date (days) or datetime (seconds) relative to its scenario's clock."""
        clock = self.clocks[scn]
        if isinstance(value, datetime):
            return (value - clock).total_seconds()
        return float((value - clock.date()).days)

    def repeat_rate(self, paths: list[str]) -> float:
        """How often a value repeats within one scenario (an owner holding several accounts)."""
        per: dict[int, list[Any]] = defaultdict(list)
        for p in paths:
            for s in self.samples.get(p, []):
                per[s.scn].append(s.value)
        total = sum(len(v) for v in per.values())
        repeats = sum(len(v) - len(set(v)) for v in per.values())
        return min(0.8, repeats / total) if total else 0.0

    def unique_in_scenario(self, path: str) -> bool:
        """No value repeats within a scenario, and some scenario holds several (ticket subjects, IBANs)."""
        if path not in self._unique:
            per: dict[int, list[Any]] = defaultdict(list)
            for s in self.samples.get(path, []):
                per[s.scn].append(s.value)
            self._unique[path] = any(len(v) > 1 for v in per.values()) and all(
                len(v) == len(set(v)) for v in per.values()
            )
        return self._unique[path]

    def email_paths(self, coll: str) -> list[str]:
        """Paths of a collection that hold email addresses (an organizer and attendees share people)."""
        return [
            p
            for p, ss in self.samples.items()
            if p.startswith(f"{coll}.") and all(isinstance(s.value, str) and "@" in s.value for s in ss)
        ]

    def ref_target(self, path: str, name: str, tp: Any) -> str | None:
        """The collection a field references: its exemplar values are that collection's ids, or it is
        named `<x>_id` / `<x>_ids` after the collection."""
        if name == "id":
            return None
        k = kind_of(tp)
        vpath = path
        if k == "list":
            tp = unwrap((get_args(tp) or (Any,))[0])[0]
            k, vpath = kind_of(tp), f"{path}[]"
        if k != "str":
            return None
        m = re.fullmatch(r"(.+)_ids?", name)
        by_name = None
        if m:
            stem = m.group(1)
            for cand in (stem, stem.split("_")[-1]):
                by_name = next(
                    (c for c in self.collections if singular(c) == cand or singular(c).endswith("_" + cand)), None
                )
                if by_name:
                    break
        vals = [v for v in self.values(vpath) if v]
        if vals:
            hits = [c for c in self.collections if all(v in self.ids[c] for v in vals)]
            if hits:
                return by_name if by_name in hits else hits[0]
        return by_name

    # ---- relations between fields ----------------------------------------------------------
    def plan(self, model: type[BaseModel], path: str) -> Plan:
        if path in self._plans:
            return self._plans[path]
        fields = fields_of(model)
        insts = self.instances.get(path, [])
        p = Plan(literal=[f for f, (_, k, _) in fields.items() if k in ("literal", "enum")])
        vocab = [f for f, (_, k, _) in fields.items() if k == "str" and self.small_vocabulary(f"{path}.{f}")]
        p.strata = p.literal + vocab
        for f, (tp, _, _) in fields.items():
            target = self.ref_target(f"{path}.{f}", f, tp)
            if target:
                p.refs[f] = target
        scalar_refs = [r for r in p.refs if kind_of(fields[r][0]) == "str"]
        for f in fields:
            if f == "id":
                continue
            for r in scalar_refs:
                g = self._copied_from(insts, f, r, p.refs[r]) if r != f else None
                if g:
                    p.derived[f] = (r, g)
                    break
        p.derived = {f: src for f, src in p.derived.items() if src[0] not in p.derived}
        for r in scalar_refs:
            per: dict[int, list[Any]] = defaultdict(list)
            for scn, inst in insts:
                if inst.get(r) is not None:
                    per[scn].append(inst[r])
            if per and all(len(v) == len(set(v)) for v in per.values()):
                p.unique_refs.add(r)
        for i, r2 in enumerate(scalar_refs):
            for r1 in scalar_refs[:i]:
                shared = self._shared_field(insts, r1, r2, p.refs[r1], p.refs[r2])
                if shared:
                    p.coherent[r2] = (r1, shared)
                    break
        temporal = [f for f, (_, k, _) in fields.items() if k in ("date", "datetime")]
        for i, f in enumerate(temporal):
            best: tuple[float, Anchor] | None = None
            for g in temporal[:i]:
                if fields[g][1] != fields[f][1]:
                    continue
                ds = [self._delta(fields[f][1], inst[f], inst[g]) for _, inst in insts if inst.get(f) and inst.get(g)]
                if ds and min(ds) >= 0 and (best is None or max(ds) < best[0]):
                    best = (max(ds), Anchor(g, min(ds), max(ds), _grid(ds) if fields[f][1] == "datetime" else 1))
            if best:
                p.anchors[f] = best[1]
        strs = [f for f, (_, k, _) in fields.items() if k == "str" and f != "id" and f not in p.refs]
        for i, f in enumerate(strs):
            for g in strs[:i]:
                pairs = [(inst.get(f), inst.get(g)) for _, inst in insts]
                vf, vg = {a for a, _ in pairs}, {b for _, b in pairs}
                if vf & vg - {None} and all(a != b for a, b in pairs):
                    p.differ.setdefault(f, []).append(g)
        optional = [f for f, (_, _, opt) in fields.items() if opt]
        p.free = not any(len({inst.get(f) is None for _, inst in insts}) > 1 for f in optional)
        self._plans[path] = p
        return p

    @staticmethod
    def _delta(k: Kind, a: Any, b: Any) -> float:
        da, db = _parse(k, a), _parse(k, b)
        return _seconds(da - db) if k == "datetime" else float((da - db).days)

    def referent(self, scn: int, coll: str, rid: Any) -> dict[str, Any] | None:
        return self.by_id[scn][coll].get(rid) if isinstance(rid, str) else None

    def _copied_from(self, insts: list[tuple[int, dict[str, Any]]], f: str, r: str, coll: str) -> str | None:
        """The field of the referenced record that `f` always equals in the exemplars (a line's name)."""
        rec_fields = [g for g in self.collections[coll].model_fields if g != "id"]
        for g in sorted(rec_fields, key=lambda g: g != f):  # the same name first
            checked = 0
            for scn, inst in insts:
                ref = self.referent(scn, coll, inst.get(r))
                if ref is None or inst.get(f) is None:
                    continue
                if ref.get(g) != inst[f]:
                    break
                checked += 1
            else:
                if checked >= (1 if g == f else 2):
                    return g
        return None

    def _shared_field(self, insts: list[tuple[int, dict[str, Any]]], r1: str, r2: str, c1: str, c2: str) -> str | None:
        """A field both referents always agree on (a transfer's account and payee have one owner)."""
        common = [g for g in self.collections[c1].model_fields if g in self.collections[c2].model_fields and g != "id"]
        for g in common:
            pairs = [
                (a.get(g), b.get(g))
                for scn, inst in insts
                if (a := self.referent(scn, c1, inst.get(r1))) and (b := self.referent(scn, c2, inst.get(r2)))
            ]
            if pairs and all(x == y and x is not None for x, y in pairs):
                return g
        return None

    def _soft_refs(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Str fields whose exemplar values all occur in another collection's field (payee owners are
        account owners): generated values are drawn from that field's generated values."""
        all_ids = set().union(*self.ids.values()) if self.ids else set()
        out: dict[tuple[str, str], tuple[str, str]] = {}
        strs = [
            (c, f)
            for c, model in self.collections.items()
            for f, (_, k, _) in fields_of(model).items()
            if k == "str" and f != "id"
        ]
        for c, f in strs:
            s1 = set(self.values(f"{c}.{f}"))
            if not s1 or s1 & all_ids or s1 == {""}:
                continue
            for c2, g in strs:
                s2 = set(self.values(f"{c2}.{g}"))
                if c2 != c and s1 <= s2 and (f == g or len(s2) >= 2):
                    out[(c, f)] = (c2, g)
                    break
        return out

    def dependencies(self, coll: str) -> list[str]:
        """Collections a collection's records reference (nested models included), in field order."""
        deps: list[str] = []
        seen: set[type[BaseModel]] = set()

        def visit(model: type[BaseModel], path: str) -> None:
            seen.add(model)
            deps.extend(self.plan(model, path).refs.values())
            for f, (tp, k, _) in fields_of(model).items():
                sub = f"{path}.{f}"
                while k in ("list", "dict"):
                    sub += "[]" if k == "list" else ".*"
                    tp = unwrap((get_args(tp) or (Any,))[-1])[0]
                    k = kind_of(tp)
                if k == "model" and tp not in seen:
                    visit(tp, sub)

        visit(self.collections[coll], coll)
        deps.extend(src for (c, _), (src, _) in self.soft.items() if c == coll)
        return list(dict.fromkeys(d for d in deps if d != coll))


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
            return _parse("time", t) if isinstance(t, str) else rng.choice(self.ex.values(path) or [time(12, 0)])
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
        vals = [
            float(v) for v in self.ex.values(path, stratum) if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        if not vals:  # nothing to imitate: small and non-negative
            return rng.randint(0, 10) if is_int else round(rng.uniform(0, 100), 2)
        lo, hi = min(vals), max(vals)
        q = _quantum(vals, is_int)
        magnitude = bool(_MAGNITUDE.search(name.lower()))
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
        tv = _parse(k, t) if isinstance(t, str) else None
        anchor = ctx.plan.anchors.get(name)
        if anchor and isinstance(ctx.done.get(anchor.field), date):
            ta = ctx.tmpl.get(anchor.field)
            if tv is not None and isinstance(ta, str):  # the template's own gap, give or take a quarter
                d = Exemplars._delta(k, t, ta) * rng.uniform(0.75, 1.25)
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
        grid = _grid([_sod(s.value) for s in samples]) if samples else 60
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
        grid = _grid([_sod(s.value) for s in samples])
        tod: float = _sod(tv)
        if grid < 86400:
            tod = min(max(tod + rng.randint(-2, 2) * grid, 0), 86400 - grid)
        v = datetime.combine(day, time()) + timedelta(seconds=tod)
        if (v > self.clock) != (tv > was):  # the jitter crossed "now": the template's exact offset instead
            v = self.clock + (tv - was)
        return v

    def list_value(self, tp: Any, path: str, name: str, t: Any, ctx: Ctx) -> list[Any]:
        rng = self.rng
        etp = unwrap((get_args(tp) or (Any,))[0])[0]
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
        rng, fk, low = self.rng, self.faker, name.lower()
        every = [v for v in self.ex.values(path) if isinstance(v, str)]  # what kind of string this is
        vals = [v for v in self.ex.values(path, ctx.stratum) if isinstance(v, str)]  # what to imitate
        if t == "":
            return ""
        soft = self.ex.soft.get((ctx.coll, name)) if ctx.top else None
        if soft:
            pool = [r[soft[1]] for i, r in self.world[soft[0]].items() if self.batch_of[i] == self.batch]
            if pool:
                return str(rng.choice(pool))
        if "email" in low or (every and all("@" in v for v in every)):
            return self.email(every, t, ctx)
        person = bool(_PERSON_FIELD.search(low)) or (low == "name" and bool(_PERSON_COLL.search(ctx.coll)))
        if person and not any(ch.isdigit() for v in every for ch in v):
            name_ = lambda: f"{fk.first_name()} {fk.last_name()}"  # noqa: E731 - no "Mrs." or "MD"
            return str(self.repeat(("person", path), self.ex.repeat_rate([path]), name_))
        unique = next((getattr(fk, p) for rx, p in _UNIQUE_PROVIDERS if rx.search(low)), None)
        if unique is not None:
            return str(unique())
        words = sum(len(v.split()) for v in every) / len(every) if every else 2.0
        if low in ("name", "title") or low.endswith(("_name", "_title")):
            return self.unique_name(path, vals, words)
        if _TEXT.search(low) and words >= 6:
            return self.text(every, words)
        provider = next((getattr(fk, p) for rx, p in _PROVIDERS if rx.search(low)), None)
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

    def email(self, every: list[str], t: Any, ctx: Ctx) -> str:
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

    def text(self, vals: list[str], words: float) -> str:
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


def _sod(v: datetime) -> int:
    return v.hour * 3600 + v.minute * 60 + v.second
