"""Test scenarios, schema-derived checks and the judge of generated environment code.

The Test Agent's verdict comes from executed checks (DESIGN): the sandbox child reports what each
call returned and what the state was; the judge here compares that with the scenario's
expectations. Nothing a model says about its own scenarios counts.

The four dimensions and their severities:

| dimension | what | severity |
|---|---|---|
| interface | a metadata tool the code does not register | critical |
| interface | parameter / required flag / type / kind mismatch; an extra tool; env name | high |
| interface | schema-valid (per metadata) arguments rejected as invalid_arguments | high |
| interface | output schema type differs | medium; description differs: low |
| execution | static rejection, import failure, no `env`, a hung call, timeout / memory / crash, tampering | critical |
| execution | internal_error (a bare exception), contract_violation (read tool wrote, write outside CRUD) | high |
| execution | the state model crashed (not a ScenarioError) loading an initial config | high |
| execution | nondeterminism: replaying a scenario on a fresh session gives other results or state | high |
| results | success where an error was expected or the reverse; a result value that does not match | high |
| results | the call failed as expected but with another error type | medium |
| state | a value at an `expect_state` path differs, or the path is missing | high |

A scenario *passes* when all its steps ran and it has no error of severity medium or worse.
`ErrorReport.passed(threshold)`: no critical or high error anywhere, at least one scenario ran,
and pass_rate >= threshold. Low errors never fail anything; they are hints for the revise prompt.

A scenario whose initial config does not load into the code's state model (a `ScenarioError`),
whose step calls a tool the metadata does not define, or whose step is claimed to succeed with
arguments that break the metadata's schema, is the *scenario's* fault: it is listed in
`ErrorReport.invalid_scenarios`, not counted, and produces no error against the code.

Matching rules (`expect_result`, and the values of `expect_state`):
- a dict matches when every expected key is present in the actual dict with a matching value
  (a subset: unmentioned keys are ignored); `{"$absent": true}` as a value means the key must be missing;
- a list matches a list of the same length element by element, in order;
- an operator object `{"$contains": [...], "$len": n}` matches a list holding, for each expected
  item, a distinct matching element (any order), and/or exactly n elements;
- numbers match numbers with math.isclose (rel 1e-9, abs 1e-9), 3 == 3.0; booleans only booleans;
  everything else by equality. `expect_result: null` means "not checked".
- `expect_state` keys are dotted paths into the state dump ("bookings.BK-0002.status"); a segment
  may itself contain dots (ids like "a.txt"): the longest key that exists wins; list indices are integers.
"""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta
from typing import Any, ClassVar, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from envfactory.env.environment import contract_problems
from envfactory.env.metadata import EnvMetadata, ToolSpec
from envfactory.env.sandbox import (
    Observations,
    SandboxLimits,
    SandboxResult,
    ScenarioObservation,
    StepObservation,
    parse_observations,
    run_checks_in_sandbox,
)
from envfactory.env.session import ErrorType
from envfactory.env.state import DEFAULT_CLOCK

Dimension = Literal["interface", "execution", "results", "state"]
Severity = Literal["critical", "high", "medium", "low"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "high": 1, "medium": 2, "low": 3}
_FAILING = frozenset({"critical", "high", "medium"})  # severities that fail the scenario they occur in
_TOOL_ERROR_FAMILY = frozenset({"tool_error", "not_found", "conflict"})
_OPERATORS = frozenset({"$contains", "$len", "$absent"})


# ---- scenarios --------------------------------------------------------------------------------


