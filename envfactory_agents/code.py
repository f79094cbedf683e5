"""Code Agent: metadata → env.py (state model + tools); revision mode fixes it from an ErrorReport."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from langchain_core.messages import BaseMessage

from envfactory.env.metadata import EnvMetadata
from envfactory.envgen.checks import ErrorReport
from envfactory.llm.structured import Expect, Structured
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
        ast.parse(code)
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
