"""The generated module's guarded builtins, and the sealed string evaluators of library modules.

Used by the child only. The policy's allow-lists again, at run time: code that slipped past the
AST check still cannot import, reach private attributes or monkeypatch classes and modules.
"""

from __future__ import annotations

import builtins
import functools
import sys
import types
from typing import Any

from envfactory.env.sandbox.policy import (
    ALLOWED_MODULES,
    ENVFACTORY_NAMES,
    FORBIDDEN_BUILTINS,
    module_member_problem,
    module_problem,
)
from envfactory.errors import EnvError


class SandboxViolation(EnvError, PermissionError):
    """Generated code did something the guards refuse (a tool call reports it as internal_error)."""


_real_import = builtins.__import__
_real_getattr = builtins.getattr
_real_setattr = builtins.setattr
_real_delattr = builtins.delattr


_RUNTIME_INTERNAL = frozenset({"time", "_strptime", "locale", "unicodedata", "encodings"})


def _guarded_import(
    name: str,
    globals: dict[str, Any] | None = None,  # the signature of __import__
    locals: dict[str, Any] | None = None,
    fromlist: tuple[str, ...] | list[str] | None = (),
    level: int = 0,
) -> Any:
    """The static allow-list again, at run time: code that slipped past the AST check still can't import."""
    if level:
        raise SandboxViolation("relative imports are not allowed in generated code")
    # C code imports through the current frame's builtins too (date.strftime imports `time`):
    # those stdlib internals are let through; they are not reachable by an import statement
    if name in _RUNTIME_INTERNAL or name.startswith("encodings."):
        return _real_import(name, globals, locals, fromlist, level)
    problem = module_problem(name)
    if problem is not None:
        raise SandboxViolation(problem)
    names = [n for n in fromlist or () if n != "__doc__"]  # PyImport_Import passes ['__doc__']
    if name in ENVFACTORY_NAMES:
        bad = [n for n in names if n not in ENVFACTORY_NAMES[name]]
        if not names or bad:
            raise SandboxViolation(f"only {', '.join(sorted(ENVFACTORY_NAMES[name]))} can be imported from {name}")
    module = _real_import(name, globals, locals, fromlist, level)
    if names and name != "__future__":
        target = sys.modules.get(name, module)
        for n in names:
            why = module_member_problem(target, n) if n != "*" else "star imports are not allowed"
            if why is not None:
                raise SandboxViolation(why)
    return module


def _check_name(name: object, action: str) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SandboxViolation(f"{action} of '{name}' is not allowed in generated code")


def _guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    _check_name(name, "getattr")
    value = _real_getattr(obj, name, *default)
    if isinstance(value, types.ModuleType) and value.__name__ not in ALLOWED_MODULES:
        raise SandboxViolation(f"getattr reaching module '{value.__name__}' is not allowed in generated code")
    return value


def _guarded_hasattr(obj: Any, name: str) -> bool:
    _check_name(name, "hasattr")
    return builtins.hasattr(obj, name)


def _guarded_setattr(obj: Any, name: str, value: Any) -> None:
    _check_name(name, "setattr")
    if isinstance(obj, type | types.ModuleType):
        raise SandboxViolation("setattr on a class or module (monkeypatching) is not allowed in generated code")
    _real_setattr(obj, name, value)


def _guarded_delattr(obj: Any, name: str) -> None:
    _check_name(name, "delattr")
    if isinstance(obj, type | types.ModuleType):
        raise SandboxViolation("delattr on a class or module is not allowed in generated code")
    _real_delattr(obj, name)


@functools.cache
def restricted_builtins() -> dict[str, Any]:
    """The generated module's builtins (one dict per process): no exec/eval/open/..., guarded import and getattr."""
    out = dict(vars(builtins))
    for name in (*FORBIDDEN_BUILTINS, "copyright", "credits", "license", "__loader__", "__spec__"):
        out.pop(name, None)
    out.update(
        __import__=_guarded_import,
        getattr=_guarded_getattr,
        hasattr=_guarded_hasattr,
        setattr=_guarded_setattr,
        delattr=_guarded_delattr,
    )
    return out


_real_eval = builtins.eval
# Library functions that evaluate strings (annotations, mostly) in a namespace their caller picks.
# Generated code can steer them to a trusted module's namespace (a class whose __module__ is
# 'types', say), whose builtins are the real ones: a known escape. Each gets a module-level
# `eval` that shadows the builtin and always evaluates with the restricted builtins.
_EVALUATING_MODULES = ("typing", "typing_extensions", "inspect", "pydantic._internal._namespace_utils")


def _restricted_eval(source: Any, globals: Any = None, locals: Any = None) -> Any:  # the signature of eval
    if globals is None:
        caller = sys._getframe(1)
        globals, locals = caller.f_globals, caller.f_locals if locals is None else locals
    if isinstance(globals, dict):
        globals = {**globals, "__builtins__": restricted_builtins()}
    return _real_eval(source, globals, locals)


def seal_evaluators() -> list[str]:
    """Give every string-evaluating library module the restricted `eval`; returns the modules sealed."""
    sealed = []
    for name in _EVALUATING_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.__dict__["eval"] = _restricted_eval
            sealed.append(name)
    return sealed