def _operator_problem(value: Any, where: str) -> str | None:
    """Unknown `$` operators are a scenario mistake, caught when the scenario is parsed."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                return f"{where}: unknown operator '{k}' (known: {', '.join(sorted(_OPERATORS))})"
            problem = _operator_problem(v, f"{where}.{k}")
            if problem:
                return problem
    elif isinstance(value, list):
        for i, v in enumerate(value):
            problem = _operator_problem(v, f"{where}[{i}]")
            if problem:
                return problem
    return None


class ExpectedCall(BaseModel):
    """One step of a scenario: a call and what must come of it."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    expect_ok: bool | None = Field(default=True, description="True: must succeed; False: must fail; None: either")
    expect_error_type: ErrorType | None = Field(default=None, description="implies expect_ok=False")
    expect_result: Any | None = Field(default=None, description="subset match of the result; null: not checked")
    expect_state: dict[str, Any] = Field(default_factory=dict, description="dotted state path -> value after the step")
    args_schema_valid: bool = Field(
        default=False, description="the arguments are valid per the metadata schema: invalid_arguments is an error"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ExpectedCall:
        if self.expect_error_type is not None:
            if self.expect_ok is True and "expect_ok" in self.model_fields_set:
                raise ValueError("expect_ok is true but expect_error_type is set; an error type implies failure")
            self.expect_ok = False
        for field in ("expect_result", "expect_state"):
            problem = _operator_problem(getattr(self, field), field)
            if problem:
                raise ValueError(problem)
        return self


class TestScenario(BaseModel):
    """A named sequence of calls on one fresh strict session, forked from `initial_config`."""

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    initial_config: dict[str, Any] = Field(default_factory=dict)
    steps: list[ExpectedCall] = Field(min_length=1)
    source: Literal["llm", "schema"] = "llm"


# ---- the report -------------------------------------------------------------------------------


class ErrorItem(BaseModel):
    dimension: Dimension
    severity: Severity
    tool: str | None = None
    scenario: str | None = None
    step: int | None = None
    message: str

    def line(self) -> str:
        where = [f"tool '{self.tool}'"] if self.tool else []
        if self.scenario is not None:
            where.append(f"scenario '{self.scenario}'" + (f" step {self.step}" if self.step is not None else ""))
        prefix = f"[{self.severity}/{self.dimension}]"
        return f"{prefix} {', '.join(where)}: {self.message}" if where else f"{prefix} {self.message}"


class ScenarioOutcome(BaseModel):
    name: str
    source: Literal["llm", "schema"]
    passed: bool
    steps_run: int = 0


class InvalidScenario(BaseModel):
    name: str
    reason: str


class ErrorReport(BaseModel):
    """The Test Agent's structured verdict, from executed checks only."""

    errors: list[ErrorItem] = Field(default_factory=list)
    scenarios_run: int = 0
    scenarios_passed: int = 0
    pass_rate: float = 0.0
    checks: int = Field(default=0, description="individual comparisons executed")
    outcomes: list[ScenarioOutcome] = Field(default_factory=list)
    invalid_scenarios: list[InvalidScenario] = Field(default_factory=list)
    sandbox_status: str = "ok"
    duration_s: float = 0.0
    threshold: float = 1.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worst(self) -> Severity | None:
        if not self.errors:
            return None
        return min((e.severity for e in self.errors), key=SEVERITY_ORDER.__getitem__)

    def passed(self, threshold: float | None = None) -> bool:
        limit = self.threshold if threshold is None else threshold
        blocking = any(e.severity in ("critical", "high") for e in self.errors)
        return not blocking and self.scenarios_run > 0 and self.pass_rate >= limit

    def summary(self, max_errors: int = 30) -> str:
        """Plain text for a revise prompt: the verdict, then the errors, worst first, repeats folded."""
        verdict = "PASSED" if self.passed() else "FAILED"
        head = (
            f"{verdict}: {self.scenarios_passed}/{self.scenarios_run} scenarios passed "
            f"({self.pass_rate:.0%}, threshold {self.threshold:.0%}); {len(self.errors)} errors"
            + (f", worst {self.worst}" if self.worst else "")
            + f"; sandbox {self.sandbox_status}"
        )
        lines = [head]
        counts: dict[str, int] = {}
        order: list[str] = []
        for e in sorted(self.errors, key=lambda e: SEVERITY_ORDER[e.severity]):
            key = e.model_copy(update={"scenario": None, "step": None}).line() if e.scenario else e.line()
            if key not in counts:
                order.append(e.line())
                counts[key] = 0
            counts[key] += 1
        folded = list(zip(order, counts.values(), strict=True))
        for text, n in folded[:max_errors]:
            lines.append(f"- {text}" + (f" (and {n - 1} more like it)" if n > 1 else ""))
        if len(folded) > max_errors:
            lines.append(f"- ... {len(folded) - max_errors} more distinct errors")
        if self.invalid_scenarios:
            lines.append(f"Ignored {len(self.invalid_scenarios)} invalid scenarios (their fault, not the code's):")
            lines.extend(f"- {s.name}: {s.reason}" for s in self.invalid_scenarios[:10])
        return "\n".join(lines)


# ---- matching ---------------------------------------------------------------------------------

MISSING: Any = object()  # what `resolve_path` returns for a path that does not exist


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def match(expected: Any, actual: Any, path: str = "result") -> str | None:
    """Why `actual` does not match `expected` (the rules in the module docstring), or None."""
    if isinstance(expected, dict) and expected and all(isinstance(k, str) and k.startswith("$") for k in expected):
        return _match_operators(expected, actual, path)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected an object, got {_short(actual)}"
        for key, want in expected.items():
            if isinstance(want, dict) and want.get("$absent") is True:
                if key in actual:
                    return f"{path}.{key}: expected no such key, got {_short(actual[key])}"
                continue
            if key not in actual:
                return f"{path}.{key}: missing (expected {_short(want)})"
            problem = match(want, actual[key], f"{path}.{key}")
            if problem:
                return problem
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{path}: expected a list, got {_short(actual)}"
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} items, got {len(actual)}: {_short(actual)}"
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            problem = match(want, got, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return None if expected is actual else f"{path}: expected {_short(expected)}, got {_short(actual)}"
    if _is_number(expected) and _is_number(actual):
        ok = math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-9)
        return None if ok else f"{path}: expected {_short(expected)}, got {_short(actual)}"
    if expected == actual and type(expected) is type(actual):
        return None
    return f"{path}: expected {_short(expected)}, got {_short(actual)}"


