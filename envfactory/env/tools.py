"""A tool `π_i`: a plain function of (state, arguments), its derived schema and its fast call path."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime, time
from typing import Any, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import to_json

from envfactory.env.metadata import ToolKind, ToolSpec
from envfactory.errors import InputError


class ArgumentProblem(BaseModel):
    """One thing wrong with a tool call's arguments."""

    parameter: str
    problem: str


class ArgumentError(InputError):
    """Arguments do not fit the tool's schema (raised before the tool runs)."""

    def __init__(self, problems: list[ArgumentProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.parameter}: {p.problem}" for p in problems))


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto titles; they add tokens to every prompt and say nothing."""
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def _collapse_optional(prop: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [T, null]` with a None default reads as plain `T` for a model; null stays accepted."""
    any_of = prop.get("anyOf")
    if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of and prop.get("default", 0) is None:
        inner = next(s for s in any_of if s != {"type": "null"})
        out = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
        return {**inner, **out}
    return prop


def pydantic_errors_to_problems(e: PydanticValidationError) -> list[ArgumentProblem]:
    problems = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<arguments>"
        kind = err["type"]
        if kind == "missing":
            msg = "required parameter is missing"
        elif kind == "extra_forbidden":
            msg = "unknown parameter"
        else:
            msg = err["msg"]
            if "input" in err and kind not in ("missing",):
                msg += f" (got {err['input']!r})"
        problems.append(ArgumentProblem(parameter=loc, problem=msg))
    return problems


class Tool:
    """A registered tool. Its signature and docstring are the single source of its schema."""

    def __init__(self, fn: Callable[..., Any], kind: ToolKind, name: str | None = None) -> None:
        self.fn = fn
        self.kind: ToolKind = kind
        self.name = name or fn.__name__
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params:
            raise TypeError(f"tool '{self.name}' must take the state as its first parameter")
        hints = get_type_hints(fn)
        doc = docstring_parser.parse(fn.__doc__ or "")
        self.description = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p).strip()
        if not self.description:
            raise TypeError(f"tool '{self.name}' needs a docstring: it is the tool's description")
        param_docs = {p.arg_name: (p.description or "").strip() for p in doc.params}
        fields: dict[str, Any] = {}
        for p in params[1:]:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool '{self.name}': *args/**kwargs are not allowed; name every parameter")
            if p.name not in hints:
                raise TypeError(f"tool '{self.name}': parameter '{p.name}' needs a type annotation")
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hints[p.name], Field(default, description=param_docs.get(p.name) or None))
        self.param_names = list(fields)
        # the state clock is naive local time; an aware datetime or time could not be compared with it
        self._clock_params = [n for n, (tp, _) in fields.items() if "time" in str(tp)]
        self.args_model: type[BaseModel] = create_model(
            f"{self.name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        self._validate_json = self.args_model.__pydantic_validator__.validate_json
        ret = hints.get("return", Any)
        self._ret_adapter: TypeAdapter[Any] = TypeAdapter(ret)
        self.output_schema: dict[str, Any] | None = None
        if ret not in (Any, None, type(None)):
            self.output_schema = _strip_titles(self._ret_adapter.json_schema(mode="serialization"))
        self._dump = self._ret_adapter.dump_python

    def input_schema(self) -> dict[str, Any]:
        schema = _strip_titles(self.args_model.model_json_schema())
        props = {k: _collapse_optional(v) for k, v in schema.get("properties", {}).items()}
        out: dict[str, Any] = {"type": "object", "properties": props}
        if schema.get("required"):
            out["required"] = schema["required"]
        if "$defs" in schema:  # nested models (a list of line items...): tidy their optionals too
            out["$defs"] = {
                name: {**d, "properties": {k: _collapse_optional(v) for k, v in d.get("properties", {}).items()}}
                if "properties" in d
                else d
                for name, d in schema["$defs"].items()
            }
        return out

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            kind=self.kind,
            input_schema=self.input_schema(),
            output_schema=self.output_schema,
        )

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validate JSON arguments strictly (a string is not an integer); return call kwargs."""
        try:
            model = self._validate_json(to_json(args), strict=True)
        except PydanticValidationError as e:
            raise ArgumentError(pydantic_errors_to_problems(e)) from None
        kwargs = {k: getattr(model, k) for k in self.param_names}
        for name in self._clock_params:
            value = kwargs[name]
            if isinstance(value, datetime | time) and value.tzinfo is not None:
                problem = "give a local time without a time zone, e.g. 2026-03-01T14:30:00"
                raise ArgumentError([ArgumentProblem(parameter=name, problem=problem)])
        return kwargs

    def invoke(self, state: Any, kwargs: dict[str, Any]) -> Any:
        """Run the tool and return its result as JSON-compatible data."""
        return self._dump(self.fn(state, **kwargs), mode="json")
