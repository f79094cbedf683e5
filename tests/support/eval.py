"""A stand-in model for evaluations: it answers each turn with its ground truth, the same in every process."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from envfactory.eval.items import EvalItem


class GroundTruthModel(BaseChatModel):
    """Answers a turn with its ground-truth calls (keyed by the request), then "Done.": the same in every
    process, so attempts do not depend on which worker ran them (a script would be consumed per process)."""

    calls: dict[str, list[dict[str, Any]]]

    @property
    def _llm_type(self) -> str:
        return "ground-truth"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="Done.")
        else:
            made = self.calls[str(messages[-1].content)]
            reply = AIMessage(
                content="", tool_calls=[{**c, "id": f"c{j}", "type": "tool_call"} for j, c in enumerate(made)]
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


class GroundTruthModels:
    """A picklable model factory for the items."""

    def __init__(self, items: list[EvalItem]) -> None:
        self.calls = {
            str(i.prompt[-1]["content"]): [{"name": c.name, "args": dict(c.arguments)} for c in i.ground_truth]
            for i in items
        }

    def __call__(self) -> GroundTruthModel:
        return GroundTruthModel(calls=self.calls)