def _match_operators(expected: dict[str, Any], actual: Any, path: str) -> str | None:
    if "$absent" in expected:
        return f"{path}: '$absent' only applies to a key or a state path"
    if not isinstance(actual, list):
        return f"{path}: expected a list, got {_short(actual)}"
    if "$len" in expected and len(actual) != expected["$len"]:
        return f"{path}: expected {expected['$len']} items, got {len(actual)}"
    wanted = expected.get("$contains", [])
    if not isinstance(wanted, list):
        wanted = [wanted]
    free = list(range(len(actual)))
    for want in wanted:
        hit = next((i for i in free if match(want, actual[i], path) is None), None)
        if hit is None:
            return f"{path}: no item matches {_short(want)} among {_short(actual)}"
        free.remove(hit)
    return None


def resolve_path(data: Any, path: str) -> Any:
    """The value at a dotted path, or `MISSING`; a key may contain dots (longest existing key wins)."""
    return _resolve(data, path.split(".") if path else [])


def _resolve(node: Any, segments: list[str]) -> Any:
    if not segments:
        return node
    if isinstance(node, dict):
        for j in range(len(segments), 0, -1):
            key = ".".join(segments[:j])
            if key in node:
                found = _resolve(node[key], segments[j:])
                if found is not MISSING:
                    return found
        return MISSING
    if isinstance(node, list):
        try:
            index = int(segments[0])
        except ValueError:
            return MISSING
        return _resolve(node[index], segments[1:]) if -len(node) <= index < len(node) else MISSING
    return MISSING


# ---- schema-derived checks (no LLM) ------------------------------------------------------------


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
        req_args = {p: gen.value(params[p], p) for p in required}
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
            wrong = _wrong_value(params[p])
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


# ---- the judge --------------------------------------------------------------------------------


