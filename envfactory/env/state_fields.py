"""A state dumped and validated field by field, against a known dump of it.

Dumped (`touched_dump`): a state forked from a known dump, serialized only in the top-level fields its change
log touched (π* reads its sessions' records at every call it binds; the reward dumps a replay that differs).
Validated (`FieldWise`): when a state model validates and dumps each top-level field on its own, a state that
differs from a known, validated one in a few fields — or in a few records of its collections — is validated and
dumped in those alone (the reward's goal states against the initial state they start from)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from envfactory.env.state import State

_OWN_POST_INITS = {"BaseModel.model_post_init", "init_private_attributes"}  # pydantic's, not a model's own
_MISSING = object()
_NOT_SCHEMA = frozenset({"cls", "metadata"})  # a schema's keys that hold the class and annotations, not schemas
_KNOWN: weakref.WeakKeyDictionary[Any, FieldWise | None] = weakref.WeakKeyDictionary()  # by state model


# schema types whose values, validated from anything equal (`==`) to a dump of theirs, dump to that very dump: a
# model dumps in its fields' order; an int, float or bool field turns 1, 1.0 and true into its own type. Not here:
# dicts and `Any` (an input's key order is kept), unions and `Any` (an input's JSON type is kept: 1 and 1.0), and
# literals of anything but strings (true is not 1 there)
_PLAIN = {
    "model", "model-fields", "model-field", "default", "nullable", "enum", "str", "int", "float", "bool", "none",
    "date", "datetime", "time", "timedelta", "decimal", "uuid", "list", "tuple",
}  # fmt: skip


@dataclass(frozen=True)
class FieldWise:
    """How `model` may be validated in parts: `keyed` are its collections (dicts with plain string keys,
    no length bounds), whose records are validated one by one; `ordered` the fields whose values (a
    collection's records) may hold what `==` does not tell apart but a dump keeps (a dict's key order, 1 and
    1.0 in a union): those are compared by their JSON text."""

    model: type[State]
    keyed: frozenset[str]
    ordered: frozenset[str]

    @staticmethod
    def of(model: Any) -> FieldWise | None:
        """`_of(model)`, worked out once per model (its schema walked)."""
        try:
            return _KNOWN[model]
        except (KeyError, TypeError):
            pass
        found = _of(model)
        with contextlib.suppress(TypeError):
            _KNOWN[model] = found
        return found

    def dump(self, known: dict[str, Any], goal: dict[str, Any], source: str) -> dict[str, Any] | None:
        """`model.load_bytes(to_json(goal)).dump()` where `known` is such a dump (of a validated state): only
        what differs from it validated and dumped. None when `goal` lacks or adds a field, or when the parts do
        not validate alone (a field without a default, a bad value): the caller validates the whole goal, whose
        error is the one to report."""
        if goal.keys() != known.keys():
            return None
        parts: dict[str, Any] = {}
        for key, value in goal.items():
            old, ordered = known[key], key in self.ordered
            if key in self.keyed and isinstance(value, dict) and isinstance(old, dict):
                if value == old and list(value) == list(old) and not ordered:
                    continue
                parts[key] = {rid: r for rid, r in value.items() if not _same(old.get(rid, _MISSING), r, ordered)}
            elif not _same(old, value, ordered):
                parts[key] = value
        try:
            dumped = self.model.load_bytes(to_json(parts), source).model_dump(mode="json", include=set(parts))
            out = dict(known)
            for key in parts:
                value, old, new = goal[key], known[key], dumped[key]
                if key in self.keyed and isinstance(value, dict) and isinstance(old, dict):
                    out[key] = {rid: new[rid] if rid in new else old[rid] for rid in value}
                else:
                    out[key] = new
        except Exception:  # (a key the model rewrote, which `of` should have ruled out: the whole way)
            return None
        return out


def _of(model: Any) -> FieldWise | None:
    """For a `State` with the base class's load and dump, no validator, serializer, `__init__` or post-init of its
    own anywhere in its schema, no strict field, no computed field and no extra fields; else None (validating a
    dump again might not give the same value back, or fields might see each other)."""
    if not (isinstance(model, type) and issubclass(model, State)):
        return None
    if model.dump is not State.dump or model.load_bytes.__func__ is not State.load_bytes.__func__:  # type: ignore[attr-defined]
        return None
    if model.model_computed_fields or model.model_config.get("extra") == "allow":
        return None
    if getattr(model.model_post_init, "__qualname__", "") not in _OWN_POST_INITS:
        return None
    schema = model.__pydantic_core_schema__
    if _has_code(schema) or _renames(schema):
        return None
    found = _fields(schema)
    if found is None:  # a schema of definitions (a model that refers to itself): not read here
        return None
    keyed, ordered = found
    return FieldWise(model, frozenset(keyed), frozenset(ordered))


def _same(a: Any, b: Any, ordered: bool) -> bool:
    """`a == b`, and with `ordered` their JSON texts equal too (the keys of their dicts in the same order; stricter
    than the order alone, which only sends more to be validated)."""
    if a != b:
        return False
    if not ordered:
        return True
    try:
        return to_json(a) == to_json(b)
    except Exception:  # a value JSON cannot hold: validated, which says what it makes of it
        return False


def _nodes(schema: Any, skip: frozenset[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """Every dict of a pydantic-core schema, depth first (the values under the keys in `skip` not entered)."""
    if isinstance(schema, dict):
        yield schema
        for k, v in schema.items():
            if k not in skip:
                yield from _nodes(v, skip)
    elif isinstance(schema, list | tuple):
        for v in schema:
            yield from _nodes(v, skip)


def _has_code(schema: Any) -> bool:
    """Whether a pydantic-core schema runs code of its own anywhere (a function validator or serializer, a model's
    own `__init__`) or is strict somewhere."""
    return any(
        (isinstance(kind := node.get("type"), str) and kind.startswith("function"))
        or node.get("strict") is True
        or node.get("custom_init") is True
        for node in _nodes(schema)
    )


def _renames(schema: Any) -> bool:
    """Whether validation may turn a key or a field's name into another: a string setting of a model's config
    (`str_to_lower`, `str_strip_whitespace`... apply to dict keys too) or an alias (a dump is by field name)."""
    return any(
        (
            isinstance(config := node.get("config"), dict)
            and any(k.startswith("str_") or k == "coerce_numbers_to_str" for k in config)
        )
        or "validation_alias" in node
        for node in _nodes(schema, _NOT_SCHEMA)
    )


def _fields(schema: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """(keyed, ordered): the model's fields whose schema is a dict with plain string keys and no length bounds
    (its values are validated each on its own, keys kept as they are), and the fields whose values (a keyed
    field's records) may hold a value `==` cannot tell from another that dumps otherwise (`_plain`)."""
    while schema.get("type") in ("definitions", "model"):
        schema = schema["schema"]
    if schema.get("type") != "model-fields":
        return None
    keyed, ordered = [], []
    for name, field in schema.get("fields", {}).items():
        inner = field.get("schema", {})
        while inner.get("type") == "default":
            inner = inner.get("schema", {})
        keys = inner.get("keys_schema", {"type": "any"})
        values = inner
        if (
            inner.get("type") == "dict"
            and keys.get("type") == "str"
            and set(keys) <= {"type", "metadata"}
            and not {"min_length", "max_length"} & set(inner)
        ):
            keyed.append(name)
            values = inner.get("values_schema", {"type": "any"})
        if not _plain(values):
            ordered.append(name)
    return keyed, ordered


def _plain(schema: Any) -> bool:
    """Whether every value `schema` validates dumps the same from any input equal (`==`) to that dump (`_PLAIN`)."""
    return all(_plain_node(node) for node in _nodes(schema, _NOT_SCHEMA | {"ref", "config"}))


def _plain_node(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    if kind == "literal":
        return all(isinstance(v, str) for v in node.get("expected", [None]))
    if isinstance(kind, str) and kind not in _PLAIN:
        return False
    return not (kind == "model" and node.get("config", {}).get("extra_fields_behavior") == "allow")


def touched_dump(state: State, initial: Mapping[str, Any]) -> dict[str, Any] | None:
    """`state.dump()` for a state forked from the dump `initial`, serializing only the top-level fields its
    change log touched (the rest is `initial`'s, shared: read-only). None for a state model that dumps
    itself its own way (the caller dumps the whole state)."""
    if type(state).dump is not State.dump:
        return None
    touched = {entry.collection for entry in state.log_since(0)}
    if not touched <= initial.keys():
        return None
    return {**initial, **state.model_dump(mode="json", include=touched)}
