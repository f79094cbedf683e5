"""Test scenarios: named sequences of calls, each with what must come of it (matched by matching.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envfactory.env.session import ErrorType
from envfactory.envgen.checks.matching import _operator_problem


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