def _interface_errors(metadata: EnvMetadata, derived: EnvMetadata) -> list[ErrorItem]:
    out: list[ErrorItem] = []

    def add(severity: Severity, message: str, tool: str | None = None) -> None:
        out.append(ErrorItem(dimension="interface", severity=severity, tool=tool, message=message))

    if metadata.name != derived.name:
        add("high", f"the metadata names the environment '{metadata.name}' but env.py names it '{derived.name}'")
    meta_tools = {t.name: t for t in metadata.tools}
    code_tools = {t.name: t for t in derived.tools}
    for name in sorted(meta_tools.keys() - code_tools.keys()):
        add("critical", "the metadata defines this tool but env.py does not register it", name)
    for name in sorted(code_tools.keys() - meta_tools.keys()):
        add("high", "env.py registers this tool but the metadata does not define it (agents cannot see it)", name)
    for name in sorted(meta_tools.keys() & code_tools.keys()):
        m, c = meta_tools[name], code_tools[name]
        one_m = metadata.model_copy(update={"tools": [m]})
        one_c = derived.model_copy(update={"tools": [c], "name": metadata.name})
        for problem in contract_problems(one_m, one_c, "the metadata"):
            add("high", problem.removeprefix(f"tool '{name}': "), name)
        if m.description.strip() != c.description.strip():
            add(
                "low",
                f"the docstring says {_short(c.description, 80)}; the metadata says {_short(m.description, 80)}",
                name,
            )
        if m.output_schema and c.output_schema and m.output_schema.get("type") != c.output_schema.get("type"):
            add(
                "medium",
                f"returns type {c.output_schema.get('type')!r} but the metadata's output schema says "
                f"{m.output_schema.get('type')!r}",
                name,
            )
    return out


class _Judge:
    def __init__(self, metadata: EnvMetadata) -> None:
        self.metadata = metadata
        self.meta_tools = set(metadata.tool_names)
        self.errors: list[ErrorItem] = []
        self.checks = 0

    def add(self, dimension: Dimension, severity: Severity, message: str, **where: Any) -> ErrorItem:
        item = ErrorItem(dimension=dimension, severity=severity, message=message, **where)
        self.errors.append(item)
        return item

    def step(self, scenario: str, index: int, want: ExpectedCall, got: StepObservation) -> bool:
        """Judge one step; True when it is clean (no failing error)."""
        where: dict[str, Any] = {"tool": want.tool, "scenario": scenario, "step": index}
        before = len(self.errors)
        clean = True
        self.checks += 1  # the universal checks: no hang, no internal error, no contract violation
        if got.error_type == "timeout":
            self.add("execution", "critical", f"hung (an endless loop?): {got.error_message}", **where)
        elif got.error_type in ("internal_error", "contract_violation"):
            what = "raised an exception" if got.error_type == "internal_error" else "broke the state contract"
            self.add("execution", "high", f"{what}: {got.error_message}", **where)
        elif got.error_type == "unknown_tool" and want.tool in self.meta_tools:
            clean = False  # the interface check already reports the missing tool (critical)
        elif got.error_type == "invalid_arguments" and want.args_schema_valid:
            self.add(
                "interface",
                "high",
                f"rejected arguments the metadata schema accepts {_short(want.args)}: {got.error_message}",
                **where,
            )
        else:
            self._outcome(want, got, where)
        if got.error_type == "timeout" or not clean:
            return False  # the state after a hung or missing tool says nothing new
        for path, value in want.expect_state.items():
            self.checks += 1
            problem = self._state_problem(path, value, got.state)
            if problem:
                self.add("state", "high", f"after this call {problem}", **where)
        return clean and not any(e.severity in _FAILING for e in self.errors[before:])

    def _outcome(self, want: ExpectedCall, got: StepObservation, where: dict[str, Any]) -> None:
        if want.expect_ok is None:
            return
        self.checks += 1
        if want.expect_ok and not got.ok:
            self.add("results", "high", f"expected success, got {got.error_type}: {got.error_message}", **where)
            return
        if not want.expect_ok and got.ok:
            kind = want.expect_error_type or "an error"
            self.add("results", "high", f"expected {kind}, but the call succeeded with {_short(got.result)}", **where)
            return
        if not got.ok and want.expect_error_type is not None:
            self.checks += 1
            expected, actual = want.expect_error_type, got.error_type
            same = actual == expected or (expected == "tool_error" and actual in _TOOL_ERROR_FAMILY)
            if not same:
                self.add(
                    "results",
                    "medium",
                    f"failed as expected but with {actual} ({got.error_message}), expected {expected}",
                    **where,
                )
        if got.ok and want.expect_result is not None:
            self.checks += 1
            problem = match(want.expect_result, got.result)
            if problem:
                self.add("results", "high", f"wrong result: {problem}", **where)

    @staticmethod
    def _state_problem(path: str, value: Any, state: dict[str, Any] | None) -> str | None:
        if state is None:
            return "the state was not observed"
        found = resolve_path(state, path)
        if isinstance(value, dict) and value.get("$absent") is True:
            return None if found is MISSING else f"state '{path}' should not exist but is {_short(found)}"
        if found is MISSING:
            return f"state '{path}' does not exist (expected {_short(value)})"
        problem = match(value, found, path)
        return f"state {problem}" if problem else None

    def scenario(self, want: TestScenario, got: ScenarioObservation) -> bool | None:
        """True/False: passed or not; None: the scenario is invalid (its initial config does not load)."""
        if got.load_error is not None:
            return None
        if got.load_crash is not None:
            self.add(
                "execution",
                "high",
                f"the state model crashed loading the initial config: {got.load_crash}",
                scenario=want.name,
            )
            return False
        clean = True
        for i, (step, obs) in enumerate(zip(want.steps, got.steps, strict=False)):
            if obs.tool != step.tool:  # the child answers in order; anything else is a broken report
                self.add("execution", "critical", "the sandbox report does not match the scenario", scenario=want.name)
                return False
            clean = self.step(want.name, i, step, obs) and clean
        if got.replay_difference is not None:
            self.checks += 1
            self.add(
                "execution",
                "high",
                "nondeterministic: the same calls on the same initial config differ "
                f"({got.replay_difference}); keep all state in the state model, ids from db.new_id()",
                scenario=want.name,
            )
            clean = False
        return clean and got.completed and len(got.steps) == len(want.steps)


