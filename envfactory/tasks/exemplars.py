"""How an environment's shipped scenarios (its *exemplars*) read, with the state model's types.

Types: a field's kind (`Literal`, `Enum`, model, list, date...) and optionality, a state model's
collections (`dict[str, SomeRecord]` fields), ISO strings parsed to dates and times, time gaps and
grids. `Exemplars` walks every scenario dump and keeps, per value path (`hotels.price_per_night`,
`flights.fares.economy`, `tickets.comments[].created_at`), the values seen, each with its scenario
and its record, so that values can be read per *stratum*: records that agree on their Literal and
small-vocabulary fields (a light's levels apart from a blind's, Lisbon's hotel names apart from
Madrid's). `Plan` holds the relations between a model's fields read out of the exemplar records
(references, copied fields, time anchors). Values are made from these in `envfactory.tasks.state_values`.
"""

from __future__ import annotations

import re
import types
import weakref
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from envfactory.words import singular

# what a field holds, as the value makers tell them apart (see `kind_of`)
Kind = Literal[
    "model", "literal", "enum", "bool", "int", "float", "str", "datetime", "date", "time", "list", "dict", "any"
]
_TIME_UNITS = (86400, 3600, 1800, 900, 300, 60, 1)


# ---- types ---------------------------------------------------------------------------------
def unwrap(tp: Any) -> tuple[Any, bool]:
    """(inner type, optional) of `X | None`; a union of several types reads as `Any`."""
    if get_origin(tp) in (Union, types.UnionType):
        args = get_args(tp)
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 else Any), len(inner) < len(args)
    return tp, False


def kind_of(tp: Any) -> Kind:
    """The kind of a (non-optional) type; a union or an unknown type is "any"."""
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
    """The values a Literal or an Enum allows."""
    return [m.value for m in tp] if kind_of(tp) == "enum" else list(get_args(tp))


def element_type(tp: Any) -> Any:
    """The (non-optional) element type of a list type."""
    return unwrap((get_args(tp) or (Any,))[0])[0]


_FIELDS: weakref.WeakKeyDictionary[type[BaseModel], Mapping[str, tuple[Any, Kind, bool]]] = weakref.WeakKeyDictionary()


def fields_of(model: type[BaseModel]) -> Mapping[str, tuple[Any, Kind, bool]]:
    """name → (inner type, kind, optional) for every field of a model (worked out once per model: read-only)."""
    out = _FIELDS.get(model)
    if out is None:
        made: dict[str, tuple[Any, Kind, bool]] = {}
        for name, info in model.model_fields.items():
            inner, optional = unwrap(info.annotation)
            made[name] = (inner, kind_of(inner), optional)
        out = types.MappingProxyType(made)
        if getattr(model, "__pydantic_complete__", True):  # (a model still waiting on a forward reference: not kept)
            _FIELDS[model] = out
    return out


