"""EnvGen's nodes: each a thin step over an agent (`envfactory_agents/`) or EnvGen's model-free parts
(`envfactory.envgen`, and `envfactory.compiler.draft` for a compiled draft).

Two modes, chosen in `code`: a request whose spec compiles (a corpus entry, an OpenAPI file) puts the compiled
plan in `plan`, and every later step works on the plan (revised as data, judged by the compiled environments'
gate, registered as a compiled folder); otherwise the Code Agent writes `code` (judged in the sandbox)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from pydantic import ValidationError

from envfactory.compiler.draft import Draft, draft_from, judge_plan, keep_rejected_plan, plan_metadata, register_plan
from envfactory.compiler.revision import plan_problems
from envfactory.env.compiled import CompiledPlan
from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX
from envfactory.env.sandbox import SandboxUnavailable
from envfactory.envgen.checks import ErrorItem, ErrorReport, TestScenario
from envfactory.envgen.register import GeneratedEnvironment, RegistrationError, register, write_environment
from envfactory.errors import EnvFactoryError, first_error
from envfactory_agents.code import generate_code, revise_code, revise_plan
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


def _draft(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> Draft | None:
    """The compiled draft of the request's spec, when there is a spec and drafting is on; else None."""
    request = EnvGenRequest.model_validate(state.get("request") or {})
    if (runtime.context is not None and not runtime.context.draft) or request.mode not in ("corpus", "openapi"):
        return None
    meta = meta_of(state)
    return draft_from(
        settings_of(runtime.context),
        name=meta.name,
        domain=meta.domain,
        corpus_id=request.corpus_id if request.mode == "corpus" else None,
        openapi_path=request.openapi_path if request.mode == "openapi" else None,
        description=meta.description,
    )


def _with_plan(plan: CompiledPlan) -> EnvGenState:
    """The state of a candidate plan: the plan, and the metadata its folder will carry."""
    return {
        "plan": plan.model_dump(mode="json"),
        "metadata": plan_metadata(plan).model_dump(mode="json", exclude_none=True),
    }


def node_code(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """A spec that compiles: the Code Agent revises its compiled plan (the gate's verdict on the draft in hand);
    otherwise it writes env.py from the metadata."""
    deps = deps_of(runtime)
    try:
        draft = _draft(state, runtime)
    except EnvFactoryError as e:  # the corpus entry or the file went away since the search read it
        return failed(f"code: draft: {e}")
    update: EnvGenState = {}
    if draft is not None and draft.plan is not None:
        verdict = judge_plan(draft.plan, deps.settings.pass_threshold)
        update["draft"] = draft.record(verdict)
        revised = revise_plan(deps, draft.plan, verdict, draft=True)
        if not revised.ok or revised.value is None:
            return {**update, **failed(f"code: {revised.error}")}
        return {**update, **_with_plan(revised.value)}
    if draft is not None:  # the spec does not compile: code from the metadata, and the reason kept
        update["draft"] = draft.record()
    result = generate_code(deps, meta_of(state))
    if not result.ok:
        return {**update, **failed(f"code: {result.error}")}
    return {**update, "code": result.value}


def _plan_of(state: EnvGenState) -> CompiledPlan | str:
    """The state's plan, or why it is none (a checkpoint edited in Studio may hold anything)."""
    try:
        return CompiledPlan.model_validate(state.get("plan"))
    except ValidationError as e:
        where, what = first_error(e)
        return f"the plan does not validate: {where}: {what}"


def _test_plan(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    """The Test Agent's verdict on a plan: the gate every compiled environment passes, never a model's word."""
    plan = _plan_of(state)
    if isinstance(plan, str):
        return failed(f"test: {plan}")
    threshold = settings_of(runtime.context).pass_threshold
    problems = plan_problems(plan)
    if problems:  # only an edited checkpoint gets here: a revision is checked when it is read
        errors = [ErrorItem(dimension="interface", severity="critical", message=p) for p in problems]
        report = ErrorReport(errors=errors, threshold=threshold, sandbox_status="not run")
    else:
        report = judge_plan(plan, threshold)
    dumped = report.model_dump(mode="json")
    return {"report": dumped, "reports": [dumped]}


def node_test(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    if state.get("plan") is not None:
        return _test_plan(state, runtime)
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
    revision = state.get("revision", 0) + 1
    if state.get("plan") is not None:
        plan = _plan_of(state)
        if isinstance(plan, str):
            return failed(f"revise: {plan}")
        revised = revise_plan(deps_of(runtime), plan, report, draft=False)
        if not revised.ok or revised.value is None:
            return failed(f"revise: {revised.error}")
        return {**_with_plan(revised.value), "revision": revision}
    result = revise_code(deps_of(runtime), meta_of(state), state.get("code") or "", report)
    if not result.ok:
        return failed(f"revise: {result.error}")
    return {"code": result.value, "revision": revision}


def _record(state: EnvGenState) -> GeneratedEnvironment:
    return GeneratedEnvironment(
        metadata=meta_of(state),
        code=state.get("code") or "",
        scenarios=[TestScenario.model_validate(s) for s in state.get("scenarios") or []],
        search=state.get("search"),
        reports=state.get("reports", []),
    )


def _plan_record(state: EnvGenState) -> dict[str, Any]:
    """What `envgen.json` keeps of a plan's run: the search, the draft (and the gate's verdict on it), every round."""
    return {"search": state.get("search"), "draft": state.get("draft"), "reports": state.get("reports", [])}


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
    if state.get("plan") is not None:
        plan = _plan_of(state)
        if isinstance(plan, str):
            return failed(f"register: {plan}; not registered")
        try:
            folder = register_plan(plan, _plan_record(state), settings_of(runtime.context))
        except RegistrationError as e:
            return failed(f"register: {e}")
        return {"status": "registered", "output": str(folder)}
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
    if state.get("plan") is not None:
        return _reject_plan(state, runtime)
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


def _reject_plan(state: EnvGenState, runtime: Runtime[EnvGenContext]) -> EnvGenState:
    plan = _plan_of(state)
    if isinstance(plan, str):
        return failed(f"reject: {plan}; not kept")
    folder = settings_of(runtime.context).data_path / "rejected" / plan.name
    try:
        keep_rejected_plan(folder, plan, _plan_record(state))
    except OSError as e:
        return failed(f"reject: cannot write {folder}: {e.strerror or e}")
    return {"status": "rejected", "output": str(folder)}