def _precheck(metadata: EnvMetadata, scenario: TestScenario) -> str | None:
    """Why a scenario cannot be a fair test of the code, or None.

    A step calling a tool the metadata does not define, or a step claimed to succeed whose arguments
    break the metadata's own schema (wrong type, missing required, unknown parameter), is the
    scenario's mistake. Formats (dates...) are not checked here: the strict runtime judges those.
    """
    specs = {t.name: t for t in metadata.tools}
    for i, step in enumerate(scenario.steps):
        spec = specs.get(step.tool)
        if spec is None:
            if step.expect_error_type != "unknown_tool":
                return f"step {i} calls '{step.tool}', which the metadata does not define"
            continue
        if step.expect_ok is not True:
            continue
        unknown = sorted(set(step.args) - set(spec.parameters))
        if unknown:
            return f"step {i} expects success but passes '{unknown[0]}', which '{step.tool}' does not take"
        # null for an optional parameter means "not given" to the runtime, whatever its schema type says
        given = {k: v for k, v in step.args.items() if v is not None or k in spec.required}
        try:
            error = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(spec.input_schema).iter_errors(given)
            )
        except Exception:  # SchemaError, an unresolvable $ref...: an odd metadata schema is not the scenario's fault
            continue
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            broken = f"break the schema of '{step.tool}' at {where}: {error.message}"
            return f"step {i} expects success but its arguments {broken}"
    return None


def _sandbox_error(result: SandboxResult, obs: Observations | None) -> ErrorItem:
    where: dict[str, Any] = {}
    if obs is not None and obs.interrupted is not None:
        it = obs.interrupted
        where = {"tool": it.tool, "scenario": it.scenario, "step": it.step}
        if it.phase == "import":
            where["scenario"] = None
    message = f"sandbox {result.status}: {result.detail}"
    if where.get("tool"):
        message += " (while running this call)"
    elif obs is not None and obs.interrupted is not None and obs.interrupted.phase == "import":
        message += " (while importing env.py: module-level code)"
    last = [ln for ln in result.stderr_tail.strip().splitlines() if ln.strip()][-1:]
    if last and result.status == "crashed":
        message += f"; last output: {_short(last[0], 300)}"
    return ErrorItem(dimension="execution", severity="critical", message=message, **where)


