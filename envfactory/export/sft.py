"""`convert_to_sft_data`: training samples from a conversation (EnvFactory reference, section 3.5).

Per valid turn (the default, `per="turn"`), one sample holding the conversation so far: `messages[:prompt_length]`
is the prompt (earlier turns + this turn's request), the rest is the completion (this turn's calls, results and
answer) — the reference's per-turn samples with the history masked. `per="conversation"` gives one sample per
conversation whose every assistant message is trained once. Failed tool calls are removed, `<think>` traces kept
on request (see `turns.py`). A sample's tool list is its conversation's, or only the tools it needs, compact or
not (`ExportOptions.tools` / `schemas`, see `row_tools.py`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from envfactory.export.messages import ChatMessage
from envfactory.export.options import ExportOptions
from envfactory.export.row_tools import row_tools
from envfactory.export.tools_schema import Catalog, ToolSchema, conversation_tools
from envfactory.export.turns import conversation_turns
from envfactory.records.models import Conversation


class SFTSample(BaseModel):
    """One SFT sample, format-neutral: the writers turn it into TRL, LlamaFactory rows."""

    model_config = ConfigDict(extra="forbid")

    id: str  # "<conversation id>#<turn>" or the conversation id
    conversation_id: str
    turn: int | None  # None for a whole-conversation sample
    messages: list[ChatMessage]
    prompt_length: int  # messages[:prompt_length]: history + request; the rest: what is trained
    tools: list[ToolSchema]
    turns: int  # how many turns the sample covers (its completion: one; a whole conversation: all)
    dropped_failed_calls: int  # failed calls removed from the turns it covers

    @property
    def prompt(self) -> list[ChatMessage]:
        return self.messages[: self.prompt_length]

    @property
    def completion(self) -> list[ChatMessage]:
        return self.messages[self.prompt_length :]


def system_messages(options: ExportOptions) -> list[ChatMessage]:
    return [ChatMessage(role="system", content=options.system)] if options.system else []


def convert_to_sft_data(
    conversation: Conversation, catalog: Catalog, options: ExportOptions | None = None
) -> list[SFTSample]:
    """SFT samples of one conversation; none when its first turn is not valid."""
    options = options or ExportOptions()
    namer, tools = conversation_tools(conversation, catalog)
    turns = conversation_turns(conversation.nodes, namer, options)
    if not turns:
        return []
    history = system_messages(options)
    if options.per == "conversation":
        messages = history + [m for t in turns for m in t.messages]
        return [
            SFTSample(
                id=conversation.id,
                conversation_id=conversation.id,
                turn=None,
                messages=messages,
                prompt_length=len(history) + turns[0].query_length,
                tools=row_tools(tools, namer, messages, conversation.id, options),
                turns=len(turns),
                dropped_failed_calls=sum(t.dropped_failed_calls for t in turns),
            )
        ]
    samples: list[SFTSample] = []
    for turn in turns:
        row_id = f"{conversation.id}#{turn.index}"
        samples.append(
            SFTSample(
                id=row_id,
                conversation_id=conversation.id,
                turn=turn.index,
                messages=history + turn.messages,
                prompt_length=len(history) + turn.query_length,
                tools=row_tools(tools, namer, history + turn.messages, row_id, options),
                turns=1,
                dropped_failed_calls=turn.dropped_failed_calls,
            )
        )
        history = history + turn.messages
    return samples
