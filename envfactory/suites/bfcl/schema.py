"""BFCL's function-doc schema dialect → JSON Schema, and strict checking of call arguments.

BFCL writes "dict", "float", "tuple", "any", `"default": "None"`...: `convert_schema` turns that into
JSON Schema 2020-12, `StrictValidator` checks arguments with strict JSON types, and `_problem_for`
words one validation error as an `ArgumentProblem`.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

from envfactory.env.tools import ArgumentProblem

_TYPE_ALIASES = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "double": "number",
    "int": "integer",
    "integer": "integer",
    "long": "integer",
    "str": "string",
    "string": "string",
    "char": "string",
    "bool": "boolean",
    "boolean": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "set": "array",
    "null": "null",
    "none": "null",
    "nonetype": "null",
}
_ANY_TYPES = {"any", "anytype", "mixed", ""}
_KEEP = ("description", "enum", "minimum", "maximum", "minItems", "maxItems", "pattern", "format", "const")


def _convert_type(t: Any) -> str | list[str] | None:
    if isinstance(t, list):
        out: list[str] = []
        for x in t:
            c = _convert_type(x)
            if c is None:
                return None  # one alternative is "any": the union accepts anything
            out.extend([c] if isinstance(c, str) else c)
        return sorted(set(out)) if len(set(out)) > 1 else (out[0] if out else None)
    if not isinstance(t, str):
        return None
    key = t.strip().lower()
    if key in _ANY_TYPES:
        return None
    if key not in _TYPE_ALIASES:
        raise ValueError(f"unknown BFCL type {t!r}")
    return _TYPE_ALIASES[key]


def convert_schema(schema: Any) -> dict[str, Any]:
    """BFCL's schema dialect → JSON Schema (2020-12): dict→object, float→number, tuple→array, any→{}.

    `"default": "None"` (BFCL's way to say the Python default is None) is dropped: such a
    parameter is optional and is omitted, not sent as null. Other defaults are kept as annotations.
    Non-schema keys are dropped.
    """
    if not isinstance(schema, dict):
        return {}
    out: dict[str, Any] = {}
    t = _convert_type(schema.get("type"))
    if t is not None:
        out["type"] = t
    for k in _KEEP:
        if k in schema:
            out[k] = copy.deepcopy(schema[k])
    if "properties" in schema and isinstance(schema["properties"], dict):
        out["properties"] = {str(k): convert_schema(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("required"), list):
        out["required"] = [r for r in schema["required"] if r in out.get("properties", {})]
    if "items" in schema:
        items = schema["items"]
        if isinstance(items, list):  # tuple-style items
            out["prefixItems"] = [convert_schema(s) for s in items]
        else:
            out["items"] = convert_schema(items)
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = convert_schema(schema["additionalProperties"])
    elif isinstance(schema.get("additionalProperties"), bool):
        out["additionalProperties"] = schema["additionalProperties"]
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(k), list):
            out[k] = [convert_schema(s) for s in schema[k]]
    if "default" in schema and schema["default"] not in ("None", None):
        out["default"] = copy.deepcopy(schema["default"])
    return out


def _parameters_schema(doc: dict[str, Any]) -> dict[str, Any]:
    params = convert_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    out: dict[str, Any] = {"type": "object", "properties": params.get("properties", {})}
    if params.get("required"):
        out["required"] = params["required"]
    return out


def _strict_type_checker() -> Any:
    base = jsonschema.Draft202012Validator.TYPE_CHECKER
    return base.redefine_many(
        {
            "integer": lambda _c, x: isinstance(x, int) and not isinstance(x, bool),
            "number": lambda _c, x: isinstance(x, int | float) and not isinstance(x, bool),
        }
    )


# JSON Schema 2020-12 with strict JSON types: 1.0 is not an integer, true is not a number
StrictValidator: Any = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, type_checker=_strict_type_checker()
)


def _problem_for(err: Any) -> ArgumentProblem:
    where = ".".join(str(p) for p in err.absolute_path) or "<arguments>"
    if err.validator == "type":
        expected = err.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        got = "boolean" if isinstance(err.instance, bool) else type(err.instance).__name__
        names = {"int": "integer", "float": "number", "str": "string", "list": "array", "dict": "object"}
        problem = f"must be of type {expected} (got {names.get(got, got)} {err.instance!r})"
    else:
        problem = err.message
    return ArgumentProblem(parameter=where, problem=problem)
