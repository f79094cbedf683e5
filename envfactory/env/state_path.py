"""Paths into a state dump: one syntax and one resolver, for the verifier's assertions and the checks' scenarios.

The syntax is the one `StateDiff` writes: object keys joined by dots, list indices in brackets
(`bookings.BK-0001.status`, `hotels.HT-LIS-01.amenities[1]`, `[0].id`, `a[1].b[0]`). Reading one:

- a key may itself hold dots (an id like `a.txt`): among the keys a run of dotted words can form, the
  longest that exists and leads somewhere wins (`files.a.txt.size`);
- a key written `["..."]` (a JSON string) is that key exactly, whatever it holds (`files["a.txt"].size`,
  `["x[0]"]`): `leaf_paths` writes a key so when the bare form could mean another;
- `[i]` indexes a list (`-1` is the last item); a bare number after a dot on a list indexes it too, which
  is how the scenario files' `expect_state` keys (`log.0.op`) read in this syntax with nothing converted.

`resolve_path` gives `MISSING` for a path that leads nowhere; `get_path` raises `KeyError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MISSING: Any = object()  # what `resolve_path` returns for a path that leads nowhere

_INDEX = re.compile(r"\[(-?\d+)\]")
_NUMERAL = re.compile(r"-?\d+")
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class _Key:
    name: str
    bare: bool  # written without quotes: it may join the bare keys after it into one dotted key


Segment = _Key | int


def _quoted(path: str, at: int) -> tuple[str, int] | None:
    """A `["..."]` key starting at `path[at] == "["`: the key and where it ends, or None."""
    if not path.startswith('["', at):
        return None
    try:
        key, end = _JSON.raw_decode(path, at + 1)
    except json.JSONDecodeError:
        return None
    if not isinstance(key, str) or not path.startswith("]", end):
        return None
    return key, end + 1


def parse_path(path: str) -> list[Segment]:
    """The segments of `path` (the syntax in the module docstring); `""` is the whole dump."""
    out: list[Segment] = []
    if not path:
        return out
    at, bare, start = 0, "", True
    while at <= len(path):
        char = path[at] if at < len(path) else "."
        if char == ".":
            if bare or start:  # `a..b`: an empty key between the dots, as a dotted path has it
                out.append(_Key(bare, True))
            at, bare, start = at + 1, "", True
            continue
        if char == "[":
            index = _INDEX.match(path, at)
            quoted = None if index else _quoted(path, at)
            if index or quoted:
                if bare:
                    out.append(_Key(bare, True))
                if index:
                    out.append(int(index.group(1)))
                    at = index.end()
                elif quoted:
                    out.append(_Key(quoted[0], False))
                    at = quoted[1]
                bare, start = "", False
                continue
        bare += char
        at += 1
    return out


def resolve_path(data: Any, path: str) -> Any:
    """The value at `path` in `data`, or `MISSING`."""
    return _resolve(data, parse_path(path), 0)


def get_path(data: Any, path: str) -> Any:
    """The value at `path` in `data` (`bookings.BK-0001.status`, `[0].id`); KeyError if absent."""
    found = resolve_path(data, path)
    if found is MISSING:
        raise KeyError(path)
    return found


def _resolve(node: Any, segments: list[Segment], i: int) -> Any:
    if i == len(segments):
        return node
    seg = segments[i]
    if isinstance(seg, int):
        if isinstance(node, list) and -len(node) <= seg < len(node):
            return _resolve(node[seg], segments, i + 1)
        return MISSING
    if isinstance(node, dict):
        if not seg.bare:
            return _resolve(node[seg.name], segments, i + 1) if seg.name in node else MISSING
        run = [seg.name]  # the bare keys from here on, one dotted key between them
        for later in segments[i + 1 :]:
            if not (isinstance(later, _Key) and later.bare):
                break
            run.append(later.name)
        for j in range(len(run), 0, -1):  # the longest dotted key first
            key = ".".join(run[:j])
            if key in node:
                found = _resolve(node[key], segments, i + j)
                if found is not MISSING:
                    return found
        return MISSING
    if isinstance(node, list) and seg.bare and _NUMERAL.fullmatch(seg.name):
        index = int(seg.name)
        return _resolve(node[index], segments, i + 1) if -len(node) <= index < len(node) else MISSING
    return MISSING


def _key_text(key: str, siblings: dict[str, Any]) -> str:
    """`key` as written in a path of `siblings`' object: bare unless that could be read as another key."""
    plain = key and not any(c in key for c in '.["') and not any(k.startswith(key + ".") for k in siblings)
    return key if plain else f"[{json.dumps(key, ensure_ascii=False)}]"


def leaf_paths(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf of `data` (a value that is no object or list, or an empty one), each path
    one that `resolve_path` reads back to that very leaf."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            text = _key_text(str(key), data)
            yield from leaf_paths(value, f"{prefix}.{text}" if prefix and not text.startswith("[") else prefix + text)
    elif isinstance(data, list) and data:
        for i, value in enumerate(data):
            yield from leaf_paths(value, f"{prefix}[{i}]")
    else:
        yield prefix, data
