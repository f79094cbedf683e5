"""Integrity of the runtime the observations come from: snapshots of it, and State machinery a model redefines.

Used by the child only. Generated code runs in the child's process; if it rebinds `Session.call`
or `State.dump`, the observations would be its own claims, so the child compares these snapshots
by identity after the import and after each scenario and reports every change as tampering.
"""

from __future__ import annotations

import builtins
import functools
import sys
from typing import Any

from envfactory.env.environment import Environment
from envfactory.env.state import State

_VOLATILE = ("__pydantic", "_abc_")


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
    for key, value in vars(builtins).items():
        snap[f"builtins.{key}"] = value
    return snap


def _class_snapshot(cls: type, label: str, snap: dict[str, Any]) -> None:
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
