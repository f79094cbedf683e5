"""Test scenarios, schema-derived checks and the judge of generated environment code.

The Test Agent's verdict comes from executed checks, never from a model's opinion: the sandbox
reports what each call returned and what the state was; the judge here compares that with the
scenario's expectations. Nothing a model says about its own scenarios counts.

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

The matching rules (`expect_result`, and the values of `expect_state`) are in `matching`.

Modules:
- `scenarios`: `ExpectedCall`, `TestScenario`;
- `report`: `ErrorItem`, `ErrorReport` and the outcomes they hold;
- `matching`: `match` (state paths: `resolve_path` and `MISSING`, from `envfactory.env.state_path`);
- `schema_scenarios`: `schema_checks`, scenarios derived from the metadata alone;
- `interface`: metadata versus the code's own metadata;
- `verdict`: `judge` and `validate_generated`.
"""

from envfactory.env.state_path import MISSING, resolve_path
from envfactory.envgen.checks.matching import match
from envfactory.envgen.checks.report import (
    SEVERITY_ORDER,
    Dimension,
    ErrorItem,
    ErrorReport,
    InvalidScenario,
    ScenarioOutcome,
    Severity,
)
from envfactory.envgen.checks.scenarios import ExpectedCall, TestScenario
from envfactory.envgen.checks.schema_scenarios import UNKNOWN_PARAMETER, UNKNOWN_TOOL, schema_checks
from envfactory.envgen.checks.verdict import judge, validate_generated

__all__ = [
    "MISSING",
    "SEVERITY_ORDER",
    "UNKNOWN_PARAMETER",
    "UNKNOWN_TOOL",
    "Dimension",
    "ErrorItem",
    "ErrorReport",
    "ExpectedCall",
    "InvalidScenario",
    "ScenarioOutcome",
    "Severity",
    "TestScenario",
    "judge",
    "match",
    "resolve_path",
    "schema_checks",
    "validate_generated",
]