def collections_of(state_model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Collection fields (`dict[str, SomeRecord]`) of a state model → their record model."""
    out: dict[str, type[BaseModel]] = {}
    for name, (tp, k, _) in fields_of(state_model).items():
        args = get_args(tp)
        if k == "dict" and len(args) == 2 and kind_of(args[1]) == "model":
            out[name] = args[1]
    return out


def parse_value(k: Kind, v: Any) -> Any:
    """An ISO string of a date, datetime or time field as that value; anything else as it is."""
    if isinstance(v, str) and k in ("datetime", "date", "time"):
        return {"datetime": datetime.fromisoformat, "date": date.fromisoformat, "time": time.fromisoformat}[k](v)
    return v


def time_grid(values: list[float]) -> float:
    """The coarsest time unit (a day, an hour, 15 minutes...) that divides every value."""
    return next((u for u in _TIME_UNITS if all(v % u == 0 for v in values)), 1)


def time_gap(k: Kind, later: Any, earlier: Any) -> float:
    """`later` − `earlier`: days between two dates, seconds between two datetimes (either may be ISO)."""
    gap = parse_value(k, later) - parse_value(k, earlier)
    if k != "datetime":
        return float(gap.days)
    return gap.total_seconds() if isinstance(gap, timedelta) else float(gap)


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
        self._seen: dict[tuple[str, Any], tuple[Any, ...]] = {}  # `values`, read many times a state
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
            self.samples[path].append(Sample(parse_value(k, value), scn, inst))

    # ---- per-path statistics ---------------------------------------------------------------
    def values(self, path: str, stratum: tuple[tuple[str, Any], ...] = ()) -> list[Any]:
        """Values seen at `path`: those of records that match the stratum ((field, value) pairs), relaxed
        from the last pair on until some match; all of them if none does."""
        try:  # (equal keys filter alike: the match below is `==` too)
            got = self._seen.get((path, stratum))
        except TypeError:  # a stratum value that is a list: worked out each time
            return self._values(path, stratum)
        if got is None:
            got = self._seen[(path, stratum)] = tuple(self._values(path, stratum))
        return list(got)

    def _values(self, path: str, stratum: tuple[tuple[str, Any], ...]) -> list[Any]:
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
        """How often `path` is None."""
        n = self.nulls.get(path, 0)
        return n / (n + len(self.samples.get(path, []))) if n else 0.0

    def offset(self, value: Any, scn: int) -> float:
        """A date (days) or datetime (seconds) relative to its scenario's clock."""
        clock = self.clocks[scn]
        if isinstance(value, datetime):
            return (value - clock).total_seconds()
        return float((value - clock.date()).days)

    def _per_scenario(self, paths: list[str]) -> dict[int, list[Any]]:
        """Scenario → the values seen at `paths` in it."""
        per: dict[int, list[Any]] = defaultdict(list)
        for p in paths:
            for s in self.samples.get(p, []):
                per[s.scn].append(s.value)
        return per

    def repeat_rate(self, paths: list[str]) -> float:
        """How often a value repeats within one scenario (an owner holding several accounts)."""
        per = self._per_scenario(paths)
        total = sum(len(v) for v in per.values())
        repeats = sum(len(v) - len(set(v)) for v in per.values())
        return min(0.8, repeats / total) if total else 0.0

    def unique_in_scenario(self, path: str) -> bool:
        """No value repeats within a scenario, and some scenario holds several (ticket subjects, IBANs)."""
        if path not in self._unique:
            per = self._per_scenario([path])
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
            tp = element_type(tp)
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
        """The relations between the fields of `model` at `path` (read once per path)."""
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
        scalar_refs = [r for r in p.refs if fields[r][1] == "str"]
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
                ds = [time_gap(fields[f][1], inst[f], inst[g]) for _, inst in insts if inst.get(f) and inst.get(g)]
                if ds and min(ds) >= 0 and (best is None or max(ds) < best[0]):
                    best = (max(ds), Anchor(g, min(ds), max(ds), time_grid(ds) if fields[f][1] == "datetime" else 1))
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

    def referent(self, scn: int, coll: str, rid: Any) -> dict[str, Any] | None:
        """The record of `coll` with id `rid` in exemplar scenario `scn`."""
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
        # depth first, in field order, with a stack: a recursive closure would be a reference cycle (it holds
        # itself), keeping this object and all it holds for the cyclic collector
        stack: list[tuple[type[BaseModel], str]] = [(self.collections[coll], coll)]
        while stack:
            model, path = stack.pop()
            if model in seen:
                continue
            seen.add(model)
            deps.extend(self.plan(model, path).refs.values())
            nested: list[tuple[type[BaseModel], str]] = []
            for f, (tp, k, _) in fields_of(model).items():
                sub = f"{path}.{f}"
                while k in ("list", "dict"):
                    sub += "[]" if k == "list" else ".*"
                    tp = unwrap((get_args(tp) or (Any,))[-1])[0]
                    k = kind_of(tp)
                if k == "model":
                    nested.append((tp, sub))
            stack.extend(reversed(nested))
        deps.extend(src for (c, _), (src, _) in self.soft.items() if c == coll)
        return list(dict.fromkeys(d for d in deps if d != coll))
