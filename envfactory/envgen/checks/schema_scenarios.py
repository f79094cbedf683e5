"""Schema-derived checks (no LLM): one scenario per tool at its schema's edges, from synthetic arguments."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

from envfactory.env.metadata import EnvMetadata, ToolSpec
from envfactory.env.state import DEFAULT_CLOCK
from envfactory.env.state_path import MISSING
from envfactory.envgen.checks.matching import _is_number
from envfactory.envgen.checks.scenarios import ExpectedCall, TestScenario


class _Samples:
    """Values from an initial config to fill synthetic arguments: ids by collection, values by field name."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.collections: dict[str, list[str]] = {}
        self.fields: dict[str, list[Any]] = {}
        for name, value in config.items():
            if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
                self.collections[name] = list(value)
                for record in value.values():
                    for field, v in record.items():
                        self.fields.setdefault(field, []).append(v)
        clock = config.get("clock")
        try:
            self.clock = datetime.fromisoformat(clock) if isinstance(clock, str) else DEFAULT_CLOCK
        except ValueError:
            self.clock = DEFAULT_CLOCK

    def ids_for(self, param: str) -> list[str]:
        """Ids of the collection a `<x>_id` parameter refers to (`booking_id` -> bookings)."""
        if not param.endswith("_id"):
            return []
        stem = param[:-3]
        stems = [stem, stem.split("_")[-1]]
        for s in stems:
            for candidate in (s + "s", s + "es", s[:-1] + "ies" if s.endswith("y") else "", s):
                if candidate in self.collections:
                    return self.collections[candidate]
        return [v for v in self.fields.get(param, []) if isinstance(v, str)]


_JSON_CHECK: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
}