def judge(
    metadata: EnvMetadata, scenarios: list[TestScenario], result: SandboxResult, threshold: float = 1.0
) -> ErrorReport:
    """Compare the observations of `run_checks_in_sandbox(code, metadata, scenarios, ...)` with expectations."""
    report = ErrorReport(sandbox_status=result.status, duration_s=result.duration_s, threshold=threshold)
    judge_ = _Judge(metadata)
    invalid: dict[int, str] = {}
    for i, s in enumerate(scenarios):
        reason = _precheck(metadata, s)
        if reason:
            invalid[i] = reason
    obs = parse_observations(result.output)
    if result.status == "static_rejected":
        for p in result.problems:
            judge_.add("execution", "critical", f"rejected before running, line {p.line}: {p.message}")
    elif result.status != "ok" and not (result.status == "timeout" and obs is not None and obs.interrupted is None):
        judge_.errors.append(_sandbox_error(result, obs))  # (hung calls alone are reported at their steps)
    elif obs is None:
        judge_.add("execution", "critical", "the sandbox returned no usable report: " + (result.detail or "malformed"))
    observed: list[ScenarioObservation] = []
    if obs is not None:
        observed = obs.scenarios
        if obs.import_error is not None:
            at = f" at line {obs.import_line}" if obs.import_line else ""
            judge_.add("execution", "critical", f"env.py failed to import{at}: {obs.import_error}")
        for problem in obs.env_problems:
            judge_.add("execution", "critical", problem)
        for change in obs.tampering:
            judge_.add("execution", "critical", f"the code changed the runtime it is checked with: {change}")
        if obs.derived_metadata is not None:
            try:
                derived = EnvMetadata.model_validate(obs.derived_metadata)
            except ValidationError as e:
                judge_.add("interface", "critical", f"the code's own metadata is invalid: {e.errors()[0]['msg']}")
            else:
                try:
                    judge_.errors.extend(_interface_errors(metadata, derived))
                except Exception as e:  # derived metadata comes from untrusted code: odd schemas must not crash us
                    judge_.add("interface", "critical", f"cannot compare the code's schemas: {type(e).__name__}: {e}")
    for i, want in enumerate(scenarios):
        if i in invalid:
            report.invalid_scenarios.append(InvalidScenario(name=want.name, reason=invalid[i]))
            continue
        got = observed[i] if i < len(observed) else None
        # not observed (import failed, a limit stopped the run): run, and not passed
        verdict = judge_.scenario(want, got) if got is not None else False
        if verdict is None:
            assert got is not None
            reason = f"its initial config does not load into the state model: {got.load_error}"
            report.invalid_scenarios.append(InvalidScenario(name=want.name, reason=reason))
            continue
        steps_run = len(got.steps) if got is not None else 0
        report.outcomes.append(ScenarioOutcome(name=want.name, source=want.source, passed=verdict, steps_run=steps_run))
    report.errors = judge_.errors
    report.checks = judge_.checks
    report.scenarios_run = len(report.outcomes)
    report.scenarios_passed = sum(o.passed for o in report.outcomes)
    report.pass_rate = report.scenarios_passed / report.scenarios_run if report.scenarios_run else 0.0
    return report


def validate_generated(
    code: str,
    metadata: EnvMetadata,
    scenarios: list[TestScenario],
    limits: SandboxLimits | None = None,
    threshold: float | None = None,
) -> ErrorReport:
    """Static check, then one fresh sandbox run of the scenarios, then the judge (invalid ones are not judged).

    `limits` and `threshold` default to the settings (sandbox_timeout_s, sandbox_memory_mb,
    pass_threshold). Callers usually pass LLM scenarios plus `schema_checks(metadata, config)`.
    """
    if limits is None or threshold is None:
        from envfactory.config import get_settings

        settings = get_settings()
        limits = limits or SandboxLimits.from_settings(settings)
        threshold = settings.pass_threshold if threshold is None else threshold
    result = run_checks_in_sandbox(code, metadata, scenarios, limits)
    return judge(metadata, scenarios, result, threshold)
