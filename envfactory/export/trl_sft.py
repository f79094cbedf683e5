"""TRL conversational SFT rows (`SFTTrainer`), one JSONL file.

- `per="turn"`: conversational **prompt-completion** rows: `prompt` = the conversation so far + the turn's
  request, `completion` = the turn's assistant tool calls, tool results and answer. TRL 1.16 trains only the
  completion (`completion_only_loss` defaults on for prompt-completion data) and, with
  `assistant_only_loss=True`, only its assistant tokens (labels keep a token where every mask is 1), so each
  turn is trained once and tool results never are.
- `per="conversation"`: language-modeling rows with `messages`; use `assistant_only_loss=True`.

`tools` is a JSON string: TRL's SFT tokenizer `json.loads` a string `tools` column and passes it to
`apply_chat_template(..., tools=...)`; a string keeps each row's own schemas (Arrow would otherwise merge every
tool's parameters into one struct). Tool-call `arguments` are dicts, as transformers' templates expect;
`datasets.load_dataset("json", ...)` keeps them exact (mixed message shapes load as `List(Json())`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from envfactory.export.files import write_jsonl
from envfactory.export.messages import wire
from envfactory.export.sft import SFTSample
from envfactory.export.tools_schema import tools_json

FILE = "train.jsonl"


class TRLSFTTurnRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    tools: str
    id: str
    conversation_id: str
    turn: int


class TRLSFTConversationRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]]
    tools: str
    id: str
    conversation_id: str


TRLSFTRecord = TRLSFTTurnRecord | TRLSFTConversationRecord


def trl_sft_record(sample: SFTSample) -> TRLSFTRecord:
    tools = tools_json(sample.tools)
    if sample.turn is None:
        return TRLSFTConversationRecord(
            messages=wire(sample.messages), tools=tools, id=sample.id, conversation_id=sample.conversation_id
        )
    return TRLSFTTurnRecord(
        prompt=wire(sample.prompt),
        completion=wire(sample.completion),
        tools=tools,
        id=sample.id,
        conversation_id=sample.conversation_id,
        turn=sample.turn,
    )


def record_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole conversation of a TRL SFT row (`messages`, or `prompt` + `completion`)."""
    if "messages" in row and row["messages"] is not None:
        return list(row["messages"])
    return [*row["prompt"], *row["completion"]]


def write_trl_sft(samples: list[SFTSample], out: Path) -> list[Path]:
    path = out / FILE
    write_jsonl((trl_sft_record(s) for s in samples), path)
    return [path]
