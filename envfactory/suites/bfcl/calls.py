"""BFCL's ground-truth call strings, parsed with `ast` (never evaluated: no `eval`, `exec` or `globals()`)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, cast

from envfactory.errors import InputError
from envfactory.inputs import parse_python


class CallSyntaxError(InputError, ValueError):
    """A string that is not a plain function call with literal arguments."""


@dataclass(frozen=True)
class ParsedCall:
    """`name(*args, **kwargs)` with literal arguments; `name` may be dotted (`Class.method`)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    raise CallSyntaxError(f"not a function name: {ast.unparse(node)}")


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallSyntaxError(f"argument is not a literal: {ast.unparse(node)!s} in {text!r}") from None


def _parse_call_node(node: ast.expr, text: str) -> ParsedCall:
    if not isinstance(node, ast.Call):
        raise CallSyntaxError(f"not a function call: {text!r}")
    name = _call_name(node.func)
    args = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            raise CallSyntaxError(f"*args are not allowed: {text!r}")
        args.append(_literal(a, text))
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallSyntaxError(f"**kwargs are not allowed: {text!r}")
        if kw.arg in kwargs:
            raise CallSyntaxError(f"argument '{kw.arg}' given twice: {text!r}")
        kwargs[kw.arg] = _literal(kw.value, text)
    return ParsedCall(name=name, args=tuple(args), kwargs=kwargs)


def _parse_expr(text: str) -> ast.expr:
    try:
        return cast(ast.Expression, parse_python(text.strip(), mode="eval")).body
    except SyntaxError as e:
        raise CallSyntaxError(f"invalid call syntax: {text!r} ({e.msg})") from None


def parse_call(text: str) -> ParsedCall:
    """Parse one call string such as `cd(folder='document')` with `ast` (never evaluated)."""
    return _parse_call_node(_parse_expr(text), text)


def parse_calls(text: str) -> list[ParsedCall]:
    """Parse one call or a Python list/tuple of calls (`[f(a=1), g()]`), as BFCL's models write them."""
    node = _parse_expr(text)
    if isinstance(node, ast.List | ast.Tuple):
        return [_parse_call_node(n, text) for n in node.elts]
    return [_parse_call_node(node, text)]
