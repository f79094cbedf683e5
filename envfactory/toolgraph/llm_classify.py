"""`user_provided` by the LLM: one structured call per environment (prompt `toolgraph/user_provided`).

Only decisions naming an existing (tool, input) of that environment are applied; every input the
model leaves out, and every input of an environment whose answer never parses, keeps its heuristic
verdict. The report says which.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.structured import ask_structured
from envfactory.llm.usage import UsageTracker
from envfactory.toolgraph.classify import Verdict
from envfactory.toolgraph.params import ParamSpec

PROMPT = "toolgraph/user_provided"


class ParamDecision(BaseModel):
    tool: str
    parameter: str
    user_provided: bool
    reason: str = ""


class UserProvidedAnswer(BaseModel):
    parameters: list[ParamDecision] = Field(default_factory=list)


class ClassifyReport(BaseModel):
    """What the LLM decided for one environment."""

    env: str
    ok: bool
    decided: int = 0  # decisions applied
    ignored: list[str] = Field(default_factory=list)  # decisions naming no input of the environment
    kept_heuristic: int = 0  # inputs the answer did not cover
    changed: int = 0  # decisions that differ from the heuristic
    error: str | None = None


def _short(tool_id: str) -> str:
    return tool_id.split(".", 1)[1]


def classify_env(
    env: str,
    env_description: str,
    inputs: Sequence[ParamSpec],
    heuristic: dict[str, Verdict],
    produced_by: dict[str, list[str]],
    *,
    model: BaseChatModel,
    library: PromptLibrary,
    retries: int,
    role: str,
    usage: UsageTracker | None = None,
) -> tuple[dict[str, Verdict], ClassifyReport]:
    """LLM verdicts for the inputs of one environment, keyed by parameter node id."""
    listing = [
        {
            "tool": _short(p.tool),
            "parameter": p.name,
            "type": p.json_type,
            "required": p.required,
            "description": p.description,
            "produced_by": produced_by.get(p.node_id, [])[:3],
            "rule_guess": "user_provided" if heuristic[p.node_id].user_provided else "internal",
        }
        for p in inputs
    ]
    messages = library.get(PROMPT).render(environment=f"{env}: {env_description}", parameters=listing)
    answer = ask_structured(
        model, messages, UserProvidedAnswer, library=library, retries=retries, role=role, usage=usage
    )
    if not answer.ok or answer.value is None:
        return {}, ClassifyReport(env=env, ok=False, kept_heuristic=len(inputs), error=answer.error)
    by_key = {(_short(p.tool), p.name): p for p in inputs}
    verdicts: dict[str, Verdict] = {}
    report = ClassifyReport(env=env, ok=True)
    for d in answer.value.parameters:
        tool = d.tool.split(".", 1)[1] if d.tool.startswith(f"{env}.") else d.tool
        p = by_key.get((tool, d.parameter))
        if p is None:
            report.ignored.append(f"{d.tool}.{d.parameter}")
            continue
        verdicts[p.node_id] = Verdict(user_provided=d.user_provided, source="llm", reason=d.reason or "LLM")
        report.changed += d.user_provided != heuristic[p.node_id].user_provided
    report.decided = len(verdicts)
    report.kept_heuristic = len(inputs) - len(verdicts)
    return verdicts, report
