"""Scenarios, schema-derived checks and the judge: verdicts from executed checks, per dimension."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from envfactory.env.metadata import EnvMetadata, load_metadata
from envfactory.env.sandbox import SandboxLimits
from envfactory.envgen.checks import (
    MISSING,
    UNKNOWN_TOOL,
    ErrorItem,
    ErrorReport,
    ExpectedCall,
    TestScenario,
    match,
    resolve_path,
    schema_checks,
    validate_generated,
)
from tests.support.paths import ROOT

HOTELS = ROOT / "envs" / "hotels"
LIMITS = SandboxLimits(timeout_s=10, memory_mb=256)
HOTELS_CODE = (HOTELS / "env.py").read_text(encoding="utf-8")
HOTELS_META = load_metadata(HOTELS / "metadata.json")
CONFIG: dict[str, Any] = json.loads((HOTELS / "scenarios" / "default.json").read_text(encoding="utf-8"))


def call(tool: str, **kw: Any) -> ExpectedCall:
    return ExpectedCall(tool=tool, **kw)


def llm_scenarios() -> list[TestScenario]:
    """What a Test Agent would write: realistic flows with expected results and state."""
    return [
        TestScenario(
            name="book_then_cancel",
            description="Book a stay, cancel it, cancelling twice is a conflict.",
            initial_config=CONFIG,
            steps=[
                call(
                    "book_room",
                    args={"hotel_id": "HT-LIS-01", "guest_name": "Ana Costa", "check_in": "2026-03-01", "nights": 2},
                    expect_result={"id": "BK-0002", "status": "confirmed", "total_price": 240},
                    expect_state={"bookings.BK-0002.status": "confirmed", "counters.BK": 2},
                ),
                call(
                    "cancel_booking",
                    args={"booking_id": "BK-0002"},
                    expect_result={"id": "BK-0002", "status": "cancelled"},
                    expect_state={"bookings.BK-0002": {"status": "cancelled", "nights": 2}},
                ),
                call("cancel_booking", args={"booking_id": "BK-0002"}, expect_error_type="conflict"),
            ],
        ),
        TestScenario(
            name="search_lisbon",
            initial_config=CONFIG,
            steps=[
                call(
                    "search_hotels",
                    args={"city": "Lisbon", "max_price": 150},
                    expect_result={"$contains": [{"id": "HT-LIS-02"}, {"id": "HT-LIS-01"}], "$len": 2},
                ),
                call("search_hotels", args={"city": "Atlantis"}, expect_result=[]),
            ],
        ),
        TestScenario(
            name="modify_and_lookup",
            initial_config=CONFIG,
            steps=[
                call(
                    "modify_booking",
                    args={"booking_id": "BK-0001", "nights": 5},
                    expect_result={"nights": 5, "total_price": 425.0},
                    expect_state={"bookings.BK-0001.total_price": 425.0},
                ),
                call("get_booking", args={"booking_id": "BK-0001"}, expect_result={"nights": 5}),
                call("get_hotel", args={"hotel_id": "HT-NOPE"}, expect_error_type="not_found"),
            ],
        ),
        TestScenario(
            name="full_hotel",
            initial_config=CONFIG,
            steps=[
                call(
                    "book_room",
                    args={"hotel_id": "HT-LIS-02", "guest_name": "Rui", "check_in": "2026-02-11", "nights": 1},
                    expect_error_type="conflict",
                    expect_state={"bookings.BK-0002": {"$absent": True}, "counters.BK": 1},
                ),
                call(
                    "book_room",
                    args={"hotel_id": "HT-LIS-01", "guest_name": "Rui", "check_in": "2025-12-01", "nights": 1},
                    expect_error_type="tool_error",
                ),
            ],
        ),
    ]


def all_scenarios() -> list[TestScenario]:
    return llm_scenarios() + schema_checks(HOTELS_META, CONFIG)


def planted(old: str, new: str) -> str:
    assert old in HOTELS_CODE, old
    return HOTELS_CODE.replace(old, new)


def errors_of(report: ErrorReport, dimension: str, severity: str | None = None) -> list[ErrorItem]:
    return [e for e in report.errors if e.dimension == dimension and (severity is None or e.severity == severity)]


# ---- matching rules -------------------------------------------------------------------------


def test_match_is_a_subset_for_dicts_elementwise_for_lists() -> None:
    actual = {"id": "BK-1", "status": "confirmed", "items": [1, 2], "extra": True}
    assert match({"status": "confirmed"}, actual) is None
    assert match({"items": [1, 2]}, actual) is None
    assert "items" in (match({"items": [1]}, actual) or "")
    assert "status" in (match({"status": "cancelled"}, actual) or "")
    assert "missing" in (match({"nope": 1}, actual) or "")
    assert match({"nope": {"$absent": True}}, actual) is None
    assert match({"extra": {"$absent": True}}, actual) is not None


def test_match_contains_len_numbers_booleans() -> None:
    rows = [{"id": "a", "n": 1}, {"id": "b", "n": 2}]
    assert match({"$contains": [{"id": "b"}, {"id": "a"}]}, rows) is None
    assert match({"$contains": [{"id": "a"}, {"id": "a"}]}, rows) is not None  # distinct elements
    assert match({"$len": 2}, rows) is None and match({"$len": 3}, rows) is not None
    assert match(240, 240.0) is None and match(0.1 + 0.2, 0.3) is None
    assert match(True, 1) is not None and match(1, True) is not None
    assert match(None, None) is None and match("1", 1) is not None


def test_resolve_path_handles_ids_with_dots_and_indices() -> None:
    state = {"files": {"a.txt": {"size": 3}, "a": {"txt": {"size": 9}}}, "log": [{"op": "x"}]}
    assert resolve_path(state, "files.a.txt.size") == 3  # the longest existing key wins
    assert resolve_path(state, "log.0.op") == "x"
    assert resolve_path({"a": {"b": 1}}, "a.c") is MISSING and resolve_path(state, "log.5") is MISSING


def test_expected_call_validation() -> None:
    assert call("t", expect_error_type="conflict").expect_ok is False
    with pytest.raises(ValidationError, match="implies failure"):
        call("t", expect_ok=True, expect_error_type="conflict")
    with pytest.raises(ValidationError, match="unknown operator"):
        call("t", expect_result={"$contain": [1]})
    with pytest.raises(ValidationError):
        call("t", expect_error_type="exploded")  # not an error type the runtime produces
    with pytest.raises(ValidationError):
        TestScenario(name="empty", steps=[])


# ---- schema checks --------------------------------------------------------------------------


def test_schema_checks_cover_every_tool_with_ids_from_the_config() -> None:
    scenarios = schema_checks(HOTELS_META, CONFIG)
    names = {s.name for s in scenarios}
    assert names == {f"schema:{t}" for t in HOTELS_META.tool_names} | {"schema:unknown_tool"}
    assert all(s.source == "schema" for s in scenarios)
    cancel = next(s for s in scenarios if s.name == "schema:cancel_booking")
    valid = cancel.steps[0]
    assert valid.args == {"booking_id": "BK-0001"} and valid.expect_ok is None and valid.args_schema_valid
    assert any(s.args == {} and s.expect_error_type == "invalid_arguments" for s in cancel.steps)
    book = next(s for s in scenarios if s.name == "schema:book_room").steps[0]
    assert book.args["hotel_id"] == "HT-LIS-01" and book.args["guest_name"] == "Maria Silva"
    assert isinstance(book.args["nights"], int) and book.args["check_in"] >= "2026-01-05"
    search = next(s for s in scenarios if s.name == "schema:search_hotels")
    assert search.steps[0].args == {"city": "Lisbon"} and set(search.steps[1].args) == {
        "city",
        "max_price",
        "min_stars",
    }
    unknown = next(s for s in scenarios if s.name == "schema:unknown_tool").steps[0]
    assert unknown.tool == UNKNOWN_TOOL and unknown.expect_error_type == "unknown_tool"


def test_schema_values_honour_enums_formats_bounds() -> None:
    meta = EnvMetadata.model_validate(
        {
            "name": "x",
            "description": "x",
            "domain": "utilities",
            "tools": [
                {
                    "name": "t",
                    "description": "t",
                    "kind": "read",
                    "input_schema": {
                        "type": "object",
                        "properties": {
                            "mode": {"type": "string", "enum": ["fast", "slow"]},
                            "when": {"type": "string", "format": "date-time"},
                            "count": {"type": "integer", "minimum": 5, "maximum": 9},
                            "tags": {"type": "array", "items": {"type": "string"}},
                            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                        },
                        "required": ["mode", "when", "count", "tags", "code"],
                    },
                }
            ],
        }
    )
    step = schema_checks(meta, {"clock": "2026-05-01T08:00:00"})[0].steps[0]
    assert step.args["mode"] == "fast" and step.args["count"] == 5 and step.args["tags"] == ["test"]
    assert step.args["when"] == "2026-05-08T08:00:00"
    assert step.args_schema_valid is False  # a pattern we cannot honour: a rejection is not held against the code


# ---- good code passes -----------------------------------------------------------------------


def test_good_code_passes_llm_scenarios_and_schema_checks() -> None:
    report = validate_generated(HOTELS_CODE, HOTELS_META, all_scenarios(), LIMITS, 1.0)
    assert report.errors == [], report.summary()
    assert report.passed() and report.pass_rate == 1.0
    assert report.scenarios_run == report.scenarios_passed == len(all_scenarios())
    assert report.checks > 50 and report.worst is None
    assert report.summary().startswith("PASSED")


# ---- planted bugs: the right dimension and severity -----------------------------------------


def test_cancel_that_changes_nothing_is_a_results_and_state_error() -> None:
    code = planted(
        'return db.update("bookings", booking_id, status="cancelled")',
        "return booking",
    )
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    assert not report.passed()
    results = errors_of(report, "results", "high")
    state = errors_of(report, "state", "high")
    assert any(e.tool == "cancel_booking" and "status" in e.message for e in results)
    assert any(e.tool == "cancel_booking" and e.scenario == "book_then_cancel" and e.step == 1 for e in state)
    failed = {o.name for o in report.outcomes if not o.passed}
    assert failed == {"book_then_cancel"}


def test_a_read_tool_that_writes_is_a_contract_violation() -> None:
    code = planted(
        '    return db.get("bookings", booking_id, "booking")',
        '    db.set("clock", db.clock)\n    db.new_id("SEEN")\n    return db.get("bookings", booking_id, "booking")',
    )
    report = validate_generated(code, HOTELS_META, all_scenarios(), LIMITS, 1.0)
    hits = errors_of(report, "execution", "high")
    assert hits and all(e.tool == "get_booking" for e in hits)
    assert "read tool 'get_booking' changed the state" in hits[0].message


def test_mutating_a_record_in_place_is_caught_by_the_strict_session() -> None:
    code = planted(
        'return db.update("bookings", booking_id, status="cancelled")',
        'booking.status = "cancelled"\n    return booking',
    )
    report = validate_generated(code, HOTELS_META, all_scenarios(), LIMITS, 1.0)
    hits = [e for e in errors_of(report, "execution", "high") if e.tool == "cancel_booking"]
    assert hits and "outside the CRUD helpers" in hits[0].message


def test_a_bare_exception_in_a_tool_is_a_high_execution_error() -> None:
    code = planted('    return db.get("hotels", hotel_id, "hotel")', '    return db.hotels[hotel_id + "!"]')
    report = validate_generated(code, HOTELS_META, all_scenarios(), LIMITS, 1.0)
    hits = errors_of(report, "execution", "high")
    assert hits and {e.tool for e in hits} == {"get_hotel"} and "KeyError" in hits[0].message
    assert not report.passed()


def test_a_wrong_error_type_is_medium() -> None:
    code = planted(
        'raise ConflictError(f"booking {booking_id} is already cancelled")',
        'raise ToolError(f"booking {booking_id} is already cancelled")',
    )
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    assert [e.severity for e in report.errors] == ["medium"]
    assert "expected conflict" in report.errors[0].message
    assert not report.passed(1.0)
    assert report.passed(0.7)  # medium fails its scenario, not the whole report below the threshold


def test_module_level_state_is_caught_by_the_replay() -> None:
    code = planted('id=db.new_id("BK"),', "id=_next_id(),")
    counter = '_LAST = [1]\n\n\ndef _next_id() -> str:\n    _LAST[0] += 1\n    return f"BK-{_LAST[0]:04d}"\n\n\n'
    code = code.replace("def _overlaps(", counter + "def _overlaps(")
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    hits = [e for e in errors_of(report, "execution", "high") if "nondeterministic" in e.message]
    assert hits and hits[0].scenario == "book_then_cancel" and "BK-0003" in hits[0].message
    assert not report.passed()


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "envs").iterdir() if (p / "env.py").is_file()))
def test_every_bundled_environment_passes_its_schema_checks(name: str) -> None:
    folder = ROOT / "envs" / name
    meta = load_metadata(folder / "metadata.json")
    config = json.loads((folder / "scenarios" / "default.json").read_text(encoding="utf-8"))
    code = (folder / "env.py").read_text(encoding="utf-8")
    report = validate_generated(code, meta, schema_checks(meta, config), LIMITS, 1.0)
    assert report.passed() and report.errors == [], report.summary()


# ---- interface ------------------------------------------------------------------------------


def test_a_metadata_tool_the_code_lacks_is_critical() -> None:
    extra = HOTELS_META.tools[0].model_copy(update={"name": "rate_hotel", "kind": "write"})
    meta = HOTELS_META.model_copy(update={"tools": [*HOTELS_META.tools, extra]})
    report = validate_generated(HOTELS_CODE, meta, schema_checks(meta, CONFIG), LIMITS, 1.0)
    crit = errors_of(report, "interface", "critical")
    assert [e.tool for e in crit] == ["rate_hotel"]
    assert report.worst == "critical" and not report.passed()
    assert {o.name for o in report.outcomes if not o.passed} == {"schema:rate_hotel"}


def test_a_wrong_required_flag_is_high() -> None:
    data = HOTELS_META.model_dump(mode="json")
    search = next(t for t in data["tools"] if t["name"] == "search_hotels")
    search["input_schema"]["required"] = ["city", "max_price"]
    meta = EnvMetadata.model_validate(data)
    report = validate_generated(HOTELS_CODE, meta, llm_scenarios(), LIMITS, 1.0)
    high = errors_of(report, "interface", "high")
    assert high and high[0].tool == "search_hotels" and "'max_price' is required" in high[0].message
    assert not report.passed()


def test_an_extra_code_tool_and_a_kind_mismatch_are_high() -> None:
    data = HOTELS_META.model_dump(mode="json")
    data["tools"] = [t for t in data["tools"] if t["name"] != "list_bookings"]
    next(t for t in data["tools"] if t["name"] == "get_hotel")["kind"] = "write"
    report = validate_generated(HOTELS_CODE, EnvMetadata.model_validate(data), llm_scenarios(), LIMITS, 1.0)
    high = {(e.tool, e.message.split(":")[0]) for e in errors_of(report, "interface", "high")}
    assert (
        "list_bookings",
        "env.py registers this tool but the metadata does not define it (agents cannot see it)",
    ) in high
    assert any(tool == "get_hotel" and "kind" in msg for tool, msg in high)


def test_schema_valid_arguments_rejected_by_the_code_are_an_interface_error() -> None:
    data = HOTELS_META.model_dump(mode="json")
    props = next(t for t in data["tools"] if t["name"] == "get_hotel")["input_schema"]["properties"]
    props["hotel_id"]["enum"] = ["HT-LIS-01"]
    meta = EnvMetadata.model_validate(data)
    code = planted("def get_hotel(db: HotelDB, hotel_id: str)", 'def get_hotel(db: HotelDB, hotel_id: Literal["X"])')
    report = validate_generated(code, meta, schema_checks(meta, CONFIG), LIMITS, 1.0)
    hits = errors_of(report, "interface", "high")
    assert any(e.tool == "get_hotel" and "rejected arguments the metadata schema accepts" in e.message for e in hits)


# ---- scenario expectations ------------------------------------------------------------------


def test_a_wrong_expected_result_is_a_results_error() -> None:
    s = TestScenario(
        name="wrong_price",
        initial_config=CONFIG,
        steps=[call("get_hotel", args={"hotel_id": "HT-LIS-01"}, expect_result={"price_per_night": 99.0})],
    )
    report = validate_generated(HOTELS_CODE, HOTELS_META, [s], LIMITS, 1.0)
    (err,) = report.errors
    assert (err.dimension, err.severity, err.tool, err.scenario, err.step) == (
        "results",
        "high",
        "get_hotel",
        "wrong_price",
        0,
    )
    assert "price_per_night: expected 99.0, got 120.0" in err.message
    assert report.pass_rate == 0.0


def test_an_expect_state_mismatch_is_a_state_error() -> None:
    s = TestScenario(
        name="state",
        initial_config=CONFIG,
        steps=[
            call(
                "modify_booking",
                args={"booking_id": "BK-0001", "nights": 4},
                expect_state={"bookings.BK-0001.nights": 5, "bookings.BK-0009.nights": 4},
            )
        ],
    )
    report = validate_generated(HOTELS_CODE, HOTELS_META, [s], LIMITS, 1.0)
    assert [e.dimension for e in report.errors] == ["state", "state"]
    assert "expected 5, got 4" in report.errors[0].message
    assert "does not exist" in report.errors[1].message


def test_an_unexpected_success_and_an_unexpected_failure_are_high() -> None:
    s = TestScenario(
        name="outcomes",
        initial_config=CONFIG,
        steps=[
            call("get_hotel", args={"hotel_id": "HT-LIS-01"}, expect_error_type="not_found"),
            call("get_hotel", args={"hotel_id": "HT-NOPE"}),
        ],
    )
    report = validate_generated(HOTELS_CODE, HOTELS_META, [s], LIMITS, 1.0)
    assert [(e.dimension, e.severity, e.step) for e in report.errors] == [
        ("results", "high", 0),
        ("results", "high", 1),
    ]


def test_a_config_that_does_not_load_is_the_scenarios_fault() -> None:
    bad = TestScenario(
        name="bad_config",
        initial_config={"hotels": {"H1": {"id": "H1", "stars": "many"}}},
        steps=[call("get_hotel", args={"hotel_id": "H1"})],
    )
    hallucinated = TestScenario(name="no_such_tool", steps=[call("teleport")])
    sloppy = TestScenario(name="sloppy_args", steps=[call("get_hotel", args={"hotel_id": 7})])
    extra = TestScenario(name="extra_arg", steps=[call("get_hotel", args={"hotel_id": "H", "verbose": True})])
    good = llm_scenarios()[1]
    report = validate_generated(HOTELS_CODE, HOTELS_META, [bad, hallucinated, sloppy, extra, good], LIMITS, 1.0)
    assert report.errors == []
    reasons = {s.name: s.reason for s in report.invalid_scenarios}
    assert set(reasons) == {"bad_config", "no_such_tool", "sloppy_args", "extra_arg"}
    assert "does not load" in reasons["bad_config"]
    assert "break the schema of 'get_hotel' at hotel_id" in reasons["sloppy_args"]
    assert "'verbose'" in reasons["extra_arg"]
    assert report.scenarios_run == 1 and report.passed()
    assert "Ignored 4 invalid scenarios" in report.summary()


def test_no_valid_scenario_means_no_pass() -> None:
    bad = TestScenario(name="bad", initial_config={"nope": 1}, steps=[call("get_hotel", args={"hotel_id": "x"})])
    report = validate_generated(HOTELS_CODE, HOTELS_META, [bad], LIMITS, 1.0)
    assert report.scenarios_run == 0 and not report.passed()


# ---- execution failures ---------------------------------------------------------------------


def test_static_rejection_gives_one_critical_error_per_problem() -> None:
    code = "import os\nimport subprocess\n" + HOTELS_CODE
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    crit = errors_of(report, "execution", "critical")
    assert len(crit) == 2 and "line 1" in crit[0].message and "line 2" in crit[1].message
    assert report.sandbox_status == "static_rejected" and report.scenarios_passed == 0 and not report.passed()


def test_an_import_failure_is_critical_with_its_line() -> None:
    code = HOTELS_CODE.replace("class HotelDB(State):", "oops = 1 / 0\n\n\nclass HotelDB(State):")
    line = code.splitlines().index("oops = 1 / 0") + 1
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    (err,) = report.errors
    assert err.severity == "critical" and err.dimension == "execution"
    assert f"at line {line}" in err.message and "ZeroDivisionError" in err.message
    assert report.scenarios_run == len(llm_scenarios()) and report.scenarios_passed == 0


def test_code_without_env_is_critical() -> None:
    code = HOTELS_CODE.replace("env = Environment(", "environment = Environment(").replace("@env.", "@environment.")
    report = validate_generated(code, HOTELS_META, llm_scenarios(), LIMITS, 1.0)
    assert [e.severity for e in report.errors] == ["critical"]
    assert "must define `env = Environment(...)`" in report.errors[0].message


def test_a_hang_is_a_critical_execution_error_naming_limit_and_tool() -> None:
    code = planted(
        '    if booking.status == "cancelled":', '    while True:\n        pass\n    if booking.status == "cancelled":'
    )
    limits = SandboxLimits(timeout_s=8, call_timeout_s=0.5, memory_mb=256)
    report = validate_generated(code, HOTELS_META, llm_scenarios(), limits, 1.0)
    crit = errors_of(report, "execution", "critical")
    assert [(e.tool, e.scenario, e.step) for e in crit] == [("cancel_booking", "book_then_cancel", 1)]
    assert "per-call limit of 0.5 s" in crit[0].message
    assert report.sandbox_status == "timeout" and not report.passed()
    # the hang fails its scenario; the others still ran and were judged
    assert {o.name: o.passed for o in report.outcomes} == {
        "book_then_cancel": False,
        "search_lisbon": True,
        "modify_and_lookup": True,
        "full_hotel": True,
    }


def test_a_run_past_its_deadline_is_critical_and_unfinished_scenarios_fail() -> None:
    code = HOTELS_CODE.replace("class HotelDB(State):", "while True:\n    pass\n\n\nclass HotelDB(State):")
    report = validate_generated(code, HOTELS_META, llm_scenarios(), SandboxLimits(timeout_s=2, memory_mb=256), 1.0)
    (err,) = report.errors
    assert err.severity == "critical" and "2 s limit" in err.message and "module-level code" in err.message
    assert report.scenarios_run == 4 and report.scenarios_passed == 0


def test_summary_folds_repeats_and_orders_by_severity() -> None:
    report = ErrorReport(
        errors=[
            ErrorItem(dimension="results", severity="medium", tool="t", scenario="a", step=0, message="m"),
            ErrorItem(dimension="execution", severity="high", tool="t", scenario="a", step=1, message="boom"),
            ErrorItem(dimension="execution", severity="high", tool="t", scenario="b", step=1, message="boom"),
        ],
        scenarios_run=2,
        pass_rate=0.0,
    )
    text = report.summary()
    lines = text.splitlines()
    assert lines[0].startswith("FAILED: 0/2") and "worst high" in lines[0]
    assert lines[1].startswith("- [high/execution]") and "(and 1 more like it)" in lines[1]
    assert lines[2].startswith("- [medium/results]")
    assert report.worst == "high"
