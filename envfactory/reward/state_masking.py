"""State masking for R_state: where the ground truth's masked argument values landed in a state
(`masked_value_blanks`, `apply_blanks`), and `fast_canonical`, the verifier's canonical form without
walking unchanged records."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic_core import to_json

from envfactory.env.diff import state_part
from envfactory.records.models import MaskSpec
from envfactory.records.verifier import MASKED, canonical, new_ids, record_collections, replace_ids

Blank = tuple[str | None, tuple[str | None, ...]]  # (collection or None for a top-level field, path; None = any index)


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
    colls = set(record_collections(goal))
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


def fast_canonical(
    initial: dict[str, Any], final: dict[str, Any], mask: MaskSpec, initial_json: Callable[[], bytes] | None = None
) -> dict[str, Any]:
    """Equal to the verifier's `canonical(initial, final, mask)`, without walking unchanged records.

    Records equal to their initial version are kept as they are — exact when no generated id occurs
    anywhere in the initial state as a string (checked on `initial_json()`, the initial state as
    `pydantic_core.to_json` writes it; a match, even a spurious one, falls back); otherwise, and for
    masks with `paths`, the verifier's own function runs."""
    final = state_part(final)  # runtime keys (a seeded RNG's position) are no state
    if mask.paths or not mask.generated_ids:
        return canonical(initial, final, mask)
    colls = record_collections(final)
    ids = new_ids(initial, final, colls)
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
            out[key] = replace_ids(value, ids)
            continue
        before = initial.get(key)
        known = before if isinstance(before, dict) else {}
        kept: dict[str, Any] = {}
        created = []
        for rid, record in value.items():
            if rid in ids:
                created.append(replace_ids(record, ids))
            elif (old := known.get(rid)) is record or old == record:
                kept[rid] = record
            else:
                kept[rid] = replace_ids(record, ids)
        if created:
            kept["<new>"] = sorted(created, key=json.dumps) if len(created) > 1 else created  # (one: no key made)
        out[key] = kept
    return out
