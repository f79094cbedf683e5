"""Integrity of the runtime the observations come from: snapshots of it, and State machinery a model redefines.

Used by the child only. Generated code runs in the child's process; if it rebinds `Session.call`
or `State.dump`, the observations would be its own claims, so the child compares these snapshots
by identity after the import and after each scenario and reports every change as tampering.

What a snapshot holds: every global of the runtime's modules (`envfactory.*`) and of the library
modules its answers go through (`_LIBRARY_MODULES`: the JSON encoder of the wire, `copy`,
pydantic-core) with the entries of their private dispatch tables (`copy._deepcopy_dispatch`), every attribute
and the bases of their classes and of `BaseModel`, every builtin, and, for every
Python function among those, what its behaviour is made of and can be swapped without rebinding the
function: `__code__`, `__defaults__`, `__kwdefaults__` (and its values) and each closure cell's
contents (`Session.dump.__code__ = other.__code__` leaves `Session.dump` the same object).

It is a tripwire, not a wall: code that holds the real builtins runs in this process and can forge
a report (patch the check itself, write frames on the pipe, change an object in place that the
snapshot does not look into). What keeps a verdict honest is the parent, which records and replays
the observations itself; see docs/security.md.
"""

from __future__ import annotations

import builtins
import copy
import functools
import json
import json.decoder
import json.encoder
import json.scanner
import sys
import types
from typing import Any

import pydantic_core

from envfactory.env.environment import Environment
from envfactory.env.state import State

_VOLATILE = ("__pydantic", "_abc_")

# Library modules the worker's answers go through (imported above, so the snapshot never sees one appear):
# `wire.encode` is `json.dumps`, states are copied with `copy`, results made JSON by pydantic-core.
# Not `pydantic` itself: it fills its globals lazily, on first use of a name.
_LIBRARY_MODULES = (json, json.decoder, json.encoder, json.scanner, copy, pydantic_core)


def _trusted_snapshot() -> dict[str, Any]:
    """References to every global and class attribute of the runtime and to `BaseModel`'s methods.

    Generated code runs in this process; if it rebinds `Session.call` or `State.dump`, the
    observations would be its own claims. Compared by identity after import and after each scenario.
    """
    from pydantic import BaseModel

    snap: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        label = name
        if name == "__main__":  # the worker itself runs as __main__ (`python -m envfactory.env.sandbox.worker`)
            spec = getattr(module, "__spec__", None)
            label = getattr(spec, "name", None) or ""
        if not (label == "envfactory" or label.startswith("envfactory.")):
            continue
        for key, value in list(vars(module).items()):
            snap[f"{label}.{key}"] = value
            if isinstance(value, type) and value.__module__ == name:
                _class_snapshot(value, f"{label}.{key}", snap)
    _class_snapshot(BaseModel, "pydantic.BaseModel", snap)
    for module in _LIBRARY_MODULES:
        for key, value in list(vars(module).items()):
            snap[f"{module.__name__}.{key}"] = value
            if type(value) is dict and key.startswith("_"):  # a private table the module dispatches through
                for k, v in list(value.items()):  # (`copy._deepcopy_dispatch[list]`): its entries, changed in place
                    snap[f"{module.__name__}.{key}[{getattr(k, '__qualname__', k)!s}]"] = v
            if isinstance(value, type) and value.__module__ == module.__name__:
                _class_snapshot(value, f"{module.__name__}.{key}", snap)
    for key, value in vars(builtins).items():
        snap[f"builtins.{key}"] = value
    _function_parts(snap)
    return snap


_EMPTY_CELL = object()
_LRU_WRAPPER = type(functools.cache(len))
# what holds a Python function: the rest (classes, modules, data, C functions) is skipped at the cost of one isinstance
_HOLDERS = (types.FunctionType, staticmethod, classmethod, types.MethodType, property, functools.partial, _LRU_WRAPPER)


