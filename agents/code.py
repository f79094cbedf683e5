"""Code Agent: metadata → env.py (state model + tools); revision mode fixes it from an ErrorReport."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel

from agents.common import AgentDeps
from envfactory.env.checks import ErrorReport
from envfactory.env.metadata import EnvMetadata

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
# the exemplar shown to the model: a real, tested environment of the bundled pool
EXAMPLE_ENV = Path(__file__).resolve().parent.parent / "envs" / "hotels" / "env.py"


class GeneratedCode(BaseModel):
    """The Code Agent's answer: the code, or why there is none after the bounded retries."""

    ok: bool
    code: str | None = None
    error: str | None = None
    attempts: int = 0


def extract_code(text: str) -> tuple[str | None, str | None]:
    """(code, problem): the first Python fence (or the whole reply if it parses); syntax checked."""
    blocks = _FENCE.findall(text)
    code = blocks[0] if blocks else text
    if not code.strip():
        return None, "the answer holds no code: reply with one ```python block holding the complete env.py"
    try:
        ast.parse(code)
    except SyntaxError as e:
        where = "the ```python block" if blocks else "the answer (no ```python block found)"
        return None, f"{where} is not valid Python: line {e.lineno}: {e.msg}"
    return code.strip() + "\n", None


def _ask_code(deps: AgentDeps, messages: list[BaseMessage]) -> GeneratedCode:
    model = deps.model("code")
    retries = deps.settings.structured_retries
    problem = "no answer"
    for attempt in range(1, retries + 2):
        reply = model.invoke(messages)
        text = reply.content if isinstance(reply.content, str) else json.dumps(reply.content)
        code, problem_or_none = extract_code(text)
        if code is not None:
            return GeneratedCode(ok=True, code=code, attempts=attempt)
        problem = problem_or_none or problem
        repair = deps.prompts.get("common/repair").render(error=problem, schema="a single ```python code block")
        messages = [*messages, AIMessage(content=text), *repair[-1:]]
    return GeneratedCode(ok=False, error=f"no valid code after {retries + 1} answers: {problem}", attempts=retries + 1)


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
