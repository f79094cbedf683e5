"""EnvGen's nodes: each a thin step over an agent (`envfactory_agents/`) or EnvGen's model-free parts
(`envfactory.envgen`)."""

from __future__ import annotations

from langgraph.runtime import Runtime
from pydantic import ValidationError

from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX
from envfactory.env.sandbox import SandboxUnavailable
from envfactory.envgen.checks import ErrorReport, TestScenario
from envfactory.envgen.register import GeneratedEnvironment, RegistrationError, register, write_environment
from envfactory.errors import EnvFactoryError, first_error
from envfactory_agents.code import generate_code, revise_code
from envfactory_agents.search import EnvGenRequest, search_environment
from envfactory_agents.test import generate_scenarios, run_tests
from graphs.envgen.state import EnvGenContext, EnvGenState, deps_of, failed, meta_of, settings_of


def node_search(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    request = EnvGenRequest.model_validate(state.get("request") or {})
    try:
        outcome = search_environment(deps_of(runtime), request)
    except EnvFactoryError as e:  # a bad metadata/OpenAPI file: a recorded failure, not a crash
        return failed(f"search: {e}")
    if not outcome.ok or outcome.metadata is None:
        return {**failed(outcome.error or "search failed"), "search": outcome.report.model_dump(mode="json")}
    return {
        "metadata": outcome.metadata.model_dump(mode="json", exclude_none=True),
        "search": outcome.report.model_dump(mode="json"),
        "status": "running",
        "revision": 0,
    }


def node_code(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    result = generate_code(deps_of(runtime), meta_of(state))
    if not result.ok:
        return failed(f"code: {result.error}")
    return {"code": result.value}


def node_test(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    deps = deps_of(runtime)
    meta = meta_of(state)
    update: EnvGenState = {}
    scenarios = [TestScenario.model_validate(s) for s in state.get("scenarios") or []]
    if not scenarios:
        n = runtime.context.n_scenarios if runtime.context else 4
        generated = generate_scenarios(deps, meta, n)
        if generated.value is None:
            return failed(f"test: scenarios: {generated.error}")
        scenarios = generated.value.scenarios
        update["scenarios"] = [s.model_dump(mode="json") for s in scenarios]
    assert state.get("code") is not None
    try:
        report = run_tests(deps, state["code"] or "", meta, scenarios)
    except SandboxUnavailable as e:  # no OS sandbox here: untrusted code is not run at all
        return failed(f"test: {e}")
    dumped = report.model_dump(mode="json")
    return {**update, "report": dumped, "reports": [dumped]}


def node_revise(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    report = ErrorReport.model_validate(state["report"])
    result = revise_code(deps_of(runtime), meta_of(state), state.get("code") or "", report)
    if not result.ok:
        return failed(f"revise: {result.error}")
    return {"code": result.value, "revision": state.get("revision", 0) + 1}


def _record(state: EnvGenState) -> GeneratedEnvironment:
    return GeneratedEnvironment(
        metadata=meta_of(state),
        code=state.get("code") or "",
        scenarios=[TestScenario.model_validate(s) for s in state.get("scenarios") or []],
        search=state.get("search"),
        reports=state.get("reports", []),
    )


def _bad_name(state: EnvGenState) -> str | None:
    """Why the state's environment name cannot name a folder, or None when it can (the metadata's rule).

    A model chose the name, and a checkpoint (an old one, a Studio edit) may hold anything: a 300-character
    name was an ENAMETOOLONG traceback, one with a newline or a `/` a path elsewhere."""
    name = (state.get("metadata") or {}).get("name")
    if isinstance(name, str) and ENV_NAME.fullmatch(name):
        return None
    shown = name if not isinstance(name, str) or len(name) <= 80 else name[:77] + "..."
    return f"{shown!r} is not a valid environment name (letters, digits, underscore; at most {ENV_NAME_MAX} characters)"


def node_register(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """Write `envs/<name>/`, load it as the pool would, validate it, add it to the registry."""
    why = _bad_name(state)
    if why is not None:
        return failed(f"register: {why}; not registered")
    try:
        folder = register(_record(state), settings_of(runtime.context))
    except ValidationError as e:  # metadata edited in a checkpoint since the search validated it
        where, what = first_error(e)
        return failed(f"register: the metadata does not validate: {where}: {what}; not registered")
    except RegistrationError as e:
        return failed(f"register: {e}")
    return {"status": "registered", "output": str(folder)}


def node_reject(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """Keep the rejected environment with its reports for inspection (outside the pool).

    A name that cannot name a folder, metadata that no longer validates or a folder that cannot be
    written: a recorded failure (nothing kept), never a traceback."""
    why = _bad_name(state)
    if why is not None:
        return failed(f"reject: {why}; not kept")
    try:
        record = _record(state)
    except ValidationError as e:
        where, what = first_error(e)
        return failed(f"reject: the metadata does not validate: {where}: {what}; not kept")
    folder = settings_of(runtime.context).data_path / "rejected" / record.metadata.name
    try:
        write_environment(folder, record)
    except OSError as e:  # a full disk, a read-only data folder
        return failed(f"reject: cannot write {folder}: {e.strerror or e}")
    return {"status": "rejected", "output": str(folder)}