class _Generator:
    """Synthetic schema-valid values. `exact` turns False where the schema says more than we honour."""

    def __init__(self, spec: ToolSpec, samples: _Samples) -> None:
        self.defs: dict[str, Any] = spec.input_schema.get("$defs", {})
        self.samples = samples
        self.exact = True

    def value(self, schema: dict[str, Any], name: str, depth: int = 0) -> Any:
        if depth > 6:
            self.exact = False
            return None
        if "$ref" in schema:
            target = self.defs.get(str(schema["$ref"]).rsplit("/", 1)[-1])
            if target is None:
                self.exact = False
                return None
            return self.value(target, name, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            options = [o for o in schema.get(key, []) if isinstance(o, dict) and o.get("type") != "null"]
            if options:
                return self.value(options[0], name, depth + 1)
        if "allOf" in schema or "not" in schema or "pattern" in schema or "multipleOf" in schema:
            self.exact = False
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "string":
            return self._string(schema, name)
        if kind in ("integer", "number"):
            return self._number(schema, name, kind)
        if kind == "boolean":
            return True
        if kind == "array":
            items = schema.get("items", {})
            count = max(1, int(schema.get("minItems", 1)))
            if schema.get("uniqueItems") and count > 1:
                self.exact = False  # our items repeat
            item_name = name[:-1] if name.endswith("s") else name
            return [self.value(items if isinstance(items, dict) else {}, item_name, depth + 1) for _ in range(count)]
        if kind == "object" or "properties" in schema:
            props: dict[str, Any] = schema.get("properties", {})
            return {k: self.value(v, k, depth + 1) for k, v in props.items() if k in schema.get("required", [])}
        if kind == "null":
            return None
        self.exact = False  # no type: anything goes, but we can't know what the code accepts
        return "test"

    def _sample(self, name: str, kind: str) -> Any:
        ids = self.samples.ids_for(name)
        if ids and kind == "string":
            return ids[0]
        check = _JSON_CHECK.get(kind, lambda v: False)
        return next((v for v in self.samples.fields.get(name, []) if check(v)), MISSING)

    def _string(self, schema: dict[str, Any], name: str) -> str:
        fmt = schema.get("format")
        soon = self.samples.clock + timedelta(days=7)
        if fmt == "date":
            sample = self._sample(name, "string")
            return (
                sample if isinstance(sample, str) and _parses(date.fromisoformat, sample) else soon.date().isoformat()
            )
        if fmt == "date-time":
            sample = self._sample(name, "string")
            valid = isinstance(sample, str) and _parses(datetime.fromisoformat, sample)
            return sample if valid else soon.isoformat()
        if fmt is not None:
            known = {
                "time": "10:00:00",
                "email": "user@example.com",
                "uri": "https://example.com/",
                "uuid": "00000000-0000-4000-8000-000000000000",
                "duration": "PT1H",
            }
            if fmt not in known:
                self.exact = False
            return known.get(fmt, "test")
        sample = self._sample(name, "string")
        text = sample if isinstance(sample, str) else "test"
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        text = text.ljust(low, "x")
        return text[: int(high)] if high is not None else text

    def _number(self, schema: dict[str, Any], name: str, kind: str) -> int | float:
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        sample = self._sample(name, kind)
        if sample is not MISSING and (low is None or sample > low) and (high is None or sample < high):
            value: float = sample
        elif low is not None:
            value = low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
        else:
            value = 1
        if high is not None and value > high:
            value = high
        return int(value) if kind == "integer" else float(value)


def _parses(fn: Any, text: str) -> bool:
    try:
        fn(text)
    except ValueError:
        return False
    return True


def _wrong_value(schema: dict[str, Any]) -> Any:
    """A value of the wrong JSON type for a single-typed parameter, or MISSING."""
    kind = schema.get("type")
    return {"string": 12345, "integer": "not a number", "number": "not a number", "boolean": "yes"}.get(
        kind if isinstance(kind, str) else "", MISSING
    )


UNKNOWN_TOOL = "zz_no_such_tool"
UNKNOWN_PARAMETER = "zz_unexpected_parameter"


def schema_checks(metadata: EnvMetadata, initial_config: dict[str, Any] | None = None) -> list[TestScenario]:
    """Checks every tool's behaviour at its schema's edges, from the metadata alone (no LLM).

    Per tool, one scenario (`schema:<tool>`):
    - schema-valid arguments (required ones; then all, if there are optional ones): the call may
      succeed or fail with a tool error (not_found, conflict, tool_error: synthetic data may name a
      booking that cannot be cancelled), but never internal_error or contract_violation, and never
      invalid_arguments when we could honour the whole schema (then the code disagrees with the metadata);
    - each required parameter left out, a wrong type, an unknown parameter: invalid_arguments.
    One more scenario calls a tool that does not exist: unknown_tool.
    Ids for `<x>_id` parameters come from the config's `<x>s` collection; other values from record
    fields of the same name, else from the type, enum, format and bounds.
    """
    config = initial_config or {}
    samples = _Samples(config)
    out: list[TestScenario] = []
    for spec in metadata.tools:
        params, required = spec.parameters, spec.required
        gen = _Generator(spec, samples)
        req_args = {p: gen.value(params.get(p, {}), p) for p in required}  # an undefined one: any value
        steps = [ExpectedCall(tool=spec.name, args=req_args, expect_ok=None, args_schema_valid=gen.exact)]
        optional = [p for p in params if p not in required]
        if optional:
            all_args = {**req_args, **{p: gen.value(params[p], p) for p in optional}}
            steps.append(ExpectedCall(tool=spec.name, args=all_args, expect_ok=None, args_schema_valid=gen.exact))
        for p in required:
            steps.append(
                ExpectedCall(
                    tool=spec.name,
                    args={k: v for k, v in req_args.items() if k != p},
                    expect_error_type="invalid_arguments",
                )
            )
        for p in required or list(params):
            wrong = _wrong_value(params.get(p, {}))
            if wrong is not MISSING:
                steps.append(
                    ExpectedCall(tool=spec.name, args={**req_args, p: wrong}, expect_error_type="invalid_arguments")
                )
                break
        if UNKNOWN_PARAMETER not in params:
            steps.append(
                ExpectedCall(
                    tool=spec.name, args={**req_args, UNKNOWN_PARAMETER: 1}, expect_error_type="invalid_arguments"
                )
            )
        out.append(
            TestScenario(
                name=f"schema:{spec.name}",
                description=f"schema edges of {spec.name}: valid, missing, wrong-type and unknown arguments",
                initial_config=config,
                steps=steps,
                source="schema",
            )
        )
    if UNKNOWN_TOOL not in metadata.tool_names:
        out.append(
            TestScenario(
                name="schema:unknown_tool",
                description="a tool that does not exist must come back unknown_tool",
                initial_config=config,
                steps=[ExpectedCall(tool=UNKNOWN_TOOL, args={}, expect_error_type="unknown_tool")],
                source="schema",
            )
        )
    return out