def _function_parts(snap: dict[str, Any]) -> None:
    """Add, for every Python function in `snap` (under a method wrapper, a property, a `functools.partial`, or
    `functools.wraps` and `functools.cache` included), the parts a function's behaviour can be swapped through
    in place, each under its own key."""
    parts: dict[int, list[tuple[str, Any]]] = {}  # id(function) -> its parts (the snapshot keeps the function)
    for label, value in list(snap.items()):
        if not isinstance(value, _HOLDERS):
            continue
        for where, fn in _functions_in(label, value):
            got = parts.get(id(fn))
            if got is None:
                got = parts[id(fn)] = _parts_of(fn)
            for suffix, part in got:
                snap[where + suffix] = part


def _parts_of(fn: types.FunctionType) -> list[tuple[str, Any]]:
    kwdefaults = fn.__kwdefaults__
    out: list[tuple[str, Any]] = [
        (".__code__", fn.__code__),
        (".__defaults__", fn.__defaults__),
        (".__kwdefaults__", kwdefaults),
    ]
    out.extend((f".__kwdefaults__[{k}]", v) for k, v in (kwdefaults or {}).items())
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            out.append((f".__closure__[{i}]", cell.cell_contents))
        except ValueError:  # an empty cell (a name assigned later)
            out.append((f".__closure__[{i}]", _EMPTY_CELL))
    return out


def _functions_in(label: str, value: Any) -> list[tuple[str, types.FunctionType]]:
    """The Python functions `value` is or wraps, each with its label (a few levels deep: no cycle can hold it)."""
    out: list[tuple[str, types.FunctionType]] = []
    todo: list[tuple[str, Any, int]] = [(label, value, 0)]
    while todo:
        where, item, depth = todo.pop()
        if depth > 4:
            continue
        if isinstance(item, types.FunctionType):
            out.append((where, item))
            wrapped = item.__dict__.get("__wrapped__")  # functools.wraps; read without running any code
        elif isinstance(item, staticmethod | classmethod | types.MethodType):
            wrapped = None
            todo.append((f"{where}.__func__", item.__func__, depth + 1))
        elif isinstance(item, property):
            wrapped = None
            todo.extend((f"{where}.{k}", getattr(item, k), depth + 1) for k in ("fget", "fset", "fdel"))
        elif isinstance(item, functools.partial):
            wrapped = None
            todo.append((f"{where}.func", item.func, depth + 1))
        elif isinstance(item, _LRU_WRAPPER):
            wrapped = item.__wrapped__
        else:
            continue
        if wrapped is not None:
            todo.append((f"{where}.__wrapped__", wrapped, depth + 1))
    return out


def _class_snapshot(cls: type, label: str, snap: dict[str, Any]) -> None:
    snap[f"{label}.__bases__"] = cls.__bases__  # a new tuple when rebased (`Environment.__bases__ = ...`)
    for key, value in list(vars(cls).items()):
        if not key.startswith(_VOLATILE):
            snap[f"{label}.{key}"] = value


def _env_snapshot(env: Environment) -> dict[str, Any]:
    snap: dict[str, Any] = {f"env.{k}": v for k, v in vars(env).items()}
    for name, tool in env.tools.items():
        snap[f"env.tools[{name}]"] = tool
        snap.update({f"env.tools[{name}].{k}": v for k, v in vars(tool).items()})
    for cls in env.state_model.__mro__:
        if cls is State:
            break
        _class_snapshot(cls, f"state model {cls.__qualname__}", snap)
    return snap


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    keys = before.keys() | after.keys()
    return sorted(k for k in keys if before.get(k, _ABSENT) is not after.get(k, _ABSENT))


_ABSENT = object()


@functools.cache
def _automatic_class_names() -> frozenset[str]:
    """What pydantic puts in the namespace of any State subclass by itself."""

    class _Probe(State):
        probe: int = 0

    return frozenset(vars(_Probe))


def _state_overrides(state_model: type[State]) -> list[str]:
    """Machinery of `State` (and BaseModel) a state model redefines: its dumps or change log could say anything."""
    reserved = set(dir(State)) - {"model_config", "model_post_init"} - _automatic_class_names()
    out: list[str] = []
    for cls in state_model.__mro__:
        if cls is State:
            break
        for name in sorted(set(vars(cls)) & reserved):
            out.append(f"state model {cls.__qualname__} redefines State.{name}; the runtime's own must be used")
    return out
