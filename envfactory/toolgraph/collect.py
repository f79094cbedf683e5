"""The pool's tools as `ToolSource`s: metadata plus, for native tools, the return annotation's class name."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.pool import EnvPool
from envfactory.toolgraph.params import ToolSource


def _class_name(annotation: Any) -> str | None:
    """`Booking` → "Booking"; `list[HotelSummary]` / `Booking | None` → the first class argument's name."""
    if isinstance(annotation, type) and annotation.__module__ != "builtins":
        return annotation.__name__
    for arg in typing.get_args(annotation):
        name = _class_name(arg)
        if name is not None:
            return name
    return None


def return_type_name(env: BaseEnvironment, tool: str) -> str | None:
    """The record class a native tool returns (titles are stripped from output schemas, so this is where
    `book_room`'s `Booking` survives); None for imported environments and untyped returns."""
    if not isinstance(env, Environment):
        return None
    binding = env.binding(tool)
    fn = getattr(binding, "fn", None)
    if fn is None:
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: the tool's noun will do
        return None
    return _class_name(hints.get("return"))


def env_sources(env: BaseEnvironment) -> list[ToolSource]:
    meta = env.metadata
    return [
        ToolSource(
            env=meta.name,
            domain=meta.domain,
            env_description=meta.description,
            spec=spec,
            return_type=return_type_name(env, spec.name),
        )
        for spec in meta.tools
    ]


def pool_sources(pool: EnvPool, names: Iterable[str] | None = None) -> list[ToolSource]:
    """Every tool of the pool (native folders and imported suites such as BFCL's), environments in name order."""
    out: list[ToolSource] = []
    for name in sorted(names if names is not None else pool.names()):
        out.extend(env_sources(pool.get(name)))
    return out
