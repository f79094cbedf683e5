"""A BFCL instance's state as JSON data: `to_jsonable`, the file-system dump, and what is not state.

The file tree of `GorillaFileSystem` is dumped in BFCL's own config format
(`{"root": {name: {"type": "directory", "contents": {...}}}}`), its working directory as a path.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
import sys
from typing import Any

from envfactory.errors import EnvError

# Attributes that are not scenario state, so no dump holds them:
# - `_api_description`: a constant string;
# - `_random`: the seeded RNG behind ids, tokens and sensor readings. It is deterministic given the
#   seed and the call history, dumping its 625-word Mersenne state would make every read of a random
#   sensor look like a write, and BFCL's own state checker ignores it;
# - `TravelAPI._flight_cost_lookup`: a cache that `book_flight` refills itself.
# `File._last_modified` (wall-clock time, ignored by BFCL's `File.__eq__`) is left out by `_fs_dump`.
# Private attributes that *are* state stay in (`VehicleControlAPI._brakePedalForce`,
# `_parkingBrakeForce`, `_slopeAngle`: `startEngine` reads them).
_NOT_STATE_ALL = frozenset({"_api_description", "_random"})
_NOT_STATE: dict[str, frozenset[str]] = {"TravelAPI": frozenset({"_flight_cost_lookup"})}


class FolderCycleError(EnvError, ValueError):
    """BFCL's `cp` of a folder into itself links the folder into its own contents: no tree to dump."""


def _json_key(k: Any) -> str:
    """A dict key as `json.dumps` writes it."""
    if isinstance(k, str):
        return k
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int | float):
        return json.dumps(k)
    return str(k)


def _dumped_keys(value: dict[Any, Any]) -> dict[str, tuple[Any, Any]]:
    """A dict's keys as its dump writes them → (the key, the value)."""
    out: dict[str, tuple[Any, Any]] = {}
    str_keys = {k for k in value if isinstance(k, str)}
    for k, v in value.items():
        key = _json_key(k)
        if not isinstance(k, str) and (key in str_keys or key in out):
            key = f"{type(k).__name__}:{key}"
        out[key] = (k, v)
    return out


def int_key_paths(value: Any, path: tuple[Any, ...] = (), _depth: int = 0) -> list[list[Any]]:
    """Where `value` holds a dict with an int key: `[steps..., the key as dumped]` each (steps: dumped
    dict keys and list indexes). JSON has only string keys, so a dump alone cannot tell BFCL's
    `comments[1]` from `comments["1"]`; these paths let a fork put the ints back."""
    out: list[list[Any]] = []
    if _depth > 50:
        return out
    if isinstance(value, dict):
        for key, (k, v) in _dumped_keys(value).items():
            if isinstance(k, int) and not isinstance(k, bool):
                out.append([*path, key])
            out.extend(int_key_paths(v, (*path, key), _depth + 1))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            out.extend(int_key_paths(v, (*path, i), _depth + 1))
    return out


def restore_int_keys(root: dict[str, Any], paths: list[list[Any]]) -> None:
    """Undo `int_key_paths` on `root` (dumped data as loaded): each dict named by a path gets its int key
    back, in its place. Dicts are rebuilt, not changed in place (they may be shared with the config)."""
    for path in sorted((p for p in paths if isinstance(p, list) and len(p) >= 2), key=len, reverse=True):
        *steps, name = path
        parent: Any = root
        for step in steps[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        last = steps[-1]
        try:
            target = parent[last] if parent is not None else None
        except (KeyError, IndexError, TypeError):
            target = None
        if not isinstance(target, dict) or not isinstance(name, str) or name not in target:
            continue
        try:
            number = int(name.rsplit(":", 1)[-1])
        except ValueError:
            continue
        parent[last] = {(number if k == name else k): v for k, v in target.items()}


def _sort_key(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


_MPF_REPR = re.compile(r"mpf\('([^']+)'\)")


def to_jsonable(value: Any, _seen: frozenset[int] = frozenset()) -> Any:
    """`value` as fresh JSON data (shares no object with `value`).

    dict keys become strings as `json.dumps` writes them (a key that would then collide with an
    existing string key is written `"<type>:<key>"`); tuples → lists; sets → sorted lists;
    datetimes → ISO strings; Decimal and mpmath numbers → floats (mpmath with the digits its repr
    shows at the precision in force, the one BFCL's call set); other objects → their public attributes.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {key: to_jsonable(v, _seen) for key, (_, v) in _dumped_keys(value).items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v, _seen) for v in value]
    if isinstance(value, set | frozenset):
        items = [to_jsonable(v, _seen) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=_sort_key)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if type(value).__module__.startswith("mpmath"):
        # repr's digits (`mpf('1.3027')` for log10(20) at precision 2), not str's (`1.3`): MathAPI returns
        # its numbers in dicts, which BFCL's executor writes with repr, so that is what a model and its
        # checker see — str's digits would make 20 and 11 as bases give the same answer
        digits = _MPF_REPR.fullmatch(repr(value))
        try:
            return float(digits.group(1) if digits else str(value))
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    fs = _fs_dump(value, _seen)
    if fs is not None:
        return fs
    if hasattr(value, "__dict__"):
        if id(value) in _seen:
            return f"<cycle: {type(value).__name__}>"
        seen = _seen | {id(value)}
        return {k: to_jsonable(v, seen) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def _fs_types() -> tuple[type[Any], type[Any]] | None:
    mod = sys.modules.get("bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system")
    if mod is None:
        return None
    return mod.Directory, mod.File


def _fs_dump(value: Any, seen: frozenset[int]) -> dict[str, Any] | None:
    """GorillaFileSystem's Directory/File in BFCL's config format (no parent links, no mtimes)."""
    types = _fs_types()
    if types is None:
        return None
    directory, file = types
    if isinstance(value, file):
        return {"type": "file", "content": to_jsonable(value.content, seen)}
    if isinstance(value, directory):
        if id(value) in seen:  # BFCL's cp of a folder into itself links it into its own contents
            raise FolderCycleError("the file system has a folder inside itself (a cycle); it cannot be dumped")
        inner = seen | {id(value)}
        return {"type": "directory", "contents": {str(k): to_jsonable(v, inner) for k, v in value.contents.items()}}
    return None


def _find_path(root: Any, target: Any) -> list[str] | None:
    """Names from `root` down to `target` (by identity), or None if `target` is not in the tree."""
    directory, _ = _fs_types() or (None, None)
    stack: list[tuple[Any, list[str]]] = [(root, [root.name])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        for name, child in node.contents.items():
            if directory is not None and isinstance(child, directory):
                stack.append((child, [*path, str(name)]))
    return None


def _dump_file_system(state: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in vars(state).items():
        if key in _NOT_STATE_ALL:
            continue
        if key == "root":
            out["root"] = {value.name: to_jsonable(value)}
        elif key == "_current_dir":
            path = _find_path(state.root, value)
            if path is None:
                # BFCL's `mv` of a directory leaves its children's parent links on the old object;
                # `cd ..` from there reaches a directory that is no longer in the tree.
                chain, node = [], value
                while node is not None:
                    chain.append(node.name)
                    node = node.parent
                out["_current_dir"] = "/" + "/".join(reversed(chain))
                out["_current_dir_detached"] = True
            else:
                out["_current_dir"] = "/" + "/".join(path)
        else:
            out[key] = to_jsonable(value)
    return out
