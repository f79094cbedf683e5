"""Code Agent: metadata → env.py (state model + tools); revision mode fixes it from an ErrorReport.

Draft mode (`revise_plan`): given a compiled environment (a plan, data) as its starting draft, it answers with a
`PlanRevision` — data again, applied and checked by `envfactory.compiler.revision` — never with code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from langchain_core.messages import BaseMessage

from envfactory.compiler.draft import plan_view, skipped_view
from envfactory.compiler.revision import PlanRevision, RevisionError, apply_revision
from envfactory.env.compiled import CompiledPlan
from envfactory.env.metadata import EnvMetadata
from envfactory.envgen.checks import ErrorReport
from envfactory.inputs import parse_python
from envfactory.llm.structured import Expect, Structured, parse_reply
from envfactory_agents.common import AgentDeps

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
# the exemplar shown to the model: a real, tested environment of the bundled pool
EXAMPLE_ENV = Path(__file__).resolve().parent.parent / "envs" / "hotels" / "env.py"


def extract_code(text: str) -> tuple[str | None, str | None]:
    """(code, problem): the first Python fence (or the whole reply if it parses); syntax checked."""
    blocks = _FENCE.findall(text)
    code = blocks[0] if blocks else text
    if not code.strip():
        return None, "the answer holds no code: reply with one ```python block holding the complete env.py"
    try:
        parse_python(code)  # one thread at a time: EnvGen batches run threads (envfactory.inputs)
    except SyntaxError as e:
        where = "the ```python block" if blocks else "the answer (no ```python block found)"
        return None, f"{where} is not valid Python: line {e.lineno}: {e.msg}"
    return code.strip() + "\n", None


# The Code Agent's answer: the code, or why there is none after the bounded retries.
GeneratedCode = Structured[str]
CODE = Expect(name="env.py", read=extract_code, shape="a single ```python code block holding the complete env.py")


def _ask_code(deps: AgentDeps, messages: list[BaseMessage]) -> GeneratedCode:
    return deps.ask("code", messages, CODE)


def generate_code(deps: AgentDeps, metadata: EnvMetadata) -> GeneratedCode:
    messages = deps.prompts.get("code/generate").render(
        metadata=metadata.model_dump_json(indent=2, exclude_none=True),
        example=EXAMPLE_ENV.read_text(encoding="utf-8"),
    )
    return _ask_code(deps, messages)


def revise_code(deps: AgentDeps, metadata: EnvMetadata, code: str, report: ErrorReport) -> GeneratedCode:
    messages = deps.prompts.get("code/revise").render(
        metadata=metadata.model_dump_json(indent=2, exclude_none=True), code=code, report=report.summary()
    )
    return _ask_code(deps, messages)


def revision_of(plan: CompiledPlan) -> Expect[CompiledPlan]:
    """A `PlanRevision` answer, read into the revised plan: one that does not validate, or does not give a valid
    plan when applied, goes back to the model with every problem (the `common/repair` loop)."""
    schema = PlanRevision.model_json_schema()

    def read(text: str) -> tuple[CompiledPlan | None, str | None]:
        revision, problem = parse_reply(text, PlanRevision)
        if revision is None:
            return None, problem
        try:
            return apply_revision(plan, revision), None
        except RevisionError as e:
            return None, str(e)

    return Expect(name="PlanRevision", read=read, shape=json.dumps(schema, indent=2), json_schema=schema)


def revise_plan(deps: AgentDeps, plan: CompiledPlan, report: ErrorReport, *, draft: bool) -> Structured[CompiledPlan]:
    """The Code Agent's revision of a compiled plan (`draft`: the compiler's own, with the gate's verdict on it;
    else its last revision, with the gate's failure), applied: the revised plan, or why there is none."""
    messages = deps.prompts.get("code/draft" if draft else "code/draft_revise").render(
        plan=plan_view(plan),
        skipped=skipped_view(plan),
        report=report.summary(),
        schema=json.dumps(PlanRevision.model_json_schema(), indent=1),
    )
    return deps.ask("code", messages, revision_of(plan))
